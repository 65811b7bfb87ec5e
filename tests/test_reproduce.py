"""experiments.reproduce: the plan covers every committed artefact, the scheduler skips finished
work and blocks dependants of a failure, --verify compares samples, bad arguments are refused, the
summary names what failed and how to rerun it, and a rebuild that changes nothing writes nothing
(a fresh clone stays clean, with ../shared a symlink or without it)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path
from typing import Optional

import pytest

from experiments.reproduce import __main__ as reproduce
from experiments.reproduce.plan import Job, plan

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
#: written by every reproduce run, not by a job
META = {"README.md", "JOBS.md", "reproduce.json", "verify.md"}  # written by reproduce itself


def _committed_artefacts() -> list[str]:
    import subprocess

    files = subprocess.run(["git", "ls-files", "results"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    return [f[len("results/"):] for f in files
            if not f.startswith("results/checkpoints/") and f[len("results/"):] not in META]


def test_plan_names_and_artefacts_are_unique():
    jobs = plan("results", "runs/reproduce")
    names = [j.name for j in jobs]
    assert len(names) == len(set(names))
    arts = [a for j in jobs for a in j.artefacts]
    assert len(arts) == len(set(arts))
    for j in jobs:
        assert set(j.after) <= set(names), j.name
        if j.training and not j.always:  # (an `always` job resumes its own samples instead)
            assert j.artefacts, j.name  # a finished training job must be recognisable


@pytest.mark.slow  # runs `git ls-files` in a subprocess
def test_every_committed_result_file_is_made_by_a_job():
    jobs = plan("results", "runs/reproduce")
    patterns = [p for j in jobs for p in (*j.artefacts, *j.samples)]
    orphans = [f for f in _committed_artefacts() if not any(fnmatch(f, p) for p in patterns)]
    assert not orphans, f"committed results no reproduce job makes: {orphans}"


def test_committed_index_is_the_plan():
    assert (RESULTS / "README.md").read_text() == reproduce.index(plan("results", "runs/reproduce"))
    assert (RESULTS / "JOBS.md").read_text() == reproduce.jobs_table(plan("results", "runs/reproduce"))


def test_limit_caps_samples_and_full_uses_retrained_checkpoints():
    small = {j.name: j for j in plan("/tmp/x", "runs/r", limit=8)}
    args = small["testbed_semiar32"].args
    assert args[args.index("--n") + 1] == 8
    g = small["gsm8k_512"].args
    assert g[g.index("--limit") + 1] == 8
    full = {j.name: j for j in plan("/tmp/x", "runs/r", full=True)}
    assert "/tmp/x/checkpoints/llada-arith" in full["testbed_pure"].args
    assert "train_llada" in full["testbed_pure"].after
    assert "results/checkpoints/llada-arith" in {j.name: j for j in plan("results", "runs/r")}["testbed_pure"].args


def _cost_job(name: str, out: Path, block: int = 32, after: tuple = ()) -> Job:
    return Job(name, "experiments.bench.compute_cost",
               ("--prompt", 10, "--gen", 64, "--block", block, "--steps", 64, "--params", 1000, "--layers", 2,
                "--d-model", 16, "--vocab", 50, "--md", out / f"{name}.md"),
               "test", (f"{name}.md",), after=after)


@pytest.mark.slow  # three job subprocesses (~5 s)
def test_run_jobs_skips_finished_work_and_blocks_dependants(tmp_path):
    out, logs = tmp_path / "out", tmp_path / "logs"
    ok = _cost_job("ok", out)
    bad = _cost_job("bad", out, block=7)  # 64 % 7 != 0: the script exits non-zero
    child = _cost_job("child", out, after=("bad",))
    res = reproduce.run_jobs([child, bad, ok], out, 2, logs)
    assert res["ok"].status == "ran" and (out / "ok.md").is_file()
    assert res["bad"].status == "failed" and res["bad"].returncode != 0
    assert res["child"].status == "blocked" and not (out / "child.md").exists()
    assert "block" in (logs / "bad.log").read_text()
    again = reproduce.run_jobs([ok], out, 1, logs)
    assert again["ok"].status == "skipped"
    assert reproduce.run_jobs([ok], out, 1, logs, force=True)["ok"].status == "ran"


def test_export_copies_a_model_dir_or_one_record_file(tmp_path):
    """A training job's export: a model dir lands whole in its checkpoint dir (replacing what was
    there), a record file lands as that one file (parents made)."""
    (tmp_path / "run" / "model").mkdir(parents=True)
    (tmp_path / "run" / "model" / "config.json").write_text("{}")
    (tmp_path / "run" / "record.json").write_text('{"run": "run"}')
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "stale.bin").write_text("old")
    reproduce.export(Job("train_m", "m", (), "t", export=(tmp_path / "run" / "model", tmp_path / "ck")))
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["config.json"]
    dst = tmp_path / "results" / "runs" / "run.json"
    reproduce.export(Job("train_r", "m", (), "t", export=(tmp_path / "run" / "record.json", dst)))
    assert dst.read_text() == '{"run": "run"}' and sorted(p.name for p in dst.parent.iterdir()) == ["run.json"]
    both = (tmp_path / "run" / "model", tmp_path / "ck2", tmp_path / "run" / "record.json", tmp_path / "r2.json")
    reproduce.export(Job("train_b", "m", (), "t", export=both))  # a model and its record, in pairs
    assert sorted(p.name for p in (tmp_path / "ck2").iterdir()) == ["config.json"] and (tmp_path / "r2.json").is_file()


def _write(path: Path, recs: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_verify_counts_identical_samples(tmp_path):
    out, ref = tmp_path / "out", tmp_path / "ref"
    mk = lambda i, o, c: {"id": f"p{i}", "output": o, "correct": c}  # noqa: E731
    _write(ref / "g" / "s.jsonl", [mk(0, "a", True), mk(1, "b", False), mk(2, "c", True), mk(3, "d", True)])
    _write(out / "g" / "s.jsonl", [mk(0, "a", True), mk(1, "x", True), mk(2, "y", True)])
    job = Job("g", "m", (), "test", samples=("g/*.jsonl",))
    _write(ref / "p.jsonl", [{"id": "config"}, {"id": "ppl/ar", "ppl": 100.0}, {"id": "ppl/bd4", "ppl": 200.0}])
    _write(out / "p.jsonl", [{"id": "config"}, {"id": "ppl/ar", "ppl": 100.0}, {"id": "ppl/bd4", "ppl": 202.0}])
    job = Job("g", "m", (), "test", samples=("g/*.jsonl", "p.jsonl"))
    text = reproduce.verify([job], out, ref)
    row = [line for line in text.splitlines() if "s.jsonl" in line][0]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:] == ["3", "1 identical outputs", "2 same correctness", "100.0% vs 66.7%"]
    row = [line for line in text.splitlines() if "p.jsonl" in line][0]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:3] == ["2 values", "1 equal to 1e-4"] and cells[4] == "max relative difference 1.00e-02"


@pytest.mark.parametrize("argv, match", [
    (["--jobs", "0"], "--jobs"),
    (["--limit", "4"], "--limit"),  # in place: would truncate the committed tables
    (["--out", "{tmp}", "--only", "nope"], "--only"),
])
def test_bad_arguments_are_refused(tmp_path, argv, match):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    with pytest.raises(ValueError, match=match):
        reproduce.main(argv)


def test_full_refuses_a_directory_with_samples(tmp_path):
    _write(tmp_path / "testbed" / "semiar32_k0.jsonl", [{"id": "a"}])
    with pytest.raises(ValueError, match="--full"):
        reproduce.main(["--out", str(tmp_path), "--full"])


@pytest.mark.slow  # a parent and a child subprocess
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="Linux only (prctl PDEATHSIG)")
def test_jobs_die_with_a_killed_reproduce():
    import subprocess
    import sys
    import textwrap
    import time

    code = textwrap.dedent("""
        import subprocess, sys, time
        from experiments.reproduce.__main__ import _die_with_parent
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], preexec_fn=_die_with_parent)
        print(p.pid, flush=True)
        time.sleep(120)
    """)
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    child = Path(f"/proc/{int(parent.stdout.readline())}/status")
    assert "State:" in child.read_text()
    parent.kill()  # SIGKILL: no finally block runs in the parent
    parent.wait()

    def alive() -> bool:
        try:
            return "(zombie)" not in child.read_text()
        except FileNotFoundError:
            return False

    deadline = time.time() + 10
    while alive() and time.time() < deadline:
        time.sleep(0.05)
    assert not alive()


def _fake_run(outcomes: dict, write: dict = {}):
    """A stand-in for :func:`reproduce.run_jobs`: writes ``write`` ({path under out: text}) and
    returns ``outcomes`` ({job: (status, seconds)})."""
    def run_jobs(jobs, out, workers, logs, force=False, **kw):
        for rel_path, text in write.items():
            (out / rel_path).parent.mkdir(parents=True, exist_ok=True)
            (out / rel_path).write_text(text)
        return {n: reproduce.Outcome(s, sec, 1 if s == "failed" else None) for n, (s, sec) in outcomes.items()}
    return run_jobs


def test_summary_names_failed_and_blocked_jobs_and_how_to_rerun_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(reproduce, "run_jobs", _fake_run({
        "testbed_report": ("ran", 1.0), "bd3lm_blocks_report": ("skipped", 0.0),
        "perplexity_eval": ("failed", 2.0), "perplexity_report": ("blocked", 0.0)}))
    out, work = str(tmp_path / "out"), str(tmp_path / "work")
    argv = ["--out", out, "--work", work, "--jobs", "2", "--only", "testbed_report", "bd3lm_blocks_report",
            "perplexity_eval", "perplexity_report"]
    assert reproduce.main(argv) == 1
    text = capsys.readouterr().out
    assert "ran 1, skipped 1, failed 1 (perplexity_eval), blocked 1 (perplexity_report)" in text
    rerun = shlex.join(["python", "-m", "experiments.reproduce", "--out", out, "--work", work, "--jobs", "2",
                        "--only", "perplexity_eval", "perplexity_report"])
    assert rerun in text and f"{work}/logs/perplexity_eval.log" in text


def test_a_rebuild_that_changes_nothing_writes_nothing(tmp_path, monkeypatch):
    """reproduce.json (and README.md, verify.md) are rewritten only when an output or a job's
    status changed; each run's timings go to <work>/logs/runs.jsonl."""
    out, work = tmp_path / "out", tmp_path / "work"
    argv = ["--out", str(out), "--work", str(work), "--only", "testbed_report"]
    meta = [out / "reproduce.json", out / "README.md", out / "verify.md"]

    def run(status, seconds, text):
        monkeypatch.setattr(reproduce, "run_jobs", _fake_run({"testbed_report": (status, seconds)},
                                                             {"testbed/testbed.md": text}))
        reproduce.main(argv)
        return [(p.read_bytes(), p.stat().st_mtime_ns) for p in meta]

    first = run("ran", 1.0, "table")
    assert run("ran", 2.5, "table") == first  # same outputs, other timings: nothing rewritten
    assert run("skipped", 0.0, "table") == first  # skipped and ran are both a success
    logged = [json.loads(x) for x in (work / "logs" / "runs.jsonl").read_text().splitlines()]
    assert [r["jobs"]["testbed_report"]["seconds"] for r in logged] == [1.0, 2.5, 0.0]
    changed = run("ran", 3.0, "another table")
    assert changed[0][0] != first[0][0] and changed[1:] == first[1:]
    assert json.loads(changed[0][0])["jobs"]["testbed_report"]["seconds"] == 3.0
    failed = run("failed", 1.0, "another table")
    assert json.loads(failed[0][0])["jobs"]["testbed_report"]["status"] == "failed"


