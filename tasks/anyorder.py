"""The any-order comparison's tasks as data (issue 52; :mod:`experiments.eval.anyorder` scores
them, :mod:`experiments.train.train_anyorder` trains on them): the task modules, each task's
answer length, its shared test sets and the held-out sets the learning curves score.

Held-out sets (:func:`heldout`), ``n`` items each:
- sudoku: ``sudoku.generate(n, 0, "valid")``;
- countdown: the validation puzzles of :func:`tasks.countdown.fixed_sets`, disjoint from the
  shared CD3 test set and from the fixed training set;
- reversal / reversal2: the forward questions about the test poems (trained: the curve the gate
  reads), with the reverse questions (``before``) and the infilling probe (``infill``) beside.
``accuracy`` is the curve the stopping rule reads (:func:`harness.run_records.flat`).
"""

from __future__ import annotations

from dlm.io import data_root

from . import countdown, reversal, sudoku

TASKS = {"sudoku": sudoku, "countdown": countdown, "reversal": reversal, "reversal2": reversal}
#: answer columns of a training row before its EOS tail (answer + EOS padding)
RESPONSE_LEN = {"sudoku": 24, "countdown": 40, "reversal": 32, "reversal2": 32}


def kind(name: str) -> str:
    """``sudoku``, ``countdown`` or a reversal question kind (``after``, ``before``, ``infill``)."""
    return name.split("_")[1] if name.startswith("reversal") else name


def test_set(name: str, n: int) -> list:
    """The first ``n`` pairs of a task's test set (Sudoku and Countdown: the shared files)."""
    if name == "sudoku":
        pairs = sudoku.load(data_root() / "reasoning" / "sudoku" / "d1_4x4_test_sudoku.csv")
    elif name == "countdown":
        pairs = countdown.load(data_root() / "reasoning" / "countdown" / "cd3_test.jsonl")
    elif kind(name) == "infill":
        pairs = reversal.infill_pairs(reversal.corpus())
    elif kind(name) == "drill":
        pairs = reversal.drill_pairs(reversal.corpus())
    else:
        pairs = reversal.test_pairs(reversal.corpus(), kind(name))
    return pairs[:n]


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
