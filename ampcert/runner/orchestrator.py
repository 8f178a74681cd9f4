"""The orchestrator: plan a suite, run each RunSpec in its own process, resume.

Isolation is by process: a run that raises, diverges, hangs past its
timeout or is killed (out of memory, a signal) becomes a failed RunResult
with its reason, and the suite goes on. Workers are forked from a
forkserver that has already imported the harness (and, for torch suites,
torch), so each run pays for a fork, not for a fresh interpreter and
framework import.

Nothing here imports a framework at module level: a JAX suite is planned,
run and reported without torch, and a suite whose backend is not installed
is refused with one line before anything is written
(:func:`ampcert.spec.require_backend`).
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import queue as queue_mod
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

from ampcert.errors import Interrupted, UserError
from ampcert.results import (
    FailureKind,
    ResultsDir,
    RunResult,
    atomic_write_json,
    atomic_write_text,
    check_path_limits,
)
from ampcert.runner.procs import STOP_SIGNALS
from ampcert.runner.procs import alive as _alive
from ampcert.spec import (
    RunSpec,
    Suite,
    apply_capabilities,
    expand,
    load_suite,
    missing_framework,
    require_backend,
)
from ampcert.version import __version__

# Imported once in the forkserver, so each worker starts with them loaded.
# torch._inductor is what torch.use_deterministic_algorithms imports (~3 s).
# JAX is not preloaded: the worker sets JAX_PLATFORMS and XLA_FLAGS before it
# imports JAX, which reads the first on import and the second when its backend starts.
_HARNESS = ["ampcert.runner.worker", "ampcert.workloads.digits", "ampcert.workloads.resnet",
            "ampcert.workloads.gpt"]
_PRELOAD = {
    "torch": [*_HARNESS, "ampcert.backends.torch_backend", "ampcert.workloads.torch_models", "torch._inductor"],
    "jax": [*_HARNESS, "ampcert.backends.jax_backend"],
}
_context: Any = None


def _mp_context(backends: set[str]):
    """The process context workers start from. The forkserver is one per
    process and preloads once, so the backends of its first use decide what
    it preloads (only what is installed)."""
    global _context
    if _context is None:
        method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        _context = mp.get_context(method)
        if method == "forkserver":
            _context.set_forkserver_preload(
                list(dict.fromkeys(m for b in sorted(backends) if missing_framework(b) is None
                                   for m in _PRELOAD[b])))
    return _context


def resolve_device(requested: str, backend: str = "torch") -> str:
    """``auto`` becomes ``cuda`` where the backend's framework sees a GPU;
    ``cuda`` where it sees none is a one-line error."""
    if backend == "jax":
        found, detail = _jax_gpu()
    else:
        import torch

        found = torch.cuda.is_available()
        detail = f"torch {torch.__version__}, CUDA build: {torch.version.cuda}"
    if requested == "auto":
        return "cuda" if found else "cpu"
    if requested == "cuda" and not found:
        raise UserError(f"device: cuda was requested but {backend} sees no CUDA device ({detail})")
    return requested


def _jax_gpu() -> tuple[bool, str]:
    import jax

    try:
        return bool(jax.devices("gpu")), f"jax {jax.__version__}"
    except RuntimeError as exc:  # no GPU backend in this jaxlib, or no device
        return False, f"jax {jax.__version__}: {' '.join(str(exc).split())[:120]}"


@dataclass
class Plan:
    suite: Suite
    suite_path: Path
    runs: list[RunSpec]
    capabilities: dict[str, Any]
    device: str


def check_fp8_layers(runs: list[RunSpec]) -> None:
    """Refuse, before any run, an FP8 layer policy that names a layer its
    recipe cannot take: each fp8/mxfp8 entry's model is built once (on the
    CPU, seed 0: only its shapes matter) and its layers planned."""
    seen: set[tuple[str, str]] = set()
    for run in runs:
        if run.fp8 is None or (run.label, run.precision) in seen:
            continue
        seen.add((run.label, run.precision))
        from ampcert.backends import torch_fp8
        from ampcert.workloads import registry

        if run.amp == "native" and not torch_fp8.torchao_installed():
            raise UserError(f"workload {run.label!r}, precision {run.precision}: `amp: native` trains torchao's "
                            "FP8 layers, and torchao is not installed: `pip install 'ampcert[fp8]'`")

        workload = registry.get(run.workload)
        task = workload.build(workload.Params.model_validate(run.params), 0, "cpu")
        torch_fp8.check_layers(task.model, run.precision, run.fp8, f"workload {run.label!r}, precision {run.precision}")


def plan_suite(suite_path: str | Path) -> Plan:
    from ampcert.backends.capability import probe

    path = Path(suite_path)
    suite = load_suite(path)
    min_seeds, repeats = 1, 0
    if suite.certify is not None:
        from ampcert.certify.rules import load_rules

        pack = load_rules(suite.certify)
        suite = suite.model_copy(update={"certify": pack.source})
        min_seeds, repeats = pack.min_seeds(), pack.repeats()
    device = resolve_device(suite.device, suite.backend)
    runs = expand(suite, device, min_seeds=min_seeds, repeats=repeats)
    check_fp8_layers(runs)
    precisions = sorted({r.precision for r in runs})
    capabilities = probe(device, precisions, backend=suite.backend)
    submission = suite.submission
    if submission.platform is None:
        submission = submission.model_copy(update={"platform": platform_name(device)})
    runs = [r.model_copy(update={"submission": submission, "config_filename": path.name}) for r in runs]
    return Plan(suite, path, apply_capabilities(suite, runs, capabilities), capabilities, device)


def platform_name(device: str) -> str:
    """MLPerf's submission_platform when a suite names none: what the
    environment fingerprint says the runs train on (the first GPU's name on
    cuda, the CPU model otherwise)."""
    from ampcert.envinfo import cpu_info, gpu_info

    if device == "cuda":
        devices = gpu_info().get("devices") or []
        if devices:
            return str(devices[0]["name"])
    return str(cpu_info()["model"]) or "unknown CPU"


def default_out_dir(suite_name: str) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("reports") / f"{suite_name}-{stamp}"


def prepare_out_dir(out: Path, run_ids: Iterable[str] | None = None) -> None:
    """Create the folder, refusing one that already holds anything (results
    are never overwritten; --resume continues a folder). A folder left by an
    invocation killed before it wrote plan.json (its dead lock, the suite
    copy, temp files) holds no results and is taken over. ``run_ids``, where
    known, make the path-length check exact (see check_path_limits)."""
    # Before anything touches the path: a name longer than the file system
    # allows would otherwise be an OSError traceback here, and a folder too
    # deep for its runs' files a failure in the middle of the suite.
    check_path_limits(out, run_ids, "--out")
    try:
        if out.exists() and not out.is_dir():
            raise UserError(f"--out {out}: exists and is not a folder")
        if out.is_dir() and any(out.iterdir()) and not _interrupted_before_plan(out):
            raise UserError(f"--out {out}: folder is not empty; use `ampcert run --resume {out}` "
                            "to continue it, or choose another folder")
    except OSError as exc:  # a parent that cannot be searched or listed
        raise UserError(f"--out {out}: cannot use this folder: {exc.strerror or exc}") from None
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe_file = out / f".write-test-{os.getpid()}"
        probe_file.write_text("")
        probe_file.unlink()
    except OSError as exc:
        raise UserError(f"--out {out}: cannot write there: {exc.strerror or exc}") from None


# What an invocation leaves in its folder before plan.json exists: the lock,
# the write probe, the suite copy and atomic-write temp files.
_PRE_PLAN = re.compile(r"^(\.lock|\.write-test(-\d+)?|suite\.yaml|\.(suite\.yaml|plan\.json)\.[^/]*\.tmp)$")


def _interrupted_before_plan(out: Path) -> bool:
    names = {p.name for p in out.iterdir()}
    # The lock is removed on every normal exit: a suite copy beside a lock
    # is ours, never a user's file.
    return (all(_PRE_PLAN.match(n) for n in names) and ("suite.yaml" not in names or ".lock" in names))


class FolderLock:
    """One invocation per results folder: a second one is refused, not interleaved.

    The lock is an flock on ``.lock`` (which also holds the owner's pid, for
    the message): the kernel drops it when its owner dies, even by SIGKILL, so
    a stale lock file is simply taken over, and two invocations racing for a
    stale lock cannot both win. Once held, temp files of atomic writes that a
    killed writer left behind are removed: nobody else can be writing them.
    """

    def __init__(self, root: Path):
        self.root = root
        self.path = root / ".lock"
        self._fd: int | None = None

    def __enter__(self) -> FolderLock:
        if fcntl is None:  # pragma: no cover - no flock (Windows): the pid file alone
            self._enter_pidfile()
        else:
            self._enter_flock()
        _remove_stale_temp_files(self.root)
        return self

    def _refuse(self, pid: int) -> UserError:
        return UserError(f"{self.root}: another ampcert (pid {pid or 'unknown'}) is writing to this "
                         "folder; wait for it to finish (or stop it), then use `ampcert run --resume`")

    def _enter_flock(self) -> None:
        for _ in range(20):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                pid = _read_pid(fd)
                os.close(fd)
                raise self._refuse(pid) from None
            try:  # the file we locked must still be the one at the path (a releasing owner unlinks it)
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            pid = _read_pid(fd)
            if pid and pid != os.getpid() and _alive(pid):
                # A pid lock (not an flock) of a live process: an older ampcert.
                os.close(fd)
                raise self._refuse(pid)
            os.ftruncate(fd, 0)
            try:
                os.pwrite(fd, str(os.getpid()).encode(), 0)
            except OSError:
                # A full disk: the flock is the lock, the pid only names its holder in
                # a refusal, so go on without it rather than fail on a file we own.
                pass
            self._fd = fd
            return
        raise UserError(f"{self.path}: could not take the folder lock")

    def _enter_pidfile(self) -> None:  # pragma: no cover - platforms without fcntl
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                try:
                    pid = int(self.path.read_text().strip() or 0)
                except (OSError, ValueError):
                    pid = 0
                if pid and _alive(pid):
                    raise self._refuse(pid) from None
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as fh:
                fh.write(str(os.getpid()))
            return
        raise UserError(f"{self.path}: could not take the folder lock")

    def __exit__(self, *exc: object) -> None:
        self.path.unlink(missing_ok=True)  # while still held: nobody can be between lock and check
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _read_pid(fd: int) -> int:
    try:
        return int(os.pread(fd, 32, 0).decode("ascii", "replace").strip() or 0)
    except (OSError, ValueError):
        return 0


def _remove_stale_temp_files(root: Path) -> None:
    """Temp files of atomic writes (``.NAME.XXXX.tmp``) in the folder and its
    run folders: left only by a writer that was killed mid-write. A linked
    folder (a tampered results folder) is never entered: its files are not
    ours to delete; reading the plan refuses such a folder afterwards."""
    runs = root / "runs"
    folders = [root]
    if runs.is_dir() and not runs.is_symlink():
        folders += [d for d in runs.iterdir() if d.is_dir() and not d.is_symlink()]
    for folder in folders:
        for p in folder.glob(".*.tmp"):
            if not p.is_symlink() and p.is_file():
                p.unlink(missing_ok=True)


def write_plan(out: Path, plan: Plan, shard: dict[str, Any] | None = None) -> None:
    from ampcert.envinfo import fingerprint

    raw = plan.suite_path.read_bytes()
    rd = ResultsDir(out)
    if rd.plan_file.exists():  # (under the folder lock) another invocation planned here first
        raise UserError(f"--out {out}: another ampcert invocation has started writing to this folder")
    atomic_write_text(rd.suite_file, raw.decode("utf-8"))
    atomic_write_json(rd.plan_file, {
        "tool": f"ampcert {__version__}",
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "suite": plan.suite.name,
        "suite_source": str(plan.suite_path),
        "suite_sha256": hashlib.sha256(raw).hexdigest(),
        "device": plan.device,
        "capabilities": plan.capabilities,
        "certify": plan.suite.certify,
        "environment": fingerprint(),
        "runs": [r.model_dump(mode="json") for r in plan.runs],
        **({"shard": shard} if shard else {}),  # run --shard i/n: the complete plan, and this shard's runs
        # The suite's `slurm:` block, for `--resume --executor slurm` (not part of any run).
        **({"slurm": plan.suite.slurm.model_dump(exclude_defaults=True)}
           if plan.suite.slurm.model_dump(exclude_defaults=True) else {}),
    })


Event = dict[str, Any]


# --------------------------------------------------------------------------- signals
#
# One policy for SIGINT (Ctrl-C), SIGTERM and SIGHUP, whether they reach the
# orchestrator alone or its whole process group (a terminal's Ctrl-C or hangup):
# the first raises Interrupted in the main thread; run_one stops the worker of
# the run in progress, which leaves that run without a result (pending, for
# --resume); the folder lock is released on the way up and the CLI ends with
# one line and exit code 128 + signum. Workers ignore SIGINT (stopping them is
# the orchestrator's job; a KeyboardInterrupt in each would be a traceback),
# and multiprocessing's helper processes start with the three signals blocked,
# so that they end with the orchestrator, never in the middle of its shutdown.
# A further signal during that shutdown (one that hangs, say on a worker that
# cannot be reaped) ends the process at once.

class _Interrupts:
    """The process's signal state: handlers are per process, so there is one (``_interrupts``)."""

    def __init__(self) -> None:
        self.folders: list[Path | None] = []  # of the interruptible blocks entered, innermost last
        self.previous: dict[int, Any] = {}     # the handlers that ours replaced
        self.raised: Interrupted | None = None
        self.worker: Any = None                # the worker process of the run in progress

    def handle(self, signum: int, frame: object) -> None:
        if self.raised is None:
            self.raised = Interrupted(signum, self.folders[-1] if self.folders else None)
            raise self.raised
        self.exit_now(self.raised)

    def exit_now(self, exc: Interrupted) -> None:
        """A further signal after ``exc``: stop the worker, end the process now."""
        if exc.written is False:  # the CLI is writing the line, and exits right after
            return
        if exc.written is None:
            # os.write, not print: this runs between two bytecodes of the main
            # thread, which may be in the middle of a print to the same stream.
            try:
                os.write(2, (exc.line + "\n").encode("utf-8", "replace"))
            except OSError:
                pass
        try:
            if os.isatty(1) and os.environ.get("TERM") != "dumb":
                os.write(1, b"\x1b[?25h")  # the live progress display hides the cursor until it stops
        except OSError:
            pass
        try:
            if self.worker is not None:
                self.worker.kill()
        except Exception:  # noqa: BLE001 - gone already; its watchdog ends it anyway (worker.exit_with)
            pass
        # What a normal exit does first (multiprocessing's atexit hook): unlink the
        # run queue's semaphores, which the resource tracker would otherwise
        # report as leaked. A private function: where it is missing, the warning is all.
        import multiprocessing.util

        try:
            getattr(multiprocessing.util, "_run_finalizers", lambda minpriority: None)(0)
        except Exception:  # noqa: BLE001 - nothing may stand between a second signal and the exit
            pass
        os._exit(exc.exit_code)


