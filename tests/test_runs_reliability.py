"""Runs that cannot collide, and every entry-point user error as one line (issue 50, part C).

Each case runs the entry point through :func:`harness.cli.run_main` (exit 2, one line on stderr,
no traceback) and checks that nothing wrong was written: no second writer's metrics, no empty
``--out`` left behind, the first run's log intact, no temp file of a failed save.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch

import dlm.io
import dlm.train as trainer
from dlm.io import leftover_temps
from dlm.locks import lock_file_of, remove_stale_locks, results_lock
from dlm.objectives import LLaDAPretrainLoss
from dlm.train import TrainConfig, train
from harness import cli
from test_gsm8k_harness import ckpt  # noqa: F401  (fixture)
from test_results_io import holder  # a spawned process holding a lock until released
from tiny import micro_model


def one_line_error(main, argv, capsys) -> str:
    """Run ``main(argv)`` as an entry point; assert it failed with one line and exit status 2."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        cli.run_main(main, argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    last = err.rstrip("\n").rsplit("\n", 1)[-1]  # after a progress bar, if any
    assert last.startswith("python -m ") and ": error: " in last and err.count(": error: ") == 1, err
    assert "Traceback" not in err, err
    return last


def _not_built(*_, **__):
    raise AssertionError("built something before refusing")


def _batch(step, g):
    return {"input_ids": torch.randint(0, 15, (4, 8), generator=g)}


def _config(out, **kw):
    return TrainConfig(**{**dict(out_dir=str(out), max_steps=4, batch_size=4, lr=1e-2, log_every=1,
                                 save_every=2), **kw})


def _save(model, tokenizer, d):
    Path(d, "weights.txt").write_text("w")


# ----------------------------------------------------------------- two runs into one folder
def test_training_takes_the_folder_lock_a_second_run_is_refused(tmp_path, capsys, monkeypatch):
    """A second train_llada / train_bd3lm / train_anyorder run into a held --out exits 2 naming the
    holder's pid and start time before building anything; dlm.train.train refuses the same way,
    and once the first run is gone the run logs every step once."""
    from experiments.train import train_anyorder, train_bd3lm, train_llada

    out = tmp_path / "run"
    out.mkdir()
    for module in (train_llada, train_anyorder):
        monkeypatch.setattr(module, "build_model", _not_built)
    monkeypatch.setattr(train_llada, "build_tokenizer", _not_built)
    monkeypatch.setattr(train_anyorder, "task_tokenizer", _not_built)
    monkeypatch.setattr(train_bd3lm, "load_model", _not_built)
    with holder(out, how="lock") as p:
        for main, argv in ((train_llada.main, ["--out", str(out)]),
                           (train_bd3lm.main, ["--out", str(out)]),
                           (train_anyorder.main, ["--task", "sudoku", "--objective", "ar", "--out", str(out)])):
            line = one_line_error(main, argv, capsys)
            assert f"--out {out}: " in line and f"locked by pid {p.pid} on host " in line and " since " in line
        with pytest.raises(ValueError, match=rf"locked by pid {p.pid}"):
            train(micro_model(), LLaDAPretrainLoss(), _batch, _config(out), save_fn=_save)
        assert sorted(os.listdir(out)) == [".lock"]  # no metrics, model/ or trainer_state.pt of a second writer
    train(micro_model(), LLaDAPretrainLoss(), _batch, _config(out), save_fn=_save)
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    assert not lock_file_of(out).exists()  # released at the end


# -------------------------------------------------------------------------------- a full disk
@pytest.mark.parametrize("failure", ["torch", "oserror"])
def test_a_full_disk_during_a_save_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch, failure):
    """torch's ``unexpected pos`` (with no room left) or an ENOSPC OSError while writing
    trainer_state.pt: one line naming the file and the full disk; the temp file is gone and the
    previous checkpoint intact."""
    out = tmp_path / "run"

    def killed_at_3(step, g):
        if step == 3:
            raise KeyboardInterrupt  # after the step-2 checkpoint
        return _batch(step, g)

    with pytest.raises(KeyboardInterrupt):
        train(micro_model(), LLaDAPretrainLoss(), killed_at_3, _config(out), save_fn=_save)
    before = (out / "trainer_state.pt").read_bytes()

    def full_save(obj, f, *a, **k):
        Path(f).write_bytes(b"half")
        if failure == "torch":
            raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 256064 vs 255952")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(trainer.torch, "save", full_save)
    if failure == "torch":
        monkeypatch.setattr(dlm.io, "free_bytes", lambda path: 0)

    def main(argv):
        train(micro_model(), LLaDAPretrainLoss(), _batch, _config(out, max_steps=4), save_fn=_save)

    line = one_line_error(main, [], capsys)
    assert line.endswith(f"{out / 'trainer_state.pt'}: No space left on device"), line
    assert (out / "trainer_state.pt").read_bytes() == before
    assert leftover_temps(out) == [] and not lock_file_of(out).exists()


