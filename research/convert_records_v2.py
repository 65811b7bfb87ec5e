"""One-off conversion of the GSM8K harness files written before the one sampler loop.

    python -m research.convert_records_v2 results/gsm8k_arith_256 ...   # --check: change nothing

The harness used to record the decoded text as ``output`` and hash a config made of the old
``Strategy`` + ``Settings`` + sampler kwargs; it now records ``prediction`` and hashes
``{"strategy": experiments.strategy.Strategy.as_dict(), model, data, num_fewshot, chat_template,
seed, dtype}`` with ``dtype`` the concrete parameter dtype (``--dtype auto`` used to be hashed as
"auto", so a GPU (bf16) run could resume into a CPU (fp32) file; every committed run ran on a CPU,
where auto is float32). For every strategy of a run's ``config.json`` this rebuilds the new
:class:`~experiments.strategy.Strategy` from the old settings (the same grid row; BD3-LM bound
to the recorded block size and alignment), checks sample by sample that each record carries the
old config's hash, and rewrites the records with ``prediction`` and the new hash, every other
field unchanged (asserted), and ``config.json`` with the new configs. Idempotent: a converted
file is left as it is. Whether the new strategies decode the same tokens is checked by
``python -m experiments.reproduce --out DIR --limit 16`` (``verify.md``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from experiments.common import atomic_write_text, config_hash, read_jsonl
from experiments.strategy import resolve


def new_config(old: dict) -> dict:
    """The harness config of the one-loop harness for an old per-strategy ``config``."""
    settings = old["settings"]
    (strategy,) = resolve([old["strategy"]["name"]], **settings)
    kw = old["sampler_kwargs"]
    if old["strategy"]["kind"] == "bd3lm":
        strategy = strategy.for_bd3(kw["block_size"], kw["align"])
        assert (strategy.steps_per_block, strategy.stop_at_eos) == (kw["steps_per_block"], kw["stop_at_eos"])
    else:  # the old kwargs and the new strategy name the same sampler call
        assert strategy.block == kw["block_length"] and strategy.total_steps == kw["steps"]
        assert (strategy.cache == "none") == (kw.get("cache") is None) and kw.get("cache") in (None, strategy.cache)
        assert kw.get("threshold") == strategy.threshold and kw.get("factor") == strategy.factor
        assert kw.get("stop_at_eos", False) == strategy.stop_at_eos
    return resolve_dtype({"strategy": strategy.as_dict(),
                          **{k: old[k] for k in ("model", "data", "num_fewshot", "chat_template", "seed", "dtype")}})


def resolve_dtype(cfg: dict) -> dict:
    """``cfg`` with ``dtype`` "auto" replaced by what it meant on the CPU that ran it."""
    return {**cfg, "dtype": "float32" if cfg["dtype"] == "auto" else cfg["dtype"]}


def convert(run_dir: Path, check: bool) -> list[str]:
    meta = json.loads((run_dir / "config.json").read_text())
    lines = []
    for name, entry in meta["strategies"].items():
        old_cfg = entry["config"]
        cfg = new_config(old_cfg) if "sampler" in old_cfg else resolve_dtype(old_cfg)
        if cfg == old_cfg:
            lines.append(f"{run_dir}/{name}: already converted")
            continue
        h_old, h_new = entry["config_hash"], config_hash(cfg)
        path = run_dir / f"{name}.jsonl"
        records = read_jsonl(path)
        out = []
        for r in records:
            if r["config_hash"] != h_old:
                raise ValueError(f"{path}: sample {r['id']} has config {r['config_hash']}, config.json says {h_old}")
            new = {("prediction" if k == "output" else k): v for k, v in r.items()}
            new["config_hash"] = h_new
            assert {k: v for k, v in new.items() if k not in ("prediction", "config_hash")} == \
                {k: v for k, v in r.items() if k not in ("output", "prediction", "config_hash")}
            assert new["prediction"] == r.get("output", r.get("prediction"))
            out.append(new)
        lines.append(f"{path}: {len(out)} samples, config {h_old} -> {h_new}")
        if not check:
            atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in out))
            meta["strategies"][name] = {**entry, "config": cfg, "config_hash": h_new}
    if not check:
        atomic_write_text(run_dir / "config.json", json.dumps(meta, indent=2, default=str) + "\n")
    return lines


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="GSM8K harness output directories")
    p.add_argument("--check", action="store_true", help="check and report, write nothing")
    args = p.parse_args(argv)
    for run in args.runs:
        print("\n".join(convert(Path(run), args.check)))


if __name__ == "__main__":
    sys.exit(main())
