"""Evaluations that write per-sample JSONL files and the tables rebuilt from them.

- ``python -m experiments.eval.gsm8k``: accuracy and throughput of every sampling strategy on one model
- ``python -m experiments.eval.anyorder``: AR vs masked diffusion where the end constrains the start
  (the reversal task's infilling probe: :mod:`experiments.eval.infill`)
- ``python -m experiments.eval.curves``: the any-order runs' learning curves and the LR grid's pick
- ``python -m experiments.eval.timing``: speed-ups with uncertainty, the baseline and each row interleaved
- ``python -m experiments.eval.drift``: how far Fast-dLLM's approximate KV cache drifts from exact recomputation
"""
