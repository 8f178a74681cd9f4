"""Data-parallel training under torchrun: what the torch training loop asks of it.

A run with ``launcher: torchrun`` trains on ``world_size`` ranks started by
``torch.distributed.run`` (see ``ampcert.runner.ddp_worker``). Each rank builds
the same model from the same seed, wraps it in DistributedDataParallel and
takes its shard of the same seeded global batch: rank ``r`` of ``W`` takes
``idx[r::W]``, so the ranks together see exactly the batch a single process
would. With equal shards DDP's gradient average is the gradient of the global
batch's mean loss, and the run computes what the single-process run computes
(up to the order of floating-point sums; batch-norm statistics stay per rank,
as in any DDP job without SyncBatchNorm).

Rank 0 evaluates, logs and writes the result; the other ranks follow its
decision to stop (:meth:`DistContext.decide`), so all ranks leave the loop at
the same step.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

import torch

from ampcert.backends.contract import Unsupported

CONTINUE, STOP, FAIL = 0, 1, 2


@dataclass(frozen=True)
class DistContext:
    rank: int
    world: int
    local_rank: int
    local_world: int
    backend: str  # gloo | nccl

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def check_batch(self, batch_size: int) -> None:
        if batch_size % self.world:
            raise Unsupported(f"global batch {batch_size} does not split into {self.world} equal per-rank "
                            "shards; choose a batch_size divisible by the world size "
                            "(nnodes x nproc_per_node)")

    def shard(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a global batch: every ``world``-th, from ``rank``."""
        return x[self.rank::self.world]

    def wrap(self, model: torch.nn.Module, device: str) -> torch.nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        if device == "cuda":
            return DistributedDataParallel(model, device_ids=[self.local_rank], output_device=self.local_rank)
        return DistributedDataParallel(model)

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        """The mean of ``t`` over ranks (a copy; one all-reduce)."""
        out = t.detach().clone()
        torch.distributed.all_reduce(out, op=torch.distributed.ReduceOp.SUM)
        return out / self.world

    def decide(self, code: int, device: str) -> int:
        """Rank 0's decision (CONTINUE, STOP or FAIL), on every rank."""
        t = torch.tensor([code if self.is_main else CONTINUE], dtype=torch.int64,
                         device=f"cuda:{self.local_rank}" if device == "cuda" else "cpu")
        torch.distributed.broadcast(t, src=0)
        return int(t.item())

    def describe(self, spec: Any, batch_size: int) -> dict[str, Any]:
        """What the run result records about the data-parallel setup."""
        return {
            "launcher": "torchrun", "world_size": self.world, "backend": self.backend,
            "nnodes": spec.launch.nnodes, "nproc_per_node": spec.launch.nproc_per_node,
            "global_batch": batch_size, "per_rank_batch": batch_size // self.world,
            "sharding": f"rank r of {self.world} takes rows r::{self.world} of each seeded global batch",
            "wrapper": "torch.nn.parallel.DistributedDataParallel",
            "rank0_host": socket.gethostname(),
            "evaluation": "rank 0 only; its stop decision is broadcast to every rank",
        }


def current() -> DistContext | None:
    """The context of this torchrun rank, or None outside a process group."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return DistContext(
        rank=dist.get_rank(), world=dist.get_world_size(),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        local_world=int(os.environ.get("LOCAL_WORLD_SIZE", str(dist.get_world_size()))),
        backend=str(dist.get_backend()),
    )


class NullTelemetry:
    """Telemetry for ranks that do not sample (rank 0 samples its node's devices)."""

    def __init__(self, rank: int):
        self.reason = f"rank {rank}: telemetry is sampled by rank 0"

    def phase(self, name: str) -> None:
        pass

    def stop(self, train_samples: int | None = None, **_: Any) -> dict[str, Any]:
        return {"energy": {"train_j": None, "scope": None, "method": None, "reason": self.reason}}

    def series(self) -> None:
        """No samples: this rank wrote none."""
        return None

    def close(self) -> None:
        pass