# ----------------------------------------------------------------- a fresh clone, rebuilt in place
#: jobs that only rebuild tables from the committed samples and records (seconds each)
TABLE_JOBS = ("perplexity_eval", "perplexity_report")
#: table jobs whose writers still stamp the SHA of the build, not of the samples (owned elsewhere):
#: research/testbed.py (meta "git_sha": git_sha(), the "git ..." line of testbed.md),
#: research/bd3_blocks.py (the same in table.md / table.json), harness/report.py
#: ("report_git_sha" of table.json, "(report ...)" in table.md) and experiments/eval/gsm8k.py (config.json
#: "git_sha"); the GSM8K jobs find every sample recorded and rebuild their tables (~15 s each)
OTHER_TABLE_JOBS = ("testbed_report", "testbed_loop_report", "testbed_chain_report", "testbed_chain_s50_report",
                    "bd3lm_blocks_report", "gsm8k_256", "gsm8k_512", "gsm8k_256_4shot", "gsm8k_512_4shot",
                    "anyorder_curves")


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


def fresh_clone(root: Path, mirror: Optional[Path] = None) -> Path:
    """``root/repo``: a clone of this checkout with its working tree committed on top (what the
    next commit would hold); with ``mirror`` (a data folder), ``root/shared`` is a symlink whose
    ``data`` is that folder."""
    clone = root / "repo"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    files = _git(REPO, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    for f in filter(None, files):
        src, dst = REPO / f, clone / f
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
        elif dst.exists():
            dst.unlink()
    _git(clone, "add", "-A")
    _git(clone, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "working tree")
    if mirror is not None and mirror.name == "data":
        (root / "shared").symlink_to(mirror.resolve().parent, target_is_directory=True)
    elif mirror is not None:
        (root / "shared-dir").mkdir()
        (root / "shared-dir" / "data").symlink_to(mirror.resolve(), target_is_directory=True)
        (root / "shared").symlink_to(root / "shared-dir", target_is_directory=True)
    return clone


def _rebuild(clone: Path, jobs: tuple) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "DLM_SHARED_DATA"}
    return subprocess.run([sys.executable, "-m", "experiments.reproduce", "--jobs", "2", "--only", *jobs],
                          cwd=clone, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)


