"""One-off conversion of ``experiments.perplexity`` runs recorded before datasets were named.

    python -m research.convert_perplexity_v2 results/perplexity_laptop.jsonl ...   # --check: change nothing

The run config used to hold its data files as paths (relative to the checkout when the data lay
beside it, absolute otherwise, so a symlinked ``../shared`` gave another config hash); it now names
them, ``<dataset>:<split>`` of :data:`experiments.perplexity_config.DATASETS` (``lm1b-sample:dev``),
with the sha256 of their content. For each file this maps the recorded paths to their names (by
``<dataset>/<file>``), checks sample by sample that every record carries the old config's hash,
and rewrites the records with the new hash (the config record also with the new config), every
other field unchanged (asserted). Idempotent: a converted file is left as it is. The tables are
then rebuilt with ``python -m experiments.perplexity report --run <run>``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path, PurePath

from experiments.common import atomic_write_text, config_hash, read_jsonl
from experiments.perplexity_config import DATASETS


def dataset_name(path: str) -> tuple[str, str]:
    """(``<dataset>:<split>``, fingerprint) of a recorded data path ``.../<dataset>/<file>``."""
    p = PurePath(path)
    for split, (file, sha) in DATASETS.get(p.parent.name, {}).items():
        if file == p.name:
            return f"{p.parent.name}:{split}", f"sha256:{sha}"
    raise ValueError(f"{path!r} is no file of a named dataset ({sorted(DATASETS)})")


def new_config(old: dict) -> dict:
    """The config of an old run with its data named and fingerprinted."""
    data = dict(old["data"])
    fingerprints = {}
    for role in ("train", "test"):
        data[role], fingerprints[role] = dataset_name(data[role])
    return {**old, "data": {**data, "fingerprints": fingerprints}}


def checked_records(path: Path) -> tuple[list, dict]:
    """(records, config record) of a run file whose records all carry its config's hash."""
    records = read_jsonl(path)
    cfg = next((r for r in records if r["id"] == "config"), None)
    if cfg is None:
        raise ValueError(f"{path}: no config record")
    h_old = cfg["config_hash"]
    if config_hash(cfg["config"]) != h_old:
        raise ValueError(f"{path}: the config record's config does not hash to its config_hash {h_old}")
    for r in records:
        if r["config_hash"] != h_old:
            raise ValueError(f"{path}: sample {r['id']} has config {r['config_hash']}, the config record {h_old}")
    return records, cfg


def rehash(path: Path, records: list, old_hash: str, new_cfg: dict, check: bool) -> str:
    """Rewrite ``records`` under ``new_cfg``'s hash (the config record also with ``new_cfg``),
    every other field unchanged (asserted); atomically unless ``check``."""
    h_new = config_hash(new_cfg)
    out = []
    for r in records:
        new = {**r, "config_hash": h_new, **({"config": new_cfg} if r["id"] == "config" else {})}
        assert {k: v for k, v in new.items() if k not in ("config_hash", "config")} == \
            {k: v for k, v in r.items() if k not in ("config_hash", "config")}
        out.append(new)
    if not check:
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in out))
    return f"{path}: {len(out)} records, config {old_hash} -> {h_new}{' (--check: nothing written)' if check else ''}"


def convert(path: Path, check: bool) -> str:
    records, cfg = checked_records(path)
    if "fingerprints" in cfg["config"]["data"]:
        return f"{path}: already converted"
    return rehash(path, records, cfg["config_hash"], new_config(cfg["config"]), check)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="perplexity_<run>.jsonl files")
    p.add_argument("--check", action="store_true", help="check and report, write nothing")
    args = p.parse_args(argv)
    for f in args.files:
        print(convert(Path(f), args.check))


if __name__ == "__main__":
    sys.exit(main())
