"""Command line generation: ``python -m experiments.generate [--model DIR] [--prompt "..."] [--stream]``.

Without ``--model`` it uses the embedded checkpoint in ``results/checkpoints/`` (``llada-arith``;
``bd3lm-arith-16`` for the block-diffusion cache) when present, else a tiny random model (so
the command always runs, in seconds, on a CPU).

The sampler is one :class:`experiments.strategy.Strategy` (the one loop
:func:`dlm.sample.denoise` with a cache policy and a commit rule), chosen by flags:

- ``--cache {none,prefix,dual,exact}`` and ``--rule {topk,threshold,factor,first_hitting,ancestral,dream}``
  (the rule defaults to ``threshold`` / ``factor`` when ``--threshold`` / ``--factor`` is given,
  else ``topk``), with ``--gen-length --block-length --steps --stop-at-eos --temperature
  --remasking``; every cache runs with every rule; ``--rules`` picks whose block rules run
  (default: Fast-dLLM's Dream rules for a Dream checkpoint), ``--rule dream`` is Dream's own
  sampler (``--alg --alg-temp --eps --top-k``);
- or a documented preset ``--strategy``: ``baseline`` (cache none, top-k: LLaDA's sampler,
  :func:`dlm.sampling.generate`), ``fastdllm`` (``--cache none|prefix|dual`` with the top-k,
  ``--threshold`` or ``--factor`` rule: :func:`fastdllm.generate`) or ``bd3lm`` (cache exact,
  top-k: :func:`bd3lm.sample`).

The block-diffusion cache (``exact``, preset ``bd3lm``) needs a BD3-LM checkpoint, loaded with
:meth:`bd3lm.BD3LM.load`: the block size and alignment come from the model
(:meth:`Strategy.for_bd3`); ``--block-length`` may be omitted or must equal it. It proposes from
BD3-LM's SUBS distribution (``top_p=1``), as :func:`bd3lm.sample` does.

``--stream`` prints each block of the answer as soon as it is final, for every cache policy, via
the loop's per-step :class:`dlm.sample.StepView` callback: a block is final once it holds no
[MASK] (committed tokens are never remasked).
"""

from __future__ import annotations

import argparse
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import Tensor

from dlm.checkpoints import load_model
from dlm.sample import StepView
from experiments.cli import UserError, add_run_args, device_of, dtype_of, reading, run_main, set_threads
from experiments.cli import parser as entry_parser
from experiments.strategy import BLOCK_MODELS, Strategy

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO / "results" / "checkpoints" / "llada-arith"
DEFAULT_BD3_MODEL = REPO / "results" / "checkpoints" / "bd3lm-arith-16"
PRESETS = ("baseline", "fastdllm", "bd3lm")
CACHES = ("none", "prefix", "dual", "exact")
RULES = ("topk", "threshold", "factor", "first_hitting", "ancestral", "dream")
DEFAULT_BLOCK = 32
DEFAULT_PROMPT = "Ann has 3 apples. She buys 4 more. How many apples does Ann have?"  # in the embedded model's range

#: on_block(block_index, tokens (B, n)): a block of the answer became final
BlockHook = Callable[[int, Tensor], None]


# ------------------------------------------------------------------------------- models, prompts
def _tiny_random_model():
    """A random model with the embedded tokenizer (token ids from the tokenizer, not literals)."""
    from dlm.model import ModelConfig, Transformer
    from dlm.tasks.tokenizer import build_tokenizer

    tok = build_tokenizer()
    cfg = ModelConfig(vocab_size=len(tok), d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, mlp_hidden=128,
                      max_seq_len=256, mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, tie_embeddings=True)
    model = Transformer(cfg)
    model.reset_parameters(std=0.3, generator=torch.Generator().manual_seed(0))
    return model.eval(), tok


def load(model_arg: Optional[str], dtype="float32", device="cpu"):
    """(model, tokenizer): ``model_arg``, else the embedded checkpoint, else a tiny random model."""
    if model_arg is None and not DEFAULT_MODEL.is_dir():
        print("[no embedded checkpoint found: using a tiny random model]")
        return _tiny_random_model()
    return load_model(model_arg or DEFAULT_MODEL, dtype=dtype, device=device)


