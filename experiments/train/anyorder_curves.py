"""Learning curves of the any-order task models: held-out accuracy every ``--eval-every`` steps,
on held-out sets of each task.

The held-out sets (:func:`heldout`), ``n`` items each, decoded as the evaluation decodes them
(``ar`` for the AR objective, ``pure`` for diffusion, :mod:`experiments.eval.anyorder`):
- sudoku: ``sudoku.generate(n, 0, "valid")``;
- countdown: the validation puzzles of :func:`tasks.countdown.fixed_sets`, disjoint from the
  shared CD3 test set and from the fixed training set;
- reversal / reversal2: the forward questions about the test poems (trained: the curve the gate
  reads), with the reverse questions (``before``) and the infilling probe (``infill``) beside.
``accuracy`` is the curve the stopping rule reads (:func:`harness.run_records.flat`).
"""

from __future__ import annotations

from experiments.eval import infill
from experiments.eval.anyorder import CHECK, GEN, answers, test_set
from tasks import countdown, reversal, sudoku


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
