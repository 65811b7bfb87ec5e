"""Learning curves of the any-order task models: held-out accuracy every ``--eval-every`` steps,
and the stopping rule "until the curve flattens".

The held-out sets (:func:`heldout`), ``n`` items each, decoded as the evaluation decodes them
(``ar`` for the AR objective, ``pure`` for diffusion, :mod:`experiments.eval.anyorder`):
- sudoku: ``sudoku.generate(n, 0, "valid")``;
- countdown: the validation puzzles of :func:`tasks.countdown.fixed_sets`, disjoint from the
  shared CD3 test set and from the fixed training set;
- reversal / reversal2: the forward questions about the test poems (trained: the curve the gate
  reads), with the reverse questions (``before``) and the infilling probe (``infill``) beside.
``accuracy`` is the curve the stopping rule reads.

:func:`flat`: the run stops when the best accuracy of the last ``patience`` evaluations is at most
``delta`` points above the best before them. It reads the curve from ``metrics.jsonl``, so a
resumed run stops where an uninterrupted one would.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from experiments.eval import infill
from experiments.eval.anyorder import CHECK, GEN, answers, test_set
from tasks import countdown, reversal, sudoku


#: a finished run's summary in its out dir (steps, stopped_flat, epochs, seconds, git_sha, args)
RUN_FILE = "run.json"


def countdown_sets(train_size: int, seed: int, valid_size: int):
    """(train, valid) of :func:`tasks.countdown.fixed_sets`, disjoint from the shared test set."""
    return countdown.fixed_sets(train_size, seed, test_set("countdown", 10**9), valid_size)


def heldout(task: str, n: int) -> dict[str, list]:
    """The held-out sets by metric name (``accuracy`` first)."""
    if task == "sudoku":
        return {"accuracy": sudoku.generate(n, 0, "valid")}
    if task == "countdown":
        return {"accuracy": countdown_sets(1, 0, n)[1]}
    return {"accuracy": test_set(f"{task}_after", n), "before": test_set(f"{task}_before", n),
            "infill": test_set(f"{task}_infill", n)}


def eval_fn(tok, task: str, objective: str, sets: dict[str, list], batch_size: int = 50):
    """``eval_fn(model) -> {metric: accuracy}`` for :func:`dlm.train.train`."""
    row = "ar" if objective == "ar" else "pure"
    poems = reversal.corpus()

    def evaluate(model) -> dict:
        out = {}
        for metric, pairs in sets.items():
            k = {"accuracy": "after"}.get(metric, metric) if task in reversal.VERSIONS else task
            right = 0
            for i in range(0, len(pairs), batch_size):
                chunk = pairs[i:i + batch_size]
                if k == "infill":
                    filled = infill.fill(model, tok, chunk, poems, reversal.VERSIONS[task], row == "ar", GEN[k])
                    texts = [f["prediction"] for f in filled]
                else:
                    texts = [t for t, _ in answers(model, tok, chunk, row, GEN[k])]
                right += sum(bool(CHECK[k](p, t)) for p, t in zip(chunk, texts))
            out[metric] = right / len(pairs)
        return out

    return evaluate


def read_metrics(path) -> list[dict]:
    """The trainer's ``metrics.jsonl``, checked: every line a JSON object with an int ``step``, and an
    ``eval/accuracy`` in [0, 1] where there is one (else a ValueError naming the file and line)."""
    out = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            ok = isinstance(r, dict) and isinstance(r.get("step"), int) and 0 <= r.get("eval/accuracy", 0) <= 1
        except (ValueError, TypeError):
            ok = False
        if not ok:
            raise ValueError(f"{path}: line {n} is not a trainer metrics record (step, eval/accuracy in [0, 1])")
        out.append(r)
    return out


def curve(metrics_path: str) -> list[float]:
    """The ``eval/accuracy`` values logged in a run's ``metrics.jsonl``, in order."""
    if not os.path.exists(metrics_path):
        return []
    return [r["eval/accuracy"] for r in read_metrics(metrics_path) if "eval/accuracy" in r]


def flat(accuracies: list[float], patience: int, delta: float) -> bool:
    """Whether the best of the last ``patience`` accuracies (fractions) is at most ``delta``
    points above the best before them (False until there are ``patience + 1``)."""
    if patience < 1 or len(accuracies) <= patience:
        return False
    return 100 * (max(accuracies[-patience:]) - max(accuracies[:-patience])) <= delta
