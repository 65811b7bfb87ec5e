"""The GPU script of the speed issue, run on the CPU at a tiny shape: it writes the SDPA table with
eager and compiled rows (same tokens), says why the flash rows are missing, and the real-shape
preset reads LLaDA-8B's shape from the data mirror."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_script_runs_on_cpu_at_a_tiny_shape(tmp_path):
    env = {**os.environ, "GPU_CHECK_DEVICE": "cpu", "GPU_CHECK_PRESET": "tiny", "GPU_CHECK_DTYPE": "float32",
           "GPU_CHECK_PROMPT": "16", "GPU_CHECK_GENS": "32", "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", str(REPO / "experiments" / "bench" / "gpu_check.sh"), str(tmp_path)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "no flash rows" in done.stdout
    res = json.loads((tmp_path / "tiny_sdpa.json").read_text())
    rows = res["rows"]
    assert {r["gen_length"] for r in rows} == {32} and len(rows) == 6
    assert all(r["tokens_equal"] and r["compiled_seconds"] > 0 for r in rows)
    assert all(r["peak_memory_gib"] is None for r in rows)  # CUDA only
    assert "peak GiB (CUDA)" in (tmp_path / "tiny_sdpa.md").read_text()


def test_real_shape_is_read_from_the_mirror_config(shared_data):
    from harness.shapes import real_shape

    cfg = json.loads(shared_data("models/LLaDA-8B-Instruct/config.json").read_text())  # skips first when absent
    shape = real_shape("llada8b")
    assert (shape["d_model"], shape["n_layers"], shape["vocab_size"]) == (cfg["d_model"], cfg["n_layers"],
                                                                           cfg["vocab_size"])
    assert shape["mlp_hidden"] == cfg["mlp_hidden_size"] and not shape["shift_logits"]
    assert real_shape("dream7b")["shift_logits"] and real_shape("dream7b")["qkv_bias"]
    with pytest.raises(ValueError, match="shape"):
        real_shape("gpt5")
