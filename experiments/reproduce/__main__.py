"""One command that regenerates every table and plot in ``results/`` from the committed checkpoints.

    python -m experiments.reproduce --jobs 2                      # results/ in place
    python -m experiments.reproduce --out /tmp/repro --limit 16   # from scratch, a subset, checked
    python -m experiments.reproduce --full --out /tmp/repro       # retrain the embedded models first
    python -m experiments.reproduce --list                        # the plan, one command per job

Every artefact is made by one job, and a job is one command of the experiment scripts, run as a
subprocess (``OMP_NUM_THREADS`` = cores / ``--jobs``; log in ``<work>/logs/<job>.log``). Jobs whose
script keeps per-sample JSONL (testbed, GSM8K-format harness, perplexity eval) always run: the
script skips the samples already written, so on a checkout with the committed results they only
rebuild their tables, and a killed reproduction resumes where it stopped. The other jobs (cost
tables, drift, traces, training) are skipped when all their artefacts exist (``--force`` reruns).

``--only NAME ...`` runs just those jobs (a training job too). ``--out DIR`` other than
``results/`` recomputes everything there from the committed checkpoints (the perplexity ladders'
checkpoints are not committed: their jobs run with ``--full``). ``--limit N``
caps every per-sample job at its first N problems (the same ids as the committed runs), and
``--verify`` (default with ``--out``) compares each sample with the committed one: same decoded
output, same correctness. ``--full`` also retrains the embedded models (two-phase
LLaDA SFT, the BD3-LM fine-tune, the five perplexity models) into ``DIR/checkpoints``; it refuses a
directory that already holds per-sample results of other models.

Writes ``<out>/README.md`` (every artefact with the command that made it), with ``--verify``
``<out>/verify.md``, and ``<out>/reproduce.json``: the git SHA at the start of the last run that
changed something (the commit that produced the results), its arguments and wall time, and each
job's status and seconds (merged over runs, in plan order). A run changes something when an
artefact or sample file of its jobs differs afterwards (sha256 before and after) or a job's outcome
differs from the recorded one (ran and skipped both count as success); otherwise reproduce.json is
left as it is, so a no-op rebuild of a clean checkout leaves it clean. Every run's timings are
appended to ``<work>/logs/runs.jsonl``. None of these files is rewritten with identical content.
The last lines name the failed and blocked jobs, their logs, and the command that reruns just them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from dlm.io import atomic_write_bytes, stable_json, write_dir
from harness.cli import parser, run_main, writing_to
from harness.results import REPO, git_sha, read_jsonl, write_if_changed
from experiments.reproduce.plan import Job, plan

RESULTS = REPO / "results"


def rel(path: Path) -> str:
    """``path`` relative to the repository when inside it, else absolute (commands run there)."""
    p = Path(path).resolve()
    return p.relative_to(REPO).as_posix() if p.is_relative_to(REPO) else str(p)


# ------------------------------------------------------------------------------------ scheduling
@dataclass
class Outcome:
    status: str  # ran | skipped | failed | blocked
    seconds: float = 0.0
    returncode: Optional[int] = None


def is_done(job: Job, out: Path) -> bool:
    return bool(job.artefacts) and all((out / a).exists() for a in job.artefacts)


def export(job: Job) -> None:
    """Copy each (source, destination) pair of ``job.export``: a model dir whole (temp dir, then rename), a file."""
    for src, dst in zip(*[(REPO / p for p in job.export)] * 2):
        if src.is_file():
            atomic_write_bytes(dst, src.read_bytes())
            continue
        write_dir(dst, lambda tmp, src=src: shutil.copytree(src, tmp, dirs_exist_ok=True))


def _die_with_parent() -> None:
    """Child setup on Linux: SIGKILL this job when reproduce dies (even by SIGKILL): no orphan appends."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def run_jobs(jobs: list[Job], out: Path, workers: int, logs: Path, force: bool = False,
             poll_s: float = 0.2) -> dict[str, Outcome]:
    """Run ``jobs`` on ``workers`` processes, dependencies first, the most expensive ready job
    first; a failed job blocks the jobs that need it. Returns each job's :class:`Outcome`."""
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    results: dict[str, Outcome] = {}
    pending = list(jobs)
    running: dict[str, tuple] = {}
    try:
        while pending or running:
            for name, (proc, t0, fh, job) in list(running.items()):
                if proc.poll() is None:
                    continue
                fh.close()
                ok = proc.returncode == 0
                if ok and job.export:
                    export(job)
                results[name] = Outcome("ran" if ok else "failed", time.perf_counter() - t0, proc.returncode)
                print(f"[reproduce] {name}: {'done' if ok else f'FAILED (rc {proc.returncode}), see {logs / name}.log'}"
                      f" in {results[name].seconds:.0f}s", flush=True)
                del running[name]
            for job in sorted(pending, key=lambda j: -j.cost_min):
                if any(results.get(d, Outcome("")).status in ("failed", "blocked") for d in job.after):
                    results[job.name] = Outcome("blocked")
                    pending.remove(job)
                    continue
                if len(running) >= workers or any(d in running or d in {p.name for p in pending}
                                                  for d in job.after):
                    continue
                pending.remove(job)
                if not job.always and not force and is_done(job, out):
                    results[job.name] = Outcome("skipped")
                    continue
                print(f"[reproduce] {job.name}: {shlex.join(job.command())}", flush=True)
                fh = open(logs / f"{job.name}.log", "w")
                proc = subprocess.Popen(job.command(), cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                        preexec_fn=_die_with_parent if sys.platform == "linux" else None)
                running[job.name] = (proc, time.perf_counter(), fh, job)
            time.sleep(poll_s if running else 0)
    finally:
        for proc, _, fh, _ in running.values():
            proc.kill()
            fh.close()
    return results


