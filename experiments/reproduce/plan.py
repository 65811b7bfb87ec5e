"""The jobs of ``experiments.reproduce``: every artefact in ``results/`` and the command that makes it.

Costs are core-minutes from scratch on one core of the 2-core AMD EPYC box this was written on
(summed ``seconds`` of the committed per-sample records; training wall times from the README);
they order the scheduler (most expensive first) and are printed by ``--list``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from experiments.reproduce.jobs import GSM8K_REPORT, Job, _cap, bd3_flags, gsm8k_table
from experiments.reproduce.anyorder import anyorder_jobs
from experiments.reproduce.chain import chain_jobs

#: a held-out problem of the embedded task (``generate_problems(..., split="test", seed=0)[0]``)
#: block sizes of the embedded BD3-LM models (bd3lm-arith-<L'>); the GSM8K tables use L'=16
BD3_BLOCKS = (4, 8, 16)
#: stage 2 of the BD3-LM recipe: small batches, many steps, 1-8 worked examples in 60% of them
BD3_STAGE2 = ("--batch-size", 16, "--steps", 1200, "--warmup", 30, "--fewshot-prob", 0.6, "--eval-every", 300)
#: phase 3 of the LLaDA recipe (few-shot prompts in 60% of the batches), run as 600 + 900 steps
LLADA_PHASE3 = ("--batch-size", 16, "--lr", 5e-4, "--warmup", 30, "--save-every", 100, "--fewshot-prob", 0.6,
                "--response-lengths", 32, 64, 256, 512, "--response-probs", 0.3, 0.2, 0.4, 0.1)
#: the loop task (``tasks.ArithConfig.loop``): 2-3 stated steps and one repeated subtraction, so
#: the answer's length is known only once the problem is solved
LOOP_TASK = ("--min-steps-per-problem", 2, "--max-steps-per-problem", 3, "--loop", "--suffix-prob", 0.5,
             "--response-lengths", 64, 256, 512, "--response-probs", 0.5, 0.35, 0.15)
#: the chain task of ``llada-chain``: five stated steps; its jobs add the share of SFT rows masked from a
#: random cut to the end (``--suffix-prob``, ``LLaDASFTLoss.suffix_prob``), the view a semi-AR block starts from
CHAIN_TASK = ("--min-steps-per-problem", 5, "--max-steps-per-problem", 5, "--cot", "terse", "--direct-prob", 0,
              "--fewshot-prob", 0.3, "--shots-per-batch", "--batch-size", 32,
              "--response-lengths", 64, 256, 512, "--response-probs", 0.7, 0.2, 0.1)
#: fine-tunes of ``llada-arith`` on the loop and chain tasks, two phases each; the second phase's model
#: (the one whose name has no ``-a``) is exported to ``checkpoints/``
FINETUNES = (
    ("train_llada_loop_a", "llada-arith", "llada-loop-a", "train_llada", 4500, 1e-3, 50, 1500, 250,
     ("--batch-size", 32, "--fewshot-prob", 0, *LOOP_TASK), 95,
     "loop-task model, phase 1: the embedded LLaDA-style model fine-tuned on the loop task, zero-shot"),
    ("train_llada_loop", "llada-loop-a", "llada-loop", "train_llada_loop_a", 600, 3e-4, 30, 300, 100,
     ("--batch-size", 32, "--fewshot-prob", 0.5, "--shots-per-batch", *LOOP_TASK), 28,
     "loop-task model, phase 2: 600 steps with 1-8 worked examples in half the batches"),
    ("train_llada_chain_a", "llada-arith", "llada-chain-a", "train_llada", 2500, 1e-3, 50, 2500, 250,
     (*CHAIN_TASK, "--suffix-prob", 0.9), 70,
     "chain-task model, phase 1: the embedded LLaDA-style model fine-tuned on 5-step chains"),
    ("train_llada_chain", "llada-chain-a", "llada-chain", "train_llada_chain_a", 1500, 5e-4, 30, 1500, 250,
     ("--seed", 1, *CHAIN_TASK, "--suffix-prob", 0.9), 45,
     "chain-task model, phase 2: 1500 more steps at half the learning rate"),
    ("train_llada_chain_s50_a", "llada-arith", "llada-chain-s50-a", "train_llada", 2500, 1e-3, 50, 2500, 250,
     (*CHAIN_TASK, "--suffix-prob", 0.5), 62,
     "chain-task control, phase 1: the chain recipe with half the SFT rows suffix-masked, not 90%"),
    ("train_llada_chain_s50", "llada-chain-s50-a", "llada-chain-s50", "train_llada_chain_s50_a", 1500, 5e-4, 30,
     1500, 250, ("--seed", 1, *CHAIN_TASK, "--suffix-prob", 0.5), 40,
     "chain-task control, phase 2: 1500 more steps at half the learning rate"),
)
TRACE_PROMPT = "Ann has 2 shells. She gets 5 more. She finds 1 more. How many shells does Ann have?"


#: the seeds of the 3-epoch character ladder (``train_ppl_char_long``)
LONG_SEEDS = (0, 1, 2, 3, 4)


def training_jobs(out: str, work: str) -> list[Job]:
    """The README's three-phase LLaDA SFT, the BD3-LM fine-tunes and the perplexity ladder."""
    ck = f"{out}/checkpoints"
    task = ("--max-value", 9, "--weighting", "uniform", "--ema", 0)
    ppl = ("train", "--preset", "laptop", "--out", out, "--work", f"{work}/perplexity-laptop")
    return [
        Job("train_llada_p1", "experiments.train.train_llada",
            ("--out", f"{work}/llada-p1", "--d-model", 128, "--n-layers", 4, "--n-heads", 4, "--lr", 3e-3,
             "--warmup", 100, "--steps", 2600, "--short-steps", 2000, *task, "--fewshot-prob", 0.2,
             "--response-lengths", 32, 256, 512, "--response-probs", 0.8, 0.15, 0.05),
            "phase 1 of the embedded LLaDA-style SFT (curriculum on 32-token answers)",
            (f"{work}/llada-p1/model/config.json",), cost_min=35, training=True),
        Job("train_llada_p2", "experiments.train.train_llada",
            ("--init", f"{work}/llada-p1/model", "--out", f"{work}/llada-p2", "--steps", 1000,
             "--batch-size", 16, "--lr", 1e-3, "--warmup", 50, "--eval-every", 250, "--save-every", 250, *task,
             "--fewshot-prob", 0.2, "--response-lengths", 32, 64, 256, 512, "--response-probs", 0.2, 0.2, 0.4, 0.2),
            "phase 2 of the embedded LLaDA-style SFT (long EOS tails)", (f"{work}/llada-p2/model/config.json",),
            after=("train_llada_p1",), cost_min=14, training=True),
        *(Job(name, "experiments.train.train_llada",
              ("--init", f"{work}/{init}/model", "--out", f"{work}/{dst}", "--steps", steps, "--eval-every", every,
               *LLADA_PHASE3, *task),
              what, (f"{work}/{dst}/model/config.json",), after=(after,), cost_min=cost, training=True,
              export=(f"{work}/llada-arith/model", f"{ck}/llada-arith") if dst == "llada-arith" else None)
          for name, init, dst, steps, every, after, cost, what in (
              ("train_llada_p3a", "llada-p2", "llada-p3a", 600, 200, "train_llada_p2", 17,
               "phase 3a of the embedded LLaDA-style SFT (60% few-shot batches)"),
              ("train_llada", "llada-p3a", "llada-arith", 900, 300, "train_llada_p3a", 17,
               "embedded LLaDA-style model (phase 3b: 900 more few-shot steps)"))),
        *(Job(name, "experiments.train.train_llada",
              ("--init", f"{work}/{init}/model", "--out", f"{work}/{dst}", "--steps", steps, "--lr", lr,
               "--warmup", warmup, "--eval-every", every, "--save-every", save, *extra, *task),
              what, (f"{work}/{dst}/model/config.json",), after=(after,), cost_min=cost, training=True,
              export=(f"{work}/{dst}/model", f"{ck}/{dst}") if not dst.endswith("-a") else None)
          for name, init, dst, after, steps, lr, warmup, every, save, extra, cost, what in FINETUNES),
        Job("train_bd3lm_s1", "experiments.train.train_bd3lm",
            ("--init", f"{work}/llada-p1/model", "--block-size", 16, "--fewshot-prob", 0,
             "--out", f"{work}/bd3lm-arith-16-s1"),
            "BD3-LM stage 1: block-causal L'=16 fine-tune of the phase-1 model, zero-shot prompts",
            (f"{work}/bd3lm-arith-16-s1/model/config.json",), after=("train_llada_p1",), cost_min=7, training=True),
        *(Job(f"train_bd3lm_{b}", "experiments.train.train_bd3lm",
              ("--init", f"{work}/bd3lm-arith-16-s1/model", "--block-size", b, *BD3_STAGE2,
               "--out", f"{work}/bd3lm-arith-{b}"),
              f"embedded BD3-LM, L'={b} (stage 2: 60% of the batches few-shot)",
              (f"checkpoints/bd3lm-arith-{b}/config.json",), after=("train_bd3lm_s1",), cost_min=25,
              export=(f"{work}/bd3lm-arith-{b}/model", f"{ck}/bd3lm-arith-{b}"), training=True)
          for b in BD3_BLOCKS),
        Job("train_ppl_a", "experiments.perplexity", (*ppl, "--models", "ar", "bd4", "bd8"),
            "perplexity ladder models AR, L'=4, L'=8",
            tuple(f"checkpoints/perplexity-laptop-{m}/config.json" for m in ("ar", "bd4", "bd8")),
            cost_min=45, training=True),
        Job("train_ppl_b", "experiments.perplexity", (*ppl, "--models", "bd16", "mdlm"),
            "perplexity ladder models L'=16, MDLM",
            tuple(f"checkpoints/perplexity-laptop-{m}/config.json" for m in ("bd16", "mdlm")),
            cost_min=30, training=True),
        Job("train_ppl_char", "experiments.perplexity",
            ("all", "--preset", "char", "--out", out, "--work", f"{work}/perplexity-char"),
            "character-level perplexity ladder (tinyshakespeare), 5 models x 3 seeds, trained and evaluated; "
            "its checkpoints (32 MB) are not committed",
            _seed_files("char"), cost_min=60, training=True),
        # one epoch leaves the seeds as far apart as the rungs (docs/perplexity_char.md): three epochs, and
        # five seeds, since three could not decide L'16 < MDLM (paired t with 2 degrees of freedom)
        Job("train_ppl_char_long", "experiments.perplexity",
            ("all", "--preset", "char", "--run", "char-long", "--steps", 3000, "--search-every", 750,
             "--seeds", *LONG_SEEDS, "--out", out, "--work", f"{work}/perplexity-char-long"),
            "the character-level ladder trained 3 epochs (3000 steps), 5 models x 5 seeds: does the seed spread "
            "shrink enough to separate the rungs?",
            _seed_files("char-long", len(LONG_SEEDS)), cost_min=310, training=True),
    ]


