"""One job of ``experiments.reproduce``: the command that makes some artefacts of ``results/``."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Job:
    name: str
    module: str
    args: tuple
    what: str
    artefacts: tuple = ()  # paths under --out this job writes
    samples: tuple = ()  # per-sample JSONL globs under --out (compared by --verify)
    always: bool = False  # the script skips finished samples itself, or only rebuilds a table
    after: tuple = ()
    cost_min: float = 0.1
    export: Optional[tuple] = None  # (trained model dir, checkpoint dir), copied after success
    training: bool = False  # only with --full (a training, or an eval of models only --full trains)

    def command(self) -> list[str]:
        return [sys.executable, "-m", self.module, *map(str, self.args)]


def _cap(n: int, limit: Optional[int]) -> int:
    """``n`` samples, at most ``limit`` (``--limit``)."""
    return n if limit is None else min(n, limit)


#: what one ``experiments.eval.gsm8k`` run writes besides its per-sample JSONL files
GSM8K_REPORT = ("table.md", "table.csv", "table.json", "ablation.md", "ablation.csv", "pareto.png", "config.json")


def bd3_flags(model: str, gen: int) -> tuple:
    """The harness flags of a table's BD3-LM row: its model, and past gen 512 its context limit raised
    to 2048 (it stops at its first EOS block, so it never reads that far)."""
    return ("--bd3-model", model) + (("--bd3-context", 2048) if gen > 512 else ())


def gsm8k_table(d: str, out: str, model: str, limit: int, batch: int, gen: int, shots: int, strategies: tuple,
                what: str, samples: tuple, after: tuple, cost_min: float, extra: tuple = (),
                name: Optional[str] = None) -> Job:
    """A strategy table of ``experiments.eval.gsm8k`` (blocks of 32) in ``<out>/<d>``, job ``name``
    (default ``d``): its report files are the artefacts, ``samples`` its per-sample globs; ``extra``
    flags go after ``--model``."""
    return Job(name or d, "experiments.eval.gsm8k",
               ("--limit", limit, "--batch-size", batch, "--gen-length", gen, "--block-length", 32,
                "--num-fewshot", shots, "--strategies", *strategies, "--model", model, *extra, "--out", f"{out}/{d}"),
               what, tuple(f"{d}/{f}" for f in GSM8K_REPORT), samples, always=True, after=after, cost_min=cost_min)
