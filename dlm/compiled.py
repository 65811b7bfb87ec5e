"""Compiled decode: the one model's forward under ``torch.compile`` for every strategy.

The loop, the cache policies and the commit rules stay eager Python, and so do the model
forward's checks, the cache's length and the LM head (its column slice changes with every block).
Only :meth:`dlm.model.Transformer.body` is compiled (TorchInductor: fused RMSNorm / RoPE / SiLU
kernels, fewer Python dispatches), with *dynamic* shapes (``dynamic=True``): one graph per kind of
call (with or without a cache, masked or not) serves every width and
every window start. The cache is written in place inside the graph
(:meth:`dlm.cache.KVCache.layer_kv`), so a compiled forward reads and writes the same storage as
an eager one and the tokens are equal (tested). CUDA graphs (``mode="reduce-overhead"``) are not
used: they need static shapes and addresses, which the growing windows do not have.
"""

from __future__ import annotations

import weakref

import torch

#: graphs one compiled body may hold (torch's default of 8 is spent by the call kinds of a few
#: strategies; past it Dynamo silently runs eager)
RECOMPILE_LIMIT = 64

_COMPILED: "weakref.WeakKeyDictionary[torch.nn.Module, CompiledModel]" = weakref.WeakKeyDictionary()


class CompiledModel(torch.nn.Module):
    """``model`` with its :meth:`body` compiled; every other attribute is the model's."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.compiled_body = torch.compile(model.body, dynamic=True)

    def forward(self, *args, **kwargs):
        return self.model(*args, body=self.compiled_body, **kwargs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["model"], name)


def compiled(model: torch.nn.Module) -> CompiledModel:
    """The :class:`CompiledModel` of ``model``, made once per model object (the first call of each
    new kind of window pays the compile time; the wrapper shares the model's parameters)."""
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "body"):
        raise TypeError(f"model must be a dlm.model.Transformer, got {type(model).__name__}")
    wrapper = _COMPILED.get(model)
    if wrapper is None:
        limit = torch._dynamo.config
        limit.recompile_limit = max(limit.recompile_limit, RECOMPILE_LIMIT)
        wrapper = CompiledModel(model)
        _COMPILED[model] = wrapper
    return wrapper