def _seed_files(run: str, seeds: int = 3) -> tuple:
    """What ``experiments.perplexity --run <run>`` writes for seeds 0..seeds-1, with the across-seed report."""
    per_seed = (f"perplexity_{run}-s{s}.{e}" for s in range(seeds) for e in ("jsonl", "md", "csv", "png"))
    return (*per_seed, f"perplexity_{run}_seeds.md", f"perplexity_{run}_seeds.csv")


DREAM_TASK = ("--max-value", 9, "--ema", 0)
FRONTIER = ("sw_dual_thr0p7", "sw_dual_thr0p8", "sw_dual_thr0p95", "sw_dual_f2", "sw_adaptive_nb_thr0p8",
            "sw_adaptive_nb_tol0p02", "sw_adaptive_nb_tol0p05", "sw_delayed_re4")
DREAM_STRATEGIES = ("baseline_full", "baseline_semiar", "baseline_semiar_eos", "fastdllm_prefix", "fastdllm_dual",
                    "fastdllm_threshold", "fastdllm_factor", "fastdllm_prefix_threshold", "fastdllm_dual_threshold",
                    "bd3lm")


#: at gen 512 without the one-block baseline (it costs as much as the semi-AR one; the 256 tables have both)
DREAM_NO_FULL = DREAM_STRATEGIES[1:]
#: the Dream-style model's strategy tables: (dir, model, n, gen, shots, batch, strategies, core-minutes for n);
#: gen 1024 4-shot (a ~220-token prompt + 1024 columns) runs on the 2048-context fine-tune
DREAM_TABLES = (("gsm8k_dream_256", "dream-arith", 300, 256, 0, 32, DREAM_STRATEGIES, 55.0),
                ("gsm8k_dream_256_4shot", "dream-arith", 100, 256, 4, 25, DREAM_STRATEGIES, 40.0),
                ("gsm8k_dream_512_4shot", "dream-arith", 100, 512, 4, 25, DREAM_NO_FULL, 60.0),
                ("gsm8k_dream_512", "dream-arith", 300, 512, 0, 32, DREAM_NO_FULL, 100.0),
                ("gsm8k_dream_1024_4shot", "dream-arith-2k", 100, 1024, 4, 25, DREAM_NO_FULL, 240.0))


