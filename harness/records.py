"""The per-sample record of :func:`harness.evaluate.evaluate`, checked before it is believed.

:func:`read_records` is how the report (:mod:`harness.report`) and every resume
(:mod:`harness.evaluate`) read a per-sample file, and :func:`check_records` the one check: every
record carries the fields its reader needs, with the right types; ``correct``,
``correct_flexible``, ``extracted`` and ``extracted_flexible`` are what :func:`tasks.is_correct`
and the extractors give for its ``prediction`` and ``target``; every count and time lies in its
range (``seconds`` finite and > 0; ``tokens_until_eos`` in 1..``tokens_committed``, both at most
the gen length; ``refreshes`` <= ``steps``; ``prompt_length`` <= ``batch_width``). The gen length
and config hash come from the folder's ``config.json`` (its entry for the file's strategy) or
from the resuming run. The first record that fails is refused: a ValueError naming the file, the
line, the problem id and the field.

Other schemas (anyorder rows, perplexity jobs) are not per-sample records and are not read here.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from dlm.io import stable_json
from harness.results import atomic_write_text, read_numbered, repo_relative
from tasks import extract_flexible, extract_strict, is_correct, normalize_number

#: fields every per-sample record has carried since the first harness run (the testbed's and
#: the BD3-LM block study's files included)
CORE = ("id", "prediction", "target", "correct", "extracted", "tokens_until_eos", "nfe", "seconds",
        "prompt_length", "first_eos_step", "config_hash", "seed")
#: what the report reads besides
REPORT = CORE + ("index", "strategy", "steps", "tokens_committed", "positions_computed")
COUNTS = ("nfe", "steps", "positions_computed", "flops", "refreshes", "tokens_committed")


@dataclass(frozen=True)
class Expected:
    """What is known of a file's records beyond themselves (None: not known)."""
    required: tuple = CORE
    gen_length: int | None = None
    config_hash: str | None = None
    strategy: str | None = None
    source: str = "the run"  # where gen_length / config_hash come from, for messages


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _bool(v) -> str | None:
    return None if isinstance(v, bool) else f"must be true or false, got {v!r:.60}"


def _count(v, low: int = 0) -> str | None:
    return None if _int(v) and v >= low else f"must be an integer >= {low}, got {v!r}"


def _text(v, none: bool = False) -> str | None:
    return None if isinstance(v, str) or (none and v is None) else \
        f"must be a string{' or null' if none else ''}, got {v!r:.60}"


def _score(r: dict) -> Iterator[tuple[str, str]]:
    """(field, problem) of the answer fields against :mod:`tasks.gsm8k`'s scoring."""
    if normalize_number(r["target"]) != r["target"]:
        yield "target", f"must be a normalised number (tasks.normalize_number), got {r['target']!r:.60}"
        return
    pred = r["prediction"]
    for field, mode, extract in (("correct", "strict", extract_strict), ("correct_flexible", "flexible",
                                                                         extract_flexible)):
        if field in r and r[field] != is_correct(pred, r["target"], mode=mode):
            yield field, (f"is {json.dumps(r[field])} but the {mode} answer of 'prediction' ({extract(pred)!r}) "
                          f"against target {r['target']!r} scores {json.dumps(not r[field])} (tasks.is_correct)")
    for field, extract in (("extracted", extract_strict), ("extracted_flexible", extract_flexible)):
        if field in r and r[field] != extract(pred):
            yield field, f"is {r[field]!r:.60} but 'prediction' gives {extract(pred)!r} ({extract.__name__})"