_interrupts = _Interrupts()


@contextmanager
def interruptible(folder: Path | None = None):
    """Inside the block, SIGINT, SIGTERM and SIGHUP raise Interrupted(signum,
    folder) in the main thread, once; a further signal ends the process at
    once, with the same line (:meth:`_Interrupts.exit_now`). Blocks nest, and
    the innermost one's folder is named: the session enters one for a whole
    command and one with the results folder once its plan.json makes it resumable.

    A signal ignored on entry stays ignored (``nohup``, a background job of a
    script): that was the user's choice. Handlers belong to the main thread, so
    in any other the block changes nothing. The outermost block puts the
    previous handlers back, unless a signal interrupted it: the process is then
    shutting down, and a further signal must still end it at once (a program
    that catches Interrupted and carries on sets its own handlers again)."""
    state = _interrupts
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outermost = not state.folders
    if outermost:
        state.raised = None  # a new command (after one that was interrupted, in a program that went on)
        for sig in STOP_SIGNALS:
            current = signal.getsignal(sig)
            if current is signal.SIG_IGN or current == state.handle:
                continue
            state.previous[sig] = current
            signal.signal(sig, state.handle)
    state.folders.append(folder)
    try:
        yield
    finally:
        state.folders.pop()
        if outermost and state.raised is None:
            for sig, previous in state.previous.items():
                signal.signal(sig, signal.SIG_DFL if previous is None else previous)
            state.previous.clear()


