"""`python -m benchmarks kernel-sass`: arguments, the machine-code readers, one real compile of the kernel, and
each kernel variant compiled to sm_90 machine code as `fused_cuda.synthesize` launches it (`compile_args`)."""

from __future__ import annotations

import collections
import json
import sys

import pytest

import dctdata
from benchmarks import kernel_sass

SASS = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_TID.X ;
        /*0020*/               @P0 LDG.E.U8 R2, desc[UR6][R2.64] ;
        /*0030*/                   FFMA R4, R2, 0.5, R4 ;
        /*0040*/              @!P1 FFMA.SAT R5, R2, 0.5, R5 ;
        /*0050*/                   STG.E.128 desc[UR6][R8.64], R4 ;
        /*0060*/                   STL [R1], R4 ;
"""


def test_kernel_argument_names_label_and_path(tmp_path):
    path = tmp_path / "k.py"
    path.write_text("synthesize_kernel = None\n")
    assert kernel_sass.parse_kernel(f"old={path}") == ("old", str(path))


@pytest.mark.parametrize("text", ["old", "=x.py", "old="])
def test_kernel_argument_without_label_or_path_is_refused(text):
    with pytest.raises(dctdata.DctDataError, match=r"--kernel: expected LABEL=PATH. Got"):
        kernel_sass.parse_kernel(text)


def test_missing_kernel_file_and_file_without_the_kernel_are_named(tmp_path):
    with pytest.raises(dctdata.DctDataError, match=r"--kernel old: no such kernel file: .*nothing\.py"):
        kernel_sass.parse_kernel(f"old={tmp_path / 'nothing.py'}")
    path = tmp_path / "empty.py"
    path.write_text("x = 1\n")
    with pytest.raises(dctdata.DctDataError, match=r"--kernel e: .*empty\.py defines no synthesize_kernel"):
        kernel_sass.load_kernel("e", str(path))


def test_pointers_are_found_by_name_and_aligned_as_launched():
    names = ["q_ptr", "out_ptr", "tab_ptr", "t_ptr", "C", "HB", "WB", "H", "W", "K", "STRIPS", "CF", "UP", "TRIANGLE",
             "BLOCKS", "HAS_R", "HAS_M", "HAS_OUT", "HAS_SIDE"]  # fmt: skip
    args = kernel_sass.compile_args(names, kernel_sass.codec_flags(4, "v2"), "bfloat16", 2)
    assert list(args["signature"]) == names
    assert args["signature"]["q_ptr"] == "*i8" and args["signature"]["out_ptr"] == "*bf16"
    assert args["signature"]["t_ptr"] == "*fp32" and args["signature"]["W"] == "i32"
    assert args["constexprs"] == dict(kernel_sass.V2_FLAGS, CF=4, UP=4, BLOCKS=64)
    assert set(args["attrs"]) == {(names.index(n),) for n in ("q_ptr", "out_ptr", "tab_ptr", "t_ptr", "W")}


def test_padded_rows_are_fused_cudas():
    from dctdata.decoder import fused_cuda

    assert [kernel_sass.padded_rows(cf) for cf in range(1, 9)] == [fused_cuda.padded_rows(cf) for cf in range(1, 9)]


def test_an_argument_of_no_known_kind_is_named():
    with pytest.raises(dctdata.DctDataError, match=r"kernel arguments \['gamma'\]: expected \*_ptr pointers"):
        kernel_sass.compile_args(["q_ptr", "gamma"], kernel_sass.codec_flags(2, "v1"), "float32", 1)


def test_instructions_are_counted_with_their_modifiers_and_predicates_dropped():
    ops = kernel_sass.count_instructions(SASS)
    assert ops == collections.Counter({"LDC": 1, "S2R": 1, "LDG.E.U8": 1, "FFMA": 1, "FFMA.SAT": 1, "STG.E.128": 1,
                                       "STL": 1})  # fmt: skip
    row = kernel_sass.summarize(ops, {"REG": 90, "STACK": 8, "SHARED": 0}, 1)
    figures = (row["instructions"], row["float"], row["global_loads"], row["global_stores"], row["spills"])
    assert figures == (7, 2, 1, 1, 1)
    assert row["stores"] == ["STG.E.128"] and row["warps_per_sm"] == 21


def test_resource_usage_is_read_and_its_absence_named():
    text = "Resource usage:\n Function synthesize_kernel:\n  REG:128 STACK:0 SHARED:1024 LOCAL:0 TEXTURE:0\n"
    assert kernel_sass.resources(text) == {"REG": 128, "STACK": 0, "SHARED": 1024}
    with pytest.raises(dctdata.DctDataError, match=r"cuobjdump -res-usage: expected REG, STACK and SHARED"):
        kernel_sass.resources("nothing here")


@pytest.mark.parametrize("registers, warps, want", [(128, 1, 16), (146, 1, 13), (168, 2, 12), (40, 1, 32), (40, 2, 50)])
def test_warps_a_multiprocessor_holds(registers, warps, want):
    assert kernel_sass.warps_per_sm(registers, warps) == want


def test_rows_are_formatted_one_a_line():
    row = dict(kernel="k", cf=8, dtype="float32", warps=1, codec="v2", registers=128, warps_per_sm=16,
               instructions=2000, float=1200, global_loads=130, global_stores=16, shared=18, spills=0)  # fmt: skip
    assert "| k | 8 | float32 | 1 | v2 | 128 | 16 | 2000 | 1200 | 130 | 16 | 18 | 0 |" in kernel_sass.format_rows([row])


def test_the_checkouts_kernel_compiles_with_vector_stores(tmp_path, monkeypatch, capsys):
    """One real compile (CF 2, float32, one warp): as launched, each thread stores its block's rows as 16-byte
    vectors, and the row names the registers and instructions it read."""
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    out = tmp_path / "sass.json"
    try:
        code = kernel_sass.main(["--cf", "2", "--dtypes", "float32", "--warps", "1", "--out", str(out)])
    except (RuntimeError, FileNotFoundError, dctdata.DctDataError) as exc:
        if "ptxas" in str(exc) or "nvdisasm" in str(exc) or "cuobjdump" in str(exc):
            pytest.skip(f"Triton's NVIDIA toolchain is not usable here: {exc}")
        raise
    assert code == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["codec"], r["cf"], r["warps"]) for r in rows] == [("v1", 2, 1), ("v2", 2, 1)]
    for r in rows:
        assert r["stores"] == ["STG.E.128"] and r["global_stores"] > 0 and r["spills"] == 0
        assert 0 < r["registers"] <= 255 and r["instructions"] > r["float"] > 0
    assert "| current | 2 | float32 | 1 | v1 |" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flags, warps",
    [
        (dict(CF=2, TRIANGLE=False, HAS_R=False, HAS_M=False, HAS_OUT=False, HAS_SIDE=False), 1),
        (dict(CF=8, TRIANGLE=False, HAS_R=True, HAS_M=False, HAS_OUT=True, HAS_SIDE=True), 2),
        (dict(CF=5, TRIANGLE=True, HAS_R=True, HAS_M=True, HAS_OUT=True, HAS_SIDE=True), 2),
    ],
    ids=["v1-cf2", "v2-cf8-side", "v2-cf5-triangle-rotation"],
)
@pytest.mark.parametrize("out", ["float32", "bfloat16"])
def test_kernel_compiles_to_sm90_machine_code(flags, warps, out, monkeypatch):
    """Triton's NVIDIA backend compiles without a driver: each variant of the kernel must reach a cubin, compiled
    as `synthesize` launches it (16-byte aligned pointers and a width that is a multiple of 16, which Triton
    specializes on): each thread stores its block's rows as 16-byte vectors."""
    triton = pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    sys.modules.pop("dctdata.decoder._triton_synth", None)
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as exc:
        pytest.skip(f"this Triton has no ahead-of-time compile API: {exc}")
    from dctdata.decoder._triton_synth import synthesize_kernel

    sys.modules.pop("dctdata.decoder._triton_synth", None)
    args = kernel_sass.compile_args(
        synthesize_kernel.arg_names, flags, out, warps
    )  # as fused_cuda.synthesize launches it
    try:
        source = ASTSource(fn=synthesize_kernel, **args)
    except TypeError as exc:  # another Triton release's ahead-of-time API; launches on a GPU check the kernel there
        pytest.skip(f"this Triton's ASTSource takes other arguments: {exc}")
    try:
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps))
    except (RuntimeError, FileNotFoundError) as exc:
        if "ptxas" in str(exc) or "libdevice" in str(exc):
            pytest.skip(f"Triton's NVIDIA toolchain is not usable here: {exc}")
        raise
    assert compiled.asm["cubin"] and "st.global.v4" in compiled.asm["ptx"]
    assert "ld.local" not in compiled.asm["ptx"], "register spills"