def _ranges(r: dict, exp: Expected) -> Iterator[tuple[str, str]]:
    """(field, problem) of the counts and times."""
    for field in COUNTS:
        if field in r and (why := _count(r[field])):
            yield field, why
    for field, low in (("prompt_length", 1), ("tokens_until_eos", 1), ("first_eos_step", -1), ("index", 0),
                       ("batch_rows", 1), ("batch_width", 1)):
        if field in r and (why := _count(r[field], low)):
            yield field, why
    s = r["seconds"]
    if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s <= 0:
        yield "seconds", f"must be a finite number > 0 (the sampler's wall time), got {s!r:.60}"
    tail = r.get("tail_before_answer")
    if tail is not None and (isinstance(tail, bool) or not isinstance(tail, (int, float)) or not 0 <= tail <= 1):
        yield "tail_before_answer", f"must be null or a share in [0, 1], got {tail!r:.60}"
    if "tokens_committed" in r and r["tokens_until_eos"] > r["tokens_committed"]:
        yield "tokens_until_eos", (f"{r['tokens_until_eos']} exceeds tokens_committed {r['tokens_committed']} "
                                   "(the tokens up to the first EOS were all committed)")
    if "refreshes" in r and "steps" in r and r["refreshes"] > r["steps"]:
        yield "refreshes", f"{r['refreshes']} exceeds steps {r['steps']} (a refresh is one of the row's steps)"
    if "batch_width" in r and r["batch_width"] < r["prompt_length"]:
        yield "batch_width", f"{r['batch_width']} is below prompt_length {r['prompt_length']}"
    if exp.gen_length is not None:
        for field in ("tokens_until_eos", "tokens_committed"):
            if field in r and r[field] > exp.gen_length:
                yield field, f"{r[field]} exceeds gen_length {exp.gen_length} ({exp.source})"


def problems(r: dict, exp: Expected = Expected()) -> Iterator[tuple[str, str]]:
    """(field, what is wrong) of every check ``r`` fails, missing and mistyped fields first."""
    missing = [f for f in exp.required if f not in r]
    if missing:
        yield missing[0], "missing (every per-sample record carries it)"
        return
    kinds = {"id": _text, "prediction": _text, "target": _text, "config_hash": _text, "strategy": _text,
             "problem": _text, "git_sha": _text, "extracted": lambda v: _text(v, True),
             "extracted_flexible": lambda v: _text(v, True), "model_weights": lambda v: _text(v, True),
             "correct": _bool, "correct_flexible": _bool,
             "seed": lambda v: None if _int(v) else f"must be an integer, got {v!r:.60}",
             "factors": lambda v: None if isinstance(v, dict) else f"must be an object, got {v!r:.60}",
             "cost_basis": lambda v: None if v == "row" else f"must be \"row\", got {v!r:.60}"}
    bad = [(f, why) for f, check in kinds.items() if f in r and (why := check(r[f]))]
    if bad:
        yield from bad[:1]
        return
    if exp.strategy is not None and r.get("strategy", exp.strategy) != exp.strategy:
        yield "strategy", f"is {r['strategy']!r} in the file of {exp.strategy!r}: it holds another row's samples"
    if exp.config_hash is not None and r["config_hash"] != exp.config_hash:
        yield "config_hash", (f"is {r['config_hash']!r} but {exp.source} says {exp.config_hash!r}: the file "
                              "holds another run's samples")
    first = next(_ranges(r, exp), None)  # the answer fields are checked on sound counts only
    yield from [first] if first else _score(r)


def check_records(path, numbered: Iterable[tuple[int, dict]], expected: Expected = Expected()) -> None:
    """Refuse the first record that fails a check: ValueError naming ``path``, the line, the
    problem id and the field."""
    for number, r in numbered:
        for field, why in problems(r, expected):
            raise ValueError(f"{path}: line {number}, problem {r.get('id')!r}, field {field!r}: {why}; restore the "
                             "line, or delete it and rerun to recompute that sample")


FIX_CONFIG = "restore it, or delete it to have it rewritten from this run's strategies"


