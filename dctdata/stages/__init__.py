"""Lossless stages: what a field's stored arrays go through, one class per stage (numcodecs' model),
described by a JSON config in the manifest so any reader rebuilds exactly the stage the writer used.

Two kinds: a codec over an array's raw bytes (`BytesStage`: zstd, blosc; every field kind), and an
array stage that codes arrays of a stated shape (`needs_shape`: the context-modelled entropy coder,
integer DCT coefficients only, its fitted model in its config). Readers, writers and calibration ask the
stage (its sizes, zarr codec JSON, webdataset member suffix, decode cost, batch decode) and never compare
ids; the registry is the allow-list of what a manifest may name. A stage decodes batches on a device
through the `DeviceDecoder` its `device_decoder(device)` hook returns (the entropy coder: CUDA and CPU;
zstd: CUDA, with nvCOMP); the others decode on the host and copy.

Adding a stage: a module with a `Stage` subclass, one `register` line below, and its tests (the shared
conformance suite in tests/stages/ runs over every registered stage).
"""

from dctdata.stages.auto import AUTO, Auto
from dctdata.stages.base import BytesStage, DeviceDecoder, RawStage, Stage
from dctdata.stages.blosc import BloscStage
from dctdata.stages.ctxrans import CtxransStage
from dctdata.stages.lz4 import LZ4Stage
from dctdata.stages.registry import (
    RAW,
    get_stage,
    ids,
    option_help,
    option_spellings,
    parse_config,
    parse_option,
    register,
    stage_classes,
)
from dctdata.stages.zstd import DEFAULT_CONFIG as DEFAULT_CODEC
from dctdata.stages.zstd import MAX_CONFIG as ZSTD_MAX
from dctdata.stages.zstd import ZstdStage

register(ZstdStage)
register(BloscStage)
register(CtxransStage)
register(LZ4Stage)


def for_setting(codec: object) -> Stage | Auto:
    """What a pack's `codec` setting names for calibration: the "auto" policy, or a stage (its config; None
    or {}: the raw stage)."""
    return Auto() if codec == AUTO else get_stage(codec)


__all__ = [
    "AUTO",
    "DEFAULT_CODEC",
    "RAW",
    "ZSTD_MAX",
    "Auto",
    "BloscStage",
    "BytesStage",
    "CtxransStage",
    "DeviceDecoder",
    "RawStage",
    "Stage",
    "ZstdStage",
    "for_setting",
    "get_stage",
    "ids",
    "option_help",
    "option_spellings",
    "parse_config",
    "parse_option",
    "register",
    "stage_classes",
]
