"""Prompt / answer pairs of the any-order tasks (:mod:`tasks.sudoku`, :mod:`tasks.countdown`,
:mod:`tasks.reversal`) and their SFT batches.

A task module exposes ``generate(n, seed, split)`` (procedural training / held-out pairs),
``load(path)`` (the shared test sets where they exist), ``check(pair, output) -> bool`` (the
answer verified, not string-matched) and ``vocabulary()`` (the words of its tokenizer).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

import torch

from .sft_data import pad_rows


@dataclass(frozen=True)
class Pair:
    """One example: ``id`` (stable across runs), ``prompt`` and reference ``answer`` texts, and
    ``meta`` (what the checker needs, e.g. the puzzle's clues)."""

    id: str
    prompt: str
    answer: str
    meta: tuple = ()


@dataclass(frozen=True)
class Epochs:
    """A fixed training set read in epochs: epoch ``e`` is a permutation of ``pairs`` seeded by
    ``(seed, e)``, and step ``s`` of ``n`` rows takes rows ``s*n … s*n+n-1`` of the epochs laid end
    to end. A function of the step alone, so a resumed run reads what an uninterrupted one would."""

    pairs: tuple
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.pairs:
            raise ValueError("Epochs needs at least one pair")

    def batch(self, step: int, n: int) -> list[Pair]:
        out, i = [], step * n
        while len(out) < n:
            epoch, at = divmod(i, len(self.pairs))
            take = _permutation(len(self.pairs), self.seed, epoch)[at:at + n - len(out)]
            out += [self.pairs[j] for j in take]
            i += len(take)
        return out

    def epoch(self, step: int, n: int) -> float:
        """Epochs completed after ``step`` steps of ``n`` rows."""
        return step * n / len(self.pairs)


@functools.lru_cache(maxsize=4)
def _permutation(size: int, seed: int, epoch: int) -> tuple[int, ...]:
    order = list(range(size))
    random.Random(f"epochs:{seed}:{epoch}").shuffle(order)
    return tuple(order)


class PairBatches:
    """``batch_fn(step, generator) -> {"input_ids", "prompt_lengths"}`` for ``dlm.train``: each
    batch is ``sample(n, seed)`` pairs, the answer EOS-padded to R columns (LLaDA's SFT layout), so
    AR and diffusion objectives see the same rows.

    R is drawn per batch, uniformly from ``response_len … response_len + max_tail``. A masked
    diffusion model attends to the end of the row, and trained at one row length it learns to count
    positions from the end: at any other generation length it misplaces every token. Varied EOS
    tails make it read positions from the prompt instead.

    ``sample`` is ``sample(n, seed)`` (a fresh draw per batch) or an :class:`Epochs` (a fixed
    set, the batch a function of the step; the per-batch seed is still drawn, so the tail lengths
    are those of the same run with a ``sample`` function)."""

    def __init__(self, tokenizer, sample, batch_size: int, response_len: int, max_tail: int = 0) -> None:
        if tokenizer.eos_token_id is None:
            raise ValueError("tokenizer has no eos_token_id")
        for name, v, low in (("batch_size", batch_size, 1), ("response_len", response_len, 1), ("max_tail", max_tail, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"{name} must be an int >= {low}, got {v!r}")
        self.tok, self.sample, self.batch_size, self.response_len = tokenizer, sample, batch_size, response_len
        self.max_tail = max_tail

    def __call__(self, step: int, generator: torch.Generator) -> dict:
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        R = self.response_len + int(torch.randint(0, self.max_tail + 1, (1,), generator=generator))
        if isinstance(self.sample, Epochs):
            pairs = self.sample.batch(step, self.batch_size)
        else:
            pairs = self.sample(self.batch_size, seed)
        prompts = [self.tok.encode(p.prompt, add_special_tokens=False) for p in pairs]
        answers = [self.tok.encode(" " + p.answer, add_special_tokens=False) for p in pairs]
        too_long = [p.id for p, a in zip(pairs, answers) if len(a) + 1 > self.response_len]
        if too_long:
            raise ValueError(f"answers longer than response_len={self.response_len}: {too_long[:3]}")
        return pad_rows(prompts, answers, R, self.tok.eos_token_id, multiple=1 if self.max_tail else 16)
