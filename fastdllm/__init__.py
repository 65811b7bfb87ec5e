"""Fast-dLLM (Wu et al. 2025): block-wise prefix / dual KV caching (:mod:`.policies`),
confidence-aware parallel decoding (:mod:`.rules`) and its Dream-family block rules (:mod:`.dream`),
registered as methods of the shared :mod:`dlm` model, cache and loop; :func:`generate` is the
paper's entry."""

from fastdllm.dream import FastDreamFamily, FirstColumn
from fastdllm.generate import generate
from fastdllm.policies import DualCache, PrefixCache, Window, window, window_flops
from fastdllm.rules import Factor, Threshold, select_factor, select_threshold

__all__ = ["DualCache", "Factor", "FastDreamFamily", "FirstColumn", "PrefixCache", "Threshold", "Window", "generate",
           "select_factor", "select_threshold", "window", "window_flops"]
