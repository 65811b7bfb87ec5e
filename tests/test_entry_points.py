"""Every entry point (``python -m experiments.<role>.X``) behaves for users: ``--help`` of at most 60
lines named by its ``python -m`` command; a user error (bad flag value, missing file or folder) is one line on
stderr naming the flag or path and exit status 2, never a traceback; bugs keep theirs.

In-process through each module's ``main`` and :func:`harness.cli.run_main` (what every
``__main__`` block runs, checked on the source); one subprocess test proves the real command."""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import cli

REPO = Path(__file__).resolve().parents[1]
#: the entry points: every module of experiments/ (and harness/) with a ``__main__`` block, by short
#: name (a package's ``__main__.py`` by the package's) -> its file
FILES = {(p.parent.name if p.stem == "__main__" else p.stem): p for pkg in ("experiments", "harness")
         for p in sorted((REPO / pkg).rglob("*.py")) if 'if __name__ == "__main__":' in p.read_text()}
ENTRY_POINTS = sorted(FILES)
#: the dotted module of each entry point, and what follows ``python -m`` to run it
MODULES = {n: ".".join(p.relative_to(REPO).with_suffix("").parts) for n, p in FILES.items()}
COMMANDS = {n: m.removesuffix(".__main__") for n, m in MODULES.items()}
#: entry points edited elsewhere that do not end with run_main(main) yet (drop each once it does)
NOT_YET: dict = {}  # entry points whose __main__ block is not run_main(main) yet: none


def _module(name: str):
    if name == "lm_eval_models":
        pytest.importorskip("lm_eval")
    return importlib.import_module(MODULES[name])


def test_the_entry_points_are_found():
    assert {"generate", "gsm8k", "reproduce", "perplexity", "trace", "train_llada", "lm_eval_models",
            "bench_load", "headline", "report"} <= set(ENTRY_POINTS)
    assert len(FILES) == len({p for pkg in ("experiments", "harness") for p in (REPO / pkg).rglob("*.py")
                              if 'if __name__ == "__main__":' in p.read_text()})  # short names are unique


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=NOT_YET[n], strict=True))
                                  if n in NOT_YET else n for n in ENTRY_POINTS])
