"""`python -m benchmarks NAME [options]`: the one command for every benchmark and measurement script.

Run it from the repository root with the development install (`pip install -e ".[dev]"`), which is
what imports `dctdata` here; `python -m benchmarks --help` lists the names, `python -m benchmarks NAME
--help` the options of one. The tables (`codec`, `rd`, `loader`, `stream`, `gpu`) are
`benchmarks.tables`; every other name is one module with its own `main(argv)`. As in the `dctdata`
CLI, an error a user can cause (`DctDataError`, `OSError`) prints one line and exits 1.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from dctdata.errors import DctDataError

PROG = "python -m benchmarks"

# The measurement scripts: name -> (module, what it measures). Add a line here when adding one.
SCRIPTS = {
    "calibration-landing": (
        "benchmarks.calibration_landing",
        "where --target-psnr lands each channel, the per-sample floor, and the stored bytes (DEM, RGB, volume, MRI)",
    ),
    "calibration-cost": (
        "benchmarks.calibration_cost",
        "a --target-psnr pack's time against the fixed-setting pack of the setting it chose (optical_damage frames)",
    ),
    "calibration-time": (
        "benchmarks.calibration_time",
        "pack and settings-search time on optical_damage TIFF frames, against an older install",
    ),
    "codec-ablation": ("benchmarks.codec_ablation", "bytes at equal PSNR with each codec fix switched off in turn"),
    "decode-kernels": ("benchmarks.decode_kernels", "the CPU decode kernels side by side (copy, torch, fused C)"),
    "decompress-host": (
        "benchmarks.decompress_host",
        "the host's Python per Decompress call on the fused CUDA path (its launch stubbed: runs without a GPU)",
    ),
    "docs-table": (
        "benchmarks.docs_table",
        "a benchmark's JSON as a docs table, headed by its command, machine and date (docs/benchmarks/)",
    ),
    "device-decode": (
        "benchmarks.device_decode",
        'bytes crossing to the device and loader samples/s, decode="cpu" beside decode="device"',
    ),
    "entropy-decode-speed": (
        "benchmarks.entropy_decode_speed",
        "the entropy stage's decode MB/s and bytes beside zstd-9 and zstd-19 on the same coefficients",
    ),
    "functional-decompress": (
        "benchmarks.functional_decompress",
        "the functional dctdata.decompress against the Decompress module, CPU (fused C) and CUDA (Triton)",
    ),
    "gpu-ctxrans": (
        "benchmarks.gpu_ctxrans",
        "the entropy stage's CUDA decoder: bit-exactness, batch decode time, hostile streams",
    ),
    "gpu-doc-table": (
        "benchmarks.gpu_doc_table",
        "the markdown for docs/benchmarks/ from a `python -m benchmarks gpu --json` run: device, date, command, rows",
    ),
    "gpu-layer": ("benchmarks.gpu_layer", "fused CUDA Decompress v1 vs v2 GB/s, nvCOMP zstd batch decode"),
    "kernel-alone": (
        "benchmarks.kernel_alone",
        "the fused CUDA kernel alone (CUDA-graph replays, no host time), v1 and v2, other kernel files side by side",
    ),
    "kernel-sass": (
        "benchmarks.kernel_sass",
        "the fused CUDA kernel's sm_90 machine code without a GPU: registers, warps/SM, instructions, memory ops",
    ),
    "loader-workers": (
        "benchmarks.loader_workers",
        "webdataset loader samples/s in process and with DataLoader workers, per lossless stage",
    ),
    "masked-fill": ("benchmarks.masked_fill", "bytes and PSNR of the fills of masked pixels; --nan mask vs fill=0"),
    "max-error": (
        "benchmarks.max_error",
        "bytes at equal pointwise error bound: --max-rel-error against SZ3 (abs), ZFP (fixed accuracy), SPERR (pwe)",
    ),
    "edge-blocks": (
        "benchmarks.edge_blocks",
        "stored bytes with partial blocks padded as before, filled from their own pixels, and with table bytes weighed",
    ),
    "fixed-bytes": (
        "benchmarks.fixed_bytes",
        "one small int16 volume's fixed bytes by part (model, checksums, zarr.json, ...) and its CR against SPERR-3D",
    ),
    "fit-speed": (
        "benchmarks.fit_speed",
        "the context coder's fit time in a default pack, the pack's time and bytes, tiny to large, beside an old tree",
    ),
    "pack-speed": (
        "benchmarks.pack_speed",
        "pack MB/s of float32 and CR (default, zstd, fixed, workers, cold CLI, GPU) beside SZ3, ZFP and SPERR",
    ),
    "rd-compare": (
        "benchmarks.rd_compare",
        "after/before stored bytes at 35/40/45 dB of two rd --json runs, pack by pack",
    ),
    "rd-fixed-bytes": ("benchmarks.rd_fixed_bytes", "the fixed bytes of each rd pack and the ratios without them"),
    "stage-choice": (
        "benchmarks.stage_choice",
        'stored bytes against the target where "auto" decides the size (int16 fMRI-like slices, an odd MRI volume)',
    ),
    "robustness-bounds": (
        "benchmarks.robustness_bounds",
        "what each resource bomb of issue 30 costs a reader: peak RSS growth and longest block",
    ),
    "segment-cost": (
        "benchmarks.segment_cost",
        "bytes of the entropy stage's segments (GPU decode units) per segment length, fields and photos",
    ),
    "scale": ("benchmarks.bench_scale", "pack throughput on 1 and 2 Dask workers, peak RSS, RSS per loader worker"),
    "trajectories": (
        "benchmarks.trajectories",
        "a Well (or --layout pdebench) set: bytes against its HDF5 (raw, gzip, zstd), windows/s against an HDF5 reader",
    ),
    "volume-levers": (
        "benchmarks.volume_levers",
        "what moves a dims=3 pack of real volumes: forced dtype, zstd-19, 2-D packing, DC entropy, padding",
    ),
    "volumes-rd": (
        "benchmarks.volumes_rd",
        "volumes (dims=3) at equal PSNR against SZ3, ZFP and 2-D packing; 3-D vs 2-D Decompress GB/s",
    ),
    "wds-overhead": (
        "benchmarks.wds_overhead",
        "bytes per sample of 64 x 64 DEM tiles as webdataset shards against zarr: tar headers and padding",
    ),
    "zstd-levels": ("benchmarks.zstd_levels", "bytes, encode and decode speed of each zstd level on coefficients"),
}


def build_parser() -> argparse.ArgumentParser:
    from benchmarks import tables

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="dctdata's benchmarks (tables against the peers) and measurement scripts. Run from the "
        "repository root; see benchmarks/README.md.",
    )
    sub = parser.add_subparsers(dest="name", metavar="NAME", required=True)
    tables.register(sub)
    for name, (_, help) in SCRIPTS.items():
        sub.add_parser(name, help=help, add_help=False)  # listed in --help; the script parses its own options
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    name = argv[0] if argv else ""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if name in SCRIPTS:
            importlib.import_module(SCRIPTS[name][0]).main(argv[1:])
            return 0
        args = build_parser().parse_args(argv)
        args.argv = argv  # what the tables record of their command (gpu --json)
        return int(args.func(args) or 0)
    except (DctDataError, OSError) as exc:
        msg = str(exc) if not isinstance(exc, OSError) or not exc.filename else f"{exc.strerror}: {exc.filename}"
        print(f"{PROG} {name}: error: {msg}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG} {name}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
