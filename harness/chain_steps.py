"""Chain-step accuracy of a harness folder's rows, from its records (no model, no re-run).

A folder whose every row ran the arithmetic task (``config.json``: ``data`` ``arith`` for each
strategy) has its problems regenerated (:func:`tasks.generate_problems` with the task of the
row's ``--model``, its seed, the test split; ids are prefix-stable), each record matched to its
problem by id and checked to be that problem (its ``problem`` fingerprint, or its target for
records written before fingerprints, as :func:`harness.evaluate.check_same_problems`), and scored by
:func:`tasks.chain_steps_right`: final answer right and every intermediate result right. A folder of
another task gets no chain-step column; one whose problems do not regenerate gets a note saying why.
"""

from __future__ import annotations

from pathlib import Path

from harness.evaluate import fingerprint
from harness.records import run_config
from harness.results import REPO, arith_config_of
from tasks import Problem, chain_steps_right, generate_problems


def _problems(entry: dict, n: int, cache: dict) -> dict[str, Problem]:
    model, seed = entry["config"]["model"], entry["config"]["seed"]
    task = arith_config_of(model if Path(model).is_absolute() else REPO / model)
    if (task, seed) not in cache or len(cache[task, seed]) < n:
        cache[task, seed] = {p.id: p for p in generate_problems(task, n, split="test", seed=seed)}
    return cache[task, seed]


def _same(r: dict, p: Problem | None) -> bool:
    if p is None:
        return False
    return r["problem"] == fingerprint(p) if "problem" in r else str(r["target"]) == p.target_str


def chain_runs(folder, runs: dict[str, list[dict]]) -> tuple[dict[str, list[dict]] | None, str | None]:
    """(runs with each record's ``correct`` replaced by its chain-step correctness, None) for an
    arithmetic-task folder; (None, why not) for one whose problems do not regenerate; (None, None)
    for a folder of another task."""
    strategies = run_config(folder).get("strategies", {})
    entries = {name: strategies.get(name) for name in runs}
    if not runs or not all(isinstance(e, dict) and (e.get("config") or {}).get("data") == "arith"
                           for e in entries.values()):
        return None, None
    cache: dict = {}
    out = {}
    for name, records in runs.items():
        entry = entries[name]
        try:
            problems = _problems(entry, 1 + max(r["index"] for r in records), cache)
        except (KeyError, TypeError, ValueError) as e:
            return None, f"chain-step accuracy not computed: {name}'s task does not regenerate ({e})"
        bad = next((r for r in records if not _same(r, problems.get(r["id"]))), None)
        if bad is not None:
            return None, (f"chain-step accuracy not computed: {name}.jsonl problem {bad['id']!r} is not the arithmetic "
                          f"problem regenerated from {entry['config']['model']} (seed {entry['config']['seed']})")
        out[name] = [{**r, "correct": chain_steps_right(r["prediction"], problems[r["id"]])} for r in records]
    return out, None


# ------------------------------------------------------------------------------ the table's part
#: the table.csv columns (fields of harness.report.Row), when the folder has them
FIELDS = ("chain_accuracy", "chain_ci_low", "chain_ci_high", "chain_mcnemar_p", "chain_discordant")
HEADER = "chain-step % [95% CI] | chain-step McNemar p (b/c) | "


def cells(row, reference: bool, fmt) -> str:
    """The two markdown cells of ``row`` (a harness.report.Row); ``fmt``: harness.frontier._fmt."""
    test = "-" if reference else f"{fmt(row.chain_mcnemar_p, '.2g')} ({row.chain_discordant})"
    return f"{100 * row.chain_accuracy:.1f} [{100 * row.chain_ci_low:.1f}, {100 * row.chain_ci_high:.1f}] | {test} | "


def words(meta: dict) -> str:
    info = meta["chain_steps"]
    if info["note"]:
        return info["note"] + "."
    return ("Chain-step accuracy: the final answer right and every intermediate result of the problem's reference "
            "chain right, in order (tasks.chain_steps_right, the problems regenerated from each row's model and "
            f"seed), with its own 95% bootstrap CI and exact McNemar test against {meta['speedup_reference']}.")
