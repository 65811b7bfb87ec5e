"""Jobs of ``experiments.reproduce``: the strategy tables and curves on ``llada-chain``.

``llada-chain``'s answers (about 45 tokens) span two blocks of 32 and are followed by a long EOS
tail, so the tables show what caching, parallel decoding and stopping at EOS each buy. Every
table has the Table 1 line-up plus ``baseline_semiar_eos`` (the baseline stopped at EOS, as
BD3-LM is) and BD3-LM on ``bd3lm-chain-16`` (``llada-chain`` fine-tuned block-causal at L'=16).
"""

from __future__ import annotations

from typing import Optional

from experiments.jobs import Job, _cap

REPORT = ("table.md", "table.csv", "table.json", "ablation.md", "ablation.csv", "pareto.png", "config.json")
#: the Table 1 line-up without the one-block baseline (at 512 it costs as much as the semi-AR one
#: and says the same: pure diffusion is the testbed tables' subject)
NO_FULL = ("baseline_semiar", "baseline_semiar_eos", "fastdllm_prefix", "fastdllm_dual", "fastdllm_threshold",
           "fastdllm_factor", "fastdllm_prefix_threshold", "fastdllm_dual_threshold", "bd3lm")


def chain_jobs(out: str, work: str, ck: str, limit: Optional[int], full: bool) -> list[Job]:
    """The chain-task BD3-LM, then per (gen length, shots) a table (n = 300 zero-shot, 100 4-shot)
    and at gen 256 and 512 the curves of ``sweep_fastdllm`` (n = 100) in the same folder."""
    chain, bd3 = f"{ck}/llada-chain", f"{ck}/bd3lm-chain-16"
    jobs = [Job("train_bd3lm_chain", "experiments.train_bd3lm",
                ("--init", chain, "--block-size", 16, "--batch-size", 16, "--steps", 1200, "--warmup", 30,
                 "--fewshot-prob", 0.6, "--eval-every", 300, "--out", f"{work}/bd3lm-chain-16"),
                "BD3-LM on the chain task: llada-chain fine-tuned block-causal at L'=16 (60% few-shot batches)",
                ("checkpoints/bd3lm-chain-16/config.json",), after=("train_llada_chain",), cost_min=25,
                export=(f"{work}/bd3lm-chain-16/model", f"{ck}/bd3lm-chain-16"), training=True)]
    after = ("train_llada_chain", "train_bd3lm_chain") if full else ()
    tables = [  # (dir, n, gen, shots, batch, strategies, cost per n core-minutes)
        ("gsm8k_chain_256", 300, 256, 0, 32, ("table1",), 60.0),
        ("gsm8k_chain_512", 300, 512, 0, 32, NO_FULL, 100.0),
        ("gsm8k_chain_256_4shot", 100, 256, 4, 25, NO_FULL, 25.0),
        ("gsm8k_chain_512_4shot", 100, 512, 4, 25, NO_FULL, 80.0),
    ]
    for d, n, gen, shots, batch, strategies, cost in tables:
        m = _cap(n, limit)
        jobs.append(Job(d, "experiments.gsm8k",
                        ("--limit", m, "--batch-size", batch, "--gen-length", gen, "--block-length", 32,
                         "--num-fewshot", shots, "--strategies", *strategies, "--model", chain, "--bd3-model", bd3,
                         "--out", f"{out}/{d}"),
                        f"strategy table on llada-chain, gen {gen}, {shots}-shot, n = {n}: Table 1 line-up, the "
                        "baseline stopped at EOS, BD3-LM", tuple(f"{d}/{f}" for f in REPORT),
                        (f"{d}/baseline_*.jsonl", f"{d}/fastdllm_*.jsonl", f"{d}/bd3lm.jsonl"), always=True,
                        after=after, cost_min=cost * m / n))
    m = _cap(100, limit)
    for gen, cost in ((256, 20.0), (512, 60.0)):
        d = f"gsm8k_chain_{gen}"
        jobs.append(Job(f"{d}_sweep", "experiments.gsm8k",
                        ("--limit", m, "--batch-size", 32, "--gen-length", gen, "--block-length", 32,
                         "--strategies", "sweep_fastdllm", "--model", chain, "--out", f"{out}/{d}"),
                        f"accuracy-vs-throughput curves on llada-chain, gen {gen}: threshold, factor, block length "
                        "and refresh swept per cache (none, prefix, dual), n = 100",
                        (), (f"{d}/sw_*.jsonl",), always=True, after=(d,), cost_min=cost * m / 100))
    return jobs
