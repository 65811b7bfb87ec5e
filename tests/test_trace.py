"""Denoising traces (dlm.trace, experiments/cli/trace.py) and ``python -m experiments.cli.generate --stream``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import experiments.cli.generate as cli
import fastdllm
from dlm import spec
from dlm.llada import generate
from dlm.spec import Sampler
from dlm.trace import block_steps, replay_lines, step_states
from experiments.cli import trace
from experiments.cli.generate import AnswerStream, FinalBlocks, label
from tiny import random_prompts, tiny_model

REPO = Path(__file__).resolve().parents[1]
G, L = 12, 4
SAMPLERS = [
    Sampler.of("baseline", gen_length=G, block_length=L, steps=6),
    Sampler.of("baseline", gen_length=G, block_length=G, steps=6),
    Sampler.of("fastdllm", gen_length=G, block_length=L, steps=6),
    Sampler.of("fastdllm", policy="prefix", gen_length=G, block_length=L, steps=12),
    Sampler.of("fastdllm", policy="dual", rule="threshold", gen_length=G, block_length=L, threshold=0.2),
    Sampler.of("bd3lm", policy="exact", gen_length=G, block_length=L, steps=6, top_p=1.0),
    Sampler.of("exact_threshold", policy="exact", rule="threshold", gen_length=G, block_length=L, threshold=0.2,
               top_p=1.0),
]


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def ids_for(model):
    return random_prompts(1, 5, model.config, seed=2)


@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda s: label(s) + f"-L{s.block}")
def test_commit_steps_are_a_valid_trace(model, sampler):
    out = spec.generate(model, ids_for(model), None, sampler)
    answer, cs = out.sequences[0, 5:], out.commit_step[0]
    bs = block_steps(cs, sampler.block)  # every column committed, blocks in order
    assert int(cs.max()) + 1 == out.stats.steps
    if sampler.rule == "topk":  # top-k: block b owns steps [b s, (b + 1) s)
        s = sampler.total_steps * sampler.block // G
        assert bs.first.tolist() == [b * s for b in range(G // sampler.block)]
        assert bs.last.tolist() == [(b + 1) * s - 1 for b in range(G // sampler.block)]
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


@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda s: label(s) + f"-L{s.block}")
def test_stream_blocks_equal_final_answer(model, sampler):
    ids = ids_for(model)
    blocks = []
    final = FinalBlocks(model.config.mask_token_id, 5, lambda b, t: blocks.append((b, t[0].tolist())))
    out = spec.generate(model, ids, None, sampler, callback=final)
    plain = spec.generate(model, ids, None, sampler)
    assert torch.equal(out.sequences, plain.sequences)
    if sampler.name == "baseline":  # the baseline is dlm.llada.generate itself
        ref = generate(model, ids, gen_length=G, steps=sampler.total_steps, block_length=sampler.block)
        assert torch.equal(out.sequences, ref.sequences)
    answer = out.sequences[0, 5:].tolist()
    expect = range(G // sampler.block)  # every block, the last one included, once it is final
    assert [b for b, _ in blocks] == list(expect)
    assert sum((t for _, t in blocks), []) == answer
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
    from tasks.tokenizer import build_tokenizer

    tok = build_tokenizer(["apples", "Ann", "has"])
    answer = tok.encode(" Ann has 12 apples .", add_special_tokens=False)
    pieces = []
    s = AnswerStream(tok, tok.eos_token_id, pieces.append)
    for i in range(0, len(answer), 2):
        s.push(answer[i:i + 2])
    s.finish(answer)
    assert "".join(pieces) == tok.decode(answer, skip_special_tokens=True) == " Ann has 12 apples ."


def _no_checkpoints(monkeypatch, tmp_path):
    """The CLI falls back to the tiny random model."""
    monkeypatch.setattr(cli, "DEFAULT_MODEL", tmp_path / "missing")
    monkeypatch.setattr(cli, "DEFAULT_BD3_MODEL", tmp_path / "missing")


@pytest.mark.parametrize("flags", [["--policy", "none"], ["--policy", "dual"],
                                   ["--policy", "exact"], ["--policy", "prefix", "--threshold", "0.5"],
                                   ["--policy", "exact", "--rule", "threshold", "--stop-at-eos"]],
                         ids=" ".join)
def test_cli_stream_matches_plain_run(flags, capsys, monkeypatch, tmp_path):
    _no_checkpoints(monkeypatch, tmp_path)
    argv = flags + ["--gen-length", "16", "--block-length", "4", "--prompt", "hi there", "--device", "cpu"]
    cli.main(argv)
    plain = capsys.readouterr().out.splitlines()
    cli.main(argv + ["--stream"])
    streamed = capsys.readouterr().out.splitlines()
    text = [line for line in plain if not line.startswith("[")]
    assert text and text[-1].startswith("Answer:") and len(text[-1]) > len("Answer:")
    assert [line for line in streamed if not line.startswith("[")] == text


def test_cli_bd3lm_takes_the_block_size_from_the_model(capsys, tmp_path):
    from bd3lm import BD3Config, save_bd3
    from tasks.tokenizer import build_tokenizer

    tok = build_tokenizer()
    model, _ = cli._tiny_random_model()
    path = save_bd3(model, tok, tmp_path / "bd3", BD3Config(block_size=8, align="prompt"))
    p = cli.parser()
    run = cli.setup(p, p.parse_args(["--policy", "exact", "--model", str(path), "--gen-length", "16"]))
    s = run.strategy
    policy, _, proposal = s.components("llada")
    assert (s.policy, s.block, policy.block_size, policy.align, proposal.top_p) == ("exact", 8, 8, "prompt", 1.0)
    cli.main(["--policy", "exact", "--model", str(path), "--gen-length", "16", "--stream"])
    assert "Answer:" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # --block-length must be the model's
        cli.main(["--policy", "exact", "--model", str(path), "--gen-length", "16", "--block-length", "4"])


@pytest.mark.slow
def test_cli_stream_subprocess_on_the_embedded_checkpoint():
    assert cli.DEFAULT_MODEL.is_dir()
    res = subprocess.run([sys.executable, "-m", "experiments.cli.generate", "--stream", "--threads", "1"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    answer = next(line for line in lines if line.startswith("Answer:"))
    assert "####" in res.stdout and len(answer) > len("Answer:")
    assert lines[-1].startswith("[baseline:") and "forwards" in lines[-1]


def test_trace_cli(monkeypatch, tmp_path, capsys):
    _no_checkpoints(monkeypatch, tmp_path)
    png = tmp_path / "t.png"
    res = trace.main(["--policy", "prefix", "--gen-length", "8", "--block-length",
                      "4", "--prompt", "abc", "--replay", "--out", str(png)])
    lines = [l for l in capsys.readouterr().out.splitlines() if " | " in l]
    assert png.stat().st_size > 0 and len(lines) == res["output"].stats.steps == 8
    assert lines[0].count("_") == 7 and "_" not in lines[-1]
    txt = tmp_path / "t.txt"  # --replay-out writes the same replay without printing it
    trace.main(["--policy", "prefix", "--gen-length", "8", "--block-length",
                "4", "--prompt", "abc", "--out", str(png), "--replay-out", str(txt)])
    assert not [l for l in capsys.readouterr().out.splitlines() if " | " in l]
    assert txt.read_text().splitlines() == ["# abc", *lines]


def test_bad_inputs(model, monkeypatch, tmp_path):
    for kw in (dict(policy="ar"), dict(rule="ar"), dict(gen_length=10, block_length=4),
               dict(rule="topk", threshold=0.5), dict(gen_length=8, block_length=4, steps=3),
               dict(policy="exact", block_length=None)):
        with pytest.raises(ValueError):
            Sampler.of(**kw)
    with pytest.raises(ValueError, match="commit_step"):
        step_states(torch.zeros(4, dtype=torch.long), torch.zeros(3, dtype=torch.long), 0)
    with pytest.raises(ValueError, match="never committed"):
        block_steps(torch.tensor([0, 1, -1, 2]), 2)
    with pytest.raises(ValueError, match="previous block"):
        block_steps(torch.tensor([0, 2, 1, 3]), 2)
    _no_checkpoints(monkeypatch, tmp_path)
    for argv in (["--step-delay", "-1"], ["--policy", "dual", "--tolerance", "0.2"],
                 ["--gen-length", "10", "--block-length", "4"]):
        with pytest.raises(SystemExit):
            trace.main(argv + ["--out", str(tmp_path / "x.png")])
    # the --strategy presets and --cache are gone (--policy); an option must belong to the policy or rule run
    for argv in (["--policy", "ar"], ["--strategy", "baseline"], ["--cache", "dual"], ["--policy", "bogus"],
                 ["--policy", "none", "--refresh-every", "2"], ["--policy", "dual", "--tolerance", "0.2"],
                 ["--policy", "none", "--delay", "2"], ["--policy", "exact", "--refresh-every", "2"],
                 ["--rule", "topk", "--threshold", "0.5"], ["--rule", "threshold", "--factor", "2"],
                 ["--gen-length", "8", "--block-length", "4", "--steps", "3"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
