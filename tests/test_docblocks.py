"""The docs' generated blocks equal what results/ gives; a block is rewritten between its markers
only; an unknown block, a missing file or field is refused naming it; a reproduction's folder gets
its own copies."""

from __future__ import annotations

import json

import pytest

from experiments.reproduce import docblocks


def _ratio(m, lo, hi):
    return {"median": m, "ci": [lo, hi], "rounds": 3}


def _ar_results(tmp_path, matmuls_over_lean=(0.25, 0.2, 0.3)):
    speed = tmp_path / "results" / "speed"
    speed.mkdir(parents=True)
    row = {"batch": 1, "seconds": {"lean": 0.2, "matmuls": 0.05},
           "ratios": {"matmuls/lean": _ratio(*matmuls_over_lean), "loop/lean": _ratio(1.5, 1.4, 1.6)}}
    (speed / "ar_embedded_g256.json").write_text(json.dumps({"git_sha": "0123456789abcdef", "rows": [row]}))
    return tmp_path / "results"


def test_every_docs_block_equals_what_results_give():
    assert docblocks.docs_with_blocks(), "docs/speed.md holds generated blocks"
    assert docblocks.main(["--check"]) == 0, "run python -m experiments.reproduce.docblocks and commit docs/"


def test_a_block_is_rewritten_between_its_markers_only(tmp_path):
    results = _ar_results(tmp_path)
    start, end = docblocks.markers("speed_ar")
    text = f"# Title 7.5x\n\n{start}\nstale 99.9\n{end}\n\nprose after\n"
    out = docblocks.filled(text, results)
    assert out.startswith("# Title 7.5x\n\n" + start + "\n") and out.endswith(end + "\n\nprose after\n")
    assert "stale" not in out and "| 1 | 0.200 | 0.050 | 0.25 [0.20, 0.30] | 1.50 [1.40, 1.60] |" in out
    assert "git 0123456" in out and "not met (0.25 [0.20, 0.30])" in out
    assert docblocks.filled(out, results) == out  # a second pass changes nothing
    met = docblocks.filled(text, _ar_results(tmp_path / "b", (0.7, 0.65, 0.75)))
    assert "Bar, lean AR >= 0.6 of its matmul floor at batch 1: met (0.70 [0.65, 0.75])" in met


def test_an_unknown_block_a_missing_file_or_field_is_refused(tmp_path):
    start, end = docblocks.markers("no_such_block")
    with pytest.raises(ValueError, match="doc: block 'no_such_block' is not registered"):
        docblocks.filled(f"{start}\n{end}\n", tmp_path)
    start, end = docblocks.markers("speed_ar")
    with pytest.raises(FileNotFoundError, match=r"speed/ar_embedded_g256\.json: missing"):
        docblocks.filled(f"{start}\n{end}\n", tmp_path)
    (tmp_path / "speed").mkdir()
    (tmp_path / "speed" / "ar_embedded_g256.json").write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match=r"ar_embedded_g256\.json: no field 'git_sha'"):
        docblocks.filled(f"{start}\n{end}\n", tmp_path)
    with pytest.raises(ValueError, match="needs one"):
        docblocks.filled(f"{start}\n{end}\n{start}{end}\n", _ar_results(tmp_path / "c"))


def test_a_reproduction_folder_gets_its_own_copies_and_skips_what_it_lacks(tmp_path, capsys):
    results = _ar_results(tmp_path)
    assert docblocks.main(["--results", str(results)]) == 0  # speed.md's other blocks' files are missing here
    assert not (results / "docs").exists()
    assert "skipped speed.md" in capsys.readouterr().err


def _anyorder(tmp_path, rows):
    (tmp_path / "anyorder").mkdir(parents=True)
    (tmp_path / "anyorder" / "table.json").write_text(json.dumps(rows))
    return tmp_path


def _row(task, row, acc, vs=None, p=None, disc="-"):
    return {"task": task, "row": row, "n": 100, "accuracy": acc, "ci": [max(0, acc - 0.1), min(1, acc + 0.1)],
            "vs": vs, "mcnemar_p": p, "discordant": disc}


def test_the_anyorder_tests_decide_each_pair_once_at_one_percent(tmp_path):
    rows = [_row("sudoku", "ar", 0.3, "pure", 1e-20, "60/0"), _row("sudoku", "pure", 0.9, "ar", 1e-20, "0/60"),
            _row("sudoku", "semiar", 0.88, "pure", 0.02, "5/1"),
            {"task": "reversal_before", "row": "pure", "n": 100, "gated": True, "forward_accuracy": 0.4}]
    from experiments.reproduce import docs_anyorder

    out = docs_anyorder.anyorder_tests(_anyorder(tmp_path, rows))
    assert "| sudoku | ar vs pure | 30.0 vs 90.0 | 1e-20 | 60/0 | pure better |" in out
    assert out.count("| ar vs pure |") + out.count("| pure vs ar |") == 1  # one line per pair
    assert "| sudoku | semiar vs pure | 88.0 vs 90.0 | 0.02 | 5/1 | no difference at p < 0.01 |" in out
    assert "below the 95% gate): reversal_before pure." in out
    table = docs_anyorder.anyorder_table(tmp_path)
    assert "| sudoku | 100 | 30.0 [20.0, 40.0] | 90.0 [80.0, 100.0] | 88.0 [78.0, 98.0] |" in table
    assert "gated (forward 40.0 < 95)" in table


def test_an_anyorder_row_without_its_fields_is_refused(tmp_path):
    from experiments.reproduce import docs_anyorder

    with pytest.raises(ValueError, match=r"table\.json: row 0 lacks \['ci'\]"):
        docs_anyorder.anyorder_table(_anyorder(tmp_path, [{"task": "t", "row": "ar", "n": 3, "accuracy": 1.0}]))


def test_every_marker_is_recognised_or_refused(tmp_path):
    text = "".join(f"{docblocks.markers(n)[0]}\nold\n{docblocks.markers(n)[1]}\n" for n in docblocks.BLOCKS)
    assert docblocks.START.findall(text) == list(docblocks.BLOCKS)  # digits in names (speed_bd3lm) included
    with pytest.raises(ValueError, match="is not of the form"):
        docblocks.filled("<!-- generated:speed-ar (python -m experiments.reproduce.docblocks) -->\n", tmp_path)
