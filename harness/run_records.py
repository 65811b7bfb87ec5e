"""Training-run records: the held-out curve a trainer logs, the rule that stops a run when the
curve flattens, and the run's summary and committed record (used by
:mod:`experiments.train.train_anyorder` and :mod:`experiments.eval.curves`).

:func:`flat`: the run stops when the best accuracy of the last ``patience`` evaluations is at most
``delta`` points above the best before them, once the curve has left 0. It reads the curve from
``metrics.jsonl`` (:func:`curve`), so a resumed run stops where an uninterrupted one would.

Each trainer invocation logs its start in the run's ``invocations.jsonl`` (:func:`begin_invocation`:
first step, commit) and its end there (:func:`add_invocation`: steps from/to, CPU and wall seconds),
which also writes ``run.json``; so a resumed run keeps the commits and cost of its earlier parts. An
invocation killed before its end keeps its commit and steps (up to where the next one resumed), its
seconds unknown: ``cpu_steps`` says how many steps the summed CPU seconds cover. :func:`run_record`
is a run's committed record: its curves, flags and cost, without the model (``record.json`` beside
``run.json``), read back checked by :func:`read_record`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from dlm.io import stable_json
from dlm.train import METRICS_FILE, STATE_FILE
from harness.results import atomic_write_text


#: a finished run's summary in its out dir (steps, stopped_flat, epochs, params, args, invocations)
RUN_FILE = "run.json"
#: every invocation's start and end lines (:func:`begin_invocation`, :func:`add_invocation`)
INVOCATIONS_FILE = "invocations.jsonl"
#: its record (:func:`run_record`), the file a plan job exports into results/
RECORD_FILE = "record.json"
RECORD_KEYS = ("run", "task", "objective", "lr", "cap", "init", "evals", "losses", "steps", "finished",
               "stopped_flat", "epochs", "cpu_hours", "cpu_steps", "git_sha", "flags")


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
    points above the best before them (False until there are ``patience + 1``, and while every
    accuracy is 0: a curve that has not left the floor has not flattened, it has not started).
    The gain is rounded to 1e-6 points first: 0.81 - 0.79 is 2 points, not 2.0000000000000018."""
    if patience < 1 or len(accuracies) <= patience or max(accuracies) == 0:
        return False
    return round(100 * (max(accuracies[-patience:]) - max(accuracies[:-patience])), 6) <= delta


def steps_done(out_dir) -> int:
    """The optimizer steps a run dir's ``trainer_state.pt`` holds (0 for a fresh dir)."""
    path = Path(out_dir) / STATE_FILE
    return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["step"]) if path.is_file() else 0


def begin_invocation(out_dir, from_step: int, git_sha: str) -> None:
    """Log an invocation's start (``from_step``, ``git_sha``) in the run's ``invocations.jsonl``."""
    with open(Path(out_dir) / INVOCATIONS_FILE, "a") as f:
        f.write(json.dumps({"from_step": from_step, "git_sha": git_sha}) + "\n")


def invocations(out_dir) -> list[dict]:
    """The run's invocations from ``invocations.jsonl``: a start with its end line is that end; a
    start without one was killed, and ran to the step the next invocation started from (its seconds
    None). An invocation that trained no step is left out unless it ended the run (``ended``)."""
    lines = [json.loads(x) for x in (Path(out_dir) / INVOCATIONS_FILE).read_text().splitlines() if x.strip()]
    out: list[dict] = []
    for r in lines:
        if "to_step" in r:  # the end of the invocation started just before (if its start was logged)
            opened = out and out[-1]["to_step"] is None and out[-1]["from_step"] == r["from_step"]
            out[-1:] = [r] if opened else [*out[-1:], r]
        else:
            if out and out[-1]["to_step"] is None:
                out[-1] = {**out[-1], "to_step": r["from_step"]}
            out.append({**r, "to_step": None, "cpu_seconds": None, "wall_seconds": None})
    return [i for i in out if i["to_step"] is None or i["to_step"] > i["from_step"] or i.get("ended")]