def load_block_model(model_arg: Optional[str], dtype="float32", device="cpu"):
    """(model, tokenizer, (block_size, align) or None) of a BD3-LM checkpoint (``model_arg``, else
    the embedded one); without either a tiny random model and None (the caller picks the block)."""
    if model_arg is None and not DEFAULT_BD3_MODEL.is_dir():
        print("[no embedded BD3-LM checkpoint found: using a tiny random model]")
        return (*_tiny_random_model(), None)
    from bd3lm import BD3LM

    bd3, tok = BD3LM.load(model_arg or DEFAULT_BD3_MODEL, dtype=dtype, device=device)
    return bd3.model.eval(), tok, (bd3.block_size, bd3.align)


def encode(model, tok, prompt: str) -> tuple[str, Tensor]:
    """(prompt text, ids (1, P)): the few-shot format with a tokenizer, else one id per char."""
    if tok is not None:
        from dlm.tasks.fewshot import format_prompt

        text = format_prompt(prompt) if "Question:" not in prompt else prompt
        return text, torch.tensor([tok.encode(text, add_special_tokens=False)])
    return prompt, torch.tensor([[4 + (ord(c) % (model.config.vocab_size - 8)) for c in prompt]])


# ---------------------------------------------------------------------------------- streaming
class FinalBlocks:
    """A :class:`dlm.sample.StepView` callback calling ``on_block(index, tokens (B, n))`` once
    for every block whose answer columns (those at or after ``prompt_len``) hold no [MASK]."""

    def __init__(self, mask_id: int, prompt_len: int, on_block: BlockHook) -> None:
        self.mask_id, self.prompt_len, self.on_block = mask_id, prompt_len, on_block
        self.done: set[int] = set()

    def __call__(self, view: StepView) -> None:
        if view.block in self.done:
            return
        block = view.x[:, max(view.lo, self.prompt_len):view.hi]  # (B, n)
        if not bool((block == self.mask_id).any()):
            self.done.add(view.block)
            self.on_block(view.block, block.clone())


class AnswerStream:
    """Writes a growing answer, each piece only once: ``push`` the final blocks in order, then
    ``finish`` with the whole answer. The pieces concatenate to the rendering of the answer up
    to and including its first EOS (decoded with special tokens skipped, or token ids)."""

    def __init__(self, tokenizer, eos_id: Optional[int], write: Callable[[str], object]) -> None:
        self.tokenizer, self.eos_id, self.write = tokenizer, eos_id, write
        self.ids: list[int] = []
        self.shown = ""
        self.ended = False

    def render(self, ids: list[int]) -> str:
        if self.tokenizer is not None:
            return self.tokenizer.decode(ids, skip_special_tokens=True)
        return "".join(f" {i}" for i in ids)

    def _show(self) -> None:
        text = self.render(self.ids)
        piece = text[len(self.shown):] if text.startswith(self.shown) else "\n" + text
        if piece:
            self.write(piece)
        self.shown = text

    def push(self, ids: list[int]) -> None:
        if self.ended:
            return
        if self.eos_id is not None and self.eos_id in ids:
            ids, self.ended = ids[: ids.index(self.eos_id) + 1], True
        self.ids += ids
        self._show()

    def finish(self, answer: list[int]) -> None:
        if self.eos_id is not None and self.eos_id in answer:
            answer = answer[: answer.index(self.eos_id) + 1]
        self.ids, self.ended = list(answer), True
        self._show()


# ------------------------------------------------------------------------------ the strategy
def add_strategy_args(p: argparse.ArgumentParser) -> None:
    """The sampler flags (shared with experiments/trace.py)."""
    p.add_argument("--strategy", default=None, choices=PRESETS,
                   help="preset: baseline (cache none, top-k), fastdllm (--cache none|prefix|dual, "
                        "--threshold/--factor) or bd3lm (cache exact, top-k); default: --cache/--rule")
    p.add_argument("--cache", default=None, choices=CACHES, help="cache policy (default none)")
    p.add_argument("--rule", default=None, choices=RULES, metavar="RULE",
                   help=f"commit rule: {', '.join(RULES)} (default: threshold / factor when its number is "
                        "given, else topk)")
    p.add_argument("--threshold", type=float, default=None, metavar="T", help="threshold rule's confidence")
    p.add_argument("--factor", type=float, default=None, metavar="F", help="factor rule's number")
    p.add_argument("--gen-length", type=int, default=64, metavar="G", help="answer tokens (default 64)")
    p.add_argument("--block-length", type=int, default=None, metavar="L",
                   help=f"block length (default {DEFAULT_BLOCK}; --cache exact: the model's)")
    p.add_argument("--steps", type=int, default=None, metavar="S", help="top-k steps in all (default: G)")
    p.add_argument("--stop-at-eos", action="store_true", help="stop after the block that holds EOS")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T", help="Gumbel temperature (0: greedy)")
    p.add_argument("--remasking", default="low_confidence", choices=["low_confidence", "random"])
    p.add_argument("--rules", default="auto", choices=["auto", "llada", "dream"],
                   help="whose rules topk/threshold/factor follow: auto = Fast-dLLM's Dream rules for a Dream "
                        "checkpoint, its LLaDA rules otherwise")
    p.add_argument("--alg", default=None, choices=["origin", "maskgit_plus", "topk_margin", "entropy"],
                   metavar="ALG", help="--rule dream: origin|maskgit_plus|topk_margin|entropy (default entropy)")
    p.add_argument("--alg-temp", type=float, default=None, metavar="T", help="--rule dream: alg_temp")
    p.add_argument("--eps", type=float, default=None, help="--rule dream: timestep floor (default 1e-3)")
    p.add_argument("--top-k", type=int, default=None, metavar="K", help="--rule dream: top-k filter")


