"""Dream's sampling semantics (Ye et al. 2025, "Dream 7B"; the reference ``diffusion_generate`` of
Dream's ``generation_utils.py``) as a proposal and commit rules of the one loop
(:func:`dlm.sample.denoise`), registered as the rule ``dream`` and the proposal ``dream``, and
:func:`generate`, Dream's sampler over it (a thin preset with the paper's argument names).

Each step of Dream's sampler, with the timesteps ``t_i = linspace(1, eps, steps + 1)[i]``:

* proposes ``x0`` and a confidence at every masked column (:func:`sample_tokens`): logits
  divided by the temperature, top-p then top-k filtered, softmaxed in the logits' dtype; ``x0``
  the argmax (temperature 0) or a draw of ``Categorical(probs)``; the confidence is ``p(x0)``
  (``maskgit_plus``), ``p_top1 - p_top2`` (``topk_margin``) or ``sum p log(p + 1e-10)``, the
  negative entropy (``entropy``);
* commits ``k = int(n_masked * (1 - t_{i+1} / t_i))`` columns (all the rest at the last step):
  the ``k`` most confident, or ``k`` drawn without replacement from ``softmax(conf / alg_temp)``
  (:class:`DreamSchedule`); ``origin`` instead unmasks each masked column with probability
  ``1 - t_{i+1} / t_i`` and samples only those.

Randomness comes only from ``generator`` and is drawn where the reference draws it (the sample
of every masked column, ``torch.rand`` over the masked columns for ``origin``, the
``alg_temp`` draw over the reference's confidence row), so seeded runs equal a transcription of
the reference token for token. One deliberate difference, as every sampler here: [MASK] is never
proposed (its logit is -inf; a trained model gives it no mass, the reference can commit it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor

from dlm.commit import CommitRule, suppress_logits
from dlm.llada import FullSequence
from dlm.policy import blocks_after
from dlm.registry import param, register
from dlm.sample import GenerateOutput, denoise
from dlm.validate import check_blocks, prepare_batch

ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")
CONFIDENCES = ("prob", "margin", "neg_entropy")
ALG_CONFIDENCE = {"maskgit_plus": "prob", "topk_margin": "margin", "entropy": "neg_entropy"}
WINDOWS = ("row", "to_end", "block")  # the columns of the reference's confidence row


def top_p_logits(logits: Tensor, top_p: float) -> Tensor:
    """Dream's nucleus filter: drop the tokens after the cumulative probability exceeds ``top_p``
    (the first one always kept); dropped logits become the dtype's lowest value. (N, V)."""
    sorted_logits, order = torch.sort(logits, descending=True)
    drop = torch.softmax(sorted_logits, dim=-1).cumsum(-1) > top_p  # (N, V)
    drop = torch.cat([torch.zeros_like(drop[..., :1]), drop[..., :-1]], dim=-1)  # keep the crossing token
    remove = torch.zeros_like(drop).scatter_(-1, order, drop)
    return logits.masked_fill(remove, torch.finfo(logits.dtype).min)


def top_k_logits(logits: Tensor, top_k: int) -> Tensor:
    """Dream's top-k filter: logits below the k-th largest become the dtype's lowest value."""
    kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[..., -1:]  # (N, 1)
    return logits.masked_fill(logits < kth, torch.finfo(logits.dtype).min)


def sample_tokens(logits: Tensor, temperature: float, top_p: Optional[float], top_k: Optional[int],
                  confidence: str, generator: Optional[torch.Generator]) -> tuple[Tensor, Tensor]:
    """Dream's ``sample_tokens``: logits (N, V) -> confidence (N,) in the logits' dtype, x0 (N,).

    ``Categorical(probs).sample()`` is ``multinomial(probs / probs.sum(), 1, replacement=True)``
    (what torch.distributions does), drawn here from ``generator``."""
    if temperature > 0:
        logits = logits / temperature
    if top_p is not None and top_p < 1:
        logits = top_p_logits(logits, top_p)
    if top_k is not None:
        logits = top_k_logits(logits, top_k)
    probs = torch.softmax(logits, dim=-1)  # (N, V)
    if temperature > 0:
        norm = probs / probs.sum(-1, keepdim=True)
        x0 = torch.multinomial(norm, 1, replacement=True, generator=generator)[:, 0]  # (N,)
        conf = probs.gather(-1, x0[:, None])[:, 0]
    else:
        conf, x0 = probs.max(dim=-1)
    if confidence == "margin":
        top2 = torch.topk(probs, 2, dim=-1).values  # (N, 2)
        conf = top2[:, 0] - top2[:, 1]
    elif confidence == "neg_entropy":
        conf = (probs * torch.log(probs + 1e-10)).sum(-1)
    elif confidence != "prob":
        raise ValueError(f"confidence must be one of {CONFIDENCES}, got {confidence!r}")
    return conf, x0


