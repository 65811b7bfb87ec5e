"""Configs of ``experiments.perplexity``: data, architecture, training, evaluation, presets.

Frozen dataclasses; :data:`PRESETS` maps ``laptop`` / ``char`` / ``lm1b`` / ``owt`` to their
defaults (the command line overrides single fields); ``char`` also names its training seeds. Model names: ``ar`` (L'=1), ``bd<k>`` (L'=k),
``mdlm`` (L'=L); :func:`model_block` validates them against L.

Data are named, never located: a config (and its hash) holds ``<dataset>:<split>`` of
:data:`DATASETS` (e.g. ``lm1b-sample:dev``) with the sha256 fingerprint of its file, ``file:<name>``
with the fingerprint of a text file of the user's own, or a Hugging Face dataset name. Named files
are looked up in the data mirror (:func:`data_root`: ``$DLM_SHARED_DATA``, else ``../shared/data``
beside the checkout; a symlink is fine) only when they are read, and their content is checked
against the fingerprint then (:func:`locate`), so a run whose results are all recorded needs no data.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from bd3lm.schedules import DEFAULT_GRID
from dlm.io import data_root  # noqa: F401  (re-exported: the data mirror)

DEFAULT_MODELS = ("ar", "bd4", "bd8", "bd16", "mdlm")
#: Table 2 rows: (label, beta, omega); the searched clipping is appended per model.
FIXED_SCHEDULES = (("U[0,1]", 0.0, 1.0), ("U[.3,.8]", 0.3, 0.8), ("U[.5,1]", 0.5, 1.0))
#: laptop clipping-search grid (DEFAULT_GRID's 21 pairs cost too much on a CPU)
LAPTOP_GRID = ((0.0, 1.0), (0.3, 0.8), (0.5, 1.0), (0.2, 0.9), (0.45, 0.95), (0.3, 1.0))
#: text datasets of the data mirror: name -> split -> (file under <mirror>/<name>/, sha256 of its
#: content), as listed in the mirror's SOURCES.md
DATASETS = {
    "lm1b-sample": {
        "dev": ("1b_benchmark.dev.tokens", "17cb1e765cc0ccbf2b25d6dfd5e7d03bc776882e579e77ed9626d65eb3bbdec7"),
        "test": ("1b_benchmark.test.tokens", "63c566dee364763db09e6bb9abd83f77830c4932fc852bf2f9a563b527654fd0")},
    "wikitext-2": {
        "valid": ("valid.txt", "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8"),
        "test": ("test.txt", "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0")},
    "wikitext-2-raw": {
        "test": ("test.joined.txt", "696cca6b65a171b0a358a4be6732cdfdf2dd6164a32e20fd70e3c13fc4dfae83")},
    "ptb": {
        "valid": ("ptb.valid.txt", "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2"),
        "test": ("ptb.test.txt", "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0")},
    "tinyshakespeare": {  # train / test: character spans of input.txt (CUTS)
        "all": ("input.txt", "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"),
        "train": ("input.txt", "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"),
        "test": ("input.txt", "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed")},
}
#: splits derived in code from one file: ``<dataset>:<split>`` -> (lo, hi) fractions of the file's
#: characters (bd3lm.data.char_span); recorded in DataConfig.spans, so part of the config hash
CUTS = {"tinyshakespeare:train": (0.0, 0.9), "tinyshakespeare:test": (0.9, 1.0)}


def fingerprint(path: Path) -> str:
    """``sha256:<hex>`` of a file's content (of a directory: its files' names and contents)."""
    path = Path(path)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    h = hashlib.sha256()
    for f in files:
        if path.is_dir():
            h.update(f.relative_to(path).as_posix().encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return f"sha256:{h.hexdigest()}"


def is_local(source: str) -> bool:
    """A text file rather than a named dataset or a HF dataset name such as ``Skylion007/openwebtext``."""
    return source.startswith((os.sep, ".", "~")) or Path(source).suffix in (".tokens", ".txt", ".jsonl")


def name_source(source: str, flag: str, check: bool = True) -> tuple[str, Optional[str], Optional[str]]:
    """(name, fingerprint, local path) of a ``--train`` / ``--test`` value: ``<dataset>:<split>``
    (pinned fingerprint, found in the mirror when read), a local file (a file of the mirror is
    named as such; another one ``file:<file name>``, fingerprinted now, so it must exist unless not
    ``check``) or a HF dataset name (no fingerprint)."""
    if ":" in source and not is_local(source):
        name, split = source.split(":", 1)
        if name not in DATASETS or split not in DATASETS[name]:
            known = ", ".join(f"{n}:{s}" for n, splits in DATASETS.items() for s in splits)
            raise ValueError(f"{flag}: unknown dataset {source!r} (named datasets: {known})")
        return source, "sha256:" + DATASETS[name][split][1], None
    if not is_local(source):
        return source, None, None
    path = Path(source).expanduser()
    if path.is_file():
        real = path.resolve()
        for name, splits in DATASETS.items():
            for split, (file, sha) in splits.items():
                mirrored = data_root() / name / file
                if mirrored.is_file() and mirrored.resolve() == real:
                    return f"{name}:{split}", "sha256:" + sha, None
    elif check:
        raise ValueError(f"{flag}: file {source!r} does not exist")
    return f"file:{path.name}", fingerprint(path) if path.is_file() else None, str(path)


def locate(role: str, data: "DataConfig") -> str:
    """What ``bd3lm.data.build_dataset`` reads for ``data.<role>`` (train / test): the mirror's
    file of ``<dataset>:<split>`` or the user's ``file:`` (content checked against the config's
    fingerprint), else the HF dataset name. A missing file: ValueError saying where to put it."""
    name, flag = getattr(data, role), f"--{role}"
    if name.startswith("file:"):
        path = Path(dict(data.paths)[role])
    elif ":" in name:
        dataset, split = name.split(":", 1)
        root = data_root()
        path = root / dataset / DATASETS[dataset][split][0]
        if not path.is_file():
            raise ValueError(
                f"{flag}: dataset {name} is needed but {path} does not exist: put the {dataset} files "
                f"(see SOURCES.md of the data mirror) in {root / dataset}, or set DLM_SHARED_DATA to the folder "
                f"that holds {dataset}/ (default: ../shared/data beside the checkout; a symlink is fine)")
    else:
        return name
    expected, found = dict(data.fingerprints).get(role), fingerprint(path)
    if expected != found:
        raise ValueError(f"{flag}: {name} at {path} has fingerprint {found}, the config names {expected}: "
                         "another version of the data")
    return str(path)


def name_tokenizer(value: str) -> tuple[str, Optional[str], Optional[str]]:
    """(name, fingerprint, local path) of a ``--tokenizer``: a hub name (``bert-base-uncased``,
    found in the mirror's ``tokenizers/`` when there) as it is, a directory of the mirror by its
    name, another directory as ``file:<dir name>`` with the fingerprint of its files."""
    path = Path(value).expanduser()
    if not path.is_dir():
        return value, None, None
    mirror = data_root() / "tokenizers" / path.name
    if mirror.is_dir() and mirror.resolve() == path.resolve():
        return path.name, None, None
    return f"file:{path.name}", fingerprint(path), str(path)


def locate_tokenizer(data: "DataConfig") -> str:
    """The tokenizer to load: a ``file:`` directory (content checked), the mirror's copy of a
    named tokenizer, else the name (hub)."""
    name = data.tokenizer
    if name.startswith("file:"):
        path = Path(dict(data.paths)["tokenizer"])
        if fingerprint(path) != dict(data.fingerprints).get("tokenizer"):
            raise ValueError(f"--tokenizer: {path} is not the tokenizer the config names ({name})")
        return str(path)
    local = data_root() / "tokenizers" / name
    return str(local) if local.is_dir() else name


@dataclass(frozen=True)
class DataConfig:
    style: str  # bd3lm.data style: lm1b | owt | char
    train: str  # <dataset>:<split>, file:<name> or HF dataset name (see the module docstring)
    test: str
    tokenizer: str
    seq_len: int
    train_split: str = "train"
    test_split: str = "test"
    hf_config: Optional[str] = None
    max_train_lines: Optional[int] = None
    max_test_lines: Optional[int] = None
    val_chunks: int = 64  # held out from the end of the training chunks (clipping search)
    fingerprints: tuple = ()  # ((role, "sha256:..."), ...) of named and file: sources; role train|test|tokenizer
    paths: tuple = ()  # ((role, local path), ...) of the file: sources: not identity
    spans: tuple = ()  # ((role, lo, hi), ...) character spans of CUTS splits (char style)


@dataclass(frozen=True)
class ArchConfig:
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    mlp_hidden: int
    tie_embeddings: bool = True


@dataclass(frozen=True)
class TrainSpec:
    steps: int
    batch_size: int
    lr: float
    warmup: int
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    grad_clip: float = 1.0
    ema: float = 0.0
    precision: str = "fp32"
    micro_batch_size: Optional[int] = None
    seed: int = 0
    clip_search: bool = True  # BD3-LM sec. 4: re-search (beta, omega) every search_every steps
    search_every: int = 0
    search_chunks: int = 32
    grid: tuple = DEFAULT_GRID
    finetune_from_mdlm: bool = False
    finetune_steps: int = 0
    var_finetune_steps: int = 0


@dataclass(frozen=True)
class EvalSpec:
    eval_chunks: Optional[int] = None  # first N test chunks (None: all)
    batch_size: int = 32
    mc_chunks: int = 64
    mc_num: int = 8
    mc_batch_size: int = 8
    var_chunks: int = 256
    seed: int = 1234
    passes: int = 1  # passes over the test set averaged for the NELBO (fresh noise each)


@dataclass(frozen=True)
class RunConfig:
    preset: str
    run: str
    command: str
    models: tuple
    var_models: tuple
    data: DataConfig
    arch: ArchConfig
    train: TrainSpec
    eval: EvalSpec
    out: str
    work: str
    device: str
    threads: Optional[int] = None
    seeds: tuple = ()  # training seeds: run ``<run>-s<seed>`` each (experiments.perplexity.seeds)

    def identity(self) -> dict:
        """What fixes the results (not which models this process runs, nor where files go): the
        data by name and content fingerprint, never by path, so the hash is the same in every clone.
        ``spans`` and ``eval.passes`` appear only when set (hashes of configs without them are unchanged)."""
        data = {k: v for k, v in asdict(self.data).items() if k != "paths" and (k != "spans" or v)}
        data["fingerprints"] = dict(self.data.fingerprints)
        ev = {k: v for k, v in asdict(self.eval).items() if k != "passes" or v != 1}
        return {"preset": self.preset, "data": data, "arch": asdict(self.arch), "train": asdict(self.train), "eval": ev}


def _laptop() -> dict:
    return dict(
        data=DataConfig("lm1b", "lm1b-sample:dev", "lm1b-sample:test", "bert-base-uncased", 128, val_chunks=64),
        arch=ArchConfig(64, 4, 4, 4, 192, True),
        train=TrainSpec(steps=400, batch_size=16, lr=2e-3, warmup=40, betas=(0.9, 0.99), search_every=150,
                        search_chunks=16, grid=LAPTOP_GRID, finetune_steps=100),
        eval=EvalSpec(eval_chunks=512, batch_size=32, mc_chunks=64, mc_num=8, mc_batch_size=8, var_chunks=256))


def _paper(style: str) -> dict:
    """BD3-LM / MDLM settings: 12 x 768 backbone, batch 512, 1M steps (850K MDLM + 150K fine-tune
    in the paper's recipe), lr 3e-4 constant after 2.5K warm-up, EMA 0.9999, bf16."""
    if style == "lm1b":
        data = DataConfig("lm1b", "lm1b", "lm1b", "bert-base-uncased", 128, val_chunks=2048)
    else:  # OpenWebText: the last 100K documents are the held-out set (MDLM / BD3-LM)
        data = DataConfig("owt", "Skylion007/openwebtext", "Skylion007/openwebtext", "gpt2", 1024,
                          train_split="train[:-100000]", test_split="train[-100000:]", val_chunks=2048)
    train_spec = TrainSpec(steps=1_000_000, batch_size=512, lr=3e-4, warmup=2500, min_lr_ratio=1.0,
                           weight_decay=0.0, betas=(0.9, 0.999), ema=0.9999, precision="bf16",
                           search_every=10_000, search_chunks=256, finetune_steps=150_000)
    return dict(data=data, arch=ArchConfig(768, 12, 12, 12, 2048, False), train=train_spec,
                eval=EvalSpec(eval_chunks=None, batch_size=64, mc_chunks=1024, mc_num=32, mc_batch_size=32,
                              var_chunks=4096))


def _char() -> dict:
    """Character-level tinyshakespeare (first 90% of the characters -> train, the rest -> test),
    sized so that each model trains in a few minutes on one CPU core; three training seeds."""
    return dict(
        data=DataConfig("char", "tinyshakespeare:train", "tinyshakespeare:test", "char", CHAR_L, val_chunks=64),
        arch=ArchConfig(CHAR_D, CHAR_LAYERS, 4, 4, 4 * CHAR_D, True),
        train=TrainSpec(steps=CHAR_STEPS, batch_size=CHAR_BATCH, lr=2e-3, warmup=100, betas=(0.9, 0.99),
                        weight_decay=0.1, search_every=CHAR_STEPS // 4, search_chunks=16, grid=LAPTOP_GRID),
        eval=EvalSpec(eval_chunks=CHAR_EVAL_CHUNKS, batch_size=64, mc_chunks=CHAR_MC_CHUNKS, mc_num=CHAR_MC_NUM,
                      mc_batch_size=16, var_chunks=256, passes=CHAR_EVAL_PASSES),
        seeds=(0, 1, 2))


#: char preset sizes (docs/perplexity_char.md: 1.06M parameters, measured step times)
CHAR_L, CHAR_D, CHAR_LAYERS, CHAR_BATCH, CHAR_STEPS = 64, 128, 4, 16, 1000
CHAR_EVAL_CHUNKS, CHAR_MC_CHUNKS, CHAR_MC_NUM = None, 256, 32
#: one pass's NELBO varies by 0.02-0.03 nats/token with the noise (measured): 16 passes bring the
#: eval's standard error to ~0.007, below the seed-to-seed spread the ladder has to resolve
CHAR_EVAL_PASSES = 16

PRESETS = {"laptop": _laptop, "char": _char, "lm1b": lambda: _paper("lm1b"), "owt": lambda: _paper("owt")}


def model_block(name: str, seq_len: int, flag: str = "--models") -> int:
    """Block size of a model name: ar -> 1, bd<k> -> k, mdlm -> L."""
    if name == "ar":
        return 1
    if name == "mdlm":
        return seq_len
    m = re.fullmatch(r"bd([1-9][0-9]*)", name)
    if not m:
        raise ValueError(f"{flag}: unknown model {name!r} (ar, bd<k>, mdlm)")
    k = int(m.group(1))
    if not 1 < k < seq_len or seq_len % k:
        raise ValueError(f"{flag}: {name} needs 1 < {k} < L={seq_len} dividing L")
    return k


