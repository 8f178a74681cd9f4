"""One rank of a data-parallel run, started by torchrun.

For a run with ``launcher: torchrun`` the orchestrator starts, in a process
group of its own::

    python -m torch.distributed.run --nproc_per_node N --nnodes M [rendezvous ...] \\
        -m ampcert.runner.ddp_worker --spec SPEC.json --root OUT --channel DIR

Every rank joins the process group (NCCL on CUDA, where ``LOCAL_RANK`` picks
the GPU; gloo on CPU) and runs the torch backend's training loop, which wraps
the model in DistributedDataParallel and trains on this rank's shard of each
global batch (``ampcert.backends.distributed``). Rank 0 does everything a
single-process worker does: MLLOG events, result.json, telemetry of its
node's GPUs, progress lines into ``DIR/progress.jsonl`` for the orchestrator.
The other ranks train and write nothing into the results folder.

Exit codes: 0 when the run completed; 3 when rank 0 recorded a failed run
(exiting non-zero makes torchrun stop ranks that wait for rank 0 in a
collective); 1 for anything else (a traceback in the launcher log). A rank
that hits the run's own failure (``RunFailed``, e.g. a non-finite loss, which
every rank sees alike) exits 0 and leaves the reason to rank 0's result.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

from ampcert.runner.procs import alive as _alive

COMPLETED, RANK0_FAILED, ERROR = 0, 3, 1
FOLLOWER_GRACE_S = 3.0


def _watch(channel: Path, orchestrator: int | None, interval_s: float = 0.2) -> None:
    """End this rank when its torchrun agent dies (SIGKILLed on a timeout),
    when the orchestrator dies (it alone enforces the timeout and owns the
    results folder), or when the orchestrator has removed the run's channel
    folder (it is done with the run). An orphaned rank would train on
    unwatched, or hang in a rendezvous whose store is gone."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent or not channel.is_dir() or (orchestrator and not _alive(orchestrator)):
                os._exit(70)

    threading.Thread(target=watch, name="ampcert-agent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ampcert.runner.ddp_worker")
    parser.add_argument("--spec", required=True, help="RunSpec JSON file")
    parser.add_argument("--root", required=True, help="results folder")
    parser.add_argument("--channel", required=True, help="folder for progress lines and rank pids")
    parser.add_argument("--orchestrator", type=int, default=None, help="pid to exit with")
    parser.add_argument("--spawned", type=float, default=None, help="time.time() when torchrun was started")
    args = parser.parse_args(argv)

    channel = Path(args.channel)
    if not channel.is_dir():  # started after the orchestrator gave up on the run
        return ERROR
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ["WORLD_SIZE"])
    node = int(os.environ.get("GROUP_RANK", "0"))
    try:  # the orchestrator kills what is listed here when a run times out
        (channel / f"rank{rank}.pid").write_text(str(os.getpid()))
    except OSError:
        pass
    _watch(channel, args.orchestrator)

    from ampcert.spec import RunSpec

    spec = RunSpec.model_validate_json(Path(args.spec).read_text(encoding="utf-8"))
    if world != spec.world_size:
        print(f"ampcert: error: torchrun started {world} ranks, but the run was planned for "
              f"{spec.world_size} (nnodes {spec.launch.nnodes} x nproc_per_node {spec.launch.nproc_per_node})", file=sys.stderr)
        return ERROR
    if rank != 0 and local_rank == 0 and node != 0:
        # This node trains, but rank 0 (and so the result) lives on another node.
        (channel / "node.json").write_text(json.dumps({"node_rank": node, "nnodes": spec.launch.nnodes, "rank": rank}))

    import datetime

    import torch
    import torch._inductor  # noqa: F401 - imported by use_deterministic_algorithms; counted as startup, as
    import torch.distributed as dist  # for workers forked from the orchestrator's preloaded forkserver

    if spec.device == "cuda":
        from ampcert.telemetry import ensure_pci_bus_order

        ensure_pci_bus_order()  # before CUDA starts, so torch and NVML agree on indices
        torch.cuda.set_device(local_rank)
    backend = "nccl" if spec.device == "cuda" else "gloo"
    # Rank 0 evaluates while the others wait in a broadcast: the run's own
    # timeout bounds that wait, not the backend's default.
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=max(spec.timeout_s, 60)))
    code = ERROR
    try:
        if rank == 0:
            code = _rank0(spec, Path(args.root), channel, args.spawned)
        else:
            code = _follower(spec, rank)
    finally:
        if code == COMPLETED:
            dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def _rank0(spec, root: Path, channel: Path, spawned: float | None) -> int:
    from ampcert.runner.worker import execute

    progress_file = (channel / "progress.jsonl").open("a", encoding="utf-8")

    def progress(update: dict) -> None:
        progress_file.write(json.dumps({"run_id": spec.run_id, **update}) + "\n")
        progress_file.flush()

    try:
        result = execute(spec, root, progress, spawned)
    finally:
        progress_file.close()
    return COMPLETED if result.status == "completed" else RANK0_FAILED


def _follower(spec, rank: int) -> int:
    import io

    from ampcert import mllog
    from ampcert.backends import torch_backend
    from ampcert.backends.contract import DoesNotFit, RunFailed

    try:
        torch_backend.train(spec, mllog.MLLogger(io.StringIO(), namespace=spec.run_id), None)
    except DoesNotFit as exc:  # this rank's own device ran out: rank 0 may be waiting in a collective
        print(f"ampcert: rank {rank}: {exc}", file=sys.stderr)
        time.sleep(FOLLOWER_GRACE_S)
        return ERROR
    except RunFailed as exc:  # every rank sees it; rank 0 records it
        print(f"ampcert: rank {rank}: {exc}", file=sys.stderr)
        return COMPLETED
    except Exception:  # noqa: BLE001 - this rank's own failure: its traceback goes to the launcher log
        traceback.print_exc()
        # A failure in the workload's code strikes rank 0 too: give it a moment
        # to record the reason before torchrun stops every rank for this exit.
        time.sleep(FOLLOWER_GRACE_S)
        return ERROR
    return COMPLETED


if __name__ == "__main__":
    code = main()
    os._exit(code)  # no interpreter teardown: a hung collective thread must not keep a failed rank alive
