"""Benchmarks of speed and compute.

- ``python -m experiments.bench.bench_fastdllm``: Fast-dLLM speed, baseline vs caches vs parallel decoding
- ``python -m experiments.bench.bench_load``: tokens/s and latency as the batch grows, beside the roofline
- ``python -m experiments.bench.bench_bd3lm``: BD3-LM's training step vs MDLM, its exact KV cache vs recomputing
- ``python -m experiments.bench.compute_cost``: analytic forward passes, positions and FLOPs of every sampler
- ``bash experiments/bench/gpu_check.sh``: LLaDA-8B's shape with random weights, every backend, on one GPU
"""
