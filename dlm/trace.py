"""Denoising traces: which step committed each answer position, replayed step by step.

Every sampler here (LLaDA baseline, Fast-dLLM, BD3-LM) commits each answer column exactly once
and never remasks it (LLaDA Alg. 2's low-confidence remasking only chooses *which* masked
columns to commit), so ``GenerateOutput.commit_step`` (G,) and the final answer determine the
whole trajectory: after step ``s`` column ``j`` holds ``answer[j]`` iff
``0 <= commit_step[j] <= s``, else [MASK]. Pure tensor helpers; plotting lives in
``experiments/cli/trace.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor

MASK_GLYPH = "_"


def _check_1d(name: str, t) -> None:
    if not isinstance(t, Tensor) or t.dim() != 1:
        got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
        raise ValueError(f"{name} must be a 1-D tensor (one row of the batch), got {got}")


def step_states(answer: Tensor, commit_step: Tensor, mask_id: int, num_steps: Optional[int] = None) -> Tensor:
    """Answer after every step: (S, G) with S = ``num_steps`` (default max commit step + 1).

    answer, commit_step: (G,) final tokens and the step that committed each (-1: never).
    """
    _check_1d("answer", answer), _check_1d("commit_step", commit_step)
    if answer.shape != commit_step.shape:
        raise ValueError(f"answer {tuple(answer.shape)} and commit_step {tuple(commit_step.shape)} differ")
    S = int(commit_step.max()) + 1 if num_steps is None else num_steps
    steps = torch.arange(S, device=answer.device)[:, None]  # (S, 1)
    done = (commit_step[None] >= 0) & (commit_step[None] <= steps)  # (S, G)
    return torch.where(done, answer[None], torch.full_like(answer, mask_id)[None])


@dataclass(frozen=True)
class BlockSteps:
    """Per block b: the first and last step that committed one of its columns, (n_b,) each."""

    first: Tensor
    last: Tensor


def block_steps(commit_step: Tensor, block_length: int) -> BlockSteps:
    """Step range of every block of a (G,) ``commit_step``; raises ValueError when a column was
    never committed or blocks were not decoded strictly one after another (semi-AR order)."""
    _check_1d("commit_step", commit_step)
    if block_length < 1 or commit_step.numel() % block_length:
        raise ValueError(f"block_length={block_length} must be positive and divide {commit_step.numel()}")
    if bool((commit_step < 0).any()):
        cols = torch.nonzero(commit_step < 0).flatten().tolist()
        raise ValueError(f"answer columns {cols[:8]} were never committed")
    per_block = commit_step.view(-1, block_length)  # (n_b, L)
    bs = BlockSteps(per_block.min(-1).values, per_block.max(-1).values)
    if bool((bs.first[1:] <= bs.last[:-1]).any()):
        raise ValueError("a block committed tokens before the previous block was finished")
    return bs


def token_labels(ids: Sequence[int], tokenizer=None) -> list[str]:
    """One printable label per token id: the decoded piece (newlines as ``\\n``) or the id."""
    if tokenizer is None:
        return [str(int(i)) for i in ids]
    return [tokenizer.decode([int(i)]).replace("\n", "\\n") for i in ids]


def replay_lines(states: Tensor, mask_id: int, tokenizer=None) -> list[str]:
    """``step | sequence`` per row of ``states`` (S, G) with masks shown as ``_``.

    With a tokenizer, pieces are joined as decoded text; otherwise ids are space separated."""
    if not isinstance(states, Tensor) or states.dim() != 2:
        raise ValueError("states must be a (S, G) tensor")
    sep = "" if tokenizer is not None else " "
    vocab_ids = sorted(set(states.flatten().tolist()) - {mask_id})
    labels = dict(zip(vocab_ids, token_labels(vocab_ids, tokenizer)))
    labels[mask_id] = MASK_GLYPH
    width = len(str(states.shape[0] - 1))
    return [f"{s:>{width}} | " + sep.join(labels[i] for i in row) for s, row in enumerate(states.tolist())]
