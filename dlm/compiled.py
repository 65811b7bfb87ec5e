"""Compiled decode: the one model's forward under ``torch.compile`` for every strategy.

The loop, the cache policies and the commit rules stay eager Python; only the model forward is
compiled (TorchInductor: fused RMSNorm / RoPE / SiLU kernels, fewer Python dispatches). Shapes are
*dynamic* (``dynamic=True``): one graph serves every window kind (a block-start refresh over all
columns, a cached window, the AR step) and every window start, instead of a recompile per block.
The cache is written in place inside the graph (:meth:`dlm.cache.KVCache.layer_kv`), so a
compiled forward reads and writes the same storage as an eager one and the tokens are equal
(tested). CUDA graphs (``mode="reduce-overhead"``) are not used: they need static shapes and
addresses, which the growing windows do not have.
"""

from __future__ import annotations

import weakref

import torch

_COMPILED: "weakref.WeakKeyDictionary[torch.nn.Module, torch.nn.Module]" = weakref.WeakKeyDictionary()


def compiled(model: torch.nn.Module) -> torch.nn.Module:
    """``torch.compile(model, dynamic=True)``, made once per model object (the first forward of
    each new graph pays the compile time; the wrapper shares the model's parameters)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    wrapper = _COMPILED.get(model)
    if wrapper is None:
        wrapper = torch.compile(model, dynamic=True)
        _COMPILED[model] = wrapper
    return wrapper
