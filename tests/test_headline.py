"""The README's headline block and docs/results.md are what results/ gives (never typed), and the
paired statistics behind them match a direct computation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from experiments.reproduce import headline
from tasks.evaluate import mcnemar_exact


def _recs(correct, seconds, tokens=10, flops=None, start=0):
    return [{"id": f"p{start + i}", "correct": c, "seconds": s, "tokens_until_eos": tokens,
             **({"flops": flops} if flops else {})} for i, (c, s) in enumerate(zip(correct, seconds))]


@pytest.mark.slow  # reads every per-sample file of results/ (~8 s)
def test_readme_block_and_results_doc_equal_what_the_files_give():
    assert headline.main(["--check"]) == 0, ("run python -m experiments.reproduce.headline and commit README.md, "
                                              "docs/results.md")


def test_paired_statistics_match_a_direct_computation():
    ref = _recs([1, 1, 0, 1, 0, 1, 1, 0], [2.0] * 8, flops=400)
    row = _recs([1, 0, 1, 1, 1, 1, 1, 1], [0.5] * 8, flops=100) + _recs([0], [9.0], start=50)  # p50: unpaired
    ev = headline.paired(ref, row, resamples=500)
    assert ev["n"] == 8 and (ev["b"], ev["c"]) == (1, 3) and ev["p"] == pytest.approx(mcnemar_exact(1, 3))
    assert ev["d_acc"] == pytest.approx(100 * (7 - 5) / 8) and ev["accuracy"] == pytest.approx(87.5)
    assert ev["speedup"] == pytest.approx(4.0) and ev["speedup_ci"] == pytest.approx([4.0, 4.0])  # equal per problem
    assert ev["flop_ideal"] == pytest.approx(4.0)
    lo, hi = ev["d_acc_ci"]
    assert lo <= ev["d_acc"] <= hi and lo < hi
    assert headline.verdict(ev).startswith("no significant change (p = ")


def test_the_speed_up_interval_resamples_problems_and_flags_a_row_above_its_ideal():
    rng = np.random.default_rng(1)
    sec = list(rng.uniform(0.5, 1.5, 40))
    ref = _recs([1] * 40, sec, flops=300)
    row = _recs([1] * 40, [s / 5 for s in sec[:20]] + [s / 3 for s in sec[20:]], flops=100)
    ev = headline.paired(ref, row, resamples=1000)
    direct = (400 / sum(r["seconds"] for r in row)) / (400 / sum(sec))
    assert ev["speedup"] == pytest.approx(direct, rel=1e-9)
    lo, hi = ev["speedup_ci"]
    assert 3 < lo < ev["speedup"] < hi < 5 and ev["flop_ideal"] == pytest.approx(3.0)
    assert "above its FLOP ideal 3.00x" in headline.verdict(ev)


def test_rows_without_timings_have_no_speed_up_and_disjoint_rows_are_refused():
    ev = headline.paired([{"id": 1, "correct": True}], [{"id": 1, "correct": False}])
    assert "speedup" not in ev and headline._speed(ev) == "-" and math.isclose(ev["d_acc"], -100.0)
    with pytest.raises(ValueError, match="common problem ids"):
        headline.paired([{"id": 1, "correct": True}], [{"id": 2, "correct": True}])


def test_the_readme_needs_both_markers_in_order():
    text = f"a\n{headline.START}\nold\n{headline.END}\nb\n"
    assert headline.readme_with(text, "new") == f"a\n{headline.START}\nnew\n{headline.END}\nb\n"
    for bad in ("no markers", f"{headline.END}\n{headline.START}\n", f"{headline.START}\n{headline.START}\n{headline.END}"):
        with pytest.raises(ValueError, match="headline:start"):
            headline.readme_with(bad, "new")


@pytest.mark.slow  # reads the committed tables
def test_each_headline_speed_up_is_the_one_its_linked_table_prints():
    """The paired recomputation agrees with the table a row links (same problems, same throughput)."""
    import re

    from harness.results import REPO

    text = (REPO / "README.md").read_text()
    block = text[text.index(headline.START):text.index(headline.END)]
    checked = 0
    for line in block.splitlines():
        linked = " ".join((REPO / link).read_text() for link in re.findall(r"\]\((results/[^)]*)\)", line))
        for number in re.findall(r"\*\*([\d.]+)x\*\*|FLOP ideal ([\d.]+)x", line):
            value = next(v for v in number if v)
            assert f"{value}x" in linked, (value, line)
            checked += 1
    assert checked >= 7  # six timed claims and one flagged FLOP ideal


def test_a_claim_reads_its_held_out_folder_and_its_timing_once_they_exist(tmp_path, monkeypatch):
    """Before the held-out run the claim is scored where it was picked; after it, on the held-out
    problems; a timing.json of the pick folder that timed this row gives the timed speed-up."""
    import json
    from pathlib import Path

    claim = headline.Claim("c", "pick", "base", "row", heldout="held")
    monkeypatch.setattr(headline.noninferiority, "margins", lambda folder, names, ref: {})
    for folder, start in (("pick", 0), ("held", 300)):
        (tmp_path / folder).mkdir()
        for name, correct in (("base", [1, 1, 0, 1]), ("row", [1, 0, 0, 1] if folder == "pick" else [1, 1, 1, 1])):
            lines = [json.dumps(r) for r in _recs(correct, [1.0] * 4, start=start)]
            if folder == "pick" or name == "base":
                (tmp_path / folder / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    ev = headline.evidence(claim, tmp_path)
    assert (ev["folder"], ev["heldout"], ev["accuracy"]) == ("pick", False, 50.0)  # held-out row not there yet
    (tmp_path / "held" / "row.jsonl").write_text("\n".join(json.dumps(r) for r in _recs([1] * 4, [0.5] * 4, start=300)))
    ev = headline.evidence(claim, tmp_path)
    assert (ev["folder"], ev["heldout"], ev["accuracy"]) == ("held", True, 100.0) and "timed" not in ev
    timing = {"meta": {"baseline": "base", "problems": 64, "conditions": {"repeats": 3}},
              "rows": [{"strategy": "row", "speedup": 2.5, "ci_low": 2.25, "ci_high": 2.75}]}
    (tmp_path / "pick" / "timing.json").write_text(json.dumps(timing))
    ev = headline.evidence(claim, tmp_path)
    assert ev["timed"] == [2.5, 2.25, 2.75] and headline._speed(ev) == "**2.50x** [2.25, 2.75] (timed, 3 repeats)"
    timing["meta"]["baseline"] = "other"  # timed against another reference: not this claim's speed-up
    (tmp_path / "pick" / "timing.json").write_text(json.dumps(timing))
    assert "timed" not in headline.evidence(claim, tmp_path)
    assert "noninferiority" not in ev and "declared margin" not in headline.verdict(ev)
    declared = {}
    monkeypatch.setattr(headline.noninferiority, "margins", lambda folder, names, ref: declared[(Path(folder).name, ref)])
    declared[("held", "base")] = {"row": 3.0}  # what the held-out folder's config.json declared
    ev = headline.evidence(claim, tmp_path)  # 4 of 4 against 3 of 4: a wide interval, inconclusive at -3
    assert ev["noninferiority"] == "inconclusive at -3" and "; inconclusive at -3 (declared margin)" in headline.verdict(ev)