def run_config(folder) -> dict:
    """``<folder>/config.json`` of a harness run ({} when absent); ValueError naming it when unreadable."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        return {}
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # unreadable, not UTF-8, not JSON
        raise ValueError(f"{path}: not a readable JSON file ({e}); {FIX_CONFIG}") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("strategies", {}), dict):
        raise ValueError(f"{path}: expected a JSON object with a 'strategies' object; {FIX_CONFIG}")  # noqa: TRY004
    return cfg


def strategy_files(folder) -> list[Path]:
    """The per-strategy sample files of a harness folder, sorted: ``<strategy>.jsonl``, without the
    per-rank logs (``.rank{r}``) and the timing cells (``timing.jsonl``, :mod:`harness.timing`)."""
    return sorted(p for p in Path(folder).glob("*.jsonl") if ".rank" not in p.stem and p.name != "timing.jsonl")


def write_run_config(folder, strategies: dict, baseline: str, sha: str, argv: list) -> None:
    """Merge ``strategies`` (name -> config hash, config, weights) into ``<folder>/config.json``
    with the commit ``sha`` and the command's ``argv`` (absolute paths inside the checkout made
    relative: results carry no machine's paths); unchanged strategies keep the file as it is, with
    the commit and command that wrote them."""
    prev = run_config(folder)
    merged = {**prev.get("strategies", {}), **strategies}
    if prev and json.dumps(merged, default=str) == json.dumps(prev.get("strategies"), default=str):
        return
    argv = [repo_relative(a) if os.path.isabs(a) else a for a in argv]
    meta = {"git_sha": sha, "argv": argv, "baseline": baseline, "strategies": merged}
    atomic_write_text(Path(folder) / "config.json", stable_json(meta, indent=2, default=str) + "\n")


def expected_of(path, required: tuple = CORE, strategy: str | None = None) -> Expected:
    """What ``<folder>/config.json`` says of ``path``'s records: the gen length and config hash of
    its entry for the file's strategy (``<strategy>.jsonl``, or a rank log of it)."""
    path = Path(path)
    name = re.sub(r"\.rank\d+$", "", path.stem)
    entry = run_config(path.parent).get("strategies", {}).get(name)
    if entry is None:
        return Expected(required, strategy=strategy)
    where = f"{path.parent / 'config.json'} (strategies.{name})"
    try:
        gen, hash_ = entry["config"]["strategy"]["gen_length"], entry["config_hash"]
    except (KeyError, TypeError):
        raise ValueError(f"{where}: expected config_hash and config.strategy.gen_length") from None
    if not _int(gen) or gen < 1 or not isinstance(hash_, str):
        raise ValueError(f"{where}: gen_length {gen!r} / config_hash {hash_!r} are not a positive integer / a string")
    return Expected(required, gen, hash_, strategy, where)


def read_records(path, expected: Expected | None = None) -> list[dict]:
    """The records of a per-sample file (strict as :func:`harness.results.read_jsonl`), each
    checked (:func:`check_records`) against ``expected`` (default: :func:`expected_of` the file)."""
    numbered = read_numbered(path)
    check_records(path, numbered, expected_of(path) if expected is None else expected)
    return [r for _, r in numbered]


TIMING_JSON = "timing.json"


def timed_speedups(folder) -> dict | None:
    """What ``<folder>/timing.json`` (:mod:`experiments.eval.timing`) says for the folder's table:
    ``{"baseline", "problems", "repeats", "rows": {strategy: [speed-up, CI low, CI high]}}``, None
    without the file; a file that is not such a record is a ValueError naming it (checked, not trusted)."""
    path = Path(folder) / TIMING_JSON
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        meta, rows = doc["meta"], doc["rows"]
        out = {"baseline": str(meta["baseline"]), "problems": int(meta["problems"]),
               "repeats": int(meta["conditions"]["repeats"]),
               "rows": {str(r["strategy"]): [float(r["speedup"]), float(r["ci_low"]), float(r["ci_high"])]
                        for r in rows}}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a timing record of experiments.eval.timing ({type(e).__name__}: {e}); "
                         "rerun that command or delete the file") from None
    if any(not (0 < lo <= s <= hi) for s, lo, hi in out["rows"].values()):
        raise ValueError(f"{path}: a row's speed-up lies outside its interval or is not positive; rerun the timing")
    return out
