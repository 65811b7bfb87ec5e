"""Dream 7B (Ye et al. 2025): Dream's own sampler (``diffusion_generate``) on the shared :mod:`dlm`
model, cache and loop: the rule ``dream`` (its remasking algorithms on its timesteps), the proposal
``dream`` (its ``sample_tokens``) and :func:`generate`, the paper's entry."""

from dream.sampler import ALGS, DreamProposal, DreamSchedule, generate, sample_tokens

__all__ = ["ALGS", "DreamProposal", "DreamSchedule", "generate", "sample_tokens"]
