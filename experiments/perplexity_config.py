"""Configs of ``experiments.perplexity``: data, architecture, training, evaluation, presets.

Frozen dataclasses; :data:`PRESETS` maps ``laptop`` / ``lm1b`` / ``owt`` to their defaults
(the command line overrides single fields). Model names: ``ar`` (L'=1), ``bd<k>`` (L'=k),
``mdlm`` (L'=L); :func:`model_block` validates them against L.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from bd3lm.schedules import DEFAULT_GRID
from experiments.common import REPO

SHARED = Path(os.environ.get("DLM_SHARED_DATA") or REPO.parent / "shared" / "data")
DEFAULT_MODELS = ("ar", "bd4", "bd8", "bd16", "mdlm")
#: Table 2 rows: (label, beta, omega); the searched clipping is appended per model.
FIXED_SCHEDULES = (("U[0,1]", 0.0, 1.0), ("U[.3,.8]", 0.3, 0.8), ("U[.5,1]", 0.5, 1.0))
#: laptop clipping-search grid (DEFAULT_GRID's 21 pairs cost too much on a CPU)
LAPTOP_GRID = ((0.0, 1.0), (0.3, 0.8), (0.5, 1.0), (0.2, 0.9), (0.45, 0.95), (0.3, 1.0))


@dataclass(frozen=True)
class DataConfig:
    style: str  # bd3lm.data style: lm1b | owt
    train: str  # text file or HF dataset name
    test: str
    tokenizer: str
    seq_len: int
    train_split: str = "train"
    test_split: str = "test"
    hf_config: Optional[str] = None
    max_train_lines: Optional[int] = None
    max_test_lines: Optional[int] = None
    val_chunks: int = 64  # held out from the end of the training chunks (clipping search)


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

    def identity(self) -> dict:
        """What fixes the results (not which models this process runs, nor where files go); local
        data paths beside the checkout are relative to it, so the hash is the same in every clone."""
        data = {k: portable(v) if k in ("train", "test", "tokenizer") else v for k, v in asdict(self.data).items()}
        return {"preset": self.preset, "data": data, "arch": asdict(self.arch),
                "train": asdict(self.train), "eval": asdict(self.eval)}


def portable(path: str) -> str:
    """``path`` relative to the checkout when it lies beside it (e.g. ``../shared/data/...``)."""
    p = Path(path)
    if p.is_absolute() and p.resolve().is_relative_to(REPO.parent.resolve()):
        return os.path.relpath(p.resolve(), REPO.resolve())
    return path


def _laptop() -> dict:
    lm1b = SHARED / "lm1b-sample"
    return dict(
        data=DataConfig("lm1b", str(lm1b / "1b_benchmark.dev.tokens"), str(lm1b / "1b_benchmark.test.tokens"),
                        "bert-base-uncased", 128, val_chunks=64),
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


PRESETS = {"laptop": _laptop, "lm1b": lambda: _paper("lm1b"), "owt": lambda: _paper("owt")}


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


