"""experiments.reproduce: the plan covers every committed artefact, the scheduler skips finished
work and blocks dependants of a failure, --verify compares samples, bad arguments are refused."""

from __future__ import annotations

import json
from fnmatch import fnmatch
from pathlib import Path

import pytest

from experiments import reproduce
from experiments.reproduce_plan import Job, plan

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
#: written by every reproduce run, not by a job
META = {"README.md", "reproduce.json", "verify.md"}


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
        if j.training:
            assert j.artefacts, j.name  # a finished training job must be recognisable


@pytest.mark.slow  # runs `git ls-files` in a subprocess
def test_every_committed_result_file_is_made_by_a_job():
    jobs = plan("results", "runs/reproduce")
    patterns = [p for j in jobs for p in (*j.artefacts, *j.samples)]
    orphans = [f for f in _committed_artefacts() if not any(fnmatch(f, p) for p in patterns)]
    assert not orphans, f"committed results no reproduce job makes: {orphans}"


def test_committed_index_is_the_plan():
    assert (RESULTS / "README.md").read_text() == reproduce.index(plan("results", "runs/reproduce"))


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
    return Job(name, "experiments.compute_cost",
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


def test_prepare_fresh_copies_perplexity_models_and_train_records(tmp_path, monkeypatch):
    res = tmp_path / "results"
    (res / "checkpoints" / "perplexity-laptop-ar").mkdir(parents=True)
    (res / "checkpoints" / "perplexity-laptop-ar" / "config.json").write_text("{}")
    (res / "checkpoints" / "llada-arith").mkdir()
    _write(res / "perplexity_laptop.jsonl", [{"id": "config", "kind": "config"}, {"id": "train/ar", "kind": "train"},
                                            {"id": "ppl/ar", "kind": "ppl"}])
    monkeypatch.setattr(reproduce, "RESULTS", res)
    out = tmp_path / "fresh"
    reproduce.prepare_fresh(out)
    assert (out / "checkpoints" / "perplexity-laptop-ar" / "config.json").is_file()
    assert not (out / "checkpoints" / "llada-arith").exists()  # read from results/ directly
    kept = [json.loads(x)["id"] for x in (out / "perplexity_laptop.jsonl").read_text().splitlines()]
    assert kept == ["config", "train/ar"]  # the eval records are recomputed


@pytest.mark.slow  # a parent and a child subprocess
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="Linux only (prctl PDEATHSIG)")
def test_jobs_die_with_a_killed_reproduce():
    import subprocess
    import sys
    import textwrap
    import time

    code = textwrap.dedent("""
        import subprocess, sys, time
        from experiments.reproduce import _die_with_parent
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