def _start_helpers(ctx: Any) -> None:
    """Start multiprocessing's resource tracker and forkserver (the first time;
    then this is cheap) with SIGINT, SIGTERM and SIGHUP blocked. They keep the
    mask (the tracker ignores SIGINT and SIGTERM besides), so a signal to the
    whole process group does not end them in the middle of the orchestrator's
    shutdown, where the tracker would report its semaphores as leaked; they end
    when the orchestrator does. Workers forked from the forkserver inherit the
    mask, so no signal lands before they have set their own (worker.process_main)."""
    if ctx.get_start_method() != "forkserver" or not hasattr(signal, "pthread_sigmask"):
        return
    from multiprocessing import forkserver, resource_tracker

    # One at a time: starting the tracker unblocks SIGINT and SIGTERM behind itself.
    for start in (resource_tracker.ensure_running, forkserver.ensure_running):
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _stop_worker(proc: Any, run_dir: Path) -> None:
    """Stop an unfinished run's worker: SIGKILL (its result.json is written
    atomically, so it is whole or absent), then remove the temp file of a
    write it may have been in the middle of (the folder lock is ours)."""
    if proc.is_alive():
        proc.kill()
    proc.join()
    for tmp in run_dir.glob(".*.tmp"):
        tmp.unlink(missing_ok=True)


