"""The suite passes on a clone without the data mirror: every test that reads ``../shared/data``
takes the ``shared_data`` fixture (and is marked ``shared_data``), every other test runs with the
mirror hidden, and with the mirror absent the data tests skip, naming ``DLM_SHARED_DATA``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HIDDEN_DATA, SHARED_DATA
from dlm.io import data_root

REPO = Path(__file__).resolve().parents[1]


def test_a_test_without_the_fixture_sees_no_mirror():
    assert data_root() == HIDDEN_DATA and not data_root().exists()


def test_the_fixture_shows_the_mirror_to_the_code_under_test(shared_data):
    shared_data(".")  # skips (CI: fails) without the mirror
    assert data_root() == SHARED_DATA


def test_data_root_is_the_variable_else_beside_the_checkout(monkeypatch, tmp_path):
    monkeypatch.setenv("DLM_SHARED_DATA", str(tmp_path))
    assert data_root() == tmp_path
    monkeypatch.delenv("DLM_SHARED_DATA")
    assert data_root() == REPO.parent / "shared" / "data"


@pytest.mark.slow  # collects the whole suite in a subprocess (~20 s)
def test_data_tests_skip_not_fail_without_the_mirror(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(DLM_SHARED_DATA=str(tmp_path / "absent"), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-m", "shared_data", "-p", "no:cacheprovider",
                           str(REPO / "tests")], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-2000:]
    summary = out.strip().splitlines()[-1]
    assert not re.search(r"\d+ (passed|failed|error)", summary), summary  # every data test skipped
    skipped = int(re.search(r"(\d+) skipped", summary).group(1))
    assert skipped >= 15, summary
    reasons = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert reasons and all("DLM_SHARED_DATA" in r for r in reasons), reasons[:3]
