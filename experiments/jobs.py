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
