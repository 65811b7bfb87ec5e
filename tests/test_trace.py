"""Denoising traces (dlm.trace, experiments/trace.py) and ``python -m dlm.generate --stream``."""

from __future__ import annotations

import pytest
import torch

import dlm.generate as cli
import fastdllm
from dlm.generate import AnswerStream, Strategy, run_strategy
from dlm.trace import block_steps, replay_lines, step_states
from experiments import trace
from tiny import random_prompts, tiny_model

G, L = 12, 4
STRATEGIES = [
    Strategy("baseline", G, L, 6),
    Strategy("baseline", G, G, 6),
    Strategy("fastdllm", G, L, 6),
    Strategy("fastdllm", G, L, 12, cache="prefix"),
    Strategy("fastdllm", G, L, cache="dual", threshold=0.2),
    Strategy("bd3lm", G, L, 6),
]


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def ids_for(model):
    return random_prompts(1, 5, model.config, seed=2)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.label + f"-L{s.block_length}")
def test_commit_steps_are_a_valid_trace(model, strategy):
    out = run_strategy(model, ids_for(model), strategy)
    answer, cs = out.sequences[0, 5:], out.commit_step[0]
    bs = block_steps(cs, strategy.block_length)  # every column committed, blocks in order
    assert int(cs.max()) + 1 == out.stats.steps
    if strategy.threshold is None:  # top-k: block b owns steps [b s, (b + 1) s)
        s = strategy.total_steps * strategy.block_length // G
        assert bs.first.tolist() == [b * s for b in range(G // strategy.block_length)]
        assert bs.last.tolist() == [(b + 1) * s - 1 for b in range(G // strategy.block_length)]
    states = step_states(answer, cs, model.config.mask_token_id)
    masked = (states == model.config.mask_token_id).sum(-1)
    assert bool((masked[1:] < masked[:-1]).all()) and int(masked[-1]) == 0  # every step commits
    assert torch.equal(states[-1], answer)
    lines = replay_lines(states, model.config.mask_token_id)
    assert len(lines) == out.stats.steps and "_" in lines[0] and "_" not in lines[-1]


@pytest.mark.parametrize("cache", [None, "prefix", "dual"])
def test_each_column_committed_once_at_its_commit_step(model, cache):
    seen = torch.zeros(1, G, dtype=torch.long)
    when = torch.full((1, G), -1)

    def count(v):
        seen[:, v.lo - 5:v.hi - 5] += v.commit.long()
        when[:, v.lo - 5:v.hi - 5] = torch.where(v.commit, v.global_step, when[:, v.lo - 5:v.hi - 5])

    out = fastdllm.generate(model, ids_for(model), gen_length=G, block_length=L, steps=6, cache=cache,
                            callback=count)
    assert bool((seen == 1).all()) and torch.equal(when, out.commit_step)


def test_callback_does_not_change_the_output(model):
    kw = dict(gen_length=G, block_length=L, cache="dual", threshold=0.3)
    a = fastdllm.generate(model, ids_for(model), **kw)
    b = fastdllm.generate(model, ids_for(model), callback=lambda v: None, **kw)
    assert torch.equal(a.sequences, b.sequences) and torch.equal(a.commit_step, b.commit_step)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.label + f"-L{s.block_length}")
def test_stream_blocks_equal_final_answer(model, strategy):
    ids = ids_for(model)
    blocks = []
    out = run_strategy(model, ids, strategy, on_block=lambda b, t: blocks.append((b, t[0].tolist())))
    plain = run_strategy(model, ids, strategy)  # baseline: dlm.sampling.generate itself
    assert torch.equal(out.sequences, plain.sequences)
    answer = out.sequences[0, 5:].tolist()
    nb = G // strategy.block_length
    expect = range(nb - 1) if strategy.name == "bd3lm" else range(nb)  # bd3lm: last block at the end
    assert [b for b, _ in blocks] == list(expect)
    assert sum((t for _, t in blocks), []) == answer[: len(expect) * strategy.block_length]
    pieces = []
    stream = AnswerStream(None, model.config.eos_token_id, pieces.append)
    for _, t in blocks:
        stream.push(t)
    stream.finish(answer)
    n = int(out.stats.tokens_until_eos[0])
    assert "".join(pieces).split() == [str(i) for i in answer[:n]]


def test_answer_stream_eos_and_tokenizer():
    pieces = []
    s = AnswerStream(None, 2, pieces.append)
    s.push([5, 6]), s.push([7, 2, 9]), s.push([8]), s.finish([5, 6, 7, 2, 9, 8])
    assert pieces == [" 5 6", " 7 2"]
    from dlm.tokenizer import build_tokenizer

    tok = build_tokenizer(["apples", "Ann", "has"])
    answer = tok.encode(" Ann has 12 apples .", add_special_tokens=False)
    pieces = []
    s = AnswerStream(tok, tok.eos_token_id, pieces.append)
    for i in range(0, len(answer), 2):
        s.push(answer[i:i + 2])
    s.finish(answer)
    assert "".join(pieces) == tok.decode(answer, skip_special_tokens=True) == " Ann has 12 apples ."


@pytest.mark.parametrize("strategy", ["baseline", "fastdllm", "bd3lm"])
def test_cli_stream_matches_plain_run(strategy, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(cli, "DEFAULT_MODEL", tmp_path / "missing")  # tiny random model
    argv = ["--strategy", strategy, "--gen-length", "16", "--block-length", "4", "--prompt", "hi there",
            "--device", "cpu"] + (["--cache", "dual"] if strategy == "fastdllm" else [])
    cli.main(argv)
    plain = capsys.readouterr().out.splitlines()
    cli.main(argv + ["--stream"])
    streamed = capsys.readouterr().out.splitlines()
    text = [line for line in plain if not line.startswith("[")]
    assert text and text[-1].startswith("Answer:") and len(text[-1]) > len("Answer:")
    assert [line for line in streamed if not line.startswith("[")] == text


def test_trace_cli(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cli, "DEFAULT_MODEL", tmp_path / "missing")
    png = tmp_path / "t.png"
    res = trace.main(["--strategy", "fastdllm", "--cache", "prefix", "--gen-length", "8", "--block-length",
                      "4", "--prompt", "abc", "--replay", "--out", str(png)])
    lines = [l for l in capsys.readouterr().out.splitlines() if " | " in l]
    assert png.stat().st_size > 0 and len(lines) == res["output"].stats.steps == 8
    assert lines[0].count("_") == 7 and "_" not in lines[-1]
    txt = tmp_path / "t.txt"  # --replay-out writes the same replay without printing it
    trace.main(["--strategy", "fastdllm", "--cache", "prefix", "--gen-length", "8", "--block-length",
                "4", "--prompt", "abc", "--out", str(png), "--replay-out", str(txt)])
    assert not [l for l in capsys.readouterr().out.splitlines() if " | " in l]
    assert txt.read_text().splitlines() == ["# abc", *lines]


def test_bad_inputs(model, monkeypatch, tmp_path):
    for kw in (dict(name="ar"), dict(name="baseline", cache="dual"), dict(gen_length=10, block_length=4),
               dict(name="bd3lm", threshold=0.9), dict(name="baseline", stop_at_eos=True),
               dict(gen_length=8, block_length=4, steps=3)):
        with pytest.raises(ValueError):
            Strategy(**kw)
    with pytest.raises(ValueError, match="commit_step"):
        step_states(torch.zeros(4, dtype=torch.long), torch.zeros(3, dtype=torch.long), 0)
    with pytest.raises(ValueError, match="never committed"):
        block_steps(torch.tensor([0, 1, -1, 2]), 2)
    with pytest.raises(ValueError, match="previous block"):
        block_steps(torch.tensor([0, 2, 1, 3]), 2)
    monkeypatch.setattr(cli, "DEFAULT_MODEL", tmp_path / "missing")
    for argv in (["--delay", "-1"], ["--cache", "dual"], ["--gen-length", "10", "--block-length", "4"]):
        with pytest.raises(SystemExit):
            trace.main(argv + ["--out", str(tmp_path / "x.png")])
    with pytest.raises(SystemExit):
        cli.main(["--strategy", "bd3lm", "--threshold", "0.9"])
