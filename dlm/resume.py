"""Resuming a training run without changing it silently (used by :mod:`dlm.train`).

The *recipe* of a run is every :class:`dlm.train.TrainConfig` field but
:data:`RESUMABLE_FIELDS`, plus the caller's ``recipe`` dict (the scripts pass :func:`flag_recipe`,
their parsed flags). A resume whose recipe differs from the checkpoint's is refused naming each
differing field and both values, unless forced; forced changes are recorded with the step.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Iterable, Optional

import torch.nn as nn

from .io import trim_jsonl

#: TrainConfig fields that may change when a run resumes: where it lives, when it logs, evaluates
#: and saves, whether the forward is compiled and how a shard splits into micro-batches. All the
#: others are recipe, ``max_steps`` too (it sets the cosine schedule of every step).
RESUMABLE_FIELDS = ("out_dir", "eval_every", "save_every", "log_every", "compile", "micro_batch_size")
_ABSENT = "<absent>"


def trim_metrics(path: str, step: int) -> None:
    """Keep the records up to ``step`` (the resumed step, 0 on a fresh start): later ones were
    logged after the last checkpoint of an interrupted run."""
    dropped = trim_jsonl(path, lambda record: record.get("step", 0) <= step)
    if dropped:
        print(f"{path}: dropped {dropped} record(s) past step {step}, logged by an interrupted run")


def plain(value):
    """``value`` as JSON would round-trip it (tuples -> lists), for comparing and recording."""
    return json.loads(json.dumps(value))


def as_recipe(recipe) -> Optional[dict]:
    if recipe is None:
        return None
    if not isinstance(recipe, dict) or not all(isinstance(k, str) for k in recipe):
        raise TypeError(f"recipe must be a dict with str keys, got {type(recipe).__name__}")
    try:
        return plain(recipe)
    except (TypeError, ValueError) as err:
        raise TypeError(f"recipe must be JSON-serialisable: {err}") from err


def check_recipe(state: dict, config, recipe: Optional[dict], force: bool) -> list[dict]:
    """The run's recorded recipe changes, plus this resume's when ``force`` allows one."""
    changed = {}
    saved_cfg, now_cfg = state["config"], asdict(config)
    for name, now in now_cfg.items():
        old = saved_cfg.get(name, _ABSENT)
        if name not in RESUMABLE_FIELDS and plain(old) != plain(now):
            changed[f"TrainConfig.{name}"] = [plain(old), plain(now)]
    saved_recipe, recipe = state.get("recipe"), recipe or {}
    for name in sorted(set(saved_recipe or {}) | set(recipe)):
        old, now = (saved_recipe or {}).get(name, _ABSENT), recipe.get(name, _ABSENT)
        if old != now:
            changed[name] = [old, now]
    history = list(state.get("recipe_changes") or [])
    if not changed:
        return history
    if not force:
        show = lambda v: _ABSENT if v == _ABSENT else repr(v)  # noqa: E731
        listed = "; ".join(f"{k}: checkpoint {show(old)}, now {show(now)}" for k, (old, now) in changed.items())
        legacy = (" (the checkpoint records no recipe: it was written before recipes were recorded)"
                  if saved_recipe is None and recipe else "")
        raise ValueError(
            f"cannot resume {config.out_dir} from its step-{state['step']} checkpoint with another recipe"
            f"{legacy}: {listed}. Rerun with the checkpoint's values or another output dir, or pass "
            f"--force-recipe (train(force_recipe=True)) to continue with the new values and record the change")
    return history + [{"step": int(state["step"]), "changed": changed}]


def flag_recipe(flags: dict, exclude: Iterable[str] = ()) -> dict:
    """A script's parsed flags (``vars(args)``) as a recipe, keyed the way the user typed them:
    ``{"--fewshot-prob": 0.25, ...}``, without the argparse dests in ``exclude``."""
    return {"--" + k.replace("_", "-"): v for k, v in flags.items() if k not in set(exclude)}


def check_shapes(saved: dict, model: nn.Module, out_dir: str) -> None:
    now = model.state_dict()
    problems = [f"{n!r}: checkpoint shape {tuple(saved[n].shape)}, model {tuple(t.shape)}"
                for n, t in now.items() if n in saved and tuple(saved[n].shape) != tuple(t.shape)]
    problems += [f"{n!r} missing from the checkpoint" for n in now if n not in saved]
    problems += [f"{n!r} not in the model" for n in saved if n not in now]
    if problems:
        raise ValueError(f"cannot resume {out_dir}: the model does not match the checkpoint's (built with "
                         f"another shape?): {'; '.join(problems[:6])}{' ...' if len(problems) > 6 else ''}")
