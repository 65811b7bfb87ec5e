"""research.countdown_failures: each row's faults counted from its per-sample file; a record whose
stored correctness the checker contradicts is refused, naming the file and the record."""

import json

import pytest

from harness.results import REPO
from research import countdown_failures


def _write(path, preds: list[tuple[str, bool]]) -> None:
    path.write_text("".join(json.dumps({"id": f"cd-{i}", "prompt": "Countdown: 15,44,79,50", "reference": "",
                                        "prediction": p, "correct": c}) + "\n" for i, (p, c) in enumerate(preds)))


def test_faults_are_counted_per_row(tmp_path):
    _write(tmp_path / "countdown_ar.jsonl", [("44-15=29,79-29=50", True), ("44-15=28,79-28=51", False),
                                             ("25-17=8,8+1=9", False)])
    rows = countdown_failures.main(["--samples", str(tmp_path), "--out", str(tmp_path / "f.md")])
    assert rows == {"ar": {"n": 3, "right": 1, "malformed": 0, "false equation": 1, "number not available": 1,
                           "target missed": 2}}
    assert "| ar | 3 | 1 (33%) | 0 (0%) | 1 (33%) | 1 (33%) | 2 (67%) |" in (tmp_path / "f.md").read_text()
    _write(tmp_path / "countdown_ar.jsonl", [("44-15=28,79-28=51", True)])
    with pytest.raises(ValueError, match="countdown_ar.jsonl: record cd-0 says correct=True"):
        countdown_failures.main(["--samples", str(tmp_path), "--out", str(tmp_path / "g.md")])
    assert not (tmp_path / "g.md").exists()


def test_the_committed_table_is_what_the_samples_give(tmp_path):
    committed = REPO / "results" / "anyorder"
    countdown_failures.main(["--samples", str(committed), "--out", str(tmp_path / "f.md")])
    assert (tmp_path / "f.md").read_text() == (committed / "countdown_failures.md").read_text()
    assert (tmp_path / "f.json").read_text() == (committed / "countdown_failures.json").read_text()