def dream_jobs(out: str, work: str, ck: str, limit: Optional[int], full: bool) -> list[Job]:
    """The embedded Dream-style model (an AR model, then the shifted-logit diffusion SFT, as Dream
    was made), its strategy tables under Fast-dLLM's Dream rules, the rule-set comparison, and the
    cache policies side by side on ``llada-chain``."""
    dream, after = f"{ck}/dream-arith", (("train_dream",) if full else ())
    n, n_caches = _cap(128, limit), _cap(200, limit)
    return [
        Job("train_dream_ar", "experiments.train.train_llada",
            ("--out", f"{work}/dream-ar", "--family", "dream", "--objective", "ar", "--d-model", 128, "--n-layers", 4,
             "--n-heads", 4, "--lr", 3e-3, "--warmup", 100, "--steps", 1500, *DREAM_TASK, "--response-lengths", 32,
             "--response-probs", 1.0, "--fewshot-prob", 0.2, "--eval-every", 100000, "--save-every", 250),
            "Dream-style model, stage 1: an autoregressive model (causal next-token SFT, Qwen2 layout)",
            (f"{work}/dream-ar/model/config.json",), cost_min=25, training=True,
            export=(f"{work}/dream-ar/model", f"{ck}/dream-ar")),
        Job("train_dream_p1", "experiments.train.train_llada",
            ("--init", f"{work}/dream-ar/model", "--out", f"{work}/dream-p1", "--objective", "diffusion",
             "--lr", 2e-3, "--warmup", 50, "--steps", 1800, "--short-steps", 1200, *DREAM_TASK, "--weighting", "uniform",
             "--response-lengths", 32, 256, 512, "--response-probs", 0.8, 0.15, 0.05, "--fewshot-prob", 0.2,
             "--eval-every", 600, "--save-every", 200),
            "Dream-style model, stage 2: the AR model adapted to masked diffusion (shifted logits)",
            (f"{work}/dream-p1/model/config.json",), after=("train_dream_ar",), cost_min=20, training=True),
        Job("train_dream", "experiments.train.train_llada",
            ("--init", f"{work}/dream-p1/model", "--out", f"{work}/dream-p2", "--objective", "diffusion",
             "--steps", 1000, "--batch-size", 16, "--lr", 1e-3, "--warmup", 50, *DREAM_TASK, "--weighting", "uniform",
             "--response-lengths", 32, 64, 256, 512, "--response-probs", 0.2, 0.2, 0.4, 0.2, "--fewshot-prob", 0.2,
             "--eval-every", 500, "--save-every", 100),
            "embedded Dream-style model (stage 3: long EOS tails)", ("checkpoints/dream-arith/config.json",),
            after=("train_dream_p1",), cost_min=15, export=(f"{work}/dream-p2/model", f"{ck}/dream-arith"),
            training=True),
        Job("train_dream_2k", "experiments.train.train_llada",
            ("--init", dream, "--out", f"{work}/dream-arith-2k", "--objective", "diffusion", "--max-seq-len", 2048,
             "--steps", 300, "--lr", 3e-4, "--warmup", 20, "--eval-every", 300, "--save-every", 50, "--seed", 2,
             *DREAM_TASK, "--weighting", "uniform", "--fewshot-prob", 0.3, "--shots-per-batch", "--batch-size", 16,
             "--response-lengths", 64, 256, 512, 1024, "--response-probs", 0.4, 0.2, 0.2, 0.2),
            "dream-arith with a 2048-token context: 300 steps with 20% gen-1024 batches, for the gen 1024 4-shot "
            "table (as llada-chain-2k)", ("checkpoints/dream-arith-2k/config.json",), after=after, cost_min=8,
            export=(f"{work}/dream-arith-2k/model", f"{ck}/dream-arith-2k"), training=True),
        *(gsm8k_table(d, out, f"{ck}/{model}", _cap(n_d, limit), batch, gen, shots, strategies,
                      f"GSM8K-format strategy comparison on the Dream-style model (Fast-dLLM's Dream rules), "
                      f"gen {gen}, {shots}-shot, n = {n_d}", (f"{d}/*.jsonl",),
                      after + (("train_dream_2k",) if full and model != "dream-arith" else ())
                      + (("train_bd3lm_16",) if full else ()),
                      cost * _cap(n_d, limit) / n_d,
                      extra=bd3_flags(f"{ck}/bd3lm-arith-16", gen))
          for d, model, n_d, gen, shots, batch, strategies, cost in DREAM_TABLES),
        Job("dream_rules", "research.dream_rules",
            ("--model", dream, "--n", _cap(96, limit), "--n-topk", _cap(32, limit), "--out", f"{out}/dream_rules"),
            "Dream-style model: Fast-dLLM's Dream rules vs its LLaDA rules, cached vs uncached",
            ("dream_rules/table.md", "dream_rules/table.json"), ("dream_rules/*.jsonl",), always=True, after=after,
            cost_min=20.0 * n / 128),
        Job("caches_chain_512_4shot", "experiments.eval.gsm8k",
            ("--limit", n_caches, "--batch-size", 25, "--gen-length", 512, "--block-length", 32, "--num-fewshot", 4,
             "--strategies", "caches", "--baseline", "cache_dual_threshold", "--model", f"{ck}/llada-chain",
             "--out", f"{out}/caches_chain_512_4shot"),
            "every approximate cache (prefix, dual, delayed, adaptive) under the threshold rule, llada-chain, "
            "gen 512, 4-shot", tuple(f"caches_chain_512_4shot/{f}" for f in GSM8K_REPORT),
            ("caches_chain_512_4shot/cache_*.jsonl",), always=True, after=("train_llada_chain",) if full else (),
            cost_min=40.0 * n_caches / 200),
        Job("caches_chain_512_4shot_sweep", "experiments.eval.gsm8k",
            ("--limit", n_caches, "--batch-size", 25, "--gen-length", 512, "--block-length", 32, "--num-fewshot", 4,
             "--strategies", *FRONTIER, "--baseline", "cache_dual_threshold", "--model", f"{ck}/llada-chain",
             "--out", f"{out}/caches_chain_512_4shot"),
            "the frontier's other points: dual at thresholds 0.7 / 0.8 / 0.95 and factor 2, the adaptive cache without "
            "block-start refreshes (threshold 0.8; tolerances 0.02, 0.05), the delayed cache refreshed every 4 steps",
            (), ("caches_chain_512_4shot/sw_*.jsonl",), always=True, after=("caches_chain_512_4shot",),
            cost_min=40.0 * n_caches / 200),
        Job("caches_chain_512_4shot_timing", "experiments.eval.gsm8k",
            ("--limit", _cap(50, limit), "--batch-size", 25, "--gen-length", 512, "--block-length", 32,
             "--num-fewshot", 4, "--strategies", "cache_prefix_threshold", "cache_dual_threshold",
             "cache_delayed_threshold", "cache_adaptive_nb_threshold", "sw_adaptive_nb_tol0p05", "sw_adaptive_nb_tol0p02",
             "--baseline", "cache_dual_threshold", "--model", f"{ck}/llada-chain",
             "--out", f"{out}/caches_chain_512_4shot_timing"),
            "the frontier's speed-ups timed in one run on an otherwise idle machine (first 50 problems)",
            tuple(f"caches_chain_512_4shot_timing/{f}" for f in GSM8K_REPORT), ("caches_chain_512_4shot_timing/*.jsonl",),
            always=True, after=("train_llada_chain",) if full else (), cost_min=6.0 * _cap(50, limit) / 50),
    ]