@dataclass(frozen=True)
class Choice:
    """The validated flags before the model is known: name, cache, rule and the rule's numbers."""

    name: str
    cache: str
    rule: str
    threshold: Optional[float]
    factor: Optional[float]


def choose(args) -> Choice:
    """Preset or direct flags -> :class:`Choice`; ValueError on a contradiction."""
    rule = args.rule or ("threshold" if args.threshold is not None else "factor" if args.factor is not None
                         else "topk")
    cache, preset = args.cache or "none", args.strategy
    if preset == "baseline":
        if cache != "none" or rule != "topk" or args.stop_at_eos:
            raise ValueError("--strategy baseline is LLaDA's sampler (cache none, top-k, run to the end); "
                             "use --cache/--rule/--stop-at-eos without a preset")
    elif preset == "fastdllm":
        if cache == "exact" or rule not in ("topk", "threshold", "factor"):
            raise ValueError("--strategy fastdllm takes --cache none|prefix|dual and the topk/threshold/factor "
                             "rule; other combinations: --cache/--rule without a preset")
    elif preset == "bd3lm":
        if cache not in ("none", "exact") or rule != "topk" or args.remasking != "low_confidence":
            raise ValueError("--strategy bd3lm is BD3-LM's sampler (cache exact, low-confidence top-k); "
                             "for other rules use --cache exact --rule ...")
        cache = "exact"
    name = preset or f"{cache}_{rule}"
    return Choice(name, cache, rule, args.threshold, args.factor)


def build_strategy(choice: Choice, args, block_model: Optional[tuple[int, str]] = None) -> Strategy:
    """The :class:`Strategy` of ``choice`` and the numeric flags. block_model: the BD3-LM model's
    ``(block_size, align)`` for the block-diffusion cache (None: ``--block-length``, prompt)."""
    block = args.block_length
    common = dict(gen_length=args.gen_length, steps=args.steps, threshold=choice.threshold, factor=choice.factor,
                  temperature=args.temperature, remasking=args.remasking, stop_at_eos=args.stop_at_eos,
                  rules=args.rules, alg=args.alg, alg_temp=args.alg_temp, eps=args.eps, top_k=args.top_k)
    if choice.cache not in BLOCK_MODELS:
        return Strategy(choice.name, choice.cache, choice.rule, block_length=block or DEFAULT_BLOCK, **common)
    size, align = block_model or (block or DEFAULT_BLOCK, "prompt")
    if block is not None and block != size:
        raise ValueError(f"--block-length {block} differs from the BD3-LM model's block size {size} "
                         "(omit it: the block size comes from the model)")
    one_block = Strategy(choice.name, choice.cache, choice.rule, block_length=args.gen_length, top_p=1.0, **common)
    return one_block.for_bd3(size, align)


def label(s: Strategy) -> str:
    """File-name friendly name, e.g. ``baseline``, ``fastdllm-dual-threshold0.9``, ``bd3lm``,
    ``exact-threshold0.9-eos``."""
    rule = (f"threshold{s.commit_rule().threshold:g}" if s.rule == "threshold"
            else f"factor{s.commit_rule().factor:g}" if s.rule == "factor" else s.rule)
    if s.name in ("baseline", "bd3lm"):
        return s.name
    if s.name == "fastdllm":
        return f"fastdllm-{s.cache}" + ("" if s.rule == "topk" else f"-{rule}")
    return ("baseline" if (s.cache, s.rule) == ("none", "topk") else f"{s.cache}-{rule}") + \
        ("-eos" if s.stop_at_eos else "")


