"""Data parallelism under torchrun (``launcher: torchrun``): every rank trains its shard
of each seeded global batch through DistributedDataParallel, the window's losses are
the mean over ranks, rank 0 alone evaluates, and its decision (go on, stop at the
target, fail) is every rank's."""

from __future__ import annotations

from typing import Any

from ampcert.backends import distributed, loop
from ampcert.backends.contract import RunFailed, Unsupported
from ampcert.backends.training_loop import Decision, Feature, Run, Tally

_CODES = {Decision.CONTINUE: distributed.CONTINUE, Decision.STOP: distributed.STOP, Decision.FAIL: distributed.FAIL}
_DECISIONS = {code: decision for decision, code in _CODES.items()}


class TorchrunRanks(Feature):
    def __init__(self) -> None:
        self.dctx: distributed.DistContext | None = None

    def started(self, run: Run) -> None:
        self.dctx = dctx = distributed.current()
        if dctx is None:
            return
        if dctx.is_main:  # rank 0 samples every device of its node
            run.gpus = list(range(dctx.local_world))
        else:
            run.telemetry = distributed.NullTelemetry(dctx.rank)

    def model_ready(self, run: Run) -> None:
        dctx = self.dctx
        if dctx is None:  # not inside a process group: one process trains alone
            return
        fw: Any = run.framework
        dctx.check_batch(fw.batch_size)
        wrap = fw.data_parallel or dctx.wrap
        fw.train_model = wrap(fw.model, run.spec.device)
        # a sharded model's forward gathers from every rank: all of them evaluate (rank 0 decides)
        fw.evaluates = dctx.is_main or getattr(wrap, "collective_forward", False)
        fw.shard = self._shard
        fw.reduce_losses = dctx.mean
        run.config.append(("world_size", dctx.world))

    def _shard(self, x: Any, y: Any, step: int) -> tuple[Any, Any]:
        """This rank's rows of the global batch; a streamed batch that does not split evenly is refused."""
        assert self.dctx is not None
        if len(x) % self.dctx.world:
            raise Unsupported(f"train_data: batch {step} has {len(x)} examples, which do not split "
                              f"into {self.dctx.world} equal per-rank shards (drop the ragged last batch)")
        return self.dctx.shard(x), self.dctx.shard(y)

    def decide(self, run: Run, step: int, decision: Decision) -> Decision:
        if self.dctx is None:
            return decision
        ruled = _DECISIONS[self.dctx.decide(_CODES[decision], run.spec.device)]
        if not self.dctx.is_main and ruled is Decision.FAIL:
            raise RunFailed(f"rank 0 ended the run at step {step}")
        return ruled

    def contribute(self, run: Run, tally: Tally) -> None:
        if self.dctx is None:
            return
        tally.determinism["world_size"] = self.dctx.world
        tally.environment["distributed"] = self.dctx.describe(run.spec, tally.batch_size)
        if run.spec.device == "cuda":  # every GPU contributes to the achieved FLOP/s
            tally.peak = loop.peak_flops(run.spec, self.dctx.world)
