"""Data-parallel helpers for ``torchrun`` (env:// rendezvous).

With ``WORLD_SIZE > 1`` in the environment :func:`init` joins the process group (NCCL on GPU,
gloo on CPU); otherwise everything degrades to a single process and the helpers are no-ops.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an int") from None


def init() -> DistInfo:
    """Join the process group when launched by torchrun (idempotent)."""
    world = _env_int("WORLD_SIZE", 1)
    if world <= 1:
        return DistInfo()
    rank, local_rank = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    if not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank)
            dist.init_process_group("nccl")
        else:
            dist.init_process_group("gloo")
    if dist.get_world_size() != world or dist.get_rank() != rank:
        raise RuntimeError("process group does not match WORLD_SIZE/RANK environment")
    return DistInfo(rank=rank, world_size=world, local_rank=local_rank)


def device_for(info: DistInfo, model: nn.Module) -> torch.device:
    """Training device: ``cuda:LOCAL_RANK`` under multi-GPU DDP, else the model's own device."""
    if info.enabled and torch.cuda.is_available():
        return torch.device("cuda", info.local_rank)
    p = next(model.parameters(), None)
    return torch.device("cpu") if p is None else p.device


class _DDP(DistributedDataParallel):
    """DDP whose unknown attributes fall through to the wrapped module (e.g. ``model.config``)."""

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "module":
                raise
            return getattr(self.module, name)


def wrap(model: nn.Module, info: DistInfo) -> nn.Module:
    """DDP-wrap ``model`` (already on its device) when running distributed; else return it."""
    if not info.enabled:
        return model
    device_ids = [info.local_rank] if next(model.parameters()).is_cuda else None
    return _DDP(model, device_ids=device_ids)


def shard_rows(batch: dict[str, Tensor], info: DistInfo) -> dict[str, Tensor]:
    """This rank's contiguous slice of every (B, ...) tensor of the global batch."""
    if not info.enabled:
        return batch
    n = next(iter(batch.values())).shape[0]
    if n % info.world_size:
        raise ValueError(f"global batch of {n} rows not divisible by world_size={info.world_size}")
    per = n // info.world_size
    return {k: v[info.rank * per:(info.rank + 1) * per] for k, v in batch.items()}


def all_reduce_mean(x: Tensor, info: DistInfo) -> Tensor:
    if info.enabled:
        x = x.clone()
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
        x /= info.world_size
    return x


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def cleanup() -> None:
    """Leave the process group (call once at the end of a torchrun script)."""
    if dist.is_initialized():
        dist.destroy_process_group()