@dataclass(frozen=True)
class Setup:
    """A loaded model and the strategy to run on it."""

    model: torch.nn.Module
    tokenizer: object
    strategy: Strategy
    device: torch.device

    @property
    def label(self) -> str:
        return label(self.strategy)


def _flags(text: str) -> str:
    """A strategy's field names in an error as this command's flags (``gen_length=`` -> ``--gen-length=``)."""
    return re.sub(r"\b(gen_length|block_length|steps|threshold|factor|temperature|alg_temp|eps|top_k)\b(?==| must)",
                  lambda m: "--" + m[1].replace("_", "-"), text)


def setup(parser: argparse.ArgumentParser, args) -> Setup:
    """Validate the flags (argparse errors, before any loading when possible), set the threads,
    load the model the cache needs and build the strategy."""
    try:
        choice = choose(args)
        if choice.cache not in BLOCK_MODELS:
            build_strategy(choice, args)
    except ValueError as e:
        parser.error(_flags(str(e)))
    set_threads(args.threads)
    device = device_of(args.device)
    dtype = dtype_of(args.dtype, device)
    if choice.cache in BLOCK_MODELS:
        try:
            with reading("--model", args.model or DEFAULT_BD3_MODEL):
                model, tok, block_model = load_block_model(args.model, dtype, device)
        except UserError as e:  # e.g. a checkpoint without BD3-LM metadata
            parser.error(f"--cache {choice.cache} needs a BD3-LM checkpoint: {e}")
    else:
        try:
            with reading("--model", args.model or DEFAULT_MODEL):
                (model, tok), block_model = load(args.model, dtype, device), None
        except UserError as e:
            parser.error(str(e))
    try:
        strategy = build_strategy(choice, args, block_model)
    except ValueError as e:
        parser.error(_flags(str(e)))
    return Setup(model.to(device), tok, strategy, device)


def parser(name: str = "generate", doc: str = __doc__) -> argparse.ArgumentParser:
    """The flags of generate and trace (``name``: the entry point, ``doc``: its docstring)."""
    p = entry_parser(name, doc)
    add_run_args(p, model=None, dtype="float32",
                 model_help="checkpoint dir or hub id (default: the embedded model, else a tiny random one)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="the question (default: an embedded-task one)")
    add_strategy_args(p)
    return p


def main(argv=None) -> None:
    p = parser()
    p.add_argument("--stream", action="store_true", help="print each block of the answer once it is final")
    p.add_argument("--compile", action="store_true", help="forward under torch.compile (same tokens)")
    args = p.parse_args(argv)
    run = setup(p, args)
    model, tok, strategy = run.model, run.tokenizer, run.strategy
    text, ids = encode(model, tok, args.prompt)
    ids = ids.to(run.device)
    P = ids.shape[1]
    gen = torch.Generator(run.device).manual_seed(args.seed)
    t0 = time.perf_counter()
    if args.stream:
        print(text if tok is not None else f"prompt ids: {ids[0].tolist()}\nanswer ids:", end="", flush=True)
        stream = AnswerStream(tok, model.config.eos_token_id, lambda s: print(s, end="", flush=True))
        final = FinalBlocks(model.config.mask_token_id, P, lambda b, blk: stream.push(blk[0].tolist()))
        out = strategy.run(model, ids, generator=gen, callback=final, compile=args.compile)
        stream.finish(out.sequences[0, P:].tolist())
        print()
    else:
        out = strategy.run(model, ids, generator=gen, compile=args.compile)
    dt = time.perf_counter() - t0
    answer = out.sequences[0, P:]
    n = int(out.stats.tokens_until_eos[0])
    if not args.stream:
        if tok is not None:
            print(text + tok.decode(answer[:n], skip_special_tokens=True))
        else:
            print("prompt ids:", ids[0].tolist(), "\nanswer ids:", answer.tolist())
    print(f"[{run.label}: {n} tokens until EOS, {out.stats.nfe} forwards, {dt:.2f}s]")


__all__ = ["AnswerStream", "FinalBlocks", "Setup", "add_strategy_args", "build_strategy", "choose", "encode",
           "label", "load", "load_block_model", "main", "setup"]

if __name__ == "__main__":
    run_main(main)
