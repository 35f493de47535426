"""`dctdata info OUT`: fields, sizes, stored and transfer ratios, achieved PSNR of a packed dataset (per
channel of each sample, over valid pixels; one row per channel below a multi-channel field), the largest
error per field and channel (and the pointwise bound a field was packed under), a trajectory pack's figures
per field, channel and time-step range (`--step-ranges`), its coordinates and field attributes."""

from __future__ import annotations

import os


def register(sub) -> None:
    p = sub.add_parser("info", help="fields, sizes, ratios and achieved PSNR of a packed dataset")
    p.add_argument("dataset", metavar="OUT", help="packed dataset directory or URL")
    p.add_argument(
        "--step-ranges",
        metavar="N|A:B,...",
        help="a trajectory pack: the time-step ranges of its fidelity table, a count of near-equal ranges or "
        "A:B,C:D (B left out: to the end; default 4 ranges)",
    )
    p.set_defaults(func=_main)


def _main(args) -> int:
    from dctdata.format.checksum import sha256_file
    from dctdata.format.location import is_url, manifest_location
    from dctdata.format.manifest import MAX_MANIFEST_BYTES, read_manifest
    from dctdata.report import FIDELITY_OVER_TIME, field_rows, num, pack_summary, stage_name, time_lines

    m = read_manifest(args.dataset)
    loc = manifest_location(args.dataset)[1]
    digest, size = sha256_file(loc, root=None if is_url(loc) else os.path.dirname(loc), limit=MAX_MANIFEST_BYTES)
    t = pack_summary(m, manifest_bytes=size)  # the numbers the pack's summary printed
    over_time = time_lines(m, args.step_ranges)  # first: bad --step-ranges stop before any output
    print(f"{args.dataset}: {m.format} v{m.version} ({m.storage}), written by dctdata {m.dctdata_version}")
    print(
        f"samples: {m.samples}   stored: {t['stored_bytes'] / 1e6:.3f} MB in {len(m.checksums)} files and the "
        f"manifest, ratio {num(t['ratio_f32'])}x vs float32 and {num(t['ratio_src'])}x vs the source "
        f"({t['source_bytes'] / 1e6:.3f} MB)"
    )
    print(f"manifest sha256: {digest} (pin this pack: open_dataset(..., sha256=...))")
    settings = {k: v for k, v in m.pack.items() if v not in (None, {}, False) and k != FIDELITY_OVER_TIME}
    print("pack settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
    print()
    print(
        "| field | kind | shape | dtype | stored as | codec | lossless stage | stored MB | ratio vs f32 | ratio vs "
        "source | transfer ratio | PSNR dataset dB | PSNR min dB | PSNR median dB | max error | overflow | valid |"
    )
    print("|---|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in field_rows(m):
        f, s = r["field"], r["stats"]
        codec = f.kind_type.describe(f)  # "exact", or the codec with its bound
        stored = None if r["stored"] is None else r["stored"] / 1e6
        valid = "-" if s is None or s.valid_fraction is None else f"{100 * s.valid_fraction:.1f}% ({f.valid})"
        dataset = num(s.psnr_dataset) if s is not None and f.coded else "-" if s is None else num(s.psnr_min)
        print(
            f"| {f.name} | {f.kind} | {list(f.shape)} | {f.dtype} | {list(f.stored_shape)} {f.stored_dtype} | {codec} "
            f"| {stage_name(f.lossless)} | {num(stored, '{:.3f}')} | {num(r['ratio_f32'])} | {num(r['ratio_src'])} | "
            f"{num(r['transfer'])} | "
            f"{dataset} | {num(s and s.psnr_min)} | {num(s and s.psnr_median)} | "
            f"{num(s and s.max_abs_error, '{:.4g}')} | {s.overflow if s else '-'} | {valid} |"
        )
        names = f.attrs.get("channels") if isinstance(f.attrs.get("channels"), list) else []
        for i, ch in enumerate(s.channels if s is not None and s.channels and len(s.channels) > 1 else ()):
            print(
                f"| {f.name}[{i}] | channel{' ' + str(names[i]) if i < len(names) else ''} | | | | | | | | | | "
                f"{num(ch.psnr_dataset)} | {num(ch.psnr_min)} | "
                f"{num(ch.psnr_median)} | {num(ch.max_abs_error, '{:.4g}')} | | |"
            )
    if over_time:
        print()
        print("fidelity over time (per frame: PSNR against its range, relative L2 ||x^ - x|| / ||x||):")
        for line in over_time:
            print(line)
        print()
    for f in m.fields:
        if f.attrs:
            print(f"{f.name} attrs: " + ", ".join(f"{k}={v}" for k, v in f.attrs.items()))
    for name, c in m.coords.items():
        values = c["values"]
        span = f"{values[0]} .. {values[-1]}" if values else "empty"
        units = c["attrs"].get("units")
        print(
            f"coordinate {name} ({c['dim']}{', per sample' if c['sample'] else ''}): {len(values)} values {span}"
            + (f" [{units}]" if units else "")
        )
    return 0