def test_a_library_error_with_room_left_keeps_its_traceback(tmp_path, monkeypatch):
    """The same RuntimeError with free space is not blamed on the disk: a bug keeps its traceback."""
    out = tmp_path / "run"

    def broken_save(obj, f, *a, **k):
        raise RuntimeError("unexpected pos 1 vs 2")

    monkeypatch.setattr(trainer.torch, "save", broken_save)
    monkeypatch.setattr(dlm.io, "free_bytes", lambda path: 1 << 40)
    with pytest.raises(RuntimeError, match="unexpected pos"):
        cli.run_main(lambda argv: train(micro_model(), LLaDAPretrainLoss(), _batch, _config(out, max_steps=2),
                                        save_fn=_save), [])
    assert leftover_temps(out) == []


def test_a_full_disk_while_writing_the_model_names_the_folder(tmp_path, capsys):
    out = tmp_path / "run"

    def full(model, tokenizer, d):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(Path(d, "model.safetensors")))

    line = one_line_error(lambda argv: train(micro_model(), LLaDAPretrainLoss(), _batch,
                                             _config(out, max_steps=2), save_fn=full), [], capsys)
    assert line.endswith(f"{out / 'model'}: No space left on device"), line
    assert sorted(os.listdir(out)) == ["metrics.jsonl"]  # no half-written model/, no temp dir


# ------------------------------------------------------------------- --out that cannot be written
def _entry_points(tmp_path, out: str):
    from experiments.eval import gsm8k
    from experiments.reproduce.__main__ import main as reproduce
    from experiments.train import train_anyorder, train_bd3lm, train_llada

    return [(train_llada.main, ["--out", out]), (train_bd3lm.main, ["--out", out]),
            (train_anyorder.main, ["--task", "sudoku", "--objective", "ar", "--out", out]),
            (gsm8k.main, ["--out", out]), (reproduce, ["--out", out, "--limit", "2", "--only", "testbed_pure"])]


def test_an_out_that_is_a_file_under_a_file_or_read_only_is_one_line_before_any_compute(tmp_path, capsys,
                                                                                        monkeypatch):
    from experiments.eval import gsm8k
    from experiments.train import train_anyorder, train_bd3lm, train_llada

    monkeypatch.setattr(train_llada, "build_tokenizer", _not_built)
    monkeypatch.setattr(train_anyorder, "task_tokenizer", _not_built)
    monkeypatch.setattr(train_bd3lm, "load_model", _not_built)
    monkeypatch.setattr(gsm8k, "load_models", _not_built)
    afile = tmp_path / "afile"
    afile.write_text("mine")
    readonly = tmp_path / "ro"
    readonly.mkdir()
    real_access = os.access
    monkeypatch.setattr(cli.os, "access", lambda p, mode, **k: Path(p) != readonly and real_access(p, mode, **k))
    cases = [(str(afile), "is a file, not a directory"),
             (str(afile / "sub"), f"{afile} is a file, not a directory"),
             (str(readonly / "new"), f"{readonly} is not writable")]
    for out, expected in cases:
        for main, argv in _entry_points(tmp_path, out):
            line = one_line_error(main, argv, capsys)
            assert f"--out {out}: " in line and expected in line, line
    assert afile.read_text() == "mine" and os.listdir(readonly) == []


