"""Command line generation: ``python -m experiments.cli.generate [--model DIR] [--prompt "..."] [--stream]``.

Without ``--model`` it uses the embedded checkpoint in ``results/checkpoints/`` (``llada-arith``;
``bd3lm-arith-16`` for the block-diffusion cache) when present, else a tiny random model (so
the command always runs, in seconds, on a CPU).

The sampler is one :class:`dlm.spec.Sampler` (the one loop :func:`dlm.sample.denoise` with a
cache policy, a commit rule and the model's family), chosen by flags generated from the registry
(:mod:`harness.sampler_flags`): ``--policy`` and ``--rule`` (every registered name; the rule
defaults to the one whose option is given, e.g. ``--threshold 0.9``, else ``topk``), ``--family``
(default: read from the checkpoint), the lengths, and one flag per registered option. Every
policy runs with every rule. LLaDA's sampler is the default (policy none, rule topk), Fast-dLLM's
``--policy dual --threshold 0.9``, BD3-LM's ``--policy exact``.

A block-model policy (``exact``, ``block_causal``) needs a BD3-LM checkpoint, loaded with
:meth:`bd3lm.BD3LM.load`: the block size and alignment come from the model
(:meth:`dlm.spec.Sampler.for_block_model`); ``--block-length`` may be omitted or must equal it.
It proposes from BD3-LM's SUBS distribution (``top_p=1``), as :func:`bd3lm.sample` does.

``--stream`` prints each block of the answer as soon as it is final, for every cache policy, via
the loop's per-step :class:`dlm.sample.StepView` callback: a block is final once it holds no
[MASK] (committed tokens are never remasked).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import Tensor

from dlm import registry
from dlm.checkpoints import TOKENIZER_FILES, load_model, model_kind
from dlm.sample import StepView
from dlm.spec import Sampler, generate
from harness.cli import UserError, add_run_args, device_of, dtype_of, reading, run_main, set_threads
from harness.cli import parser as entry_parser
from harness.sampler_flags import add_sampler_args, as_flags, sampler_from_args

REPO = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO / "results" / "checkpoints" / "llada-arith"
DEFAULT_BD3_MODEL = REPO / "results" / "checkpoints" / "bd3lm-arith-16"
DEFAULT_PROMPT = "Ann has 3 apples. She buys 4 more. How many apples does Ann have?"  # in the embedded model's range

#: how to run a checkpoint of each attention with this command (dlm.kind.ModelKind.bind)
RUN_AS = {"block_causal": "run it with --policy exact (the block size comes from the model)",
          "causal": "run it with --policy ar --block-length 1",
          "bidirectional": "run it with a bidirectional policy, e.g. --policy none (the default)"}

#: on_block(block_index, tokens (B, n)): a block of the answer became final
BlockHook = Callable[[int, Tensor], None]


# ------------------------------------------------------------------------------- models, prompts
def _tiny_random_model():
    """A random model with the embedded tokenizer (token ids from the tokenizer, not literals)."""
    from dlm.model import ModelConfig, Transformer
    from tasks.tokenizer import build_tokenizer

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
        from tasks.fewshot import format_prompt

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


# ------------------------------------------------------------------------------ the sampler
def label(s: Sampler) -> str:
    """File-name friendly name: ``baseline``, ``dual-threshold0.9``, ``exact-topk-eos``."""
    rule_cls = registry.get("rule", s.rule)
    values = {**{p.name: p.default for p in registry.user_params(rule_cls)}, **dict(s.options)}
    numbers = "".join(f"{p.name}{values[p.name]:g}" for p in registry.user_params(rule_cls)
                      if p.type in (int, float) and values[p.name] is not None)
    name = "baseline" if (s.policy, s.rule) == ("none", "topk") else f"{s.policy}-{numbers or s.rule}"
    return name + ("-eos" if s.stop_at_eos else "")


@dataclass(frozen=True)
class Setup:
    """A loaded model and the strategy to run on it."""

    model: torch.nn.Module
    tokenizer: object
    strategy: Sampler
    device: torch.device

    @property
    def label(self) -> str:
        return label(self.strategy)


def setup(parser: argparse.ArgumentParser, args) -> Setup:
    """Validate the flags (argparse errors, before any loading when possible), set the threads,
    load the model the policy needs and build the sampler."""
    block_model = registry.get("policy", args.policy).block_model
    try:  # a block model's block size is known only once it is loaded: one block until then
        sampler_from_args(args, block_model=(args.block_length or args.gen_length, "prompt") if block_model else None)
    except ValueError as e:
        parser.error(as_flags(str(e)))
    set_threads(args.threads)
    device = device_of(args.device)
    dtype = dtype_of(args.dtype, device)
    kind = None
    if block_model:
        try:
            with reading("--model", args.model or DEFAULT_BD3_MODEL):
                model, tok, size_align = load_block_model(args.model, dtype, device)
        except UserError as e:  # e.g. a checkpoint without BD3-LM metadata
            parser.error(f"--policy {args.policy} needs a BD3-LM checkpoint: {e}")
    else:
        try:
            with reading("--model", args.model or DEFAULT_MODEL):
                (model, tok), size_align = load(args.model, dtype, device), None
                if args.model is not None or DEFAULT_MODEL.is_dir():
                    kind = model_kind(args.model or DEFAULT_MODEL)
        except UserError as e:
            parser.error(as_flags(str(e)))
    if tok is None:
        parser.error(f"--model {args.model}: no tokenizer files (one of {', '.join(TOKENIZER_FILES)}): the prompt "
                     "cannot be encoded")
    try:
        sampler = sampler_from_args(args, block_model=size_align)
        if block_model and "top_p" not in dict(sampler.options):  # BD3-LM proposes from SUBS
            sampler = sampler.with_(top_p=1.0)
        if kind is not None:
            kind.bind(sampler, f"--model {args.model or DEFAULT_MODEL}", RUN_AS)
    except ValueError as e:
        parser.error(as_flags(str(e)))
    return Setup(model.to(device), tok, sampler, device)


def parser(module: str = "experiments.cli.generate", doc: str = __doc__) -> argparse.ArgumentParser:
    """The flags of generate and trace (``module``: the entry point, ``doc``: its docstring)."""
    p = entry_parser(module, doc)
    add_run_args(p, model=None, dtype="float32",
                 model_help="checkpoint dir or hub id (default: the embedded model, else a tiny random one)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="the question (default: an embedded-task one)")
    add_sampler_args(p)
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
        out = generate(model, ids, None, strategy, generator=gen, callback=final, compile=args.compile)
        stream.finish(out.sequences[0, P:].tolist())
        print()
    else:
        out = generate(model, ids, None, strategy, generator=gen, compile=args.compile)
    dt = time.perf_counter() - t0
    answer = out.sequences[0, P:]
    n = int(out.stats.tokens_until_eos[0])
    if not args.stream:
        if tok is not None:
            print(text + tok.decode(answer[:n], skip_special_tokens=True))
        else:
            print("prompt ids:", ids[0].tolist(), "\nanswer ids:", answer.tolist())
    print(f"[{run.label}: {n} tokens until EOS, {out.stats.nfe} forwards, {dt:.2f}s]")


__all__ = ["AnswerStream", "FinalBlocks", "Setup", "encode", "label", "load", "load_block_model", "main", "setup"]

if __name__ == "__main__":
    run_main(main)