def test_main_block_is_run_main(name):
    tree = ast.parse(FILES[name].read_text())
    block = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    assert len(block) == 1 and [ast.unparse(s) for s in block[0].body] == ["run_main(main)"]


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_help_is_short_and_named(name, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as exit_:
        _module(name).main(["--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    assert out.startswith(f"usage: python -m {COMMANDS[name]}"), out[:200]
    assert len(out.splitlines()) <= 60, f"{name} --help has {len(out.splitlines())} lines"


def _user_error(name: str, argv: list[str], capsys) -> str:
    """The one stderr line of ``python -m <module of name> argv`` (status 2, no traceback)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        cli.run_main(_module(name).main, argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"python -m {COMMANDS[name]}: error: "), lines[0]
    return lines[0]


def test_user_errors_are_one_line_naming_the_flag_or_path(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing is written into the checkout
    missing, afile = tmp_path / "missing", tmp_path / "afile"
    afile.write_text("x")
    cases = [("generate", ["--model", str(missing), "--gen-length", "256", "--block-length", "32", "--steps", "256",
                           "--dtype", "auto"], ["--model", str(missing)]),
             ("generate", ["--gen-length", "abc"], ["--gen-length", "abc"]),
             ("generate", ["--gen-length", "0"], ["--gen-length"]),
             ("generate", ["--gen-length", "100", "--block-length", "32"], ["--gen-length", "--block-length"]),
             ("trace", ["--step-delay", "-1", "--out", str(tmp_path / "t.png")], ["--step-delay"]),
             ("gsm8k", ["--data", str(missing / "test.jsonl")], ["--data", str(missing / "test.jsonl")]),
             ("gsm8k", ["--out", str(afile)], ["--out", str(afile)]),
             ("gsm8k", ["--limit", "0"], ["--limit"]),
             ("gsm8k", ["--model", str(missing), "--limit", "2", "--strategies", "baseline_semiar",
                        "--out", str(tmp_path / "o")], ["--model", str(missing)]),
             ("reproduce", ["--out", str(afile), "--work", str(tmp_path / "w")], ["--out", str(afile)]),
             ("reproduce", ["--jobs", "0"], ["--jobs"]),
             ("perplexity", ["--steps", "0"], ["--steps"]),
             ("perplexity", ["--train", str(missing / "train.txt")], ["--train", "train.txt"]),
             ("drift", ["--model", str(missing)], ["--model", str(missing)]),
             ("drift", ["--prompts", "0"], ["--prompts"]),
             ("compute_cost", ["--prompt", "10"], ["--gen"]),
             ("compute_cost", ["--prompt", "10", "--gen", "256", "--block", "32", "--steps", "256", "--model",
                               str(missing)], ["--model", str(missing)]),
             ("anyorder", ["--task", "sudoku", "--ar", str(missing), "--mdm", str(missing)], ["--ar", str(missing)]),
             ("anyorder", ["--report-only", "--out", str(afile)], ["--out", str(afile)]),
             ("bench_bd3lm", ["--block-size", "0"], ["--block-size"]),
             ("bench_fastdllm", ["--model", str(missing)], ["--model", str(missing)]),
             ("bench_load", ["--shape", "tiny", "--gen-length", "20", "--out", str(tmp_path)], ["--gen-length"]),
             ("train_llada", ["--init", str(missing), "--out", str(tmp_path / "r")], ["--init", str(missing)]),
             ("train_llada", ["--steps", "x"], ["--steps"]),
             ("train_bd3lm", ["--response-length", "20", "--out", str(tmp_path / "b")], ["--response-length"]),
             ("train_anyorder", ["--task", "sudoku"], ["--objective", "--out"]),
             ("report", ["--out", str(missing)], ["--out", str(missing)])]
    for name, argv, words in cases:
        line = _user_error(name, argv, capsys)
        assert all(w in line for w in words), (name, argv, line)


def test_bugs_keep_their_traceback(monkeypatch):
    def library_value_error(argv):
        json.loads("{")  # a ValueError raised inside a library: not a user error

    def runtime_error(argv):
        raise RuntimeError("a bug")

    for main in (library_value_error, runtime_error):
        with pytest.raises((ValueError, RuntimeError)):
            cli.run_main(main, [])
    def user_error(argv):
        raise cli.UserError("--x: bad")

    monkeypatch.setenv("DLM_TRACEBACK", "1")  # and user errors too, on request
    with pytest.raises(cli.UserError):
        cli.run_main(user_error, [])


def test_list_strategies_instead_of_a_long_help(capsys):
    from experiments.eval import gsm8k
    from harness.grids import sampler_names

    help_text = gsm8k.build_parser().format_help()
    assert "sw_dual_thr0p9" not in help_text and "--list-strategies" in help_text
    with pytest.raises(SystemExit) as exit_:
        gsm8k.main(["--list-strategies"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and all(name in out.split() for name in sampler_names())


def test_lm_eval_help_says_which_task_is_which(capsys):
    lem = _module("lm_eval_models")
    text = lem.model_args_help()
    assert "embedded task" not in text and "real GSM8K" in text and "arith" in text


def test_reproduce_list_puts_training_last_and_says_full(capsys):
    from experiments.reproduce import __main__ as reproduce

    assert reproduce.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("# training jobs"))
    assert "--full" in lines[header]
    names = [line.split()[0] for line in lines if line and not line.startswith("#")]
    training = {j.name for j in reproduce.plan("results", "runs/reproduce", None, False) if j.training}
    first = len([line for line in lines[:header] if line and not line.startswith("#")])
    assert training and set(names[first:]) == training and not training & set(names[:first])


def test_reproduce_summary_names_the_skipped_jobs():
    from experiments.reproduce.__main__ import Outcome, summary

    res = {n: Outcome("skipped") for n in ("drift_dual", "drift_prefix", "trace_bd3lm_g64", "cost_x")}
    text = summary({"gsm8k_256": Outcome("ran", 1.0), **res}, 60.0, Path("logs"), None)
    assert "ran 1, skipped 4" in text
    assert "drift_{dual,prefix} trace_bd3lm_g64 cost_x" in text


@pytest.mark.slow
def test_python_m_generate_with_a_missing_model_is_one_line(tmp_path):
    """The README's quick-start command with a folder that does not exist, as a user runs it."""
    missing = tmp_path / "DIR"
    res = subprocess.run([sys.executable, "-m", "experiments.cli.generate", "--model", str(missing),
                          "--gen-length", "256", "--block-length", "32", "--steps", "256", "--dtype", "auto"], cwd=REPO, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [f"python -m experiments.cli.generate: error: --model {missing}: "
                                               f"checkpoint directory '{missing}' does not exist"]
