"""The one loop's hot path is sync-free: untimed (the default) a whole generation calls no
``torch.cuda.synchronize`` inside its steps (one at the end of the call, for its wall time) and
reads nothing to the host there but the dynamic rule's stop check (one ``bool`` per step, none for
a scheduled rule); ``timed=True`` synchronises around every forward and records the forward time;
tokens and counts are the same either way.

The host is CPU here, so the loop's timer is made to believe it runs on CUDA and
``torch.cuda.synchronize`` is a recording mock (:func:`guard`). The steps' region is found from
the run itself, whatever entry starts it: from the first forward to the last step's ``callback``
(every block's steps, their stop checks and policy calls; the call's setup and its final reads
are outside). Each read or sync is recorded with the library line that made it."""

import functools
import os
import sys
import traceback

import pytest
import torch

import fastdllm
from bd3lm import sample as bd3_sample
from dlm import sample
from dlm.stats import ForwardTimer
from fastdllm import DualCache
from tiny import fastdllm_model, fastdllm_prompts, tiny_model

READS = ("item", "tolist", "numpy", "__int__", "__float__", "__index__")  # a tensor's value to the host
TORCH = os.path.dirname(torch.__file__)


def caller() -> str:
    """``file:line`` of the library code that made the current call."""
    for f in reversed(traceback.extract_stack()[:-2]):
        if f.filename != __file__ and not f.filename.startswith(TORCH):
            return f"{os.path.relpath(f.filename)}:{f.lineno}"
    return "?"


class Guard:
    """What a run did: forwards, step callbacks and its host events ``(kind, callbacks before it,
    where)`` from the first forward on."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.forwards, self.steps, self.events = 0, 0, []

    def note(self, kind: str) -> None:
        if self.forwards:
            self.events.append((kind, self.steps, caller()))

    def callback(self, view) -> None:  # reads nothing
        self.steps += 1

    def inside(self, *kinds: str) -> list:
        """The events of ``kinds`` inside the steps: before the last step's callback."""
        return [e for e in self.events if e[0] in kinds and e[1] < self.steps]

    def after(self, kind: str) -> list:
        return [e for e in self.events if e[0] == kind and e[1] == self.steps]