# --------------------------------------------------------------------- two reproduce runs
@pytest.mark.parametrize("flag", ["--out", "--work"])
def test_a_second_reproduce_into_one_folder_is_refused_up_front(tmp_path, capsys, flag):
    """The first run holds --out and --work: the second exits 2 naming the holder, starts no job and
    leaves the first run's log as it was."""
    from experiments.reproduce.__main__ import main as reproduce

    out, work = tmp_path / "out", tmp_path / "work"
    (work / "logs").mkdir(parents=True)
    out.mkdir()
    log = work / "logs" / "testbed_pure.log"
    log.write_text("the first run's log\n")
    held = out if flag == "--out" else work
    with holder(held, how="lock") as p:
        line = one_line_error(reproduce, ["--out", str(out), "--work", str(work), "--limit", "2",
                                          "--only", "testbed_pure"], capsys)
    assert f"{flag} {held}: " in line and f"locked by pid {p.pid} on host " in line and " since " in line
    assert log.read_text() == "the first run's log\n"
    assert sorted(os.listdir(out)) == [] and sorted(os.listdir(work / "logs")) == ["testbed_pure.log"]


# ------------------------------------------------------------------------------------ --data
def test_bad_utf8_in_data_names_the_file_and_line_and_creates_nothing(tmp_path, capsys):
    from experiments.eval import gsm8k

    data = tmp_path / "test.jsonl"
    data.write_bytes(b'{"question": "1+1?", "answer": "#### 2"}\n{"question": "caf\xe9", "answer": "#### 3"}\n')
    out = tmp_path / "new" / "out"
    line = one_line_error(gsm8k.main, ["--data", str(data), "--out", str(out)], capsys)
    assert f"{data}:2: not UTF-8 text (byte 0xe9 at column 18)" in line and line.count("--data") == 1
    assert not (tmp_path / "new").exists()


def test_the_hub_offline_is_one_line_and_leaves_no_out(tmp_path, capsys, monkeypatch):
    datasets = pytest.importorskip("datasets")
    from experiments.eval import gsm8k

    def offline(*a, **k):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    out = tmp_path / "out"
    line = one_line_error(gsm8k.main, ["--data", "gsm8k", "--out", str(out)], capsys)
    assert "--data gsm8k: openai/gsm8k[main/test]: cannot load it from the Hugging Face Hub" in line
    assert "ConnectionError" in line and "offline? pass a local JSONL" in line
    assert not out.exists()
    line = one_line_error(gsm8k.main, ["--data", "someone/some-set", "--out", str(out)], capsys)
    assert "--data must be 'arith', 'gsm8k' or an existing jsonl file, got 'someone/some-set'" in line
    assert not out.exists()


# ------------------------------------------------------------------- messages name the flags
@pytest.mark.parametrize("module, argv, expected", [
    ("train_llada", ["--steps", "10"], "error: --warmup 60 > --steps 10"),
    ("train_llada", ["--lr", "-1"], "error: --lr -1.0 outside (0.0, inf]"),
    ("train_llada", ["--ema", "1.5"], "error: --ema 1.5 outside [0.0, 1.0)"),
    ("train_bd3lm", ["--warmup", "400"], "error: --warmup 400 > --steps 300"),
    ("train_anyorder", ["--task", "sudoku", "--objective", "ar", "--warmup", "-1"],
     "error: --warmup must be an int >= 0, got -1"),
])
def test_training_config_errors_name_the_flags(tmp_path, capsys, monkeypatch, module, argv, expected):
    import importlib

    mod = importlib.import_module(f"experiments.train.{module}")
    out = tmp_path / "out"
    line = one_line_error(mod.main, [*argv, "--out", str(out)], capsys)
    assert line.endswith(expected) and "TrainConfig" not in line and "max_steps" not in line, line
    assert not out.exists()


def test_in_flags_comes_from_the_parser():
    p = cli.parser("x", "doc")
    cli.add_train_args(p, steps=1, lr=1.0, warmup=0)
    names = {f: cli.flags_of(p)[d] for f, d in (("warmup_steps", "warmup"), ("max_steps", "steps"))}
    assert cli.in_flags("TrainConfig.warmup_steps=60 > max_steps=10", names) == "--warmup 60 > --steps 10"
    assert cli.in_flags("the steps of max_steps", names) == "the steps of max_steps"  # prose stays


