"""Jobs of ``experiments.reproduce``: the strategy tables and curves on ``llada-chain``.

``llada-chain``'s answers (about 45 tokens) span two blocks of 32 and are followed by a long EOS
tail, so the tables show what caching, parallel decoding and stopping at EOS each buy. Every
table has the Table 1 line-up plus ``baseline_semiar_eos`` (the baseline stopped at EOS, as
BD3-LM is) and BD3-LM on ``bd3lm-chain-16`` (``llada-chain`` fine-tuned block-causal at L'=16).
"""

from __future__ import annotations

from typing import Optional

from experiments.reproduce.jobs import Job, _cap, bd3_flags, gsm8k_table

#: the Table 1 line-up without the one-block baseline (at 512 it costs as much as the semi-AR one
#: and says the same: pure diffusion is the testbed tables' subject)
NO_FULL = ("baseline_semiar", "baseline_semiar_eos", "fastdllm_prefix", "fastdllm_dual", "fastdllm_threshold",
           "fastdllm_factor", "fastdllm_prefix_threshold", "fastdllm_dual_threshold", "bd3lm")

#: the bar's pair, rerun in one invocation for a speed-up measured in one run
ONE_RUN = ("baseline_semiar", "fastdllm_dual_threshold")

#: gen 512 zero-shot points taken to n = 300 (chosen from the n = 100 curves, so the first 100 problems are biased)
FRONTIER_512 = ("sw_dual_f2", "sw_dual_f4", "sw_none_f4", "sw_dual_b16", "cache_adaptive_threshold")

#: EB-Sampler and dLLM-Cache beside Fast-dLLM at gen 256 zero-shot, n = 300 (chosen before the run)
METHODS_256 = ("sw_none_g0p1", "sw_none_g1", "sw_dual_g0p1", "sw_dual_g1", "cache_dllm_cache_threshold",
               "sw_dllm_cache_kr8", "sw_dllm_cache_rho0p5")


