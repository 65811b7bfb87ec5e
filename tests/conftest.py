"""Shared pytest fixtures: shared data, the tiny models of :mod:`tiny`, a left-padded prompt
batch, the embedded tokenizer.

Markers (registered in pyproject.toml): ``slow`` = loads the shipped checkpoints, runs
subprocesses or takes more than ~2 s; ``python -m pytest -m "not slow"`` is the quick run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import tiny

#: Default location of the shared data directory: <repo>/../shared/data.
DEFAULT_SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def find_shared_data(relpath: str) -> Path:
    """Path of ``relpath`` under the shared data directory, or skip/fail the test.

    ``$DLM_SHARED_DATA`` (if set) is searched before the default location.  A
    missing file fails the test when ``CI=true`` and skips it otherwise; the message
    names the missing file and where to put it.
    """
    roots = [Path(os.environ["DLM_SHARED_DATA"])] if os.environ.get("DLM_SHARED_DATA") else []
    roots.append(DEFAULT_SHARED_DATA)
    for root in roots:
        candidate = root / relpath
        if candidate.exists():
            return candidate
    message = (f"shared data {relpath!r} is missing: put it at {DEFAULT_SHARED_DATA / relpath} (the data mirror "
               f"../shared/data beside the checkout; a symlink is fine) or set DLM_SHARED_DATA to a folder "
               f"holding {relpath} (searched: {', '.join(str(r) for r in roots)})")
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def shared_data() -> Callable[[str], Path]:
    """Fixture returning :func:`find_shared_data` (call it with a relative path)."""
    return find_shared_data


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny float64 models run much faster on one thread than on an oversubscribed 2-core box."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ------------------------------------------------------------------------------ tiny models
# Function-scoped: a test may edit its model's weights (e.g. push the EOS logit).


@pytest.fixture
def tiny_model():
    """Random native LLaDA-layout :class:`dlm.model.Transformer` (float64, eval): vocab 40,
    2 layers, bidirectional, [MASK] = 39, EOS = 2, pad = 0 (:func:`tiny.tiny_model`)."""
    return tiny.tiny_model()


@pytest.fixture
def tiny_dream():
    """:func:`tiny.tiny_dream`: the tiny model with Dream's shifted logits and q/k/v bias."""
    return tiny.tiny_dream()


@pytest.fixture
def prompts():
    """A left-padded prompt batch for the tiny models: ids (3, 5) with 5, 3, 4 real tokens and
    pad id 0, attention mask (3, 5) 0/1 (:func:`tiny.padded_prompts`)."""
    return tiny.padded_prompts(tiny.tiny_config(), lengths=(5, 3, 4))


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """The embedded word-level tokenizer (:func:`dlm.tasks.tokenizer.build_tokenizer`)."""
    from dlm.tasks.tokenizer import build_tokenizer

    return build_tokenizer()


@pytest.fixture
def tokenizer_model(tiny_tokenizer):
    """A random 1-layer float32 model over :func:`tiny_tokenizer`'s ids (:func:`tiny.tokenizer_model`)."""
    return tiny.tokenizer_model(tiny_tokenizer)
