"""`dctdata demo`: the README's first command. Runs the codec end to end on embedded data and prints
one table. (Grows into the full pack -> stream -> Decompress -> train demo.)"""

from __future__ import annotations

import statistics

import torch

from dctdata.layer import Decompress
from dctdata.metrics import psnr
from dctdata.quantize import encode
from dctdata.sample_images import sample_images, to_chw_float
from dctdata.spec import CodecSpec


def register(sub) -> None:
    p = sub.add_parser("demo", help="compress/decompress embedded sample data and print sizes, ratios, PSNR")
    p.add_argument("--cf", type=int, nargs="+", default=[2, 3, 4, 6, 8], help="chop factors to show")
    p.add_argument("--mask", default="square", choices=["square", "triangle"])
    p.set_defaults(func=_main)


def codec_table(cfs, mask: str = "square") -> list[dict]:
    """One row per CF: transfer ratio vs float32 and vs uint8 source, PSNR min/median over the images."""
    images = {name: torch.from_numpy(to_chw_float(img)) for name, img in sample_images().items()}
    rows = []
    for cf in cfs:
        scores, ratio = [], []
        for x in images.values():
            spec = CodecSpec(cf=cf, mask=mask, channels=x.shape[0], height=x.shape[1], width=x.shape[2])
            q, _ = encode(x, spec)
            x_hat = Decompress(spec)(q)
            scores.extend(psnr(x, x_hat).tolist())
            ratio.append(spec.transfer_ratio)
        rows.append(
            {
                "cf": cf,
                "kept": CodecSpec(cf=cf, mask=mask, height=8, width=8).kept,
                "ratio_f32": statistics.median(ratio),
                "ratio_u8": statistics.median(ratio) / 4,
                "psnr_min": min(scores),
                "psnr_median": statistics.median(scores),
                "items": len(scores),
            }
        )
    return rows


def _main(args) -> int:
    rows = codec_table(args.cf, args.mask)
    print(f"DCT+Chop ({args.mask} mask, float32 coefficients) on {rows[0]['items']} image channels shipped with scikit-image/scikit-learn")
    print("| CF | kept/64 | ratio vs float32 | ratio vs uint8 | PSNR min dB | PSNR median dB |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['cf']} | {r['kept']} | {r['ratio_f32']:.2f} | {r['ratio_u8']:.2f} | {r['psnr_min']:.1f} | {r['psnr_median']:.1f} |"
        )
    return 0
