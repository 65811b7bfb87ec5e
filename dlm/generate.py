"""Command line generation: ``python -m dlm.generate --model DIR --prompt "..."``.

Without ``--model`` it uses the embedded checkpoint in ``results/checkpoints/`` when present,
else a tiny random model (so the command always runs, in seconds, on a CPU).

``--strategy`` picks the sampler: ``baseline`` (default; :func:`dlm.sampling.generate`, LLaDA),
``fastdllm`` (:func:`fastdllm.generate`, ``--cache``, ``--threshold`` / ``--factor``) or
``bd3lm`` (:func:`bd3lm.sample`, exact block-causal KV cache). ``--stream`` prints each block of
the answer as soon as it is final: fastdllm through its per-step ``callback``; the baseline
through the identical loop ``fastdllm.generate(cache=None)`` with the top-k schedule (equal
tokens, tested in tests/test_fastdllm.py); bd3lm by observing its committing forwards (a clean
block's K/V are written exactly once, when it is final). The strategy packages are imported only
when chosen, so :mod:`dlm` itself never depends on them.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import Tensor

from .checkpoints import load_model
from .sampling import GenerateOutput, check_blocks, generate

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "results" / "checkpoints" / "llada-arith"
STRATEGIES = ("baseline", "fastdllm", "bd3lm")

#: on_block(block_index, tokens (B, L)): a block of the answer became final
BlockHook = Callable[[int, Tensor], None]


def _tiny_random_model():
    """A random model with the embedded tokenizer (token ids from the tokenizer, not literals)."""
    from .model import ModelConfig, Transformer
    from .tokenizer import build_tokenizer

    tok = build_tokenizer()
    cfg = ModelConfig(vocab_size=len(tok), d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, mlp_hidden=128,
                      max_seq_len=256, mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, tie_embeddings=True)
    model = Transformer(cfg)
    model.reset_parameters(std=0.3, generator=torch.Generator().manual_seed(0))
    return model.eval(), tok


@dataclass(frozen=True)
class Strategy:
    """A sampler and its options (``steps`` None: ``gen_length``, one token per step)."""

    name: str = "baseline"
    gen_length: int = 64
    block_length: int = 32
    steps: Optional[int] = None
    cache: Optional[str] = None  # fastdllm only: None | "prefix" | "dual"
    threshold: Optional[float] = None  # fastdllm only
    factor: Optional[float] = None  # fastdllm only
    temperature: float = 0.0
    remasking: str = "low_confidence"  # baseline / fastdllm
    stop_at_eos: bool = False  # fastdllm / bd3lm

    def __post_init__(self) -> None:
        if self.name not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.name!r}")
        check_blocks(self.gen_length, self.block_length, self.total_steps)
        if self.name != "fastdllm":
            for opt in ("cache", "threshold", "factor"):
                if getattr(self, opt) is not None:
                    raise ValueError(f"{opt} is a fastdllm option, not one of strategy {self.name!r}")
        if self.name == "baseline" and self.stop_at_eos:
            raise ValueError("stop_at_eos needs strategy 'fastdllm' or 'bd3lm'")
        if self.name == "bd3lm" and self.remasking != "low_confidence":
            raise ValueError("bd3lm uses low-confidence top-k; remasking must be 'low_confidence'")

    @property
    def total_steps(self) -> int:
        return self.gen_length if self.steps is None else self.steps

    @property
    def label(self) -> str:
        """File-name friendly name, e.g. ``baseline``, ``fastdllm-dual-threshold0.9``, ``bd3lm``."""
        if self.name != "fastdllm":
            return self.name
        rule = (f"-threshold{self.threshold:g}" if self.threshold is not None
                else f"-factor{self.factor:g}" if self.factor is not None else "")
        return f"fastdllm-{self.cache or 'none'}{rule}"


def run_strategy(model, input_ids: Tensor, strategy: Strategy, generator: Optional[torch.Generator] = None,
                 on_block: Optional[BlockHook] = None) -> GenerateOutput:
    """Run ``strategy`` on prompts (B, P); ``on_block`` sees every block once it is final
    (the last block(s) of a bd3lm run only through the returned output)."""
    s = strategy
    common = dict(gen_length=s.gen_length, temperature=s.temperature, generator=generator)
    if s.name == "baseline" and on_block is None:
        return generate(model, input_ids, steps=s.total_steps, block_length=s.block_length,
                        remasking=s.remasking, **common)
    if s.name in ("baseline", "fastdllm"):
        from fastdllm.generate import generate as fast_generate

        mid, done = model.config.mask_token_id, set()

        def callback(view) -> None:
            block = view.x[:, view.lo:view.hi]
            if view.block not in done and not bool((block == mid).any()):
                done.add(view.block)
                on_block(view.block, block.clone())

        return fast_generate(model, input_ids, block_length=s.block_length, steps=s.total_steps,
                             cache=s.cache, threshold=s.threshold, factor=s.factor,
                             remasking=s.remasking, stop_at_eos=s.stop_at_eos,
                             callback=None if on_block is None else callback, **common)
    from bd3lm import sample

    P, L = input_ids.shape[1], s.block_length

    def observe(module, args, kwargs) -> None:  # forward pre-hook: committing block forwards
        start = kwargs.get("start", 0)
        if kwargs.get("commit", False) and start >= P:
            on_block((start - P) // L, args[0].clone())

    handle = None if on_block is None else model.register_forward_pre_hook(observe, with_kwargs=True)
    try:
        return sample(model, input_ids, block_size=L, steps_per_block=s.total_steps * L // s.gen_length,
                      stop_at_eos=s.stop_at_eos, **common)
    finally:
        if handle is not None:
            handle.remove()


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


def load(model_arg: Optional[str], dtype: str = "float32", device: str = "cpu"):
    """(model, tokenizer): ``model_arg``, else the embedded checkpoint, else a tiny random model."""
    if model_arg is None and not DEFAULT_MODEL.is_dir():
        print("[no embedded checkpoint found: using a tiny random model]")
        return _tiny_random_model()
    return load_model(model_arg or DEFAULT_MODEL, dtype=dtype, device=device)


def encode(model, tok, prompt: str) -> tuple[str, Tensor]:
    """(prompt text, ids (1, P)): the few-shot format with a tokenizer, else one id per char."""
    if tok is not None:
        from .tasks.fewshot import format_prompt

        text = format_prompt(prompt) if "Question:" not in prompt else prompt
        return text, torch.tensor([tok.encode(text, add_special_tokens=False)])
    return prompt, torch.tensor([[4 + (ord(c) % (model.config.vocab_size - 8)) for c in prompt]])


def add_strategy_args(p: argparse.ArgumentParser) -> None:
    """The options of :class:`Strategy` (shared with experiments/trace.py)."""
    p.add_argument("--strategy", default="baseline", choices=STRATEGIES,
                   help="sampler: LLaDA baseline, Fast-dLLM, or BD3-LM exact cache (default baseline)")
    p.add_argument("--gen-length", type=int, default=64, help="answer tokens")
    p.add_argument("--steps", type=int, default=None, help="denoising steps in all; default: gen-length "
                   "(one token per step)")
    p.add_argument("--block-length", type=int, default=32, help="semi-AR / BD3-LM block length")
    p.add_argument("--cache", default="none", choices=["none", "prefix", "dual"], help="fastdllm KV cache")
    p.add_argument("--threshold", type=float, default=None, help="fastdllm parallel decoding threshold (eq. 5)")
    p.add_argument("--factor", type=float, default=None, help="fastdllm parallel decoding factor (eq. 6)")
    p.add_argument("--stop-at-eos", action="store_true", help="fastdllm/bd3lm: stop after the block with EOS")
    p.add_argument("--temperature", type=float, default=0.0, help="Gumbel temperature (0: greedy)")
    p.add_argument("--remasking", default="low_confidence", choices=["low_confidence", "random"])
    p.add_argument("--seed", type=int, default=0, help="generator seed")


def strategy_from_args(args) -> Strategy:
    cache = None if args.cache == "none" else args.cache
    return Strategy(args.strategy, args.gen_length, args.block_length, args.steps,
                    cache if args.strategy == "fastdllm" else None, args.threshold, args.factor,
                    args.temperature, args.remasking, args.stop_at_eos)


def parse_strategy(parser: argparse.ArgumentParser, args) -> "Strategy":
    """The :class:`Strategy` of parsed ``add_strategy_args`` options; argparse errors otherwise."""
    if args.strategy != "fastdllm" and args.cache != "none":
        parser.error("--cache is a fastdllm option")
    try:
        return strategy_from_args(args)
    except ValueError as e:
        parser.error(str(e))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="checkpoint dir or hub id (default: embedded model)")
    p.add_argument("--prompt", default="Ann has 12 apples. She buys 7 more. How many apples does Ann have?")
    add_strategy_args(p)
    p.add_argument("--stream", action="store_true", help="print each block of the answer once it is final")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    strategy = parse_strategy(p, args)

    model, tok = load(args.model, args.dtype, args.device)
    text, ids = encode(model, tok, args.prompt)
    ids = ids.to(args.device)
    gen = torch.Generator(args.device).manual_seed(args.seed)
    t0 = time.perf_counter()
    if args.stream:
        print(text if tok is not None else f"prompt ids: {ids[0].tolist()}\nanswer ids:", end="", flush=True)
        stream = AnswerStream(tok, model.config.eos_token_id, lambda s: print(s, end="", flush=True))
        out = run_strategy(model, ids, strategy, gen, on_block=lambda b, blk: stream.push(blk[0].tolist()))
        stream.finish(out.sequences[0, ids.shape[1]:].tolist())
        print()
    else:
        out = run_strategy(model, ids, strategy, gen)
    dt = time.perf_counter() - t0
    answer = out.sequences[0, ids.shape[1]:]
    n = int(out.stats.tokens_until_eos[0])
    if not args.stream:
        if tok is not None:
            print(text + tok.decode(answer[:n], skip_special_tokens=True))
        else:
            print("prompt ids:", ids[0].tolist(), "\nanswer ids:", answer.tolist())
    print(f"[{n} tokens until EOS, {out.stats.nfe} forwards, {dt:.2f}s]")


if __name__ == "__main__":
    main()
