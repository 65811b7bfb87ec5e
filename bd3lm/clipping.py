"""Data-driven clipped schedules (BD3-LM sec. 4 / Table 6): the variance search.

:func:`search_clipping` evaluates the clipped NELBO estimator (:func:`bd3lm.loss.bd3_nelbo`) for
every ``(beta, omega)`` of a grid on validation batches, with *common random numbers* (the same
block uniforms ``u`` and token uniforms for every grid point), and picks the pair that minimises
the summed per-batch variance of the per-(sequence, block) NELBO terms (as BD3-LM's reference
``_clipped_schedule_search``). Imports: schedules <- loss <- clipping (no cycle).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

import torch

from .loss import bd3_nelbo
from .schedules import DEFAULT_GRID, ClipSchedule, check_grid, draw_noise

__all__ = ["ClipSearchResult", "search_clipping"]


@dataclass(frozen=True)
class ClipSearchResult:
    """Chosen schedule and the summed per-batch variance of every grid point."""

    schedule: ClipSchedule
    variances: dict = field(default_factory=dict)  # (beta, omega) -> summed variance
    n_batches: int = 0

    def to_dict(self) -> dict:
        return {"beta": self.schedule.beta, "omega": self.schedule.omega, "n_batches": self.n_batches,
                "variances": {f"{b:g}-{o:g}": v for (b, o), v in self.variances.items()}}


@torch.no_grad()
def search_clipping(model, batches: Iterable[dict], block_size: int,
                    grid: Iterable = DEFAULT_GRID, generator: Optional[torch.Generator] = None,
                    resample: bool = False, backend: str = "sdpa") -> ClipSearchResult:
    """Pick ``(beta, omega)`` minimising Var(NELBO estimate) on validation ``batches``.

    Each batch (a dict with ``input_ids`` (B, L), or the ids tensor) gets one noise draw shared
    by all grid points; the statistic of a grid point is the sum over batches of the variance of
    its per-(sequence, block) NELBO terms.
    """
    pairs = check_grid(grid)
    schedules = [ClipSchedule(b, o, resample=resample) for b, o in pairs]
    totals = torch.zeros(len(pairs), dtype=torch.float64)  # (G,)
    n = 0
    for batch in batches:
        ids = batch["input_ids"] if isinstance(batch, dict) else batch  # (B, L)
        batch = batch if isinstance(batch, dict) else {"input_ids": batch}
        noise = draw_noise(ids.shape[0], ids.shape[1], block_size, schedules[0], generator, ids.device)
        for i, sched in enumerate(schedules):
            terms = bd3_nelbo(model, batch, block_size, schedule=sched, noise=noise, backend=backend)
            totals[i] += terms.block_terms.flatten().to(torch.float64).var().cpu()
        n += 1
    if n == 0:
        raise ValueError("batches: empty validation set for the clipping search")
    best = int(torch.argmin(totals))
    variances = {p: float(v) for p, v in zip(pairs, totals)}
    return ClipSearchResult(ClipSchedule(*pairs[best], resample=resample), variances, n)
