"""Teacher-forced probes: does the model compute each reasoning line, and read its answer off the chain?

    python -m research.chain_probe --model results/checkpoints/llada-arith --n 100 --gen-length 32

For held-out problems, the reference answer is placed after the prompt (EOS-padded to
``gen_length``, as in SFT) and some of it is masked; one forward pass, then the argmax at every
masked position of the probed number (all its digits must be right). Four probes:

  line | left       a line's result ``c`` in ``a op b = c``, with the answer from ``c`` on masked:
                    can the model do the step from what precedes it (how a left-to-right,
                    semi-AR decode meets it)?
  line | rest       only ``c`` masked, the rest of the reference visible (the step given its context)
  final | chain     the ``#### N`` number with it and the EOS tail masked, the whole chain visible:
                    does the model read its answer off its own last line?
  final | question  the whole answer masked: the answer straight from the question, at the
                    reference's position (meaningful when the chain's length is fixed by the
                    question, as in ``cot="terse"``; with ``ArithConfig.loop`` it is told the
                    length, which the question leaves open, so it overstates a one-pass guess)

If ``final | question`` is close to ``final | chain`` and ``line | left`` is far from 100%, the
chain carries no computation the model could not do in one pass, and decoding it first (semi-AR)
cannot beat committing the answer early (pure diffusion): LLaDA's semi-AR advantage needs chains
that compute. The mask follows the SFT objective (LLaDA, Nie et al. 2025, Eq. 5: prompt never
masked, answer tokens masked), here chosen, not sampled.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch

from dlm.io import stable_json
from dlm.checkpoints import load_model
from tasks import DEFAULT_TEMPLATE, generate_problems
from tasks.sft_data import encode_prompt
from harness.cli import check_out, run_main, set_threads
from harness.results import arith_config_of, atomic_write_text, git_sha, repo_relative
from research.testbed import DEFAULT_MODEL

PROBES = ("line_left", "line_rest", "final_chain", "final_question")
_RESULT_RE = re.compile(r"^[^\n]*?\d+ [-+*/] \d+ = (\d+)\)?$|^#### (\d+)$", re.M)


def number_sites(tokenizer, answer: str) -> tuple[list[int], list[tuple[int, int, bool]]]:
    """Token ids of the answer's completion text and its probe sites.

    Returns ``(ids, sites)``; each site is ``(start, end, is_final)``, the token span ``[start,
    end)`` of a line's result (``a op b = c``, check lines included) or of the final ``#### N``.
    Spans come from the tokenizer's character offsets, so any number tokenisation works.
    """
    text = DEFAULT_TEMPLATE.completion(answer)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    sites = []
    for m in _RESULT_RE.finditer(text):
        group = 1 if m.group(1) is not None else 2
        lo, hi = m.span(group)
        toks = [i for i, (s, e) in enumerate(offsets) if s < hi and e > lo]
        sites.append((toks[0], toks[-1] + 1, group == 2))
    return ids, sites


def probe_rows(n_prompt: int, gen_length: int, sites: list[tuple[int, int, bool]]
               ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{probe: (masked, scored)}``, both ``(R, n_prompt + gen_length)`` bool with one row per site
    the probe uses (line probes: the line results; final probes: the final number): which
    positions the probe masks, and which it scores (the probed number's tokens)."""
    pos = torch.arange(n_prompt + gen_length)[None, :]  # (1, L)
    spans = {kind: torch.tensor([[s, e] for s, e, f in sites if f == final], dtype=torch.long).view(-1, 2)
             + n_prompt for kind, final in (("line", False), ("final", True))}
    spans["final"] = spans["final"][:1]
    start = {k: v[:, :1] for k, v in spans.items()}  # (R, 1)
    scored = {k: (pos >= v[:, :1]) & (pos < v[:, 1:]) for k, v in spans.items()}  # (R, L)
    answer = (pos >= n_prompt).expand(spans["final"].shape[0], -1)  # (R, L)
    return {"line_left": (pos >= start["line"], scored["line"]),
            "line_rest": (scored["line"], scored["line"]),
            "final_chain": (pos >= start["final"], scored["final"]),
            "final_question": (answer, scored["final"])}


@torch.no_grad()
def probe_problem(model, tokenizer, question: str, answer: str, gen_length: int) -> dict[str, tuple[int, int]]:
    """``{probe: (right, total)}`` for one problem (one batched forward pass per problem)."""
    prompt = encode_prompt(tokenizer, question)
    ids, sites = number_sites(tokenizer, answer)
    if len(ids) > gen_length:
        raise ValueError(f"gen_length ({gen_length}) is shorter than a reference answer ({len(ids)} tokens)")
    cfg = model.config
    x0 = torch.tensor(prompt + ids + [cfg.eos_token_id] * (gen_length - len(ids)))  # (L,)
    rows = probe_rows(len(prompt), gen_length, sites)
    mask = torch.cat([rows[p][0] for p in PROBES])  # (R, L)
    target = torch.cat([rows[p][1] for p in PROBES])  # (R, L)
    device = next(model.parameters()).device
    xt = torch.where(mask, torch.full_like(x0, cfg.mask_token_id), x0[None, :]).to(device)  # (R, L)
    pred = model(xt).argmax(-1).cpu()  # (R, L)
    right = ((pred == x0[None, :]) | ~target).all(-1)  # (R,)
    out, row = {}, 0
    for p in PROBES:
        r = rows[p][0].shape[0]
        out[p] = (int(right[row:row + r].sum()), r)
        row += r
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(DEFAULT_MODEL))
    p.add_argument("--n", type=int, default=100, help="held-out problems")
    p.add_argument("--gen-length", type=int, default=32, help="EOS-padded answer length of the probe")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--unique", action="store_true", help="held-out problems with distinct arithmetic")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: OMP_NUM_THREADS if set, else the free cores)")
    p.add_argument("--out", default=None, help="write the result as JSON here (atomically)")
    args = p.parse_args(argv)
    if args.out:
        check_out("--out", args.out, kind="file")
    if args.n < 1:
        raise ValueError(f"--n must be >= 1, got {args.n}")
    set_threads(args.threads)
    model, tok = load_model(args.model, dtype=torch.float32)
    model.eval()
    problems = generate_problems(arith_config_of(args.model), args.n, split="test", seed=args.seed,
                                 unique=args.unique)
    totals = {p_: [0, 0] for p_ in PROBES}
    for pr in problems:
        for name, (r, n) in probe_problem(model, tok, pr.question, pr.answer, args.gen_length).items():
            totals[name][0] += r
            totals[name][1] += n
    result = {"meta": {"git_sha": git_sha(), "model": repo_relative(args.model), "n": args.n, "seed": args.seed,
                       "unique": args.unique, "gen_length": args.gen_length},
              "probes": {k: {"right": r, "total": n, "accuracy": r / max(n, 1)} for k, (r, n) in totals.items()}}
    for k, v in result["probes"].items():
        print(f"{k:15s} {v['right']:5d} / {v['total']:5d}  {100 * v['accuracy']:5.1f}%")
    if args.out:
        atomic_write_text(Path(args.out), stable_json(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    run_main(main)