@pytest.mark.parametrize("extra, expected", [
    (["--threshold", "2"], "--strategies baseline_semiar: --threshold (an option of rule 'threshold') must be in "
                           "(0, 1], got 2.0"),
    (["--gen-length", "100"], "--strategies baseline_semiar: --gen-length 100 must be divisible by --block-length 32"),
])
def test_a_strategy_message_names_the_strategy_asked_for_and_the_flag(tmp_path, capsys, extra, expected):
    from experiments.eval import gsm8k

    out = tmp_path / "out"
    line = one_line_error(gsm8k.main, ["--strategies", "baseline_semiar", *extra, "--out", str(out)], capsys)
    assert line.endswith(expected) and "fastdllm" not in line, line
    assert not out.exists()
    line = one_line_error(gsm8k.main, ["--strategies", "table1", *extra, "--out", str(out)], capsys)
    assert "--strategies table1: sampler " in line


# ----------------------------------------------------------------------- the harness's config.json
@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "\xff"])
def test_a_corrupt_config_json_of_a_results_folder_is_one_line_naming_it(ckpt, tmp_path, capsys, text):  # noqa: F811
    from experiments.eval import gsm8k
    from test_gsm8k_harness import argv

    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_bytes(text.encode("latin-1"))
    line = one_line_error(gsm8k.main, argv(ckpt, out), capsys)
    assert f"{out / 'config.json'}: " in line and "delete it" in line
    assert sorted(os.listdir(out)) == ["config.json"]


# ---------------------------------------------------------------------- leftovers of killed runs
def test_leftovers_of_killed_runs_are_cleaned_at_the_next_start(tmp_path, capsys):
    """Temp files of every writer's pattern and lock files no process holds are removed when a run
    takes the folder; a lock another process holds, and the user's files, stay."""
    out = tmp_path / "out"
    out.mkdir()
    stale = out / "baseline_semiar.rank0.jsonl.lock"
    stale.write_text(json.dumps({"pid": 999999999, "host": "h", "since": "then"}))
    for name in (".ablation.md.tmp-abc", ".pareto.png.tmp-123.png", ".table.md.old-x"):
        (out / name).write_text("half")
    (out / "notes.txt").write_text("mine")
    live = out / "live.jsonl"
    with holder(live, how="lock"):
        with cli.writing_to("--out", out):
            assert sorted(os.listdir(out)) == [".lock", "live.jsonl.lock", "notes.txt"]
        assert lock_file_of(live).exists()
    assert "removed what an interrupted run left" in capsys.readouterr().err
    assert sorted(os.listdir(out)) == ["notes.txt"]


def test_remove_stale_locks_keeps_the_ones_held_here(tmp_path):
    (tmp_path / "a.jsonl.lock").write_text("")
    with results_lock(tmp_path / "b.jsonl"):
        assert remove_stale_locks(tmp_path) == ["a.jsonl.lock"]
        assert os.listdir(tmp_path) == ["b.jsonl.lock"]


def test_training_removes_stale_locks_of_a_killed_run(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "x.jsonl.lock").write_text("{}")
    train(micro_model(), LLaDAPretrainLoss(), _batch, _config(out, max_steps=2), save_fn=_save)
    assert "x.jsonl.lock" in capsys.readouterr().out
    assert sorted(os.listdir(out)) == ["metrics.jsonl", "model", "trainer_state.pt"]


@pytest.mark.parametrize("module, argv", [
    ("experiments.perplexity.__main__", ["train", "--out", "{f}"]),
    ("experiments.perplexity.__main__", ["train", "--work", "{f}/w"]),
    ("experiments.cli.trace", ["--out", "{f}/x.png"]),
    ("experiments.eval.anyorder", ["--out", "{f}"]),
    ("experiments.eval.drift", ["--out-dir", "{f}"]),
    ("experiments.bench.bench_load", ["--out", "{f}"]),
    ("experiments.bench.bench_fastdllm", ["--out", "{f}"]),
    ("research.testbed", ["--out", "{f}"]),
    ("research.dream_rules", ["--out", "{f}"]),
    ("research.bd3_blocks", ["--out", "{f}/sub"]),
    ("research.chain_probe", ["--out", "{f}/x.json"]),
])
def test_every_output_flag_is_checked_by_the_shared_check(tmp_path, capsys, module, argv):
    import importlib

    afile = tmp_path / "afile"
    afile.write_text("mine")
    argv = [a.format(f=afile) for a in argv]
    line = one_line_error(importlib.import_module(module).main, argv, capsys)
    flag = next(a for a in argv if a.startswith("--"))
    assert f"{flag} {afile}" in line and "is a file, not a directory" in line, line
    assert afile.read_text() == "mine"