def add_invocation(out_dir, summary: dict, invocation: dict) -> dict:
    """Log ``invocation``'s end (``from_step``, ``to_step``, ``cpu_seconds``, ``wall_seconds``,
    ``git_sha``; :func:`begin_invocation` logged its start) and write ``run.json``: ``summary`` (the
    run as it stands) with every invocation (:func:`invocations`). One that trained no step counts
    only when it ended the run (a finished run rerun adds nothing). Returns what it wrote."""
    path = Path(out_dir) / RUN_FILE
    with open(Path(out_dir) / INVOCATIONS_FILE, "a") as f:
        f.write(json.dumps({**invocation, "ended": not path.is_file()}) + "\n")
    done = invocations(out_dir)
    timed = [i for i in done if i["cpu_seconds"] is not None]
    out = {**summary, "invocations": done, "cpu_seconds": round(sum(i["cpu_seconds"] for i in timed), 1),
           "cpu_steps": sum(i["to_step"] - i["from_step"] for i in timed)}
    atomic_write_text(path, stable_json(out, indent=1) + "\n")
    return out


def _init_name(init):
    """The run a continuation started from: its out dir's name (``--init RUN/model`` gives ``RUN``)."""
    return init and (Path(init).parent.name if Path(init).name == "model" else Path(init).name)


def run_record(out_dir) -> dict:
    """A train_anyorder run's record: its held-out curve ``evals`` [(step, accuracy)], answer-loss
    curve ``losses`` [(step, nats)] (4 decimals), flags (``out`` left out: the record is named by
    ``run``) and, once it finished, its steps, stop and cost. A dir that is not a run is a ValueError."""
    path = Path(out_dir)
    cfg = path / "model" / "config.json"
    if not (path / METRICS_FILE).is_file() or not cfg.is_file():
        raise ValueError(f"--runs {path}: not an experiments.train.train_anyorder run (needs {METRICS_FILE} and "
                         "model/config.json)")
    extra = json.loads(cfg.read_text())["extra"]
    flags = {k: v for k, v in extra["args"].items() if k != "out"}
    metrics = read_metrics(path / METRICS_FILE)
    evals = [[r["step"], r["eval/accuracy"]] for r in metrics if "eval/accuracy" in r]
    losses = [[r["step"], round(r["answer_loss"], 4)] for r in metrics if "answer_loss" in r]
    done = json.loads((path / RUN_FILE).read_text()) if (path / RUN_FILE).is_file() else None
    last = max((s for s, _ in evals + losses), default=0)
    return {"run": path.name, "task": flags["task"], "objective": flags["objective"], "lr": flags["lr"],
            "cap": flags["steps"], "init": _init_name(flags["init"]), "evals": evals,
            "losses": losses, "steps": done["steps"] if done else last, "finished": done is not None,
            "stopped_flat": bool(done and done["stopped_flat"]), "epochs": done.get("epochs") if done else None,
            "cpu_hours": round(done["cpu_seconds"] / 3600, 3) if done else None,
            "cpu_steps": done["cpu_steps"] if done else None,
            "git_sha": " ".join(dict.fromkeys(i["git_sha"] for i in done["invocations"])) if done else
            extra.get("git_sha", "not recorded"), "flags": {**flags, "init": _init_name(flags["init"])}}


def read_record(path) -> dict:
    """A committed run record (:func:`run_record`'s JSON), checked: its keys, an ``evals`` of
    [step, accuracy in [0, 1]] pairs with rising steps, and a ``run`` equal to the file's name."""
    path = Path(path)
    try:
        r = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    missing = [k for k in RECORD_KEYS if not isinstance(r, dict) or k not in r]
    if missing:
        raise ValueError(f"{path}: not an any-order run record (missing {', '.join(missing)})")
    steps = [s for s, _ in r["evals"]]
    if any(not 0 <= a <= 1 for _, a in r["evals"]) or steps != sorted(set(steps)) or r["run"] != path.stem:
        raise ValueError(f"{path}: 'evals' must be [step, accuracy in [0, 1]] with rising steps, and 'run' the "
                         f"file's name ({path.stem})")
    return r
