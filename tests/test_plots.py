"""Plots read at a glance (harness/plots.py, plot_labels.py, trace.py): the Pareto plot's labels
never overlap (rendered boxes), every point belongs to a legend entry whose words match what it
draws, the title names the data from the run's config; the trace picture wraps into rows that
fit ~1400 px at a fixed dpi. Built from the committed results files only (no ../shared)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from experiments.cli import trace  # noqa: E402
from harness import plots  # noqa: E402
from harness.plot_labels import candidate_offsets, overlapping_pairs, segment_hits_box  # noqa: E402
from harness.report import Row  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CHAIN_256 = REPO / "results" / "gsm8k_chain_256"


def _committed(d: Path = CHAIN_256) -> tuple[list[Row], dict]:
    table = json.loads((d / "table.json").read_text())
    return [Row(**r) for r in table["rows"]], table["meta"]


@pytest.fixture(scope="module")
def chain_256():
    """The committed 58-row sweep (3 caches x 19 rows + BD3-LM), drawn once."""
    rows, meta = _committed()
    drawn = plots.draw_pareto(rows, meta)
    yield rows, meta, drawn
    plt.close(drawn["fig"])


def test_crowded_committed_sweep_labels_never_overlap(chain_256):
    rows, _, drawn = chain_256
    renderer = drawn["fig"].canvas.get_renderer()
    labels = drawn["labels"]
    named = {i for i, r in enumerate(rows) if not r.strategy.startswith("sw_")} | set(drawn["front"])
    assert set(labels) == named and len(named) >= 10  # the front and every named row, no sweep row
    texts = [labels[i] for i in sorted(labels)]
    assert None not in texts, [rows[i].strategy for i in labels if labels[i] is None]
    assert not overlapping_pairs(texts, renderer)
    frame = drawn["ax"].get_window_extent(renderer)
    legend = drawn["legend"].get_window_extent(renderer)
    for t in texts:
        b = t.get_window_extent(renderer)
        assert frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1, t.get_text()
        assert not b.overlaps(legend)
    assert {t.get_text() for t in texts} == {rows[i].strategy for i in named}


def test_every_point_is_in_one_legend_entry_whose_counts_match_the_drawing(chain_256):
    rows, _, drawn = chain_256
    groups, handles = drawn["groups"], drawn["handles"]
    assert sorted(i for idx in groups.values() for i in idx) == list(range(len(rows)))  # one group each
    texts = drawn["legend_texts"]
    assert [t.get_text() for t in drawn["legend"].get_texts()] == texts
    assert len(texts) == len(groups) + 1
    fronts = []
    for (cache, idx), text in zip(groups.items(), texts):
        marks, line, n_own = handles[cache]
        assert sorted(zip(marks.get_xdata(), marks.get_ydata())) == sorted(
            (rows[i].tokens_per_second, 100 * rows[i].accuracy) for i in idx)
        m = re.fullmatch(rf"cache {cache}: (\d+) rows?(?:; dashed: its own front \((\d+) rows?\))?", text)
        assert m and int(m[1]) == len(idx), text
        own = plots.pareto_front([(rows[i].tokens_per_second, rows[i].accuracy) for i in idx])
        if line is None:
            assert m[2] is None and len(own) == 1
        else:
            assert int(m[2]) == len(line.get_xdata()) == len(own) == n_own
            fronts.append(n_own)
    # the old legend said "its front (19 points)" for all three caches: each front is counted on its own
    assert {c: handles[c][2] for c in ("none", "prefix", "dual")} == {"none": 2, "prefix": 1, "dual": 2}
    # the committed table: 19 sweep and Table 1 rows per Fast-dLLM cache, plus EB-Sampler's two on none and dual
    assert fronts == [2, 2] and {c: len(groups[c]) for c in ("none", "prefix", "dual")} == {
        "none": 21, "prefix": 19, "dual": 21}
    m = re.fullmatch(r"Pareto front over all rows \((\d+) rows?, bold labels\)", texts[-1])
    assert m and int(m[1]) == len(drawn["front"]) >= 1
    assert all(drawn["labels"][i].get_fontweight() == "bold" for i in drawn["front"])


def test_title_names_the_data_model_and_length_from_the_config(chain_256):
    rows, meta, drawn = chain_256
    words, details = plots.describe_run(rows, meta)
    assert words == "procedural GSM8K-format arithmetic"
    assert details.startswith("llada-chain + bd3lm-chain-16 (bd3lm)") and "gen 256" in details
    assert "0-shot" in details and "n = 100–300 per row" in details
    shown = [t.get_text() for t in drawn["fig"].texts]
    assert f"Accuracy vs throughput: {words}" in shown and details in shown
    words, details = plots.describe_run(rows[:2], {"run_config": {}})  # no config.json: said, not guessed
    assert words == "" and details == "n = 300 per row"


def test_small_runs_label_every_row_and_the_png_is_byte_stable(tmp_path):
    rows, meta = _committed(REPO / "results" / "gsm8k_chain_256_4shot")
    drawn = plots.draw_pareto(rows, meta)
    assert len(drawn["labels"]) == len(rows) and None not in drawn["labels"].values()
    assert not overlapping_pairs(list(drawn["labels"].values()), drawn["fig"].canvas.get_renderer())
    plt.close(drawn["fig"])
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    plots.plot_pareto(rows, a, meta)
    plots.plot_pareto(rows, b, meta)
    assert a.read_bytes() == b.read_bytes()
    from PIL import Image

    with Image.open(a) as im:
        assert im.size[0] <= 1400 and set(im.info) <= {"Software", "Description", "dpi"}
        assert json.loads(im.info["Description"])["run_git_shas"] == meta["run_git_shas"]


def test_placer_geometry():
    offsets = candidate_offsets()
    assert len(offsets) == len(set(offsets)) and offsets[0] == (6.0, 0.0, "left", "center")
    assert segment_hits_box((0, 0), (10, 10), (4, 4, 6, 6)) and not segment_hits_box((0, 0), (10, 0), (4, 1, 6, 3))


# ---------------------------------------------------------------------------------------- trace
def _commit_steps(G: int, parallel: bool) -> np.ndarray:
    """One token per step in a shuffled order, or blocks of 16 committed 4 at a time."""
    if parallel:
        return np.array([(j // 16) * 4 + (j % 16) // 4 for j in range(G)])
    return np.random.default_rng(0).permutation(G)


@pytest.mark.parametrize("G,parallel,rows", [(64, True, 2), (64, False, 2), (100, True, 4), (8, False, 1)])
def test_trace_wraps_into_rows_that_fit_1400px(tmp_path, G, parallel, rows):
    cs = _commit_steps(G, parallel)
    labels = ["<|eos|>" if j > G // 2 else str(j % 10) for j in range(G)]
    fig, axes = trace.draw_trace(cs, labels, 16, 30, "t", max_columns=32)
    assert len(axes) == rows
    spans = [ax.get_xlim() for ax in axes]
    assert all(hi - lo <= 32 for lo, hi in spans) and spans[0][0] == 29.5 and spans[-1][1] == 30 + G - 0.5
    renderer = fig.canvas.get_renderer()
    tokens = [t for ax in axes for t in ax.texts]
    assert len(tokens) == G and min(t.get_fontsize() for t in tokens) >= 8
    assert {t.get_text() for t in tokens} >= ({"eos"} if G > 2 else set())
    for ax in axes:  # glyphs are legible: none overlaps another, each stays within its row's axes
        assert not overlapping_pairs(ax.texts, renderer)
        frame = ax.get_window_extent(renderer)
        for t in ax.texts:
            b = t.get_window_extent(renderer)
            assert frame.y0 - 0.5 <= b.y0 and b.y1 <= frame.y1 + 0.5 and b.width < frame.width / (ax.get_xlim()[1]
                                                                                                  - ax.get_xlim()[0])
    plt.close(fig)
    png = tmp_path / "t.png"
    trace.plot_trace(cs, labels, 16, 30, "t", png)
    from PIL import Image

    with Image.open(png) as im:
        width, height = im.size
    assert width <= 1400 and height <= 1100


def test_trace_glyphs_fit_a_cell():
    assert [trace.glyph(x) for x in ("<|eos|>", " ", "\\n", "7", "####", " answer", "$")] == \
        ["eos", "␣", "\\n", "7", "####", "ans…", "$"]
    assert trace.trace_rows(np.array([0, 1, 5, 6, 2]), max_columns=2) == [(0, 2, 0, 1), (2, 4, 5, 6), (4, 5, 2, 2)]
