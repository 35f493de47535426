"""The fused CUDA kernel's machine code, without a GPU: registers, spills and instructions per variant (issue 28).

`python -m benchmarks kernel-alone` times the kernel and needs a CUDA device; this compiles it for sm_90 with the
installed Triton (its NVIDIA backend compiles without a driver) and reads the machine code with the `nvdisasm`
and `cuobjdump` that ship with Triton. It compiles each variant as `fused_cuda.synthesize` launches it: 16-byte
aligned pointers and a width divisible by 16 (Triton then specializes the stores to 16-byte vectors, which an
ahead-of-time compile without those facts does not show), one warp a program for samples up to 256 wide and
two above, the decode table's codecs (`benchmarks.gpu.v1_spec` / `v2_spec`: v2 with dead zone and per-sample
side, one channel).

What it shows is what the compiler produced, not speed: registers a thread set how many warps a multiprocessor
holds ("warps/SM", from 65,536 registers, 8-register steps, and 32 programs at most), instructions a warp's
program issues, and the memory operations (global loads and stores, shared-memory staging, spills). Register
counts move between Triton releases for the same source, so a comparison names the Triton it used.

`--kernel LABEL=PATH` (repeatable) reads other kernel files side by side, e.g. an older revision's (`git show
REV:dctdata/decoder/_triton_synth.py > old.py`): their pointer arguments are found by name (`*_ptr`), so revisions with
other tables compile too. This module needs only Triton (no torch), so it also runs under another Triton
installed beside the development one: `python benchmarks/kernel_sass.py ...`.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile

try:
    from dctdata.errors import DctDataError
except ImportError:  # run as a script under a Python with Triton alone (no torch, so no dctdata)
    DctDataError = ValueError

BLOCK = 8
REGISTERS_PER_SM = 65536
PROGRAMS_PER_SM = 32  # resident thread blocks a multiprocessor holds (sm_90)
DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
V1_FLAGS = dict(TRIANGLE=False, HAS_R=False, HAS_M=False, HAS_OUT=False, HAS_SIDE=False)
V2_FLAGS = dict(TRIANGLE=False, HAS_R=True, HAS_M=False, HAS_OUT=True, HAS_SIDE=True)
SIZES = ("C", "HB", "WB", "H", "W", "K", "STRIPS")
INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)")


def parse_kernel(text: str, form: str = "LABEL=PATH") -> tuple[str, str]:
    """`LABEL=PATH` -> (label, path); `form` names what the caller's option takes, for the message
    (`kernel-alone` reads a `:plain` suffix off first)."""
    label, sep, path = text.partition("=")
    if not sep or not label or not path:
        raise DctDataError(f"--kernel: expected {form}. Got {text!r}")
    if not os.path.isfile(path):
        raise DctDataError(f"--kernel {label}: no such kernel file: {path}")
    return label, path


def kernel_module(label: str, path: str):
    """The kernel module at `path`, imported under its own name (its Triton cache entry is its own source's);
    `kernel-alone` loads its `--kernel` files with it too."""
    spec = importlib.util.spec_from_file_location(f"_kernel_{label}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "synthesize_kernel"):
        raise DctDataError(f"--kernel {label}: {path} defines no synthesize_kernel")
    return module


def load_kernel(label: str, path: str):
    """The `synthesize_kernel` of the module at `path`."""
    return kernel_module(label, path).synthesize_kernel


def padded_rows(cf: int) -> int:
    """`fused_cuda.padded_rows` (repeated here: this module imports no torch)."""
    return 8 if cf > 4 else (4 if cf > 2 else 2)


def codec_flags(cf: int, codec: str) -> dict:
    """The kernel's codec flags of the decode table's v1 or v2 codec at `cf`."""
    return dict(V1_FLAGS if codec == "v1" else V2_FLAGS, CF=cf)


def compile_args(arg_names, codec: dict, dtype: str, warps: int) -> dict:
    """signature, constexprs and attrs of one variant (`codec`: CF and the HAS_* / TRIANGLE flags), compiled as
    `fused_cuda.synthesize` launches it, for `triton.compiler.ASTSource`. The compile test of every variant
    (benchmarks/tests/test_kernel_sass.py) builds its variants with it too."""
    flags = dict(codec, UP=padded_rows(codec["CF"]), BLOCKS=32 * warps)
    pointers = [name for name in arg_names if name.endswith("_ptr")]
    signature = {name: "*fp32" for name in pointers} | {"q_ptr": "*i8", "out_ptr": f"*{DTYPES[dtype]}"}
    signature |= {name: "i32" for name in SIZES}
    signature |= {name: "constexpr" for name in flags}
    missing = [name for name in arg_names if name not in signature]
    if missing:
        raise DctDataError(f"kernel arguments {missing}: expected *_ptr pointers, {SIZES} and {sorted(flags)}")
    aligned = {(arg_names.index(name),): [["tt.divisibility", 16]] for name in (*pointers, "W")}
    return dict(signature={name: signature[name] for name in arg_names}, constexprs=flags, attrs=aligned)


def tool(name: str) -> str:
    """A CUDA binary utility shipped with Triton's NVIDIA backend."""
    import triton

    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    if not os.access(path, os.X_OK):
        raise DctDataError(f"{name}: expected it beside Triton's NVIDIA backend at {path}")
    return path


def count_instructions(sass: str) -> collections.Counter:
    """Opcode (with its modifiers) -> count, over the disassembly's instruction lines."""
    ops = collections.Counter()
    for line in sass.splitlines():
        match = INSTRUCTION.match(line)
        if match:
            ops[match.group(1) + match.group(2)] += 1
    return ops


def resources(text: str) -> dict:
    """REG, STACK and SHARED of `cuobjdump -res-usage` output."""
    found = {key: re.search(rf"\b{key}:(\d+)", text) for key in ("REG", "STACK", "SHARED")}
    if not all(found.values()):
        raise DctDataError(f"cuobjdump -res-usage: expected REG, STACK and SHARED. Got {text.strip()[:200]!r}")
    return {key: int(m.group(1)) for key, m in found.items()}


def warps_per_sm(registers: int, warps: int) -> int:
    """Warps a multiprocessor holds at `registers` a thread (allocated in steps of 8) and `warps` a program."""
    per_warp = -(-max(registers, 1) // 8) * 8 * 32
    programs = min(REGISTERS_PER_SM // (per_warp * warps), PROGRAMS_PER_SM)
    return programs * warps


def summarize(ops: collections.Counter, usage: dict, warps: int) -> dict:
    """One row's figures from the opcode counts and the resource usage."""

    def total(*prefixes):
        return sum(n for op, n in ops.items() if op.split(".")[0] in prefixes)

    return {
        "registers": usage["REG"], "stack": usage["STACK"], "warps_per_sm": warps_per_sm(usage["REG"], warps),
        "instructions": sum(ops.values()), "float": total("FFMA", "FMUL", "FADD", "FMNMX", "FSEL"),
        "global_loads": total("LDG"), "global_stores": total("STG"),
        "shared": total("STS", "LDS", "LDSM", "STSM"), "spills": total("LDL", "STL"),
        "stores": sorted(op for op in ops if op.startswith("STG")),
    }  # fmt: skip


def machine_code(kernel, cf: int, codec: str, dtype: str, warps: int, arch: int = 90) -> dict:
    """Compile one variant and read its machine code."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource(fn=kernel, **compile_args(kernel.arg_names, codec_flags(cf, codec), dtype, warps))
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=warps))
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "kernel.cubin")
        with open(cubin, "wb") as f:
            f.write(compiled.asm["cubin"])
        sass = subprocess.run([tool("nvdisasm"), "-c", cubin], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([tool("cuobjdump"), "-res-usage", cubin], capture_output=True, text=True, check=True)
    return summarize(count_instructions(sass), resources(usage.stdout), warps)


def rows(kernels, cfs, dtypes, warps_list, arch: int = 90) -> list[dict]:
    out = []
    for cf in cfs:
        for dtype in dtypes:
            for warps in warps_list:
                for label, kernel in kernels:
                    for codec in ("v1", "v2"):
                        figures = machine_code(kernel, cf, codec, dtype, warps, arch)
                        out.append(dict(kernel=label, cf=cf, dtype=dtype, warps=warps, codec=codec, **figures))
    return out


def format_rows(result: list[dict]) -> str:
    """Markdown: one line per kernel, CF, dtype, warps and codec."""
    lines = [
        "| kernel | CF | dtype | warps | codec | registers | warps/SM | instructions | float | global loads | "
        "global stores | shared | spills |",
        "|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result:
        lines.append(f"| {r['kernel']} | {r['cf']} | {r['dtype']} | {r['warps']} | {r['codec']} | {r['registers']} | "
                     f"{r['warps_per_sm']} | {r['instructions']} | {r['float']} | {r['global_loads']} | "
                     f"{r['global_stores']} | {r['shared']} | {r['spills']} |")  # fmt: skip
    return "\n".join(lines)


def default_kernel() -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(root, "dctdata", "decoder", "_triton_synth.py")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks kernel-sass", description=__doc__.split("\n")[0])
    parser.add_argument("--kernel", action="append", default=[], metavar="LABEL=PATH",
                        help="a kernel file to compile (repeatable); default: this checkout's")  # fmt: skip
    parser.add_argument("--cf", type=int, nargs="+", default=[2, 4, 8], choices=range(1, BLOCK + 1))
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["float32", "bfloat16"])
    parser.add_argument("--warps", type=int, nargs="+", default=[1, 2], choices=(1, 2, 4))
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100, H200)")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    specs = [parse_kernel(k) for k in args.kernel] or [("current", default_kernel())]
    try:
        import triton
    except ImportError:
        print("kernel-sass: skipped (Triton is not installed)")
        return 0
    kernels = [(label, load_kernel(label, path)) for label, path in specs]
    result = rows(kernels, args.cf, args.dtypes, args.warps, args.arch)
    print(f"Triton {triton.__version__}; sm_{args.arch}; the fused kernel as fused_cuda launches it (aligned, width a "
          "multiple of 16); int8 coefficients; v1 and v2 as in the decode table")  # fmt: skip
    print(format_rows(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"triton": triton.__version__, "arch": args.arch, "argv": argv, "rows": result}, f, indent=1)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (DctDataError, OSError) as exc:
        print(f"kernel-sass: {exc}", file=sys.stderr)
        sys.exit(1)
