"""The registry of lossless stages, which is also the allow-list of what a manifest may name: a manifest
comes with the data, and numcodecs can build codecs whose decoder runs code (`pickle`), so only
registered stages are ever built. A stage is built once per process per config.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from dctdata.errors import DctDataError
from dctdata.stages.auto import AUTO, AUTO_HELP
from dctdata.stages.base import RawStage, Stage

_STAGES: dict[str, type[Stage]] = {}
RAW = RawStage({})
_BUILT: dict[str, Stage] = {}  # JSON of a config (in its key order) -> its stage
_BUILT_MAX = 64


def register(cls: type[Stage]) -> type[Stage]:
    """Add a stage class (usable as a decorator). Its id and its member suffix must be new, unless it says it
    shares a suffix (`Stage.shares_suffix`); its option spelling too."""
    if not (isinstance(cls, type) and issubclass(cls, Stage)):
        raise TypeError(f"register: expected a Stage subclass. Got {cls!r}")
    if not isinstance(cls.codec_id, str) or not cls.codec_id or cls.codec_id in _STAGES:
        raise DctDataError(f"register: expected a new codec_id. Got {cls.codec_id!r} (registered: {ids()})")
    taken = {c.member_suffix for c in _STAGES.values()} | {RawStage.member_suffix}
    if cls.member_suffix in taken and not cls.shares_suffix:
        raise DctDataError(f"register: {cls.codec_id}: expected a new member suffix. Got {cls.member_suffix!r}")
    if cls.option is not None and (cls.option == AUTO or cls.option in {c.option for c in _STAGES.values()}):
        raise DctDataError(f"register: {cls.codec_id}: expected a new option spelling. Got {cls.option!r}")
    _STAGES[cls.codec_id] = cls
    return cls


def ids() -> tuple[str, ...]:
    """The ids a manifest may name, in registration order."""
    return tuple(_STAGES)


def stage_classes() -> tuple[type[Stage], ...]:
    return tuple(_STAGES.values())


def parse_config(config: object, where: str = "codec") -> dict[str, Any]:
    """A stage config validated and built once (a mapping with a registered "id"); None or {} means no stage.
    `where` names it in errors (a manifest field's stage: "field 'x': lossless")."""
    if config is None or (isinstance(config, Mapping) and not config):
        return {}
    if not isinstance(config, Mapping) or not isinstance(config.get("id"), str):
        raise DctDataError(
            f"{where}: expected a numcodecs config such as {{'id': {ids()[0]!r}, ...}} naming a registered stage. "
            f"Got {config!r}"
        )
    if config["id"] not in _STAGES:
        raise DctDataError(
            f"{where}: expected one of {ids()}. Got {config['id']!r} (a manifest may not name other codecs: some "
            "decoders run code)"
        )
    try:
        _build(dict(config))
    except DctDataError as exc:  # the stage's own check, named here
        raise type(exc)(f"{where}: {exc}") from exc
    return dict(config)


def get_stage(config: object) -> Stage:
    """The stage of a config (checked as `parse_config` does); the raw stage for None or {}."""
    config = parse_config(config)
    return _build(config) if config else RAW


def _build(config: dict[str, Any]) -> Stage:
    """The stage of a config, built once per process (a DataLoader worker forked after a manifest was read
    inherits it). Why: building the entropy coder (its frequency and search tables) takes milliseconds,
    and the webdataset loader rebuilt it in every worker every epoch (docs/benchmarks/design.md has the cost).
    Stages keep no per-call state, so one instance serves every caller; a config that fails to
    build is never cached."""
    cls = _STAGES[config["id"]]
    try:
        key = json.dumps(config)  # in its key order: a stage gives back its config exactly as given
    except (TypeError, ValueError):  # not JSON: build it, uncached
        return cls.from_config(config)
    stage = _BUILT.get(key)
    if stage is None:
        stage = cls.from_config(config)
        if len(_BUILT) >= _BUILT_MAX:
            _BUILT.clear()
        _BUILT[key] = stage
    return stage


def option_spellings() -> tuple[str, ...]:
    """The `--lossless` spellings: "auto", then each selectable stage's."""
    return (AUTO, *tuple(s for c in _STAGES.values() if c.option is not None for s in c.option_spellings))


def option_help() -> str:
    """The `--lossless` help: "auto" and each selectable stage's own."""
    return ", ".join([AUTO_HELP] + [c.option_help for c in _STAGES.values() if c.option is not None])


def parse_option(text: object, where: str = "--lossless") -> dict[str, Any] | str:
    """The pack's lossless stage from its `--lossless` spelling: "auto" (the default: per dct field the
    smaller of the entropy coder and zstd-19: bytes first), or `NAME[:ARG]` as a registered stage spells it
    (`Stage.from_option`)."""
    if not isinstance(text, str):
        raise TypeError(f"{where}: expected a string such as {' or '.join(map(repr, option_spellings()[:2]))}. "
                        f"Got {type(text).__name__}")  # fmt: skip
    name, colon, arg = text.strip().partition(":")
    if name == AUTO and not colon:
        return AUTO
    for cls in _STAGES.values():
        if cls.option is not None and cls.option == name:
            config = cls.from_option(arg if colon else None)
            if config is not None:
                return config
    raise DctDataError(f"{where}: expected one of: {', '.join(option_spellings())}. Got {text!r}")