# ------------------------------------------------------------------------------ verify + index
def _output(rec: dict) -> str:
    return rec.get("output", rec.get("prediction"))

#: numeric fields compared for records without a decoded output (perplexity eval records)
VALUES = ("ppl", "var_nelbo")


def _compare(mine: dict, theirs: dict) -> Optional[str]:
    """One table row for the ids in both files, or None when they share none."""
    ids = [i for i in mine if i in theirs]
    if not ids:
        return None
    if all("correct" in mine[i] and "correct" in theirs[i] for i in ids):
        same = sum(_output(mine[i]) == _output(theirs[i]) for i in ids)
        corr = sum(mine[i]["correct"] == theirs[i]["correct"] for i in ids)
        acc = [100 * sum(d[i]["correct"] for i in ids) / len(ids) for d in (mine, theirs)]
        return f"{len(ids)} | {same} identical outputs | {corr} same correctness | {acc[0]:.1f}% vs {acc[1]:.1f}%"
    pairs = [(float(mine[i][k]), float(theirs[i][k])) for i in ids for k in VALUES
             if k in mine[i] and k in theirs[i]]
    if not pairs:
        return None
    rel = [abs(a - b) / max(abs(b), 1e-12) for a, b in pairs]
    return (f"{len(pairs)} values | {sum(r <= 1e-4 for r in rel)} equal to 1e-4 | - | "
            f"max relative difference {max(rel):.2e}")


def verify(jobs: list[Job], out: Path, ref: Path, sha: Optional[str] = None) -> str:
    """Per-sample comparison of ``out`` with the committed ``ref``: for every id present in both,
    is the decoded output identical and the correctness the same (perplexity records: are the
    PPL / Var(NELBO) values equal)? ``sha``: the commit that computed ``out`` (default: now)."""
    lines = ["# Reproduction check", "", f"`{rel(out)}` against `{rel(ref)}`, git {sha or git_sha()}", "",
             "| file | compared | identical | same correctness | here vs committed |", "|---|---|---|---|---|"]
    for job in jobs:
        for pattern in job.samples:
            for path in sorted(out.glob(pattern)):
                other = ref / path.relative_to(out)
                if not other.is_file():
                    continue
                row = _compare({r["id"]: r for r in read_jsonl(path)}, {r["id"]: r for r in read_jsonl(other)})
                if row is not None:
                    lines.append(f"| `{path.relative_to(out)}` | {row} |")
    return "\n".join(lines) + "\n"


