"""BD3LM wrapper (train / validate / save / load) and the LM1B / OWT data pipelines."""

from __future__ import annotations

import json

import pytest
import torch

from bd3lm import BD3LM, ClipSchedule
from bd3lm.data import build_dataset, iterate_batches, load_tokenizer, wrap_chunks
from tiny import random_prompts, tiny_model


def test_train_validate_save_load(tmp_path):
    from dlm.train import TrainConfig, train

    model = tiny_model()
    bd3 = BD3LM(model, block_size=4, schedule=ClipSchedule(0.0, 1.0))
    data = random_prompts(8, 16, model.config, seed=1)
    val = [{"input_ids": data[:4]}]
    cfg = TrainConfig(out_dir=str(tmp_path / "run"), max_steps=2, batch_size=4, eval_every=2, log_every=1)
    result = train(model, bd3.objective, lambda step, g: {"input_ids": data[4:]}, cfg,
                   eval_fn=bd3.eval_fn(val, grid=[(0.0, 1.0), (0.3, 0.8)]), save_fn=bd3.save_fn)
    ev = result.eval_metrics
    assert ev["val_ppl"] > 1 and (ev["clip_beta"], ev["clip_omega"]) == (bd3.schedule.beta, bd3.schedule.omega)
    saved = tmp_path / "run" / "model"
    meta = json.loads((saved / "config.json").read_text())["extra"]["bd3lm"]
    assert meta["block_size"] == 4 and (meta["beta"], meta["omega"]) == (bd3.schedule.beta, bd3.schedule.omega)
    loaded, _ = BD3LM.load(saved, dtype=torch.float64)
    assert loaded.block_size == 4 and loaded.schedule == bd3.schedule and loaded.align == "absolute"
    g = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    assert abs(loaded.perplexity(val, g()).nelbo - bd3.perplexity(val, g()).nelbo) < 1e-9
    out = loaded.sample(torch.tensor([[loaded.config.bos_token_id]]), max_length=12)
    assert out.sequences.shape == (1, 12)


def test_bd3lm_bad_input():
    model = tiny_model()
    with pytest.raises(ValueError, match="block_size"):
        BD3LM(model, block_size=0)
    with pytest.raises(ValueError, match="max_seq_len"):
        BD3LM(model, block_size=model.config.max_seq_len + 1)
    with pytest.raises(TypeError, match="Transformer"):
        BD3LM(object(), block_size=4)
    with pytest.raises(ValueError, match="align"):
        BD3LM(model, block_size=4, align="left")


def test_lm1b_pipeline(shared_data):
    path = shared_data("lm1b-sample/1b_benchmark.dev.tokens")
    tok_dir = shared_data("tokenizers/bert-base-uncased")
    chunks, ids = build_dataset(path, "lm1b", tokenizer=str(tok_dir), max_lines=60)
    assert chunks.shape[1] == 128 and chunks.shape[0] >= 5
    assert (ids.bos, ids.eos, ids.mask) == (101, 102, 103) and ids.vocab_size == 30522
    assert chunks[0, 0] == ids.bos and (chunks == ids.eos).any() and not (chunks == ids.mask).any()
    batches = list(iterate_batches(chunks, 4))
    assert batches[0]["input_ids"].shape == (4, 128)


def test_owt_style_pipeline_and_empty(tmp_path, shared_data):
    tok = load_tokenizer(str(shared_data("tokenizers/gpt2")))
    texts = [f"Document number {i} talks about block diffusion language models." for i in range(30)]
    chunks, ids = build_dataset(texts, "owt", tokenizer=tok, seq_len=32)
    assert ids.mask == 50257 and ids.vocab_size == 50258 and ids.bos == ids.eos == 50256
    assert (chunks[:, 0] == ids.bos).all() and (chunks[:, -1] == ids.eos).all()
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    with pytest.raises(ValueError, match="empty"):
        build_dataset(empty, "owt", tokenizer=tok, seq_len=32)
    with pytest.raises(ValueError, match="empty"):
        wrap_chunks([[1, 2]], 8)
    with pytest.raises(ValueError, match="style"):
        build_dataset(texts, "c4", tokenizer=tok)