def plan(out: str, work: str, limit: Optional[int] = None, full: bool = False) -> list[Job]:
    """Every job, training first; ``out``/``work`` are paths as the commands should show them."""
    ck = f"{out}/checkpoints" if full else "results/checkpoints"
    llada, bd3 = f"{ck}/llada-arith", f"{ck}/bd3lm-arith-16"
    after_llada = ("train_llada",) if full else ()
    after_bd3 = ("train_llada", "train_bd3lm_16") if full else ()
    jobs = training_jobs(out, work)

    testbeds = [  # (out dir, checkpoint, its training job, extra args, [(name, configs, shots, n, cost)])
        ("testbed", "llada-arith", "train_llada", (), [
            ("testbed_semiar32", ("semiar32",), 0, 500, 40.0),
            ("testbed_pure", ("pure",), 0, 200, 16.8),
            ("testbed_fewshot", ("semiar32",), 4, 500, 77.7),
            ("testbed_pure_fewshot", ("pure",), 4, 100, 11.0),
            ("testbed_tokens_per_step",
             ("semiar32_s2", "semiar32_s4", "semiar32_s8", "semiar32_s16", "semiar32_s32"), 0, 100, 8.0),
            ("testbed_pure_tokens_per_step", ("pure_s2", "pure_s4", "pure_s8", "pure_s16", "pure_s32"), 0, 100, 14.5),
        ]),
        ("testbed_loop", "llada-loop", "train_llada_loop", ("--unique",), [
            ("testbed_loop_semiar32", ("semiar32",), 0, 500, 37.5),
            ("testbed_loop_pure", ("pure",), 0, 500, 35.0),
            ("testbed_loop_fewshot", ("semiar32",), 4, 500, 86.0),
            ("testbed_loop_pure_fewshot", ("pure",), 4, 500, 86.9),
        ]),
        ("testbed_chain", "llada-chain", "train_llada_chain", ("--unique",), [
            ("testbed_chain_semiar32", ("semiar32",), 0, 500, 42.5),
            ("testbed_chain_pure", ("pure",), 0, 500, 40.0),
            ("testbed_chain_fewshot", ("semiar32",), 4, 500, 101.8),
            ("testbed_chain_pure_fewshot", ("pure",), 4, 200, 36.0),
            ("testbed_chain_tokens_per_step", ("semiar32_s2", "semiar32_s4", "semiar32_s8"), 0, 100, 5.1),
            ("testbed_chain_pure_tokens_per_step", ("pure_s2", "pure_s4", "pure_s8"), 0, 100, 5.6),
        ]),
        ("testbed_chain_s50", "llada-chain-s50", "train_llada_chain_s50", ("--unique",), [
            ("testbed_chain_s50_semiar32", ("semiar32",), 0, 200, 10.8),
            ("testbed_chain_s50_pure", ("pure",), 0, 200, 11.7),
        ]),
    ]
    for d, ckpt_name, trained_by, extra, runs in testbeds:
        model, after = f"{ck}/{ckpt_name}", ((trained_by,) if full else ())
        tb = ("--model", model, *extra, "--out", f"{out}/{d}")
        for name, configs, k, n, cost in runs:
            jobs.append(Job(name, "research.testbed",
                            ("--configs", *configs, "--fewshot", k, "--n", _cap(n, limit), *tb),
                            f"{d} samples ({Path(model).name}): {', '.join(configs)}, {k}-shot, gen 256",
                            samples=tuple(f"{d}/{c}_k{k}.jsonl" for c in configs), always=True,
                            after=after, cost_min=cost * _cap(n, limit) / n))
        jobs.append(Job(f"{d}_report", "research.testbed",
                        ("--report-only", "--fewshot", 0, 4, "--n", _cap(500, limit), *tb),
                        f"{d} table ({Path(model).name}): semi-AR vs pure diffusion, first-EOS step, "
                        "tokens/step, few-shot", (f"{d}/testbed.md", f"{d}/testbed.json"), always=True,
                        after=tuple(r[0] for r in runs)))

    gen512 = ("baseline_semiar", "fastdllm_prefix", "fastdllm_dual", "fastdllm_threshold",
              "fastdllm_dual_threshold", "bd3lm")
    table1 = ("baseline_full", *gen512[:-1], "fastdllm_factor", "fastdllm_prefix_threshold", "bd3lm")
    gsm = [  # (dir, n, gen, shots, strategies, cost); table1 as it was before baseline_semiar_eos
        ("gsm8k_arith_256", 64, 256, 0, table1, 10.9),
        ("gsm8k_arith_512", 32, 512, 0, gen512, 17.0),
        ("gsm8k_arith_256_4shot", 64, 256, 4, table1, 20.0),
        ("gsm8k_arith_512_4shot", 32, 512, 4, gen512, 18.0),
    ]
    for d, n, gen, shots, strategies, cost in gsm:
        m = _cap(n, limit)
        jobs.append(gsm8k_table(d, out, llada, m, m, gen, shots, strategies,
                                f"GSM8K-format strategy comparison, gen {gen}, {shots}-shot (Fast-dLLM Table 1 layout)",
                                (f"{d}/*.jsonl",), after_bd3, cost * m / n, extra=("--bd3-model", bd3),
                                name=d.replace("_arith", "")))

    blocks = f"{out}/bd3lm_blocks"
    for b in BD3_BLOCKS:
        n = _cap(500, limit)
        jobs.append(Job(f"bd3lm_blocks_{b}", "research.bd3_blocks",
                        ("--models", f"{ck}/bd3lm-arith-{b}", "--n", n, "--uncached", _cap(100, limit),
                         "--fewshot", 0, 4, "--out", blocks),
                        f"embedded BD3-LM L'={b}: 0/4-shot accuracy, cached vs uncached outputs and time",
                        samples=tuple(f"bd3lm_blocks/L{b}_k{k}{u}.jsonl" for k in (0, 4) for u in ("", "_uncached")),
                        always=True, after=(f"train_bd3lm_{b}",) if full else (), cost_min=3.0 * n / 500))
    jobs.append(Job("bd3lm_blocks_report", "research.bd3_blocks",
                    ("--report-only", "--models", *(f"{ck}/bd3lm-arith-{b}" for b in BD3_BLOCKS),
                     "--n", _cap(500, limit), "--out", blocks),
                    "embedded BD3-LM by block size (table)", ("bd3lm_blocks/table.md", "bd3lm_blocks/table.json"),
                    always=True, after=tuple(f"bd3lm_blocks_{b}" for b in BD3_BLOCKS)))

    jobs += dream_jobs(out, work, ck, limit, full)
    jobs += anyorder_jobs(out, work, ck, limit, full)
    jobs += chain_jobs(out, work, ck, limit, full)
    # the laptop ladder's checkpoints are not committed (21 MB, as the char ladder's): its eval and report
    # run with --full, after its retraining (or --only, on checkpoints trained here)
    ppl_after = ("train_ppl_a", "train_ppl_b") if full else ()
    jobs.append(Job("perplexity_eval", "experiments.perplexity", ("eval", "--preset", "laptop", "--out", out),
                    "perplexity ladder eval: NELBO PPL, MC ELBO cross-check, Var(NELBO) per schedule",
                    (), ("perplexity_laptop.jsonl",), always=True, after=ppl_after, cost_min=6, training=True))
    jobs.append(Job("perplexity_report", "experiments.perplexity", ("report", "--preset", "laptop", "--out", out),
                    "BD3-LM Table 3 (PPL vs block size) and Table 2 (clipped schedules) at laptop scale",
                    ("perplexity_laptop.md", "perplexity_laptop.csv", "perplexity_laptop.png"),
                    always=True, after=("perplexity_eval",), training=True))

    cost = [  # (name, prompt, gen, block, steps, tokens/step, model)
        ("llada8b_p1000_g256", 1000, 256, 32, 256, 4, None),
        ("llada-arith_p220_g256", 220, 256, 32, 256, 8, llada),
    ]
    for name, P, G, B, K, R, model in cost:
        base = f"{out}/compute_cost/{name}"
        jobs.append(Job(f"cost_{name}", "experiments.bench.compute_cost",
                        ("--prompt", P, "--gen", G, "--block", B, "--steps", K, "--tokens-per-step", R,
                         *(("--model", model) if model else ()), "--md", f"{base}.md", "--json", f"{base}.json",
                         "--plot", f"{base}.png"),
                        f"passes / positions / FLOPs per sampler, prompt {P}, gen {G} "
                        f"({'LLaDA-8B shape' if model is None else 'embedded model'})",
                        tuple(f"compute_cost/{name}.{e}" for e in ("md", "json", "png")), after=after_llada))

    for cache in ("dual", "prefix"):
        run = f"llada-arith_{cache}_g128_b32"
        jobs.append(Job(f"drift_{cache}", "experiments.eval.drift",
                        ("--model", llada, "--prompts", 4, "--gen", 128, "--block", 32, "--cache", cache,
                         "--refresh", "block", "every:4", "every:1", "--run", run, "--out-dir", f"{out}/drift"),
                        f"Fast-dLLM {cache}-cache drift vs exact recomputation (K/V cos, KL, first divergence)",
                        (f"drift/{run}.json", f"drift/{run}.md", f"drift/{run}/k_cos_by_layer.png",
                         f"drift/{run}/kl_by_step.png"), after=after_llada, cost_min=1.0))

    run = "llada-chain_policies_g128_b32"
    jobs.append(Job("drift_policies", "experiments.eval.drift",
                    ("--model", f"{ck}/llada-chain", "--prompts", 4, "--gen", 128, "--block", 32, "--cache", "dual",
                     "--refresh", "block", "every:4", "delayed", "adaptive:0.1", "adaptive-nb:0.1", "adaptive-nb:0.05",
                     "adaptive-nb:0.02", "--run", run, "--out-dir", f"{out}/drift"),
                    "every approximate cache's drift vs exact recomputation, with its refresh count (dual per block / "
                    "every 4 steps, delayed, adaptive), llada-chain (answers span two blocks)",
                    (f"drift/{run}.json", f"drift/{run}.md", f"drift/{run}/k_cos_by_layer.png",
                     f"drift/{run}/kl_by_step.png"), after=("train_llada_chain",) if full else (), cost_min=1.5))

    traces = [  # (name, strategy args, model)
        ("baseline_pure_g64", ("--strategy", "baseline", "--block-length", 64), llada),
        ("baseline_semiar16_g64", ("--strategy", "baseline", "--block-length", 16), llada),
        ("fastdllm_dual_t0.9_g64", ("--strategy", "fastdllm", "--cache", "dual", "--threshold", 0.9,
                                    "--block-length", 16), llada),
        ("bd3lm_g64", ("--strategy", "bd3lm", "--block-length", 16), bd3),
    ]
    for name, strategy, model in traces:
        jobs.append(Job(f"trace_{name}", "experiments.cli.trace",
                        ("--model", model, "--prompt", TRACE_PROMPT, "--gen-length", 64, *strategy,
                         "--out", f"{out}/trace/{name}.png", "--replay-out", f"{out}/trace/{name}.txt"),
                        "denoising order: step that committed each position (heatmap + text replay)",
                        (f"trace/{name}.png", f"trace/{name}.txt"),
                        after=after_bd3 if model == bd3 else after_llada))
    jobs.append(Job("headline", "experiments.reproduce.headline", ("--results", out),
                    "the README's headline table and docs/results.md (outside results/; headline.md and results.md "
                    "in another --out), from the per-sample files", () if out == "results" else ("headline.md", "results.md"),
                    always=True, after=tuple(j.name for j in jobs if not j.training), cost_min=0.2))
    return jobs