@register("proposal", "dream")
@dataclass(frozen=True)
class DreamProposal:
    """Dream's proposal (:func:`sample_tokens`) for the one loop: drawn at the ``where`` columns
    only, in row-major order (the reference's ``logits[mask_index]``). ``confidence`` is the
    default kind; a rule's ``confidence`` overrides it."""

    temperature: float = field(default=0.0, metadata=param("Gumbel-max temperature (0: greedy)", min=0.0))
    top_p: Optional[float] = field(default=None, metadata=param(
        "nucleus filter: propose from the smallest token set holding this probability mass", min=0.0, max=1.0,
        open_min=True))
    top_k: Optional[int] = field(default=None, metadata=param("Dream's proposal: keep the k most likely tokens",
                                                              min=1))
    confidence: str = field(default="prob", metadata=param("", derived="dream_confidence"))
    suppress_eos = False
    eos_last = False

    def __post_init__(self) -> None:
        if self.confidence not in CONFIDENCES:
            raise ValueError(f"confidence must be one of {CONFIDENCES}, got {self.confidence!r}")

    def __call__(self, logits: Tensor, where: Tensor, generator: Optional[torch.Generator],
                 exclude: tuple[int, ...] | Tensor = (), confidence: Optional[str] = None) -> tuple[Tensor, Tensor]:
        """logits (B, L, V), where (B, L) bool -> x0 (B, L) (0 outside ``where``), conf (B, L)
        (-inf outside ``where``)."""
        kind = {None: self.confidence, "low_confidence": "prob"}.get(confidence, confidence)
        if kind not in CONFIDENCES:
            raise ValueError(f"DreamProposal has no confidence {confidence!r}; expected one of {CONFIDENCES}")
        B, L, _ = logits.shape
        x0 = torch.zeros(B, L, dtype=torch.long, device=logits.device)
        conf = torch.full((B, L), float("-inf"), dtype=logits.dtype, device=logits.device)
        if bool(where.any()):
            c, t = sample_tokens(suppress_logits(logits[where], exclude), self.temperature, self.top_p,
                                 self.top_k, kind, generator)
            x0[where], conf[where] = t, c
        return x0, conf


def timesteps(steps: int, eps: float, device=None) -> Tensor:
    """Dream's ``linspace(1, eps, steps + 1)`` (float32, as the reference)."""
    return torch.linspace(1, eps, steps + 1, device=device)


def transfer_counts(n_masked: Tensor, i: int, steps: int, eps: float) -> Tensor:
    """Columns step ``i`` commits: ``int(n * (1 - t_{i+1} / t_i))`` in float32, all ``n`` at the
    last step. n_masked (B,) -> (B,) long."""
    if i >= steps - 1:
        return n_masked
    ts = timesteps(steps, eps, n_masked.device)
    return (n_masked.to(torch.float32) * (1 - ts[i + 1] / ts[i])).long()  # truncation, as int()


def reference_row(conf: Tensor, span: tuple[int, int, int], window: str) -> tuple[Tensor, int]:
    """The block's confidences (B, L) laid out as the reference's confidence row: ``row`` the whole
    sequence ``[0, T)``, ``to_end`` ``[lo, T)`` (prefix window), ``block`` ``[lo, hi)``; -inf
    outside the block. Returns the row (B, W) and the block's first column in it."""
    lo, hi, T = span
    left = lo if window == "row" else 0
    right = T - hi if window in ("row", "to_end") else 0
    B = conf.shape[0]
    pad = lambda n: torch.full((B, n), float("-inf"), dtype=conf.dtype, device=conf.device)  # noqa: E731
    return torch.cat([pad(left), conf, pad(right)], dim=-1), left


def select_scheduled(conf: Tensor, eligible: Tensor, k: Tensor, alg_temp: Optional[float],
                     generator: Optional[torch.Generator], span: tuple[int, int, int], window: str) -> Tensor:
    """``k`` (B,) eligible columns per row: the most confident (``torch.topk`` over the reference's
    confidence row, so ties break as there), or with ``alg_temp`` drawn without replacement from
    ``softmax(conf / alg_temp)`` over that row. (B, L) bool."""
    kmax = int(k.max()) if k.numel() else 0
    commit = torch.zeros_like(eligible)
    if kmax == 0:
        return commit
    masked = torch.where(eligible, conf, torch.full_like(conf, float("-inf")))
    row, left = reference_row(masked, span, window)  # (B, W)
    if not alg_temp:
        idx = torch.topk(row, kmax, dim=-1).indices  # (B, kmax), most confident first
    else:
        probs = torch.softmax(row / alg_temp, dim=-1)
        empty = ~eligible.any(-1, keepdim=True)  # rows with nothing to draw from keep k = 0
        probs = torch.where(empty, torch.ones_like(probs), probs)
        idx = torch.multinomial(probs, kmax, generator=generator)  # (B, kmax) in draw order
    keep = torch.arange(kmax, device=k.device)[None, :] < k[:, None]  # the first k of each row
    hit = torch.zeros_like(row, dtype=torch.bool).scatter_(-1, idx, keep)  # (B, W)
    return hit[:, left:left + conf.shape[1]] & eligible


