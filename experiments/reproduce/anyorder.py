"""The any-order, load and speed jobs of ``experiments.reproduce`` (``docs/anyorder.md``,
``docs/speed.md``)."""

from __future__ import annotations

from typing import Optional

from experiments.reproduce.jobs import Job, _cap

ANYORDER_TASKS = ("sudoku", "countdown", "reversal")
ANYORDER_ADAPTED = ("sudoku", "countdown")  # tasks that also get the AR -> diffusion (Dream) model
ANYORDER_STEPS, ANYORDER_ADAPT_STEPS = 3000, 1000


def anyorder_jobs(out: str, work: str, ck: str, limit: Optional[int], full: bool) -> list[Job]:
    """AR vs masked diffusion on the any-order tasks (same size, rows and tokens), and throughput
    under load with the roofline."""
    jobs = []
    for task in ANYORDER_TASKS:
        runs = {"ar": ("ar", None, ANYORDER_STEPS), "diffusion": ("diffusion", None, ANYORDER_STEPS)}
        if task in ANYORDER_ADAPTED:  # Dream's recipe: the AR model continued as a diffusion model, and
            runs["adapted"] = ("diffusion", "ar", ANYORDER_ADAPT_STEPS)  # as AR for as many tokens
            runs["arlong"] = ("ar", "ar", ANYORDER_ADAPT_STEPS)
        model = {name: f"{ck}/anyorder-{task}-{name}" for name in runs}
        for name, (obj, init, steps) in runs.items():
            what = {"ar": "autoregressive", "diffusion": "masked diffusion",
                    "adapted": "the AR model adapted to masked diffusion (Dream's recipe)",
                    "arlong": "the AR model trained on as AR for the adapted model's extra tokens"}[name]
            jobs.append(Job(f"train_anyorder_{task}_{name}", "experiments.train.train_anyorder",
                            ("--task", task, "--objective", obj, "--out", f"{work}/anyorder/{task}-{name}",
                             "--steps", steps, *(("--init", model[init]) if init else ())),
                            f"any-order task model: {task}, {what}", (f"checkpoints/anyorder-{task}-{name}/config.json",),
                            cost_min=steps / 120, training=True, after=(f"train_anyorder_{task}_{init}",) if init else (),
                            export=(f"{work}/anyorder/{task}-{name}/model", model[name])))
        names = ("reversal_after", "reversal_before") if task == "reversal" else (task,)
        rows = ("ar", "pure", "semiar") + (("arlong", "dream", "dreamsa") if "adapted" in runs else ())
        samples = tuple(f"anyorder/{n}_{r}.jsonl" for n in names for r in rows)
        jobs.append(Job(f"anyorder_{task}", "experiments.eval.anyorder",
                        ("--task", task, "--ar", model["ar"], "--mdm", model["diffusion"],
                         *(("--adapted", model["adapted"], "--arlong", model["arlong"]) if "adapted" in runs else ()),
                         "--n", _cap(300, limit), "--out", f"{out}/anyorder"),
                        f"any-order samples: {task}, AR vs pure / semi-AR diffusion", samples, samples,
                        after=tuple(f"train_anyorder_{task}_{m}" for m in runs) if full else (),
                        cost_min=1.5 * len(rows) * _cap(300, limit) / 300))
    jobs.append(Job("anyorder_report", "experiments.eval.anyorder", ("--report-only", "--out", f"{out}/anyorder"),
                    "any-order table: AR vs diffusion accuracy with CIs and McNemar",
                    ("anyorder/table.md", "anyorder/table.json"), always=True,
                    after=tuple(f"anyorder_{t}" for t in ANYORDER_TASKS) if full else ()))
    jobs.append(Job("bench_load_embedded", "experiments.bench.bench_load",
                    ("--shape", "embedded", "--batches", 1, 8, 32, 64, "--out", f"{out}/bench_load"),
                    "throughput under load: tokens/s and latency vs batch size, AR + KV cache vs the diffusion "
                    "samplers, with the measured roofline and the crossover batch (timing: run it alone)",
                    tuple(f"bench_load/embedded_g256.{e}" for e in ("md", "json", "png")), cost_min=10))
    jobs.append(Job("bench_load_mid", "experiments.bench.bench_load",
                    ("--shape", "mid", "--batches", 1, 8, 32, 64, "--gen-length", 64, "--skip-after", 120,
                     "--out", f"{out}/bench_load"),
                    "throughput under load at the mid shape (d 512, 8 layers, vocab 32000, random weights), 64 tokens "
                    "per sequence; a strategy's larger batches are skipped once a call takes 2 min (timing: run it alone)",
                    tuple(f"bench_load/mid_g64.{e}" for e in ("md", "json", "png")), cost_min=12))
    for shape, model in (("mid", ("--preset", "mid")), ("embedded", ("--model", f"{ck}/llada-arith"))):
        jobs.append(Job(f"speed_{shape}", "experiments.bench.bench_fastdllm",
                        (*model, "--prompt-len", 200, "--gen-length", 256, "--threads", 1, "--compile",
                         "--out", f"{out}/speed", "--name", f"{shape}_p200_g256"),
                        f"Fast-dLLM speed against the roofline, {shape} shape, eager and compiled (timing: run it alone)",
                        tuple(f"speed/{shape}_p200_g256.{e}" for e in ("md", "json")), cost_min=12 if shape == "mid" else 2))
    return jobs