def _failure_reason(exitcode: int | None, timed_out: bool, timeout_s: int) -> str:
    if timed_out:
        return f"timeout: run exceeded {timeout_s} s and was killed"
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name if -exitcode in signal.valid_signals() else str(-exitcode)
        hint = " (the out-of-memory killer sends SIGKILL)" if name == "SIGKILL" else ""
        return f"worker killed by {name}{hint} before writing its result"
    return f"worker exited with code {exitcode} before writing its result"


def run_one(spec: RunSpec, root: Path, on_event: Callable[[Event], None]) -> RunResult:
    """Run one spec in a worker process and return its (stored) result."""
    if spec.launcher == "torchrun":  # data-parallel ranks under torch.distributed.run
        from ampcert.runner.torchrun import run_torchrun

        return run_torchrun(spec, root, on_event)
    from ampcert.runner.worker import now_iso

    rd = ResultsDir(root)
    ctx = _mp_context({spec.backend})
    _start_helpers(ctx)  # before the queue, whose semaphores start the resource tracker
    events = ctx.Queue()  # one queue per run: a killed worker cannot poison the next one
    started_at = now_iso()
    spawned = time.time()
    proc = ctx.Process(
        target=_process_entry, args=(spec.model_dump_json(), str(root), events, spawned, os.getpid()),
        name=f"ampcert-{spec.run_id}", daemon=True,
    )
    proc.start()
    _interrupts.worker = proc
    try:
        deadline = time.monotonic() + spec.timeout_s
        timed_out = False
        while True:
            try:
                on_event(events.get(timeout=0.25))
            except queue_mod.Empty:
                pass
            if not proc.is_alive():
                break
            if time.monotonic() > deadline:
                timed_out = True
                proc.kill()
                break
        proc.join()
        try:
            while True:
                on_event(events.get_nowait())
        except (queue_mod.Empty, OSError, ValueError, EOFError):
            pass
    except BaseException:
        # Interrupted (a signal: see interruptible) before the run finished: no
        # result is written for it, so it stays pending and --resume runs it
        # again; a result.json the worker wrote before it was stopped stands.
        _stop_worker(proc, rd.run_dir(spec.run_id))
        raise
    finally:
        _interrupts.worker = None
        events.close()
    result = rd.read_result(spec.run_id)
    if result is None or timed_out:
        result = RunResult(
            run_id=spec.run_id, spec=spec, status="failed",
            reason=_failure_reason(proc.exitcode, timed_out, spec.timeout_s),
            failure=FailureKind.TIMEOUT if timed_out else FailureKind.WORKER_LOST,
            started_at=started_at, finished_at=now_iso(), wall_s=time.time() - spawned,
            accelerated=spec.accelerated, capability_note=spec.capability_note,
        )
        atomic_write_json(rd.result_file(spec.run_id), result)
    return result


