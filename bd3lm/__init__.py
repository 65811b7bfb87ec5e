"""BD3-LM: block discrete denoising diffusion language models (Arriola et al., ICLR 2025).

Autoregressive over blocks of ``L'`` tokens, masked diffusion within a block:
``log p(x) >= -L_BD = -sum_b E_t (1/t) sum_{masked l} -log p(x^{b,l} | x_t^b, x^{<b})``
(BD3-LM eq. 8). ``L' = 1`` is an AR model, ``L' = L`` is MDLM.

Modules: :mod:`.masks` (the vectorized ``x_t ⊕ x_0`` mask), :mod:`.loss` (NELBO / objective),
:mod:`.schedules` (clipped schedules), :mod:`.clipping` (the variance search), :mod:`.policy`
(the exact block-causal cache), :mod:`.sampler` (exact-cache sampling), :mod:`.perplexity`,
:mod:`.data` (LM1B / OWT chunks). :class:`BD3LM` ties them to one ``dlm`` Transformer.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Iterable, Optional

import torch
import torch.nn as nn

from .loss import BD3Objective, NELBOTerms, bd3_logits, bd3_nelbo
from .masks import bd3_mask, dense_bd3_mask, flex_bd3_mask
from .perplexity import PerplexityResult, perplexity
from .policy import ALIGNS, BlockCausal, ExactBlockCache
from .rules import Ancestral, FirstHitting
from .sampler import sample
from .clipping import ClipSearchResult, search_clipping
from .schedules import DEFAULT_GRID, UNCLIPPED, ClipSchedule

from dlm.kind import BD3_FILE as META_FILE, BD3_KEY as META_KEY

__all__ = [
    "ALIGNS", "Ancestral", "BD3Config", "BD3LM", "BD3Objective", "BlockCausal", "ClipSchedule", "ClipSearchResult",
    "DEFAULT_GRID", "ExactBlockCache", "FirstHitting", "NELBOTerms", "PerplexityResult", "UNCLIPPED", "bd3_logits",
    "bd3_mask", "bd3_nelbo",
    "dense_bd3_mask", "flex_bd3_mask", "perplexity", "sample", "save_bd3", "search_clipping",
]


@dataclass(frozen=True)
class BD3Config:
    """BD3-LM metadata saved with the model: block size, training clip schedule, block alignment
    used when sampling (``absolute`` for pre-training chunks, ``prompt`` for SFT)."""

    block_size: int
    beta: float = 0.0
    omega: float = 1.0
    resample: bool = False
    align: str = "absolute"

    def __post_init__(self) -> None:
        if not isinstance(self.block_size, int) or isinstance(self.block_size, bool) or self.block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {self.block_size!r}")
        if self.align not in ALIGNS:
            raise ValueError(f"align must be one of {ALIGNS}, got {self.align!r}")
        ClipSchedule(self.beta, self.omega, self.resample)

    @property
    def schedule(self) -> ClipSchedule:
        return ClipSchedule(self.beta, self.omega, self.resample)


class BD3LM(nn.Module):
    """A dlm :class:`~dlm.model.Transformer` used as a BD3-LM with block size ``L'``.

    ``objective`` (for :func:`dlm.train.train`) carries the current training schedule;
    :meth:`eval_fn` reports the unclipped NELBO perplexity and, when ``search`` is on, replaces
    the schedule by the variance-minimising ``(beta, omega)`` (BD3-LM sec. 4).
    """

    def __init__(self, model: nn.Module, block_size: int, schedule: ClipSchedule = UNCLIPPED,
                 align: str = "absolute", backend: str = "sdpa") -> None:
        super().__init__()
        if getattr(getattr(model, "config", None), "mask_token_id", None) is None:
            raise TypeError(f"model must be a dlm Transformer, got {type(model).__name__}")
        self.model = model
        BD3Config(block_size, schedule.beta, schedule.omega, schedule.resample, align)
        if block_size > model.config.max_seq_len:
            raise ValueError(f"block_size={block_size} exceeds max_seq_len={model.config.max_seq_len}")
        self.block_size, self.align, self.backend = block_size, align, backend
        self.objective = BD3Objective(block_size, schedule, backend)

    @property
    def config(self):
        return self.model.config

    @property
    def schedule(self) -> ClipSchedule:
        return self.objective.schedule

    @schedule.setter
    def schedule(self, value: ClipSchedule) -> None:
        if not isinstance(value, ClipSchedule):
            raise TypeError(f"schedule must be a ClipSchedule, got {type(value).__name__}")
        self.objective.schedule = value

    @property
    def bd3_config(self) -> BD3Config:
        s = self.schedule
        return BD3Config(self.block_size, s.beta, s.omega, s.resample, self.align)

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    # ---------------------------------------------------------------------------------------
    def loss(self, batch, generator: Optional[torch.Generator] = None, clipped: bool = True) -> NELBOTerms:
        """NELBO terms of one estimate; ``clipped=False`` uses the unclipped U[0, 1] schedule."""
        batch = batch if isinstance(batch, dict) else {"input_ids": batch}
        return bd3_nelbo(self.model, batch, self.block_size, schedule=self.schedule if clipped else UNCLIPPED,
                         generator=generator, backend=self.backend)

    def sample(self, input_ids, attention_mask=None, **kwargs):
        """:func:`bd3lm.sampler.sample` with this block size and alignment (overridable)."""
        kwargs.setdefault("block_size", self.block_size)
        kwargs.setdefault("align", self.align)
        return sample(self.model, input_ids, attention_mask, **kwargs)

    def perplexity(self, batches: Iterable, generator: Optional[torch.Generator] = None,
                   exact_ar: bool = False, passes: int = 1) -> PerplexityResult:
        return perplexity(self.model, batches, self.block_size, generator=generator, exact_ar=exact_ar,
                          backend=self.backend, passes=passes)

    def search_clipping(self, batches: Iterable, grid: Iterable = DEFAULT_GRID,
                        generator: Optional[torch.Generator] = None, update: bool = True) -> ClipSearchResult:
        result = search_clipping(self.model, batches, self.block_size, grid, generator,
                                 resample=self.schedule.resample, backend=self.backend)
        if update:
            self.schedule = result.schedule
        return result

    def eval_fn(self, val_batches, grid: Iterable = DEFAULT_GRID, search: bool = True, seed: int = 0):
        """``eval_fn(model) -> dict`` for :func:`dlm.train.train` (``val_batches``: a list, or a
        zero-argument callable returning an iterable). Reports ``val_nelbo``/``val_ppl`` (always
        unclipped) and, with ``search``, the chosen ``beta``/``omega`` (applied to training)."""
        def fn(model) -> dict:
            batches = list(val_batches() if callable(val_batches) else val_batches)
            g = torch.Generator(device=next(model.parameters()).device.type).manual_seed(seed)
            ppl = perplexity(model, batches, self.block_size, generator=g, backend=self.backend)
            out = {"val_nelbo": ppl.nelbo, "val_ppl": ppl.ppl}
            if search:
                res = search_clipping(model, batches, self.block_size, grid, g,
                                      resample=self.schedule.resample, backend=self.backend)
                self.schedule = res.schedule
                out.update({"clip_beta": res.schedule.beta, "clip_omega": res.schedule.omega})
            return out

        return fn

    # ---------------------------------------------------------------------------------------
    def save_fn(self, model, tokenizer, out_dir) -> None:
        """``save_fn(model, tokenizer, dir)`` for :func:`dlm.train.train`."""
        save_bd3(model, tokenizer, out_dir, self.bd3_config)

    def save(self, out_dir, tokenizer=None, dtype=None) -> Path:
        return save_bd3(self.model, tokenizer, out_dir, self.bd3_config, dtype)

    @classmethod
    def load(cls, path, dtype=torch.float32, device=None, backend: str = "sdpa") -> tuple["BD3LM", object]:
        """``(BD3LM, tokenizer)`` from a directory written by :meth:`save`: its BD3-LM metadata
        (``config.json`` ``extra.bd3lm`` and / or ``bd3lm.json``, which must agree) checked whole,
        each error naming the file and the key."""
        from dlm.checkpoints import load_model, read_config, resolve_path
        from dlm.kind import bd3_metadata

        path = resolve_path(path)
        _, raw = read_config(path)
        found = bd3_metadata(path, raw)
        if found is None:
            raise ValueError(f"{path} has no BD3-LM metadata (config.json extra.{META_KEY} or {META_FILE}): "
                             "not a block-causal BD3-LM checkpoint")
        meta, source = found
        unknown = sorted(set(meta) - {f.name for f in fields(BD3Config)})
        if unknown:
            raise ValueError(f"{source}: unknown key(s) {unknown} (BD3Config fields: "
                             f"{[f.name for f in fields(BD3Config)]})")
        if "block_size" not in meta:
            raise ValueError(f"{source}: missing key 'block_size'")
        try:
            cfg = BD3Config(**meta)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{source}: {e}") from None
        model, tokenizer = load_model(path, dtype=dtype, device=device)
        return cls(model, cfg.block_size, cfg.schedule, cfg.align, backend), tokenizer


def save_bd3(model, tokenizer, out_dir, config: BD3Config, dtype=None) -> Path:
    """Save via :func:`dlm.checkpoints.save_model` with the BD3-LM metadata in
    ``config.json["extra"]["bd3lm"]`` and a copy in ``bd3lm.json``."""
    from dlm.checkpoints import save_model

    meta = asdict(config)
    path = Path(save_model(model, tokenizer, out_dir, dtype=dtype, extra_config={META_KEY: meta}))
    (path / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return path