@register("rule", "dream")
@dataclass(frozen=True)
class DreamSchedule(CommitRule):
    """Dream's own sampler: ``steps`` per block on Dream's timesteps. ``maskgit_plus`` /
    ``topk_margin`` / ``entropy`` commit :func:`transfer_counts` columns, the most confident first
    (``alg_temp``: sampled); ``origin`` selects first, each masked column with probability
    ``1 - t_{i+1} / t_i`` (1 at the last step), and the proposal samples only those.
    ``window``: the reference's confidence row for the ``alg_temp`` draw (:func:`reference_row`)."""

    steps: int = field(metadata=param("", derived="steps_per_block"))
    alg: str = field(default="entropy", metadata=param("Dream's remasking algorithm", choices=ALGS))
    eps: float = field(default=1e-3, metadata=param("Dream's timestep floor: t runs from 1 to eps", min=0.0,
                                                    max=1.0, open_min=True))
    alg_temp: Optional[float] = field(default=None, metadata=param(
        "Dream: draw the committed columns from softmax(confidence / alg_temp) (unset: the most confident)",
        min=0.0))
    window: str = field(default="row", metadata=param("", derived="dream_window"))
    proposal = "dream"

    def __post_init__(self) -> None:
        if self.window not in WINDOWS:
            raise ValueError(f"window must be one of {WINDOWS}, got {self.window!r}")
        if self.alg == "origin" and self.alg_temp:
            raise ValueError("alg_temp is an option of the confidence algs, not of alg='origin'")

    @property
    def confidence(self) -> Optional[str]:
        return ALG_CONFIDENCE.get(self.alg)

    @property
    def label(self) -> str:
        return f"dream_{self.alg}"

    @property
    def random(self) -> bool:
        return self.alg == "origin" or bool(self.alg_temp)

    def selects_first(self, i: int) -> bool:
        return self.alg == "origin"

    def block_steps(self, width: int) -> int:
        return self.steps

    def begin(self, eligible: Tensor, n_steps: Optional[int], span: tuple[int, int, int]):
        return span

    def select(self, conf, eligible, i, span, generator):
        if self.alg == "origin":
            ts = timesteps(self.steps, self.eps, eligible.device)
            p = 1 - ts[i + 1] / ts[i] if i < self.steps - 1 else 1
            u = torch.rand(int(eligible.sum()), generator=generator, device=eligible.device)  # (N,) float32
            commit = torch.zeros_like(eligible)
            commit[eligible] = u < p
            return commit, span
        k = transfer_counts(eligible.sum(-1), i, self.steps, self.eps)
        return select_scheduled(conf, eligible, k, self.alg_temp, generator, span, self.window), span


def generate(model, input_ids: Tensor, attention_mask: Optional[Tensor] = None, max_new_tokens: int = 128,
             steps: int = 128, alg: str = "origin", alg_temp: Optional[float] = None, eps: float = 1e-3,
             temperature: float = 0.0, top_p: Optional[float] = None, top_k: Optional[int] = None,
             block_length: Optional[int] = None, generator: Optional[torch.Generator] = None,
             backend: str = "sdpa", callback=None) -> GenerateOutput:
    """Dream's ``diffusion_generate`` (no cache): ``steps`` full forwards over prompt + answer.

    block_length None (Dream's sampler) is one block of ``max_new_tokens``; a number splits the
    answer into semi-autoregressive blocks with ``steps`` divided evenly over them. Works for any
    model (Dream's logit shift is the model's own, ``config.shift_logits``)."""
    block = max_new_tokens if block_length is None else block_length
    steps_per_block = check_blocks(max_new_tokens, block, steps)
    rule = DreamSchedule(steps_per_block, alg, eps, alg_temp)
    proposal = DreamProposal(temperature, top_p, top_k)
    batch = prepare_batch(model, input_ids, attention_mask, max_new_tokens, None)
    return denoise(model, batch, blocks_after(batch.prompt_len, max_new_tokens, block), FullSequence(), rule,
                   proposal, generator=generator, backend=backend, callback=callback)
