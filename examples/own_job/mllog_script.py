"""A plain PyTorch job that writes its MLLOG with MLPerf's own logger
(``mlperf_logging.mllog``) and imports nothing of ampcert: what any MLPerf
training reference already does is all a command workload needs.

    python examples/own_job/mllog_script.py            # fp32; the MLLOG lines go to stdout only
    AMPCERT_MLLOG=run.mllog AMPCERT_PRECISION=bf16 AMPCERT_SEED=1 python examples/own_job/mllog_script.py

An MLP learns which of 4 directions a point lies nearest (a fixed random
linear teacher; 10% of the labels flipped, so the best accuracy is about
0.9). With AMPCERT_PRECISION=bf16 (or fp16 on a GPU) the forward runs under
torch.autocast. The job declares its lowest precisions itself (ampcert's
own callbacks measure them instead).
"""

from __future__ import annotations

import os
import sys

import torch
from mlperf_logging import mllog
from mlperf_logging.mllog import constants
from torch import nn

FEATURES, CLASSES, NOISE = 16, 4, 0.1
STEPS, BATCH, EVAL_EVERY = 150, 64, 25


def data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    teacher = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    y = (x @ teacher).argmax(dim=1)
    flip = torch.rand(n, generator=g) < NOISE
    return x, torch.where(flip, torch.randint(0, CLASSES, (n,), generator=g), y)


def main() -> int:
    precision = os.environ.get("AMPCERT_PRECISION", "fp32")
    seed = int(os.environ.get("AMPCERT_SEED", "0"))
    device = os.environ.get("AMPCERT_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, "unsupported")
    if dtype == "unsupported":
        print(f"mllog_script.py: precision {precision} is not supported by this example", file=sys.stderr)
        return 2
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))  # a tiny model: one thread is fastest

    if os.environ.get("AMPCERT_MLLOG"):
        mllog.config(filename=os.environ["AMPCERT_MLLOG"])
    log = mllog.get_mllogger()
    log.event(key=constants.SEED, value=seed)
    log.event(key=constants.GLOBAL_BATCH_SIZE, value=BATCH)
    lowest = {None: "fp32", torch.bfloat16: "bfloat16", torch.float16: "fp16"}[dtype]
    for key in (constants.LOWEST_NUMERICAL_PRECISION_IN_LINEAR, constants.LOWEST_NUMERICAL_PRECISION_IN_ATTN):
        log.event(key=key, value=lowest)  # declared, not measured (there is no attention: the linear value)
    log.event(key=constants.LOWEST_NUMERICAL_PRECISION_IN_COMM, value="fp32")  # one process
    log.start(key=constants.RUN_START)

    status = constants.ABORTED
    try:
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(FEATURES, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                              nn.Linear(128, CLASSES)).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        scaler = torch.amp.GradScaler(device, enabled=dtype == torch.float16)
        train_x, train_y = (t.to(device) for t in data(STEPS * BATCH, seed + 1000))
        eval_x, eval_y = (t.to(device) for t in data(2048, seed + 2000))
        accuracy = 0.0
        for step in range(1, STEPS + 1):
            x, y = train_x[(step - 1) * BATCH: step * BATCH], train_y[(step - 1) * BATCH: step * BATCH]
            with torch.autocast(device, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            if step % EVAL_EVERY == 0:
                with torch.no_grad(), torch.autocast(device, dtype=dtype or torch.bfloat16,
                                                     enabled=dtype is not None):
                    accuracy = (model(eval_x).argmax(dim=1) == eval_y).float().mean().item()
                log.event(key=constants.EVAL_ACCURACY, value=accuracy,
                          metadata={constants.SAMPLES_COUNT: step * BATCH,
                                    constants.EPOCH_NUM: step * BATCH / len(train_x)})
        status = constants.SUCCESS
    finally:
        log.end(key=constants.RUN_STOP, metadata={constants.STATUS: status})
    print(f"mllog_script.py: precision={precision} seed={seed} final eval_accuracy={accuracy:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