@pytest.fixture
def guard(monkeypatch) -> Guard:
    g = Guard()

    class FakeCudaTimer(ForwardTimer):
        """The loop's timer as on a CUDA device (it calls the mocked synchronize); counts forwards."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.cuda = True

        def __call__(self, *args, **kwargs):
            g.forwards += 1
            return super().__call__(*args, **kwargs)

    monkeypatch.setattr(sample, "ForwardTimer", FakeCudaTimer)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: g.note("synchronize"))
    for name in (*READS, "__bool__"):
        def read(self, *args, _orig=getattr(torch.Tensor, name), _name=name, **kwargs):
            g.note(_name)
            return _orig(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, read)

    def tensor(*args, _orig=torch.tensor, **kwargs):  # host data to a device: on CUDA a synchronising copy
        g.note("torch.tensor")
        return _orig(*args, **kwargs)

    monkeypatch.setattr(torch, "tensor", tensor)
    return g


def check_sync_free(guard: Guard, out, dynamic: bool, per_block: int = 0) -> None:
    st = out.stats
    assert guard.steps == st.steps > 0 and guard.forwards == st.nfe
    assert not guard.inside(*READS), f"host reads inside the steps: {guard.inside(*READS)}"
    assert not guard.inside("synchronize"), f"synchronize inside the steps: {guard.inside('synchronize')}"
    assert len(guard.after("synchronize")) == 1  # the call's end only: its wall time
    bools = guard.inside("__bool__")
    assert len(bools) <= (st.steps if dynamic else 0) + per_block, f"more than the stop checks: {bools}"
    assert st.forward_seconds == 0.0 and all(k[1] == 0.0 for k in st.forward_kinds.values())
    assert st.seconds > 0 and type(st.extra["refreshes"]) is int


def without_timing(out) -> dict:
    d = out.stats.as_dict()
    d.pop("seconds"), d.pop("forward_seconds")
    d["forward_kinds"] = [k[:4] + k[5:] for k in d["forward_kinds"]]  # (queries, keys, head, n, FLOPs)
    return d


CASES = [  # fastdllm.generate options, Dream-style model (under the LLaDA rules), padded prompts
    (dict(cache="dual", threshold=0.3), False, True),
    (dict(cache="dual", threshold=0.3), True, False),
    (dict(cache="prefix"), False, True),  # top-k
    (dict(cache="prefix", factor=2.0), True, True),
    (dict(cache="dual", refresh_every=2), False, True),
    (dict(threshold=0.3), False, True),  # no cache
    (dict(temperature=1.0, remasking="random"), False, False),
]


@pytest.mark.parametrize("kw,shift,padded", CASES)
def test_untimed_steps_neither_sync_nor_read(guard, kw, shift, padded):
    model = fastdllm_model(n_layers=2, shift=shift)
    ids, am = fastdllm_prompts(padded=padded)
    run = functools.partial(fastdllm.generate, model, ids, am, gen_length=12, block_length=4, steps=6,
                            rules="llada", **kw)
    out = run(generator=torch.Generator().manual_seed(3), callback=guard.callback)
    check_sync_free(guard, out, dynamic="threshold" in kw or "factor" in kw)
    plain = run(generator=torch.Generator().manual_seed(3))
    assert torch.equal(out.sequences, plain.sequences) and torch.equal(out.commit_step, plain.commit_step)
    assert without_timing(out) == without_timing(plain)


def test_a_per_row_refresh_flag_is_counted_on_the_device(guard, monkeypatch):
    """A policy reporting its refreshes per row ((B,) bool, as the adaptive cache does) costs the
    steps no read: the loop counts them on the device; a callback reading ``view.full`` pays its own."""
    model = fastdllm_model(n_layers=2)
    ids, am = fastdllm_prompts(padded=True)
    run = functools.partial(fastdllm.generate, model, ids, am, gen_length=12, block_length=4, cache="dual")
    full = []
    plain = run(callback=lambda v: full.append(v.full))
    logits = DualCache.logits

    def per_row(self, run, lo, hi, i):
        out = logits(self, run, lo, hi, i)
        run.refreshed = torch.full((run.x.shape[0],), run.refreshed)  # (B,) the same flag for every row
        return out

    monkeypatch.setattr(DualCache, "logits", per_row)
    guard.reset()
    out = run(callback=guard.callback)
    check_sync_free(guard, out, dynamic=False)
    assert out.stats.extra["refreshes"] == plain.stats.extra["refreshes"] == 3  # one per block
    assert torch.equal(out.sequences, plain.sequences) and without_timing(out) == without_timing(plain)
    seen = []
    run(callback=lambda v: seen.append(v.full))
    assert seen == full and all(type(f) is bool for f in seen) and sum(seen) == 3


@pytest.mark.parametrize("mode", ["topk", "threshold"])
def test_the_exact_cache_is_sync_free(guard, mode):
    model = tiny_model()
    ids = torch.randint(4, 39, (2, 5), generator=torch.Generator().manual_seed(0))
    kw = dict(steps_per_block=2) if mode == "topk" else dict(threshold=0.5)
    out = bd3_sample(model, ids, block_size=4, gen_length=12, mode=mode, stop_at_eos=False,
                     callback=guard.callback, **kw)
    check_sync_free(guard, out, dynamic=mode == "threshold")


def test_stop_at_eos_reads_once_per_block(guard):
    model = fastdllm_model(n_layers=2, eos_bias=3.0)
    ids, am = fastdllm_prompts(padded=True)
    out = fastdllm.generate(model, ids, am, gen_length=12, block_length=4, cache="dual", stop_at_eos=True,
                            callback=guard.callback)  # top-k
    check_sync_free(guard, out, dynamic=False, per_block=out.stats.extra["blocks_run"])


@pytest.mark.parametrize("kw,shift", [(dict(cache="delayed"), False), (dict(cache="adaptive", tolerance=0.05), False),
                                      (dict(cache="dual", rules="dream"), True)])
@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="the delayed (dKV) and adaptive (drift) caches and Dream's proposal and schedule read "
                          "to the host every step; the failure lists the lines")
def test_host_reading_steps_are_caught(guard, kw, shift):
    """Known per-step host reads outside the loop: strict xfail, so fixing one turns this red
    until its case moves to ``CASES``."""
    model = fastdllm_model(n_layers=2, shift=shift)
    ids, am = fastdllm_prompts(padded=True)
    out = fastdllm.generate(model, ids, am, gen_length=12, block_length=4, callback=guard.callback, **kw)
    check_sync_free(guard, out, dynamic=False)


def test_no_host_to_device_copy_inside_the_steps(guard):
    """The excluded ids' tensor is built once per call (a host-to-device copy syncs on CUDA)."""
    model = fastdllm_model(n_layers=2)
    ids, am = fastdllm_prompts(padded=True)
    fastdllm.generate(model, ids, am, gen_length=12, block_length=4, cache="dual", threshold=0.3,
                      callback=guard.callback)
    assert not guard.inside("torch.tensor"), f"torch.tensor inside the steps: {guard.inside('torch.tensor')}"


def test_timed_syncs_every_forward_and_changes_nothing(guard):
    model = fastdllm_model(n_layers=2)
    ids, am = fastdllm_prompts(padded=True)
    run = functools.partial(fastdllm.generate, model, ids, am, gen_length=12, block_length=4, cache="dual",
                            threshold=0.3)
    untimed = run()
    assert untimed.stats.forward_seconds == 0.0 and untimed.stats.overhead_seconds == untimed.stats.seconds
    guard.reset()
    timed = run(timed=True, callback=guard.callback)
    st = timed.stats
    assert len([e for e in guard.events if e[0] == "synchronize"]) == 2 * st.nfe + 1  # around each forward, at the end
    assert st.forward_seconds > 0 and all(k[1] > 0 for k in st.forward_kinds.values())
    assert sum(k[1] for k in st.forward_kinds.values()) == pytest.approx(st.forward_seconds)
    assert st.forward_seconds <= st.seconds
    assert torch.equal(timed.sequences, untimed.sequences) and torch.equal(timed.commit_step, untimed.commit_step)
    assert without_timing(timed) == without_timing(untimed)
