"""`dctdata info OUT`: fields, sizes, stored and transfer ratios, achieved PSNR of a packed dataset."""

from __future__ import annotations

import math

from dctdata.format import Manifest, read_manifest


def register(sub) -> None:
    p = sub.add_parser("info", help="fields, sizes, ratios and achieved PSNR of a packed dataset")
    p.add_argument("dataset", metavar="OUT", help="packed dataset directory or URL")
    p.set_defaults(func=_main)


def field_rows(m: Manifest) -> list[dict]:
    """Per field: stored bytes (files under `<field>/`; None when fields share files, as in webdataset
    shards), ratio vs float32 and vs the source dtype, transfer ratio, error figures."""
    rows = []
    for f in m.fields:
        stored = sum(e["bytes"] for k, e in m.checksums.items() if k.startswith(f.name + "/")) or None
        n_values = math.prod(f.shape) * m.samples
        rows.append(
            {
                "field": f,
                "stored": stored,
                "ratio_f32": None if not stored else 4 * n_values / stored,
                "ratio_src": None if not stored else f.source_sample_bytes * m.samples / stored,
                "transfer": f.codec.transfer_ratio if f.kind == "dct" else 4 * math.prod(f.shape) / max(1, f.stored_sample_bytes),
                "stats": m.stats.get(f.name),
            }
        )
    return rows


def _num(v, fmt="{:.2f}") -> str:
    if v is None:
        return "-"
    if v == math.inf:
        return "exact"
    return fmt.format(v)


def _main(args) -> int:
    m = read_manifest(args.dataset)
    total = m.stored_bytes
    print(f"{args.dataset}: {m.format} v{m.version} ({m.storage}), written by dctdata {m.dctdata_version}")
    print(f"samples: {m.samples}   stored: {total / 1e6:.3f} MB in {len(m.checksums)} files")
    settings = {k: v for k, v in m.pack.items() if v not in (None, {}, False)}
    print("pack settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
    print()
    print("| field | kind | shape | dtype | stored as | codec | stored MB | ratio vs f32 | ratio vs source | transfer ratio | PSNR min dB | PSNR median dB | max error | overflow |")
    print("|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in field_rows(m):
        f, s = r["field"], r["stats"]
        codec = f"cf={f.codec.cf} {f.codec.mask} {f.codec.dtype}" if f.kind == "dct" else "lossless"
        print(
            f"| {f.name} | {f.kind} | {list(f.shape)} | {f.dtype} | {list(f.stored_shape)} {f.stored_dtype} | {codec} | "
            f"{_num(None if r['stored'] is None else r['stored'] / 1e6, '{:.3f}')} | {_num(r['ratio_f32'])} | {_num(r['ratio_src'])} | "
            f"{_num(r['transfer'])} | {_num(s and s.psnr_min)} | {_num(s and s.psnr_median)} | "
            f"{_num(s and s.max_abs_error, '{:.4g}')} | {s.overflow if s else '-'} |"
        )
    return 0
