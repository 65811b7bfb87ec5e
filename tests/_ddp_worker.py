"""DDP test helper: ``torchrun --nproc_per_node 2 tests/_ddp_worker.py OUT`` trains 2 steps and
every rank saves its final weights to ``OUT/rank{r}.pt``. The builders are shared with the
1-process reference in ``tests/test_train.py``."""

from __future__ import annotations

import os
import sys

import torch

from dlm.model import Transformer
from dlm.objectives import LLaDAPretrainLoss
from dlm.train import TrainConfig, train
from tiny import micro_config, micro_model  # tests/ is sys.path[0] when run as a script

VOCAB, SEQ, GLOBAL_BATCH, STEPS = micro_config().vocab_size, 8, 8, 2  # [MASK] = VOCAB - 1


def tiny_model(seed: int = 0) -> Transformer:
    """The 1-layer float32 training model (:func:`tiny.micro_model`)."""
    return micro_model(seed)


def batch_fn(step: int, generator: torch.Generator) -> dict:
    return {"input_ids": torch.randint(0, VOCAB - 1, (GLOBAL_BATCH, SEQ), generator=generator)}


def make_config(out_dir: str, micro_batch_size=None) -> TrainConfig:
    return TrainConfig(out_dir=out_dir, max_steps=STEPS, batch_size=GLOBAL_BATCH,
                       micro_batch_size=micro_batch_size, lr=1e-3, warmup_steps=1,
                       grad_clip=0.5, ema_decay=0.9, log_every=1, seed=3)


def save_weights(model, tokenizer, out_dir: str) -> None:
    torch.save(model.state_dict(), os.path.join(out_dir, "weights.pt"))


def main(out: str) -> None:
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    model = tiny_model()
    # world 2 x micro 2 -> 2 accumulation micro-steps per rank (the reference uses one forward)
    train(model, LLaDAPretrainLoss(), batch_fn, make_config(os.path.join(out, "run"), 2),
          save_fn=save_weights)
    torch.save(model.state_dict(), os.path.join(out, f"rank{rank}.pt"))
    from dlm import distributed

    distributed.cleanup()


if __name__ == "__main__":
    main(sys.argv[1])
