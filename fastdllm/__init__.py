"""Fast-dLLM (Wu et al. 2025): block-wise prefix / dual KV caching and confidence-aware
parallel decoding for masked diffusion LMs, on the shared :mod:`dlm` model, cache and loop."""

from fastdllm.generate import generate
from fastdllm.policies import CACHE_MODES, DualCache, PrefixCache, Window, cache_policy, window, window_flops

__all__ = ["CACHE_MODES", "DualCache", "PrefixCache", "Window", "cache_policy", "generate", "window",
           "window_flops"]
