"""The attention a checkpoint was trained with, read from its metadata, and the check that a
sampler decodes it under that attention.

``bidirectional``: every column sees every other (LLaDA, Dream, MDLM; a checkpoint without other
metadata). ``block_causal``: a block sees itself and the blocks before it (BD3-LM): the block size
and alignment come from ``config.json`` ``extra.bd3lm`` and ``bd3lm.json``, which must agree.
``causal``: an autoregressive model, ``config.json`` ``extra.args.objective == "ar"`` (as the
training entry points record it). A cache policy declares the attention it decodes with
(:attr:`dlm.policy.CachePolicy.attention`); :meth:`ModelKind.bind` refuses a sampler whose policy
decodes with another one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .registry import get as registered

BD3_FILE = "bd3lm.json"
BD3_KEY = "bd3lm"
ATTENTIONS = ("bidirectional", "block_causal", "causal")
_WORDS = {"bidirectional": "bidirectional", "block_causal": "block-causal", "causal": "causal (autoregressive)"}


def read_json(file: Path):
    """The parsed JSON of ``file``; a file that does not parse is a ValueError naming it and the place."""
    text = Path(file).read_text()
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{file} is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None


@dataclass(frozen=True)
class ModelKind:
    """The attention a checkpoint was trained with; ``source`` names the file and key that say so."""

    attention: str
    source: str
    block_size: int | None = None
    align: str | None = None

    def __post_init__(self) -> None:
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {self.attention!r}")
        if (self.block_size is None) != (self.attention != "block_causal"):
            raise ValueError("a block size goes with block_causal attention, and only with it")

    def describe(self) -> str:
        """``block-causal model (block size 16, per <file> <key>)``."""
        size = f"block size {self.block_size}, " if self.block_size is not None else ""
        return f"{_WORDS[self.attention]} model ({size}per {self.source})"

    def bind(self, sampler, model: str, hints: Mapping[str, str]):
        """``sampler`` on this model (a block-causal model's block size and alignment set), or a
        ValueError naming ``model``, both attentions and ``hints[self.attention]`` (how to run it)."""
        needs = registered("policy", sampler.policy).attention
        if needs != self.attention:
            hint = hints.get(self.attention)
            raise ValueError(f"{model} is a {self.describe()}, but strategy {sampler.name} (policy "
                             f"{sampler.policy!r}) decodes with {_WORDS[needs]} attention"
                             + (f": {hint}" if hint else ""))
        if self.attention != "block_causal":
            return sampler
        try:
            return sampler.for_block_model(self.block_size, self.align)
        except ValueError as e:
            raise ValueError(f"strategy {sampler.name} on {model}: {e}") from None


def bd3_metadata(path: Path, raw: dict) -> tuple[dict, str] | None:
    """BD3-LM metadata ``(dict, source)`` of a checkpoint from ``config.json`` ``extra.bd3lm``
    and/or ``bd3lm.json`` (ValueError naming both files and values when they disagree), else None."""
    cfg_file, meta_file = Path(path) / "config.json", Path(path) / BD3_FILE
    found = {}
    extra = raw.get("extra")
    if extra is not None and not isinstance(extra, dict):
        raise ValueError(f"{cfg_file}: key 'extra' must be a JSON object, got {extra!r}")
    if extra and BD3_KEY in extra:
        found[f"{cfg_file} extra.{BD3_KEY}"] = extra[BD3_KEY]
    if meta_file.is_file():
        found[str(meta_file)] = read_json(meta_file)
    for source, meta in found.items():
        if not isinstance(meta, dict):
            raise ValueError(f"{source}: BD3-LM metadata must be a JSON object, got {meta!r}")
    if len(found) == 2:
        (a, ma), (b, mb) = found.items()
        diff = [f"{k} {ma.get(k, '<absent>')!r} vs {mb.get(k, '<absent>')!r}"
                for k in sorted(set(ma) | set(mb)) if ma.get(k, ...) != mb.get(k, ...)]
        if diff:
            raise ValueError(f"{a} and {b} disagree: {', '.join(diff)} (fix or remove one)")
    if not found:
        return None
    source, meta = next(iter(found.items()))
    return meta, source


def read_kind(path, raw: dict) -> ModelKind:
    """The :class:`ModelKind` of the checkpoint directory ``path`` whose ``config.json`` is ``raw``."""
    path = Path(path)
    bd3 = bd3_metadata(path, raw)
    if bd3 is not None:
        meta, source = bd3
        size = meta.get("block_size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"{source}: key 'block_size' must be a positive JSON integer, got {size!r}")
        align = meta.get("align", "absolute")
        if not isinstance(align, str):
            raise ValueError(f"{source}: key 'align' must be a JSON string, got {align!r}")
        return ModelKind("block_causal", source, size, align)
    args = (raw.get("extra") or {}).get("args")
    if isinstance(args, dict) and args.get("objective") == "ar":
        return ModelKind("causal", f"{path / 'config.json'} extra.args.objective 'ar'")
    return ModelKind("bidirectional", f"{path / 'config.json'}: no extra.{BD3_KEY}, {BD3_FILE} or extra.args.objective 'ar'")