@pytest.mark.slow  # a clone of the repository and the table jobs (~1 min)
@pytest.mark.parametrize("shared", [pytest.param("symlink", marks=pytest.mark.shared_data), "none"])
def test_a_noop_rebuild_of_a_fresh_clone_leaves_it_clean(tmp_path, shared, request):
    mirror = None
    if shared == "symlink":  # the mirror this checkout sees, linked beside the clone
        mirror = request.getfixturevalue("shared_data")("lm1b-sample").parent
    clone = fresh_clone(tmp_path, mirror)
    head = _git(clone, "rev-parse", "HEAD").strip()
    res = _rebuild(clone, TABLE_JOBS)
    assert res.returncode == 0, res.stdout + res.stderr
    assert _git(clone, "status", "--porcelain") == ""
    sha = [sys.executable, "-c", "from harness.results import git_sha; print(git_sha())"]
    (clone / "results" / "perplexity_laptop.md").write_text("edited")  # results are outputs, not code
    assert subprocess.run(sha, cwd=clone, capture_output=True, text=True).stdout.strip() == head
    (clone / "experiments" / "__init__.py").write_text("# edited\n")
    assert subprocess.run(sha, cwd=clone, capture_output=True, text=True).stdout.strip() == head + "-dirty"


@pytest.mark.slow
def test_a_noop_rebuild_of_the_other_tables_leaves_a_clone_clean(tmp_path):
    clone = fresh_clone(tmp_path)
    res = _rebuild(clone, OTHER_TABLE_JOBS)
    assert res.returncode == 0, res.stdout + res.stderr
    assert _git(clone, "status", "--porcelain") == ""


def test_table_numbers_are_rounded_before_formatting():
    """Float noise in a drift table cannot print -0.000000 or a stray 1e-17 where 0 is meant."""
    from experiments.eval.drift import _num

    assert [_num(-1e-9, ".6f"), _num(-3e-17, ".3e"), _num(2e-17, ".3e"), _num(-0.0, ".2f")] == \
        ["0.000000", "0.000e+00", "0.000e+00", "0.00"]
    assert [_num(0.99999996, ".6f"), _num(1.899e-3, ".3e"), _num(4582.0, ".0f")] == ["1.000000", "1.899e-03", "4582"]
