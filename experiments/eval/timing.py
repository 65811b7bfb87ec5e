"""Speed-ups with uncertainty: the baseline and each row timed alternately on the same batches.

    python -m experiments.eval.timing --model results/checkpoints/llada-chain --out DIR --limit 32 \\
        --batch-size 32 --repeats 3 --baseline baseline_semiar --strategies fastdllm_dual_threshold

Times the first --limit problems (a declared subset) as the GSM8K harness batches them: for each of
--repeats repeats, for each batch, the baseline and every strategy decode that batch back to back,
the order rotated per repeat (:mod:`harness.timing`). Every flag of ``experiments.eval.gsm8k`` means
the same here. Writes under --out: ``timing.jsonl``, one line per (repeat, batch, strategy) cell,
appended as it completes (a rerun skips the cells written; another config or batch layout is
refused); then ``timing.md`` / ``timing.json``: per strategy the median speed-up with its 95%
bootstrap CI over the cells, the CPU model, torch threads and load average, and the FLOP ideal when
--out holds the harness's ``<strategy>.jsonl`` for these problems (whose samples the timed calls must
reproduce where the batch is the same). A row whose CI lies above its FLOP ideal is flagged.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from dlm.io import stable_json
from experiments.eval import gsm8k
from harness.cli import (
    UserError,
    at_least,
    device_of,
    run_main,
    set_threads,
    writing_to,
)
from harness.evaluate import check_resumable, check_same_problems, existing_records
from harness.grids import sampler_names
from harness.prompt_checks import check_shots_unseen, encode_prompts
from harness.records import TIMING_JSON, run_config, strategy_files
from harness.report import build_report
from harness.results import JsonlLog, atomic_write_text
from harness.timing import (
    clock_name,
    Entrant,
    batches_of,
    conditions,
    flop_ideals,
    render,
    run_cells,
    timing_rows,
)

CELLS = "timing.jsonl"


@dataclass(frozen=True)
class TimingConfig:
    harness: gsm8k.HarnessConfig  # strategies: the baseline first
    repeats: int
    resamples: int


def build_parser():
    p = gsm8k.build_parser("experiments.eval.timing", __doc__, paragraphs=1)
    declared = {"out": "folder of timing.jsonl / .md / .json (and of the harness's records)",
                "limit": "time the first N problems (a declared subset)"}
    for action in p._actions:  # the harness's defaults do not apply: both are declared
        if action.dest in declared:
            action.required, action.help = True, declared[action.dest]
    p.add_argument("--repeats", type=at_least(3), default=3, metavar="R",
                   help="times each batch is timed per strategy (>= 3, default 3)")
    p.add_argument("--resamples", type=at_least(100), default=2000, metavar="N",
                   help="bootstrap resamples of the cells (default 2000)")
    return p


def parse_config(argv=None) -> TimingConfig:
    """Parse and validate the command line; bad values raise ValueError / UserError naming the flag."""
    p = build_parser()
    a = p.parse_args(argv)
    if a.baseline not in sampler_names():
        raise ValueError(f"--baseline must be a known strategy, got {a.baseline!r}")
    a.strategies = [a.baseline, *a.strategies]  # timed first in repeat 0; its grid's numbers
    cfg = gsm8k.config_of(p, a)
    rows = tuple(s for s in cfg.strategies if s.name != cfg.baseline)
    if not rows:
        raise UserError(f"--strategies: only the baseline {cfg.baseline} was given: name the rows to time against it")
    base = next(s for s in cfg.strategies if s.name == cfg.baseline)
    cfg = dataclasses.replace(cfg, strategies=(base, *rows))
    return TimingConfig(cfg, a.repeats, a.resamples)


def entrants(cfg: gsm8k.HarnessConfig, problems, shots, device) -> list[Entrant]:
    """Every strategy bound to its model, with the records of ``<out>/<strategy>.jsonl`` (checked:
    this config, these problems), before any compute."""
    strategies = list(cfg.strategies)
    if cfg.bd3_model is None and any(gsm8k.is_bd3(s) for s in strategies):
        print("bd3lm: skipped (no --bd3-model given)", file=sys.stderr)
        strategies = [s for s in strategies if not gsm8k.is_bd3(s)]
    if gsm8k.is_bd3(cfg.strategies[0]) and cfg.bd3_model is None:
        raise UserError(f"--baseline {cfg.baseline} needs --bd3-model")
    main, bd3 = gsm8k.load_models(cfg, strategies, device)
    for loaded in (m for m in (main, bd3) if m is not None):
        encode_prompts(loaded.tokenizer, problems, shots, cfg.chat_template, mask_id=loaded.model.config.mask_token_id,
                       where=f"--data {cfg.data} on {loaded.source}")
    out = []
    for s in strategies:
        job = gsm8k.make_job(s, bd3 if gsm8k.is_bd3(s) else main, cfg, problems, shots)
        path = cfg.out / f"{job.strategy.name}.jsonl"
        recorded = existing_records(path)
        check_resumable(recorded, path, job.config_hash, job.loaded.weights)
        check_same_problems(recorded, problems, path)
        out.append(Entrant(job.strategy, job.loaded.model, job.loaded.tokenizer, job.config["chat_template"],
                           job.config_hash, recorded, str(path)))
    return out


def report(out: Path, cells: list[dict], cfg: TimingConfig, recorded: dict, ids: list[str], clock: str) -> str:
    """Write ``timing.md`` / ``timing.json`` from the cells; returns the markdown."""
    h = cfg.harness
    rows = timing_rows(cells, h.baseline, flop_ideals(recorded, h.baseline, ids), cfg.resamples)
    meta = {"baseline": h.baseline, "model": gsm8k.repo_relative(h.model), "data": h.data, "problems": len(ids),
            "first_id": ids[0], "last_id": ids[-1], "num_fewshot": h.num_fewshot, "batch_size": h.batch_size,
            "bootstrap": {"resamples": cfg.resamples, "seed": 0, "level": 0.95}, "conditions": conditions(cells),
            "clock": clock}
    md = render(rows, meta)
    atomic_write_text(out / "timing.md", md)
    atomic_write_text(out / TIMING_JSON, stable_json({"meta": meta, "rows": [asdict(r) for r in rows]},
                                                       indent=2) + "\n")
    return md


def run(cfg: TimingConfig, clock: Callable[[], float] | None = None) -> str:
    """Time every cell not yet in ``<out>/timing.jsonl`` and write timing.md / .json; the folder's own
    table (harness.report, its config's baseline) is rebuilt with the timed column. ``clock``: by
    default this thread's CPU time on the CPU at one thread (other jobs' time not counted), else
    wall time (:func:`harness.timing.clock_name`). Returns timing.md."""
    h = cfg.harness
    with writing_to("--out", h.out):
        set_threads(h.threads)
        device = device_of(h.device)
        label = clock_name(device) if clock is None else getattr(clock, "__name__", "given")
        clock = clock or getattr(time, label)
        problems, shots = gsm8k.load_problems(h), gsm8k.load_shots(h)
        local = h.data not in ("arith", "gsm8k")
        check_shots_unseen(shots, problems, Path(h.data).parent / "train.jsonl" if local else h.data)
        ents = entrants(h, problems, shots, device)
        batches = [[h.skip + i for i in b]  # the harness's batches of the problems from --skip on
                   for b in batches_of(ents[0], problems[h.skip:], shots, h.batch_size, h.sort_prompts)]
        with JsonlLog(h.out / CELLS) as log:
            cells = run_cells(ents, problems, log, shots=shots, batches=batches, repeats=cfg.repeats, seed=h.seed,
                              clock=clock, compile=h.compile,
                              progress=lambda c: print(f"{c['id']}: {c['seconds']:.2f} s, {c['tokens']} tokens",
                                                       file=sys.stderr))
        cells = [c for c in cells if c["repeat"] < cfg.repeats and c["strategy"] in {e.name for e in ents}]
        md = report(h.out, cells, cfg, {e.name: e.recorded for e in ents}, [p.id for p in problems[h.skip:]], label)
        if strategy_files(h.out):  # a folder of harness records: its table gains the timed column
            build_report(h.out, baseline=run_config(h.out).get("baseline", h.baseline))
        return md


def main(argv=None) -> None:
    print(run(parse_config(argv)))


if __name__ == "__main__":
    run_main(main)