def _process_entry(spec_json: str, root: str, events, spawned: float, orchestrator: int) -> None:
    from ampcert.runner.worker import process_main

    process_main(spec_json, root, events, spawned, orchestrator)


def skipped_result(spec: RunSpec) -> RunResult:
    return RunResult(run_id=spec.run_id, spec=spec, status="skipped", reason=spec.skip_reason,
                     accelerated=spec.accelerated, capability_note=spec.capability_note)


def pending_runs(rd: ResultsDir, runs: list[RunSpec], retry_failed: bool,
                 on_event: Callable[[Event], None] = lambda e: None) -> list[RunSpec]:
    """Runs without a trustworthy result (and failed ones, if asked). A result
    file that is there but cannot be trusted (truncated, not a RunResult,
    another run's) is reported with an ``invalid`` event, and its run redone.

    Before anything is written: a run folder that is a link out of the folder,
    or paths the file system cannot hold, are refused with one line (a
    resumed folder may come from elsewhere; read_plan checked it as well)."""
    ids = [spec.run_id for spec in runs]
    rd.check_run_dirs(ids)
    check_path_limits(rd.root, ids, "results folder")
    todo = []
    for spec in runs:
        result, problem = rd.check_result(spec.run_id)
        if problem is not None:
            on_event({"kind": "invalid", "run_id": spec.run_id,
                      "path": str(rd.result_file(spec.run_id)), "reason": problem})
        if result is None or (retry_failed and result.status == "failed"):
            todo.append(spec)
    return todo


