"""The jobs of ``experiments.reproduce``, read from the data table ``plan.toml`` beside this file.

``plan.toml`` lists every job once (its header explains the keys and placeholders); this module
checks it whole and fills in ``--out``, ``--work``, ``--limit`` and ``--full``. Costs are
core-minutes from scratch on one core of the 2-core AMD EPYC box the plan was written on (summed
``seconds`` of the committed per-sample records; training wall times from the README); they order
the scheduler (most expensive first) and are printed by ``--list``.
"""

from __future__ import annotations

import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

PLAN = Path(__file__).with_name("plan.toml")
#: what one ``experiments.eval.gsm8k`` run writes in its folder besides its per-sample JSONL files
GSM8K_REPORT = ("table.md", "table.csv", "table.json", "ablation.md", "ablation.csv", "pareto.png", "config.json")
#: a job's keys in plan.toml and their types (name, module, args and what are required)
KEYS = {"name": str, "module": str, "args": list, "what": str, "artefacts": list, "tables_in": str,
        "samples": list, "always": bool, "after": list, "after_full": list, "after_every_eval": bool,
        "cost": (int, float), "cost_n": int, "export": list, "training": bool, "only_outside_results": bool}
REQUIRED = ("name", "module", "args", "what")
CAP = re.compile(r"\{n:(\d+)\}")
PLACEHOLDERS = re.compile(r"\{(?!out\}|work\}|ck\}|trained\})[^}]*\}")


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
    export: Optional[tuple] = None  # (trained model dir or record file, its place, ...), copied after success
    training: bool = False  # only with --full (a training, or an eval of models only --full trains)

    def command(self) -> list[str]:
        return [sys.executable, "-m", self.module, *map(str, self.args)]


def _cap(n: int, limit: Optional[int]) -> int:
    """``n`` samples, at most ``limit`` (``--limit``)."""
    return n if limit is None else min(n, limit)


def read_plan(path: Path = PLAN) -> tuple[dict[str, list], list[dict]]:
    """The ``[groups]`` and ``[[job]]`` entries of a plan file, checked: every key known and of its
    type, names unique, every ``@group`` and ``after`` name defined, no unknown placeholder. A bad
    entry is a ValueError naming the file, the job and the key."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML: {e}") from e
    groups, jobs = raw.pop("groups", {}), raw.pop("job", [])
    if raw:
        raise ValueError(f"{path}: unknown table(s) {sorted(raw)} (expected [groups] and [[job]])")
    names = [j.get("name") for j in jobs]
    for i, job in enumerate(jobs):
        where = f"{path}: job {job.get('name', f'#{i + 1}')!r}"
        for key in REQUIRED:
            if key not in job:
                raise ValueError(f"{where} has no {key!r}")
        for key, value in job.items():
            if key not in KEYS:
                raise ValueError(f"{where}: unknown key {key!r} (known: {', '.join(KEYS)})")
            if not isinstance(value, KEYS[key]) or (KEYS[key] is not bool and isinstance(value, bool)):
                raise ValueError(f"{where}: {key!r} must be {getattr(KEYS[key], '__name__', 'a number')}, "
                                 f"got {value!r}")
        if names.count(job["name"]) > 1:
            raise ValueError(f"{where}: the name is used by {names.count(job['name'])} jobs")
        for dep in (*job.get("after", ()), *job.get("after_full", ())):
            if dep not in names:
                raise ValueError(f"{where}: 'after' names no job {dep!r}")
        for arg in job["args"]:
            if isinstance(arg, str) and arg.startswith("@") and arg[1:] not in groups:
                raise ValueError(f"{where}: 'args' splices {arg!r}, which [groups] does not define")
        texts = [a for a in _splice(job["args"], groups) if isinstance(a, str) and not CAP.fullmatch(a)]
        for text in (*texts, *job.get("artefacts", ()), *job.get("samples", ()), *job.get("export", ())):
            if PLACEHOLDERS.search(text):
                raise ValueError(f"{where}: unknown placeholder {PLACEHOLDERS.search(text).group()!r} in {text!r}")
        if "export" in job and (not job["export"] or len(job["export"]) % 2):
            raise ValueError(f"{where}: 'export' must be [trained dir or file, destination, ...] pairs, got "
                             f"{job['export']!r}")
    _check_acyclic(path, {j["name"]: (*j.get("after", ()), *j.get("after_full", ())) for j in jobs})
    return groups, jobs


def _check_acyclic(path: Path, deps: dict[str, tuple]) -> None:
    """A ValueError naming a cycle of ``after`` names (a job after itself, directly or not): the
    scheduler would wait on it for ever."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, trail: list[str]) -> None:
        if state.get(name) == 1:
            cycle = trail[trail.index(name):] + [name]
            raise ValueError(f"{path}: job {name!r}: 'after' makes a cycle ({' -> '.join(cycle)})")
        if state.get(name) != 2:
            state[name] = 1
            for dep in deps[name]:
                visit(dep, [*trail, name])
            state[name] = 2

    for name in deps:
        visit(name, [])


def _splice(args: list, groups: dict[str, list]) -> list:
    return [x for a in args for x in (groups[a[1:]] if isinstance(a, str) and a.startswith("@") else (a,))]


def plan(out: str, work: str, limit: Optional[int] = None, full: bool = False, path: Path = PLAN) -> list[Job]:
    """Every job of the plan file, in its order; ``out``/``work`` are paths as the commands should show them."""
    groups, entries = read_plan(path)
    trained = out if full else "results"  # what training made: retrained with --full, else the committed files
    ck = f"{trained}/checkpoints"

    def fill(text: str) -> str:
        return text.replace("{out}", out).replace("{work}", work).replace("{ck}", ck).replace("{trained}", trained)

    def arg(a):
        if not isinstance(a, str):
            return a
        cap = CAP.fullmatch(a)
        return _cap(int(cap.group(1)), limit) if cap else fill(a)

    jobs = []
    for e in entries:
        artefacts = [f"{e['tables_in']}/{f}" for f in GSM8K_REPORT] if "tables_in" in e else []
        artefacts += [] if e.get("only_outside_results") and out == "results" else e.get("artefacts", [])
        cost = e.get("cost", 0.1)
        if "cost_n" in e:
            cost = cost * _cap(e["cost_n"], limit) / e["cost_n"]
        after = e.get("after", []) + (e.get("after_full", []) if full else [])
        if e.get("after_every_eval"):
            after = [j.name for j in jobs if not j.training]
        jobs.append(Job(e["name"], e["module"], tuple(arg(a) for a in _splice(e["args"], groups)), e["what"],
                        tuple(fill(a) for a in artefacts), tuple(fill(s) for s in e.get("samples", ())),
                        e.get("always", False), tuple(after), cost,
                        tuple(fill(p) for p in e["export"]) if "export" in e else None, e.get("training", False)))
    return jobs