INDEX_HEAD = """# results/

What each committed table answers. Per-sample JSONL files are the source of truth: every table is
rebuilt from them alone (`python -m experiments.reproduce`), each line carries its config hash,
seed and the commit that produced it. The job and the exact command behind every file:
[JOBS.md](JOBS.md); how to rerun and verify: [docs/reproducing.md](../docs/reproducing.md).
"""

#: (question, job-name prefixes): the groups of the human index, in reading order
QUESTIONS = (
    ("How much faster is each cache / commit rule, at what accuracy? (Fast-dLLM Table 1 layout)", ("gsm8k_",)),
    ("Does semi-autoregressive decoding beat pure diffusion, and why (the EOS tail)?", ("testbed_",)),
    ("Is BD3-LM's KV cache exact, and what does each block size give?", ("bd3lm_blocks",)),
    ("Perplexity vs block size (BD3-LM Table 3) and clipped schedules (Table 2)", ("perplexity_", "train_ppl_char")),
    ("What does each sampler compute: passes, positions, FLOPs?", ("cost_",)),
    ("Beyond Fast-dLLM: delayed (dKV-Cache) and drift-refreshed caches on the same frontier", ("caches_",)),
    ("Dream's family: Dream's own sampler and Fast-dLLM's Dream rules vs its LLaDA rules", ("dream_",)),
    ("How far do the approximate caches drift from exact recomputation?", ("drift_",)),
    ("Where does any-order generation win, and where does the bill arrive under load?", ("anyorder_", "bench_load")),
    ("In which order does each sampler commit tokens?", ("trace_",)),
)


def index(jobs: list[Job]) -> str:
    """``results/README.md``: the tables grouped by the question they answer (one short line each)."""
    lines = [INDEX_HEAD]
    for question, prefixes in QUESTIONS:
        group = [j for j in jobs if j.name.startswith(prefixes)]  # a training job shows its reports, if any
        shown = [(j.what, [a for a in j.artefacts if a.endswith((".md", ".png"))]) for j in group]
        shown = [(what, arts) for what, arts in shown if arts]
        samples = sorted({g.split("/")[0] if "/" in g else g for j in group for g in j.samples})
        if not shown and not samples:
            continue
        lines += [f"## {question}", ""]
        lines += [f"- {what}: " + " · ".join(f"[`{a}`]({a})" for a in arts) for what, arts in shown]
        if samples:
            lines.append("- per-sample files: " + ", ".join(f"`{d}`" for d in samples))
        lines.append("")
    lines += ["## How the embedded models were trained", "",
              "`checkpoints/`: the models every table uses; recipes in [docs/training.md](../docs/training.md), "
              "jobs (run with `--full`) in [JOBS.md](JOBS.md).", ""]
    return "\n".join(lines)


