#!/usr/bin/env bash
# The speed issue's GPU table: LLaDA-8B's real shape (read from the data mirror's config.json) with
# random bf16 weights (fixed-step speed-ups do not depend on the weights), prompt 512, gen 256 and
# 512, the LLaDA baseline and every Fast-dLLM strategy, SDPA eager and compiled, flash-attn eager
# when installed, each call's peak memory. About 8 minutes on one H100. Writes OUT/<name>.md, .json.
#
#   bash experiments/bench/gpu_check.sh [OUT]           # default OUT: results/speed/gpu
#
# The CPU smoke test of the same script (tests/test_gpu_check.py):
#   GPU_CHECK_DEVICE=cpu GPU_CHECK_PRESET=tiny GPU_CHECK_DTYPE=float32 GPU_CHECK_PROMPT=16 \
#   GPU_CHECK_GENS=32 bash experiments/bench/gpu_check.sh DIR
set -euo pipefail
OUT=${1:-results/speed/gpu}
DEVICE=${GPU_CHECK_DEVICE:-cuda}
PRESET=${GPU_CHECK_PRESET:-llada8b}
DTYPE=${GPU_CHECK_DTYPE:-bfloat16}
PROMPT=${GPU_CHECK_PROMPT:-512}
GENS=${GPU_CHECK_GENS:-256 512}
PY=${PYTHON:-python}
# shellcheck disable=SC2206  # GENS is a list of numbers
common=(--preset "$PRESET" --device "$DEVICE" --dtype "$DTYPE" --prompt-len "$PROMPT" --gen-length $GENS --out "$OUT")
$PY -m experiments.bench.bench_fastdllm "${common[@]}" --backend sdpa --compile --name "${PRESET}_sdpa"
if $PY -c "import sys; from dlm.attention import available_backends; sys.exit('flash' not in available_backends('$DEVICE'))"; then
    $PY -m experiments.bench.bench_fastdllm "${common[@]}" --backend flash --name "${PRESET}_flash"
else
    echo "flash-attn is not usable on $DEVICE: no flash rows (pip install -e '.[gpu]' on a CUDA machine)"
fi
