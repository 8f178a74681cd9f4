"""The Ray executor: each run a Ray task that asks for the resources its spec needs.

``--executor ray`` connects to the cluster at ``--address`` (no address: a
Ray instance started on this machine for the command and stopped after it).
Every run is one task of :func:`ampcert_run` (``ray::ampcert_run`` in ``ps``)
with ``num_cpus``/``num_gpus`` from :func:`ampcert.runner.fleet.resources`;
Ray places it on a node with those free. GPU tasks get a fresh worker process
each (``max_calls=1``): CUDA_VISIBLE_DEVICES is per task, and a run's GPU
memory is returned when its process ends.

Ray's own retries are off (``max_retries=0``): the fleet driver retries a lost
run itself, so that it knows and records why each attempt was lost. Events
(a run started on which node, its steps) come back through one Ray queue actor.

Ray is imported here only, and only when this executor is chosen.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from collections.abc import Sequence
from typing import Any

from ampcert.errors import Interrupted, UserError
from ampcert.runner.fleet import Event, Lost, resources, run_on_node, short_reason
from ampcert.runner.procs import STOP_SIGNALS
from ampcert.spec import RunSpec

# How long the reachability check waits for the cluster's port: ray.init itself
# would retry an unreachable address for minutes.
CONNECT_TIMEOUT_S = 5.0


def ampcert_run(spec_json: str, events: Any) -> dict[str, Any]:
    """The Ray task: one run on the node Ray chose (see fleet.run_on_node)."""

    def send(event: Event) -> None:
        try:
            events.put_nowait(event)
        except Exception:  # noqa: BLE001 - a full or lost event channel must not fail the run
            pass

    return run_on_node(spec_json, send)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UserError("--executor ray needs Ray: pip install 'ampcert[ray]'") from None
    return ray


def check_reachable(address: str) -> None:
    """One line, before ray.init, for an address nothing answers on."""
    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise UserError(f"--address {address}: give HOST:PORT of the Ray head (its GCS port, 6379 by default), "
                        "ray://HOST:PORT, or auto")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise UserError(f"--address {address}: cannot reach a Ray cluster there ({why})") from None


class RayExecutor:
    name = "ray"
    capacity = None  # Ray queues tasks until their resources are free
    keeps_log = True

    def __init__(self, address: str | None = None):
        self.ray = ray = _import_ray()
        self.address = address
        if address not in (None, "auto"):
            check_reachable(address)
        # ray.init installs its own SIGTERM handling (exit at once, with a C++ stack
        # dump); ampcert's (signals.interruptible: cancel the runs in flight, keep
        # what finished, one line) is put back afterwards.
        handlers = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.ERROR, configure_logging=True,
                     num_cpus=os.cpu_count() if address is None else None)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            # Ray >= 2.59 starts clusters with token authentication, which a client
            # given an address uses only when told to: the commonest refusal.
            hint = ("" if os.environ.get("RAY_AUTH_MODE") == "token" or address in (None, "auto") else
                    " (a cluster started with token authentication needs RAY_AUTH_MODE=token here too, "
                    "with its token in RAY_AUTH_TOKEN or ~/.ray/auth_token)")
            raise UserError(f"--executor ray: cannot connect to {address or 'a local Ray instance'}: "
                            f"{short_reason(str(exc))}{hint}") from None
        finally:
            for sig, handler in handlers.items():
                if handler is not None and threading.current_thread() is threading.main_thread():
                    signal.signal(sig, handler)
        from ray.util.queue import Queue

        self.events = Queue(actor_options={"num_cpus": 0})
        self.task = ray.remote(ampcert_run)
        self.refs: dict[Any, Any] = {}

    def where(self) -> str:
        return self.address or "a local Ray instance"

    def check(self, runs: Sequence[RunSpec], cpus_per_run: int) -> None:
        """A run no node can hold would wait forever: refused before anything runs."""
        nodes = [n.get("Resources", {}) for n in self.ray.nodes() if n.get("Alive")]
        best_cpu = max((r.get("CPU", 0) for r in nodes), default=0)
        best_gpu = max((r.get("GPU", 0) for r in nodes), default=0)
        for spec in runs:
            if spec.skip_reason:
                continue
            need = resources(spec, cpus_per_run)
            if need.gpus > best_gpu or need.cpus > best_cpu:
                raise UserError(
                    f"run {spec.run_id} asks for {need} on one node; the largest node of {self.where()} has "
                    f"{best_cpu:g} CPU, {best_gpu:g} GPU (--cpus-per-run sets a run's CPUs)")

    def submit(self, specs: Sequence[RunSpec], cpus_per_run: int) -> list[Any]:
        tickets = []
        for spec in specs:
            need = resources(spec, cpus_per_run)
            options: dict[str, Any] = {"num_cpus": need.cpus, "num_gpus": need.gpus, "max_retries": 0,
                                       "retry_exceptions": False}
            if need.gpus:
                options["max_calls"] = 1
            ref = self.task.options(**options).remote(spec.model_dump_json(), self.events)
            self.refs[ref] = spec.run_id
            tickets.append(ref)
        return tickets

    def _outcome(self, ref: Any) -> dict[str, Any] | Lost:
        try:
            return self.ray.get(ref)
        except self.ray.exceptions.RayError as exc:
            # WorkerCrashedError, NodeDiedError, OutOfMemoryError, ObjectLostError, or an
            # exception on the node outside the run (ampcert missing there: RayTaskError).
            return Lost(f"{type(exc).__name__}: {short_reason(str(exc))}")

    def poll(self, timeout_s: float) -> tuple[list[tuple[Any, dict[str, Any] | Lost]], list[Event]]:
        try:
            return self._poll(timeout_s)
        except SystemError as exc:
            # A signal handler's exception (ampcert's Interrupted) raised while Ray's C++
            # core waited comes out wrapped in a SystemError: it is unwrapped, so that an
            # interrupt ends the command as it does locally (one line, runs kept).
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, (Interrupted, KeyboardInterrupt)):
                raise cause from None
            raise

    def _poll(self, timeout_s: float) -> tuple[list[tuple[Any, dict[str, Any] | Lost]], list[Event]]:
        ended: list[tuple[Any, dict[str, Any] | Lost]] = []
        if self.refs:
            ready, _ = self.ray.wait(list(self.refs), num_returns=1, timeout=timeout_s)
            if ready:
                more, _ = self.ray.wait(list(self.refs), num_returns=len(self.refs), timeout=0)
                ready = list(dict.fromkeys([*ready, *more]))
            for ref in ready:
                self.refs.pop(ref)
                ended.append((ref, self._outcome(ref)))
        return ended, self._drain()

    def _drain(self) -> list[Event]:
        size = self.events.qsize()
        return list(self.events.get_nowait_batch(size)) if size else []

    def cancel(self) -> None:
        # A task that is returning right now is left to return, not force-cancelled: Ray's
        # core aborts the driver when a force-cancel crosses the task's reply ("Tried to
        # complete task that was not pending", seen in CI when SIGTERM came just as a run
        # finished). Half a second lets such replies land; what is still running then is
        # cancelled, and its worker killed.
        running = list(self.refs)
        if running:
            _, running = self.ray.wait(running, num_returns=len(running), timeout=0.5)
        for ref in running:
            try:
                self.ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - already finished or gone: nothing to stop
                pass
        self.refs.clear()

    def close(self) -> None:
        try:
            self.ray.kill(self.events.actor)
        except Exception:  # noqa: BLE001
            pass
        self.ray.shutdown()

