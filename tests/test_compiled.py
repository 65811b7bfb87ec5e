"""Compiled decode (dlm.compiled): the model forward under torch.compile gives the eager tokens
for a cache-free, an approximate-cache, a gathered-window (dLLM-Cache), an exact-cache and the AR strategy, on one compiled model
(dynamic shapes: one graph for every window kind and start). Slow: TorchInductor compiles C++. The cache's write and read stay out of every traced graph."""

import pytest
import torch

from dlm.cache import KVCache

from dlm.compiled import compiled
from dlm.spec import Sampler, generate
from tests.tiny import random_prompts, tiny_model


@pytest.mark.slow
def test_compiled_decode_gives_the_eager_tokens():
    model = tiny_model()
    ids = random_prompts(2, 10, model.config)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    ids = ids.masked_fill(mask == 0, model.config.pad_token_id)
    rows = [Sampler.of("baseline", policy="none", rule="topk", gen_length=16, block_length=8),
            Sampler.of("dual_threshold", policy="dual", rule="threshold", gen_length=16, block_length=8, threshold=0.2),
            Sampler.of("prefix", policy="prefix", rule="topk", gen_length=16, block_length=8, steps=8),
            Sampler.of("dllm_cache", policy="dllm_cache", rule="topk", gen_length=16, block_length=8, gen_interval=2,
                       transfer_ratio=0.5),
            Sampler.of("ar", policy="ar", rule="topk", gen_length=16, block_length=1)]
    for s in rows:
        eager = generate(model, ids, mask, s)
        fast = generate(model, ids, mask, s, compile=True)
        assert torch.equal(fast.sequences, eager.sequences), s.name
        assert fast.stats.nfe == eager.stats.nfe
    assert compiled(model) is compiled(model)  # one wrapper per model: its graphs are reused


def test_compile_flag_is_checked_before_compute():
    model = tiny_model()
    with pytest.raises(TypeError, match="compile"):
        generate(model, random_prompts(1, 4, model.config), None,
                 Sampler.of("baseline", policy="none", rule="topk", gen_length=8, block_length=8), compile="yes")
    with pytest.raises(TypeError, match="model"):
        compiled(object())


@pytest.mark.parametrize("gathered", [False, True])
def test_the_cache_buffer_never_enters_a_traced_graph(gathered):
    model = tiny_model()
    ids = random_prompts(2, 12, model.config)
    graphs = []

    def capture(gm, example_inputs):  # the traced graphs, run as traced (no Inductor)
        graphs.append([tuple(t.shape) for t in example_inputs if isinstance(t, torch.Tensor)])
        return gm.forward

    eager_cache, traced_cache = (KVCache.for_model(model, 2, 12) for _ in range(2))
    for cache in (eager_cache, traced_cache):
        with torch.no_grad():
            model(ids, cache=cache, commit=True)
    body = torch.compile(model.body, backend=capture, dynamic=True)
    window = torch.tensor([[3, 5], [4, 7]]) if gathered else 4
    x = ids.gather(1, window) if gathered else ids[:, 4:6]
    pos = window if gathered else torch.arange(4, 6).expand(2, 2)
    with torch.no_grad():
        want = model(x, positions=pos, cache=eager_cache, start=window)
        got = model(x, positions=pos, cache=traced_cache, start=window, body=body)
    assert len(graphs) > model.config.n_layers  # a graph break at each layer's cache access
    assert not [s for g in graphs for s in g if s == tuple(traced_cache.k.shape)]
    assert torch.equal(got, want) and torch.equal(traced_cache.k, eager_cache.k) and torch.equal(traced_cache.v, eager_cache.v)


def test_importing_the_library_does_not_load_the_compiler():
    import subprocess
    import sys

    code = "import sys, dlm.sample, dlm.model, dlm.cache, dlm.spec; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"  # torch._dynamo costs ~2 s per process; only compiling loads it
