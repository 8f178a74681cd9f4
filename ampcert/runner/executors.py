"""Choosing an executor: ``ampcert run --executor local|ray|slurm`` and its options.

``local`` is this machine (one run after another, nothing more to install);
``ray`` and ``slurm`` place runs on a cluster. All three are executors that
:mod:`ampcert.runner.fleet`'s one driver runs. This module only checks the
options and opens the chosen engine, importing it lazily, so that neither Ray
nor submitit is imported unless asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ampcert.errors import BadArgument, UserError
from ampcert.runner.fleet import EXECUTORS, Executor
from ampcert.spec import SlurmOptions

DEFAULT_RETRIES = 2


@dataclass(frozen=True)
class FleetOptions:
    """Where a suite's runs train (docs/fleet.md). The default is this machine."""

    executor: str = "local"
    # --executor ray: HOST:PORT (or ray://HOST:PORT, or auto) of the cluster; None: a local Ray instance.
    address: str | None = None
    # A run whose worker or node is lost is submitted again this many times (None: 2).
    retries: int | None = None
    # CPUs each run asks for (None: 1); under Ray also its torch threads (OMP_NUM_THREADS).
    cpus_per_run: int | None = None
    # --executor slurm: overrides of the suite's `slurm:` block.
    partition: str | None = None
    account: str | None = None
    time_min: int | None = None
    # --executor slurm through submitit's local executor (no Slurm needed).
    slurm_local: bool = False

    @property
    def local(self) -> bool:
        return self.executor == "local"

    def check(self) -> None:
        """The options alone, before anything is planned: one line each, naming the
        option as this class (and the session API) spells it; the CLI names its flag."""
        if self.executor not in EXECUTORS:
            raise BadArgument("executor", f"expected one of {', '.join(EXECUTORS)}", self.executor)
        if self.address is not None and self.executor != "ray":
            raise BadArgument("address", "only with the ray executor")
        slurm_given = [n for n, v in (("partition", self.partition), ("account", self.account),
                                      ("time_min", self.time_min), ("slurm_local", self.slurm_local or None))
                       if v is not None]
        if slurm_given and self.executor != "slurm":
            raise BadArgument(slurm_given[0], "only with the slurm executor")
        if self.local and (self.retries is not None or self.cpus_per_run is not None):
            raise BadArgument("retries" if self.retries is not None else "cpus_per_run",
                              "only with the ray or slurm executor (a local run is never lost by a cluster, "
                              "so never retried)")
        if self.retries is not None and self.retries < 0:
            raise BadArgument("retries", "expected 0 or more", self.retries)
        if self.cpus_per_run is not None and self.cpus_per_run < 1:
            raise BadArgument("cpus_per_run", "expected 1 or more", self.cpus_per_run)
        if self.time_min is not None and self.time_min < 1:
            raise BadArgument("time_min", "expected 1 or more minutes", self.time_min)

    @property
    def run_retries(self) -> int:
        return DEFAULT_RETRIES if self.retries is None else self.retries

    @property
    def run_cpus(self) -> int:
        return 1 if self.cpus_per_run is None else self.cpus_per_run

    def slurm_options(self, suite: SlurmOptions | None) -> SlurmOptions:
        base = suite or SlurmOptions()
        given = {k: v for k, v in (("partition", self.partition), ("account", self.account),
                                   ("time_min", self.time_min)) if v is not None}
        return base.model_copy(update=given)

    def open(self, root: Path, suite_slurm: SlurmOptions | None = None) -> Executor:
        """Connect to the engine (Ray: now; Slurm: at the first submission; this machine: nothing to connect)."""
        executor: Any
        if self.local:
            from ampcert.runner.local_executor import LocalExecutor

            executor = LocalExecutor(root)
        elif self.executor == "ray":
            from ampcert.runner.ray_executor import RayExecutor

            executor = RayExecutor(self.address)
        elif self.executor == "slurm":
            from ampcert.runner.slurm_executor import SlurmExecutor

            executor = SlurmExecutor(root, self.slurm_options(suite_slurm), local=self.slurm_local)
        else:  # pragma: no cover - check() admits no other name
            raise UserError(f"--executor {self.executor}: no fleet executor of that name")
        return executor