def jobs_table(jobs: list[Job]) -> str:
    """``results/JOBS.md``: every artefact with the job that makes it and that job's command."""
    lines = ["# Jobs of `python -m experiments.reproduce`", "",
             "Every artefact, the job that makes it and the command that job runs (from the repository root; "
             "one thread per process on a CPU). Training jobs run only with `--full`.", "",
             "| artefact | what | job | command |", "|---|---|---|---|"]
    for j in jobs:
        arts = "<br>".join(f"`{a}`" for a in dict.fromkeys((*j.artefacts, *j.samples)))
        cmd = shlex.join(j.command()[1:]).replace("|", "\\|")
        lines.append(f"| {arts} | {j.what} | `{j.name}` | `python {cmd}` |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- summary, no-op
def outputs(jobs: list[Job], out: Path) -> dict[str, str]:
    """sha256 of every existing artefact and sample file of ``jobs`` (paths relative to ``out``)."""
    paths = {out / a for j in jobs for a in j.artefacts} | {p for j in jobs for g in j.samples for p in out.glob(g)}
    return {p.relative_to(out).as_posix() if p.is_relative_to(out) else str(p):
            hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(paths) if p.is_file()}


def _ok(status: Optional[str]) -> Optional[str]:
    """A job's outcome as reproduce.json compares it: ran and skipped are both a success."""
    return "ok" if status in ("ran", "skipped") else status


def record_run(out: Path, work: Path, jobs: list[Job], res: dict[str, Outcome], run: dict,
               changed_files: list[str], started: str = "") -> bool:
    """Append this run to ``<work>/logs/runs.jsonl``; rewrite ``<out>/reproduce.json`` (this run's
    SHA, arguments and wall time, its jobs merged over the recorded ones) only when a file changed
    or a job's outcome differs from the recorded one. True when reproduce.json was written."""
    jobs_now = {n: {"status": o.status, "seconds": o.seconds} for n, o in res.items()}
    log = work / "logs" / "runs.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        f.write(json.dumps({"started": started, **run, "changed": changed_files, "jobs": jobs_now}) + "\n")
    path = out / "reproduce.json"
    try:
        recorded = json.loads(path.read_text()).get("jobs", {})
    except (FileNotFoundError, ValueError, AttributeError):
        recorded = {}
    if not changed_files and all(_ok(recorded.get(n, {}).get("status")) == _ok(o.status) for n, o in res.items()):
        return False
    merged = {**recorded, **jobs_now}
    order = [j.name for j in jobs if j.name in merged] + [n for n in merged if n not in {j.name for j in jobs}]
    return write_if_changed(path, stable_json({**run, "jobs": {n: merged[n] for n in order}}, indent=1) + "\n")


def rerun_command(a, parser: argparse.ArgumentParser, names: list[str]) -> str:
    """The command that reruns just ``names`` with this run's other options."""
    cmd = ["python", "-m", "experiments.reproduce"]
    for flag in ("out", "work", "jobs", "limit", "verify"):
        value = getattr(a, flag)
        if value is not None and value != parser.get_default(flag):
            cmd += [f"--{flag}", str(value)]
    cmd += [f"--{flag}" for flag in ("full", "force") if getattr(a, flag)]
    return shlex.join([*cmd, "--only", *names])


def compact(names: list[str]) -> str:
    """Job names (each ``word_rest``) grouped by their first word: ``drift_{dual,prefix} trace_bd3lm_g64``."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(name.partition("_")[0], []).append(name)
    return " ".join(g[0] if len(g) == 1 else f"{h}_{{{','.join(n[len(h) + 1:] for n in g)}}}"
                    for h, g in groups.items())


def listing(jobs: list[Job]) -> str:
    """``--list``: the jobs of a plain run (plan order), then the training jobs (``--full`` only)."""
    line = lambda j: f"{j.name:28s} {j.cost_min:5.1f} min  {shlex.join(j.command()[1:])}"  # noqa: E731
    plain, training = [j for j in jobs if not j.training], [j for j in jobs if j.training]
    return "\n".join([f"# the jobs of a plain run ({len(plain)}; min: one core, from scratch: the committed results "
                      "make most of them quick)", *map(line, plain), "", f"# training jobs ({len(training)}): run ONLY "
                      "with --full (each before the jobs that use its model) or --only NAME", *map(line, training)])


def summary(res: dict[str, Outcome], wall: float, logs: Path, rerun: Optional[str]) -> str:
    """The last lines: counts, the failed / blocked / skipped (:func:`compact`) jobs, logs, rerun command."""
    parts = []
    for status in ("ran", "skipped", "failed", "blocked"):
        names = [n for n, o in res.items() if o.status == status]
        parts.append(f"{status} {len(names)}" + (f" ({', '.join(names)})" if names and status in ("failed", "blocked")
                                                  else ""))
    lines = [f"[reproduce] {len(res)} jobs in {wall / 60:.1f} min: " + ", ".join(parts)]
    if skipped := [n for n, o in res.items() if o.status == "skipped"]:
        lines.append(f"[reproduce] skipped (artefacts exist; --force reruns them): {compact(skipped)}")
    failed = [n for n, o in res.items() if o.status == "failed"]
    if failed:
        lines.append("[reproduce] logs: " + " ".join(str(logs / f"{n}.log") for n in failed))
    if rerun:
        lines.append(f"[reproduce] rerun just these: {rerun}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ CLI
def check_args(a, out: Path, names: list[str]) -> None:
    if a.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {a.jobs}")
    in_place = out.resolve() == RESULTS.resolve()
    if a.limit is not None and (a.limit < 1 or in_place):
        raise ValueError(f"--limit {a.limit}: needs N >= 1 and an --out other than results/ "
                         "(a subset would truncate the committed tables)")
    unknown = sorted(set(a.only or ()) - set(names))
    if unknown:
        raise ValueError(f"--only: unknown job(s) {unknown}; see --list")
    if a.full and any(out.glob("*/*.jsonl")):
        raise ValueError(f"--full: {out} already holds per-sample results (of the committed models); "
                         "give a fresh --out so retrained models do not resume them")


def main(argv=None) -> int:
    p = parser("experiments.reproduce.__main__", __doc__, paragraphs=2)
    p.add_argument("--out", default=str(RESULTS), metavar="DIR", help="results directory (default results/)")
    p.add_argument("--work", default=str(REPO / "runs" / "reproduce"), metavar="DIR",
                   help="logs and trainer state (default runs/reproduce)")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="jobs run at once (default 1; 2 on 2 cores)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="first N problems of every per-sample job")
    p.add_argument("--full", action="store_true", help="retrain the embedded models first (training jobs)")
    p.add_argument("--only", nargs="+", default=None, metavar="JOB", help="these jobs and nothing else")
    p.add_argument("--force", action="store_true", help="rerun jobs whose artefacts exist")
    p.add_argument("--verify", default=None, metavar="DIR",
                   help="compare samples with this results dir (default: results/ when --out is elsewhere)")
    p.add_argument("--list", action="store_true", help="print the plan (training jobs last) and exit")
    a = p.parse_args(argv)
    out, work = Path(a.out), Path(a.work)
    jobs = plan(rel(out), rel(work), a.limit, a.full)
    check_args(a, out, [j.name for j in jobs])
    if a.list:
        print(listing(jobs))
        return 0
    # one reproduction per folder: a second one into the same --out or --work is refused here,
    # naming the first one's pid and start time, before it starts a job or opens a log
    with writing_to("--out", out), writing_to("--work", work):
        return reproduce(a, p, jobs, out, work, argv)


def reproduce(a, p: argparse.ArgumentParser, jobs: list[Job], out: Path, work: Path, argv) -> int:
    """Run the jobs the flags ``a`` select, then write the index, timings and check; 1 when one failed."""
    selected = [j for j in jobs if j.name in a.only] if a.only else [j for j in jobs if a.full or not j.training]
    in_place = out.resolve() == RESULTS.resolve()
    sha = git_sha()  # before any job writes: the commit (and code state) that produces the results
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    before = outputs(selected, out)
    t0 = time.perf_counter()
    res = run_jobs(selected, out, a.jobs, work / "logs", a.force)
    wall = time.perf_counter() - t0
    after = outputs(selected, out)
    changed = sorted(f for f in before.keys() | after.keys() if before.get(f) != after.get(f))
    run = {"git_sha": sha, "argv": sys.argv[1:] if argv is None else list(argv), "jobs_at_once": a.jobs,
           "cpu_count": os.cpu_count(), "wall_s": wall}
    wrote = record_run(out, work, jobs, res, run, changed, started)
    write_if_changed(out / "README.md", index(jobs))
    write_if_changed(out / "JOBS.md", jobs_table(jobs))
    ref = Path(a.verify) if a.verify else (None if in_place else RESULTS)
    if ref is not None:
        report = verify(selected, out, ref, sha)
        write_if_changed(out / "verify.md", report)
        print(report)
    bad = [j.name for j in jobs if j.name in res and res[j.name].status in ("failed", "blocked")]  # plan order
    print(f"[reproduce] {len(changed)} result file(s) changed; {rel(out / 'reproduce.json')} "
          f"{'updated' if wrote else 'left as it was'}; timings in {rel(work / 'logs' / 'runs.jsonl')}")
    print(summary(res, wall, work / "logs", rerun_command(a, p, bad) if bad else None))
    return 1 if bad else 0


if __name__ == "__main__":
    run_main(main)