def chain_jobs(out: str, work: str, ck: str, limit: Optional[int], full: bool) -> list[Job]:
    """The chain-task BD3-LM and 2048-context LLaDA, then per (gen length, shots) a table (n = 300
    zero-shot, 100 4-shot)
    and at gen 256 and 512 the curves of ``sweep_fastdllm`` (n = 100) in the same folder."""
    chain, bd3 = f"{ck}/llada-chain", f"{ck}/bd3lm-chain-16"
    jobs = [Job("train_bd3lm_chain", "experiments.train.train_bd3lm",
                ("--init", chain, "--block-size", 16, "--batch-size", 16, "--steps", 1200, "--warmup", 30,
                 "--fewshot-prob", 0.6, "--eval-every", 300, "--out", f"{work}/bd3lm-chain-16"),
                "BD3-LM on the chain task: llada-chain fine-tuned block-causal at L'=16 (60% few-shot batches)",
                ("checkpoints/bd3lm-chain-16/config.json",), after=("train_llada_chain",), cost_min=25,
                export=(f"{work}/bd3lm-chain-16/model", f"{ck}/bd3lm-chain-16"), training=True)]
    jobs.append(Job("train_llada_chain_2k", "experiments.train.train_llada",
                    ("--init", chain, "--out", f"{work}/llada-chain-2k", "--max-seq-len", 2048, "--steps", 300,
                     "--lr", 3e-4, "--warmup", 20, "--eval-every", 300, "--save-every", 50, "--seed", 2,
                     "--min-steps-per-problem", 5, "--max-steps-per-problem", 5, "--cot", "terse", "--direct-prob", 0,
                     "--fewshot-prob", 0.3, "--shots-per-batch", "--batch-size", 16,
                     "--response-lengths", 64, 256, 512, 1024, "--response-probs", 0.4, 0.2, 0.2, 0.2,
                     "--suffix-prob", 0.9, "--max-value", 9, "--weighting", "uniform", "--ema", 0),
                    "llada-chain with a 2048-token context: 300 steps with 20% gen-1024 batches, for the gen "
                    "1024 4-shot table (a 416-token prompt + 1024 columns exceed llada-chain's 1024)",
                    ("checkpoints/llada-chain-2k/config.json",), after=("train_llada_chain",), cost_min=8,
                    export=(f"{work}/llada-chain-2k/model", f"{ck}/llada-chain-2k"), training=True))
    after = ("train_llada_chain", "train_bd3lm_chain") if full else ()
    tables = [  # (dir, model, n, gen, shots, batch, strategies, cost per n core-minutes)
        ("gsm8k_chain_256", "llada-chain", 300, 256, 0, 32, ("table1",), 60.0),
        ("gsm8k_chain_512", "llada-chain", 300, 512, 0, 32, NO_FULL, 100.0),
        ("gsm8k_chain_256_4shot", "llada-chain", 100, 256, 4, 25, NO_FULL, 25.0),
        ("gsm8k_chain_512_4shot", "llada-chain", 100, 512, 4, 25, NO_FULL, 80.0),
        # bd3lm-chain-16 with its context limit raised (--bd3-context): it stops at the first EOS block
        ("gsm8k_chain_1024_4shot", "llada-chain-2k", 100, 1024, 4, 25, NO_FULL, 330.0),
    ]
    for d, name, n, gen, shots, batch, strategies, cost in tables:
        m = _cap(n, limit)
        needs = after + (("train_llada_chain_2k",) if full and name != "llada-chain" else ())
        jobs.append(gsm8k_table(d, out, f"{ck}/{name}", m, batch, gen, shots, strategies,
                                f"strategy table on {name}, gen {gen}, {shots}-shot, n = {n}: Table 1 line-up, the "
                                "baseline stopped at EOS, BD3-LM",
                                (f"{d}/baseline_*.jsonl", f"{d}/fastdllm_*.jsonl", f"{d}/bd3lm.jsonl"),
                                needs, cost * m / n, extra=bd3_flags(bd3, gen)))
    for gen, n, cost in ((256, 300, 16.0), (512, 96, 22.0)):  # the zero-shot tables' rows ran in several invocations
        d, m = f"gsm8k_chain_{gen}_one_run", _cap(n, limit)
        jobs.append(gsm8k_table(d, out, chain, m, 32, gen, 0, ONE_RUN,
                                f"gen {gen} zero-shot, n = {n}: the baseline and dual + threshold in one invocation, "
                                "so their speed-up is one run's ratio (same tokens as the table's rows)",
                                tuple(f"{d}/{s}.jsonl" for s in ONE_RUN), after, cost * m / n))
    m = _cap(100, limit)  # the curves' points
    for gen, cost in ((256, 20.0), (512, 60.0)):
        d = f"gsm8k_chain_{gen}"
        jobs.append(Job(f"{d}_sweep", "experiments.eval.gsm8k",
                        ("--limit", m, "--batch-size", 32, "--gen-length", gen, "--block-length", 32,
                         "--strategies", "sweep_fastdllm", "--model", chain, "--out", f"{out}/{d}"),
                        f"accuracy-vs-throughput curves on llada-chain, gen {gen}: threshold, factor, block length "
                        "and refresh swept per cache (none, prefix, dual), n = 100",
                        (), (f"{d}/sw_*.jsonl",), always=True, after=(d,), cost_min=cost * m / 100))
    m = _cap(300, limit)  # the gen 512 curves' best points (at n = 100), and the drift-refreshed cache, to n = 300
    jobs.append(Job("gsm8k_chain_512_frontier", "experiments.eval.gsm8k",
                    ("--limit", m, "--batch-size", 32, "--gen-length", 512, "--block-length", 32,
                     "--strategies", *FRONTIER_512, "--model", chain, "--out", f"{out}/gsm8k_chain_512"),
                    "gen 512 zero-shot: the curves' points that held accuracy at n = 100 (factor 2 / 4, blocks of 16) "
                    "and the adaptive cache, to n = 300", (), tuple(f"gsm8k_chain_512/{s}.jsonl" for s in FRONTIER_512),
                    always=True, after=("gsm8k_chain_512_sweep",), cost_min=15.0 * m / 300))
    m = _cap(300, limit)  # the two methods beyond Fast-dLLM on the gen 256 frontier, paired with the table's rows
    jobs.append(Job("gsm8k_chain_256_methods", "experiments.eval.gsm8k",
                    ("--limit", m, "--batch-size", 32, "--gen-length", 256, "--block-length", 32,
                     "--strategies", *METHODS_256, "--model", chain, "--out", f"{out}/gsm8k_chain_256"),
                    "gen 256 zero-shot, n = 300: EB-Sampler (gamma 0.1 / 1, no cache and dual) and dLLM-Cache "
                    "(threshold 0.9; K_r 8; rho 0.5), chosen before the run; non-inferiority margin -3 points",
                    (), tuple(f"gsm8k_chain_256/{s}.jsonl" for s in METHODS_256),
                    always=True, after=("gsm8k_chain_256_sweep",), cost_min=20.0 * m / 300))
    return jobs
