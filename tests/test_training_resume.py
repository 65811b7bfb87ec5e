"""Resuming a training run cannot silently change how it trains: the recipe (data, objective,
model shape, optimizer, schedule) must match the checkpoint's or the resume is refused by name;
``--force-recipe`` continues and records the change. A rerun never logs a step twice, the temp
files of a killed run are removed, and written files get ordinary (umask) permissions."""

import json
import os
import stat
from pathlib import Path

import pytest
import torch

from dlm.objectives import LLaDAPretrainLoss
from tasks.sft_data import SFTBatches
import dlm.train as trainer
from dlm.train import TrainConfig, train
from tiny import micro_model

LLADA_FLAGS = ["--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--max-seq-len", "512",
               "--steps", "4", "--batch-size", "2", "--max-value", "9", "--response-lengths", "32",
               "--response-probs", "1", "--fewshot-prob", "1", "--shots-per-batch", "--warmup", "1",
               "--weighting", "uniform", "--eval-every", "0", "--save-every", "2"]


def _set(flags: list, **changes) -> list:
    """``flags`` with ``--name value`` pairs replaced (``name`` with underscores)."""
    out = list(flags)
    for name, value in changes.items():
        flag = "--" + name.replace("_", "-")
        values = [str(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
        if flag in out:
            i = out.index(flag) + 1
            j = i
            while j < len(out) and not out[j].startswith("--"):
                j += 1
            out[i:j] = values
        else:
            out += [flag, *values]
    return out


def _crashed_llada_run(out: Path, monkeypatch, crash_at: int = 2) -> list:
    """Run the LLaDA script until the batch of step ``crash_at`` (checkpoint at step 2 of 4)."""
    from experiments.train import train_llada

    class Crashing(SFTBatches):
        def __call__(self, step, generator):
            if step == crash_at:
                raise RuntimeError("simulated kill")
            return super().__call__(step, generator)

    monkeypatch.setattr(train_llada, "SFTBatches", Crashing)
    with pytest.raises(RuntimeError, match="simulated kill"):
        train_llada.main(["--out", str(out), *LLADA_FLAGS])
    monkeypatch.setattr(train_llada, "SFTBatches", SFTBatches)
    assert torch.load(out / "trainer_state.pt", weights_only=True)["step"] == 2
    return LLADA_FLAGS


@pytest.mark.slow  # three short runs of the training script (~3 s)
def test_llada_resume_refuses_a_changed_recipe(tmp_path, monkeypatch, capsys):
    from experiments.train import train_llada

    out = tmp_path / "run"
    flags = _crashed_llada_run(out, monkeypatch)
    built = []
    monkeypatch.setattr(train_llada, "SFTBatches", lambda tok, cfg: built.append(cfg) or SFTBatches(tok, cfg))
    cases = [
        (dict(fewshot_prob=0.5), r"--fewshot-prob: checkpoint 1\.0, now 0\.5"),
        (dict(response_lengths=[32, 64], response_probs=[0.5, 0.5]),
         r"--response-lengths: checkpoint \[32\], now \[32, 64\]"),
        (dict(suffix_prob=0.5), r"--suffix-prob: checkpoint 0\.0, now 0\.5"),
        (dict(max_value=5), r"--max-value: checkpoint 9, now 5"),
        (dict(d_model=32), r"--d-model: checkpoint 16, now 32"),
        (dict(steps=6), r"--steps: checkpoint 4, now 6"),
        (dict(lr=1e-2), r"--lr: checkpoint 0\.002, now 0\.01"),
    ]
    for changes, match in cases:
        with pytest.raises(ValueError, match=match) as err:
            train_llada.main(["--out", str(out), *_set(flags, **changes)])
        assert "--force-recipe" in str(err.value)
    assert built == []  # refused before the data (or the model) was built
    # evaluation and checkpoint cadence may change: the run resumes and finishes
    train_llada.main(["--out", str(out), *_set(flags, eval_every=3, save_every=4)])
    assert torch.load(out / "trainer_state.pt", weights_only=True)["step"] == 4
    extra = json.loads((out / "model" / "config.json").read_text())["extra"]
    assert extra["recipe_changes"] == [] and extra["args"]["force_recipe"] is False


@pytest.mark.slow  # two short runs of the training script (~2 s)
def test_llada_force_recipe_continues_and_records_the_change(tmp_path, monkeypatch):
    from experiments.train import train_llada

    out = tmp_path / "run"
    flags = _crashed_llada_run(out, monkeypatch)
    train_llada.main(["--out", str(out), *_set(flags, fewshot_prob=0.5), "--force-recipe"])
    extra = json.loads((out / "model" / "config.json").read_text())["extra"]
    assert extra["args"]["force_recipe"] is True and extra["args"]["fewshot_prob"] == 0.5
    assert extra["recipe_changes"] == [{"step": 2, "changed": {"--fewshot-prob": [1.0, 0.5]}}]
    state = torch.load(out / "trainer_state.pt", weights_only=True)
    assert state["step"] == 4 and state["recipe"]["--fewshot-prob"] == 0.5
    assert state["recipe_changes"] == extra["recipe_changes"]


# ------------------------------------------------------------------------------ dlm.train level


def _batch(step, g):
    return {"input_ids": torch.randint(0, 15, (4, 8), generator=g)}


def _config(out, **kw):
    return TrainConfig(**{**dict(out_dir=str(out), max_steps=4, batch_size=4, lr=1e-2, log_every=1,
                                 save_every=2), **kw})


def _save(model, tokenizer, d):
    torch.save(model.state_dict(), os.path.join(d, "weights.pt"))


def _crash_at(k):
    def batch(step, g):
        if step == k:
            raise RuntimeError("simulated kill")
        return _batch(step, g)
    return batch


def test_train_refuses_changed_recipe_and_config_naming_both_values(tmp_path):
    with pytest.raises(RuntimeError, match="simulated kill"):
        train(micro_model(), LLaDAPretrainLoss(), _crash_at(2), _config(tmp_path), save_fn=_save,
              recipe={"data": "a", "mask": 0.5})
    with pytest.raises(ValueError, match=r"data: checkpoint 'a', now 'b'") as err:
        trainer.check_resume(_config(tmp_path), {"data": "b", "mask": 0.5})
    assert "force_recipe" in str(err.value)
    with pytest.raises(ValueError, match=r"TrainConfig\.weight_decay: checkpoint 0\.1, now 0\.0"):
        train(micro_model(), LLaDAPretrainLoss(), _batch, _config(tmp_path, weight_decay=0.0),
              save_fn=_save, recipe={"data": "a", "mask": 0.5})
    with pytest.raises(ValueError, match=r"extra: checkpoint <absent>, now 1"):
        trainer.check_resume(_config(tmp_path), {"data": "a", "mask": 0.5, "extra": 1})
    assert trainer.check_resume(_config(tmp_path), {"data": "a", "mask": 0.5}) == []
    assert trainer.check_resume(_config(tmp_path / "fresh"), {"anything": 1}) == []
    # forced: the change is returned, stored with the checkpoint, and the new values are used
    forced = [{"step": 2, "changed": {"TrainConfig.weight_decay": [0.1, 0.0], "data": ["a", "b"]}}]
    assert trainer.check_resume(_config(tmp_path, weight_decay=0.0), {"data": "b", "mask": 0.5},
                        force_recipe=True) == forced
    model = micro_model()
    train(model, LLaDAPretrainLoss(), _batch, _config(tmp_path, weight_decay=0.0), save_fn=_save,
          recipe={"data": "b", "mask": 0.5}, force_recipe=True)
    state = torch.load(tmp_path / "trainer_state.pt", weights_only=True)
    assert state["recipe_changes"] == forced and state["recipe"] == {"data": "b", "mask": 0.5}
    assert [g["weight_decay"] for g in state["optimizer"]["param_groups"]] == [0.0, 0.0]


def test_train_resume_with_another_model_shape_is_a_value_error(tmp_path):
    train(micro_model(), LLaDAPretrainLoss(), _batch, _config(tmp_path, max_steps=2), save_fn=_save)
    from tiny import micro_config
    from dlm.model import Transformer

    wider = Transformer(micro_config(d_model=2 * micro_config().d_model))
    with pytest.raises(ValueError, match=r"embed\.weight.*shape"):
        train(wider, LLaDAPretrainLoss(), _batch, _config(tmp_path, max_steps=2), save_fn=_save)


def _steps(path):
    return [json.loads(line)["step"] for line in open(path)]


def test_rerun_after_a_kill_before_the_first_checkpoint_logs_each_step_once(tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="simulated kill"):
        train(micro_model(), LLaDAPretrainLoss(), _crash_at(3), _config(out, save_every=0), save_fn=_save)
    assert _steps(out / "metrics.jsonl") == [1, 2, 3] and not (out / "trainer_state.pt").exists()
    train(micro_model(), LLaDAPretrainLoss(), _batch, _config(out, save_every=0), save_fn=_save)
    assert _steps(out / "metrics.jsonl") == [1, 2, 3, 4]


def test_resume_drops_later_and_torn_metrics_lines(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="simulated kill"):
        train(micro_model(), LLaDAPretrainLoss(), _crash_at(3), _config(out), save_fn=_save)
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "lo')  # a line cut short by the kill
    train(micro_model(), LLaDAPretrainLoss(), _batch, _config(out), save_fn=_save)
    assert _steps(out / "metrics.jsonl") == [1, 2, 3, 4]


def test_temp_leftovers_of_a_killed_run_are_removed_at_start(tmp_path, capsys):
    out = tmp_path / "run"
    train(micro_model(), LLaDAPretrainLoss(), _batch, _config(out, max_steps=2), save_fn=_save)
    (out / "tmp-abc123").mkdir()
    (out / "tmp-abc123" / "weights.pt").write_bytes(b"half")
    (out / ".tmp-xyz.pt").write_bytes(b"half")
    (out / ".model.tmp-q1w2").mkdir()
    (out / "notes.txt").write_text("mine")
    capsys.readouterr()
    train(micro_model(), LLaDAPretrainLoss(), _batch, _config(out, max_steps=2), save_fn=_save)
    printed = capsys.readouterr().out
    assert "tmp-abc123" in printed and ".tmp-xyz.pt" in printed and ".model.tmp-q1w2" in printed
    assert sorted(os.listdir(out)) == ["metrics.jsonl", "model", "notes.txt", "trainer_state.pt"]


# ------------------------------------------------------------------------------ file modes


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_written_files_follow_the_umask(tmp_path, umask):
    from dlm.checkpoints import save_model
    from harness.results import atomic_write_text
    from tiny import tiny_model

    old = os.umask(umask)
    try:
        out = tmp_path / "run"
        train(micro_model(), LLaDAPretrainLoss(), _batch, _config(out, max_steps=2))  # default save_fn
        saved = save_model(tiny_model(), None, tmp_path / "ckpt")
        atomic_write_text(tmp_path / "results" / "table.md", "| a |\n")
    finally:
        os.umask(old)
    file_mode, dir_mode = 0o666 & ~umask, 0o777 & ~umask
    for f in (out / "trainer_state.pt", out / "metrics.jsonl", out / "model" / "model.safetensors",
              out / "model" / "config.json", saved / "model.safetensors", saved / "config.json",
              tmp_path / "results" / "table.md"):
        assert _mode(f) == file_mode, (f, oct(_mode(f)))
    for d in (out, out / "model", saved):
        assert _mode(d) == dir_mode, (d, oct(_mode(d)))


@pytest.mark.slow  # two short BD3-LM fine-tunes of the shipped 0.9M-parameter checkpoint (~3 s)
def test_bd3lm_resume_refuses_a_changed_recipe_and_records_a_forced_one(tmp_path, monkeypatch):
    from experiments.train import train_bd3lm

    init = Path(train_bd3lm.DEFAULT_INIT)
    if not (init / "config.json").is_file():
        pytest.skip(f"no shipped checkpoint at {init}")
    out = tmp_path / "bd3"
    flags = ["--out", str(out), "--block-size", "16", "--response-length", "16", "--steps", "1",
             "--batch-size", "2", "--warmup", "0", "--fewshot-prob", "0", "--eval-every", "0"]
    train_bd3lm.main(flags)
    loads = []
    monkeypatch.setattr(train_bd3lm, "load_model", lambda *a, **k: loads.append(a) or pytest.fail("loaded"))
    for changes, match in [(dict(fewshot_prob=0.5), r"--fewshot-prob: checkpoint 0\.0, now 0\.5"),
                           (dict(block_size=8), r"--block-size: checkpoint 16, now 8"),
                           (dict(omega=0.5), r"--omega: checkpoint 1\.0, now 0\.5")]:
        with pytest.raises(ValueError, match=match):
            train_bd3lm.main(_set(flags, **changes))
    assert loads == []  # refused before the model was loaded
    monkeypatch.undo()
    train_bd3lm.main(_set(flags, steps=2, fewshot_prob=0.5) + ["--force-recipe"])
    extra = json.loads((out / "model" / "config.json").read_text())["extra"]
    assert extra["args"]["force_recipe"] is True
    assert extra["recipe_changes"] == [{"step": 1, "changed": {
        "TrainConfig.max_steps": [1, 2], "--fewshot-prob": [0.0, 0.5], "--steps": [1, 2]}}]
