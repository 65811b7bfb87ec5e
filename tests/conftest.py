"""Shared pytest fixtures."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

#: Default location of the shared data directory: <repo>/../shared/data.
DEFAULT_SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def find_shared_data(relpath: str) -> Path:
    """Path of ``relpath`` under the shared data directory, or skip/fail the test.

    ``$DLM_SHARED_DATA`` (if set) is searched before the default location.  A
    missing file fails the test when ``CI=true`` and skips it otherwise.
    """
    roots = [Path(os.environ["DLM_SHARED_DATA"])] if os.environ.get("DLM_SHARED_DATA") else []
    roots.append(DEFAULT_SHARED_DATA)
    for root in roots:
        candidate = root / relpath
        if candidate.exists():
            return candidate
    message = f"shared data file {relpath!r} not found under {[str(r) for r in roots]}"
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
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
