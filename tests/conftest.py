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

from dlm.io import data_root

#: the data mirror this session would see ($DLM_SHARED_DATA, else ../shared/data beside the
#: checkout), read once before any test hides it
SHARED_DATA = data_root()
#: where every test that does not ask for the data mirror finds it: nowhere
HIDDEN_DATA = Path("/nonexistent/dlm-data-mirror-hidden-from-this-test")


def find_shared_data(relpath: str) -> Path:
    """Path of ``relpath`` in the data mirror (:data:`SHARED_DATA`), or skip the test, naming the
    file and ``DLM_SHARED_DATA``; under ``CI=true`` a missing file fails it instead.

    Only tests that take the :func:`shared_data` fixture see the mirror: for every other test
    ``DLM_SHARED_DATA`` points to :data:`HIDDEN_DATA`, so a test that reads it by another way fails
    on every machine, not only on a clone without ``../shared``."""
    candidate = SHARED_DATA / relpath
    if candidate.exists():
        return candidate
    message = (f"needs the data mirror's {relpath} (not in {SHARED_DATA}): set DLM_SHARED_DATA to a folder "
               f"holding it, or put the mirror at ../shared/data beside the checkout (see README, 'Data')")
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def shared_data(monkeypatch) -> Callable[[str], Path]:
    """:func:`find_shared_data`, for a test that reads the data mirror: the code under test sees
    the mirror too (``DLM_SHARED_DATA`` set to it for this test)."""
    monkeypatch.setenv("DLM_SHARED_DATA", str(SHARED_DATA))
    return find_shared_data


@pytest.fixture(autouse=True)
def _hide_shared_data(request, monkeypatch):
    """Every test without the ``shared_data`` fixture runs as on a clone without ``../shared``."""
    if "shared_data" not in request.fixturenames:
        monkeypatch.setenv("DLM_SHARED_DATA", str(HIDDEN_DATA))


def pytest_collection_modifyitems(items):
    """Tests that take ``shared_data`` are marked ``shared_data`` (``-m shared_data`` selects them)."""
    for item in items:
        if "shared_data" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.shared_data)


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
    """The embedded word-level tokenizer (:func:`tasks.tokenizer.build_tokenizer`)."""
    from tasks.tokenizer import build_tokenizer

    return build_tokenizer()


@pytest.fixture
def tokenizer_model(tiny_tokenizer):
    """A random 1-layer float32 model over :func:`tiny_tokenizer`'s ids (:func:`tiny.tokenizer_model`)."""
    return tiny.tokenizer_model(tiny_tokenizer)