def execute_plan(root: Path, runs: list[RunSpec], *, retry_failed: bool = False,
                 on_event: Callable[[Event], None] = lambda e: None) -> list[RunResult]:
    """Run every pending spec in order, emitting progress events:
    ``{"kind": "start"|"step"|"done", ...}``."""
    rd = ResultsDir(root)
    todo = pending_runs(rd, runs, retry_failed, on_event)
    # A resumed folder was planned elsewhere: its framework may be missing here.
    for backend in sorted({s.backend for s in todo if not s.skip_reason}):
        require_backend(backend, str(root))
    _mp_context({s.backend for s in todo})
    on_event({"kind": "plan", "total": len(runs), "todo": len(todo)})
    for spec in todo:
        on_event({"kind": "start", "run_id": spec.run_id, "limit": spec.train.step_limit})
        if spec.skip_reason:
            result = skipped_result(spec)
            atomic_write_json(rd.result_file(spec.run_id), result)
        else:
            result = run_one(spec, root, lambda e: on_event({"kind": "step", **e}))
        on_event({"kind": "done", "run_id": spec.run_id, "result": result})
    return [r for r in (rd.read_result(s.run_id) for s in runs) if r is not None]


def dump_plan_table(runs: list[RunSpec]) -> list[dict[str, Any]]:
    return [
        {"run_id": r.run_id, "workload": r.label, "precision": r.precision, "amp": r.amp,
         "seed": r.seed, "device": r.device, "steps": r.train.step_limit,
         "target": r.train.target, "accelerated": r.accelerated,
         "note": ("skipped: " if r.skip_reason else "") + ("" if r.accelerated else "not accelerated")}
        for r in runs
    ]
