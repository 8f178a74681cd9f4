"""Run under torchrun (2 ranks, gloo): each rank trains its own copy of a tiny
model with ampcert's DynamicLossScaler, without DDP, so nothing but the scaler
itself links the ranks; rank 1 alone injects inf into its gradients at some
steps. Writes each rank's scale trajectory and final weights to OUT/rank<r>.json,
for every scaler mode."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

from ampcert.amp import DynamicLossScaler

INJECT = (2, 6, 7)  # steps (0-based) where rank 1 alone sees an overflow
STEPS = 12
MODES = {
    "auto": {},                              # sync_ranks=None: reduce, a process group is up
    "auto_sync_free": {"sync_free": True},   # the masked (device-side) skip path
    "off": {"sync_ranks": False},            # the control: no reduction
}


def trajectory(rank: int, **kwargs) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = DynamicLossScaler("cpu", init_scale=2.0**10, growth_interval=3, **kwargs)
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1 + rank))
    for step in range(STEPS):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        scaler.scale(loss).backward()
        if rank == 1 and step in INJECT:
            model.weight.grad[0, 0] = float("inf")
        scaler.step(opt)
        scaler.update()
    t = scaler.trajectory()
    return {"scale": t["scale"], "skipped": t["skipped_steps"], "found_inf": t["found_inf"]}


def main() -> None:
    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    result = {mode: trajectory(rank, **kwargs) for mode, kwargs in MODES.items()}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
        json.dump(result, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
