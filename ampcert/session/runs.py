"""Planning and running a suite: the matrix, a new folder or a resumed one, shards and their merge.

Every run goes through the one driver, :func:`ampcert.runner.fleet.run_fleet`,
with the executor the options choose: this machine (the default), a Ray
cluster or Slurm. The sequence is the same for all: check the options and the
signing key, plan (or read the stored plan), open the executor and let it
refuse what it cannot hold, write plan.json, run what is pending, finish.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ampcert.errors import BadArgument, UserError, WriteFailed
from ampcert.runner.signals import interruptible
from ampcert.session.folders import Finished, finish, finish_locked, folder_lock
from ampcert.vocabulary import OnEvent

if TYPE_CHECKING:
    from ampcert.certify.rules import RulePack
    from ampcert.runner.executors import FleetOptions
    from ampcert.runner.fleet import Executor
    from ampcert.runner.planning import SuitePlan
    from ampcert.spec import RunSpec, SlurmOptions
    from ampcert.stored_plan import StoredPlan


@dataclass(frozen=True)
class PlannedRuns:
    """A run matrix before anything runs (`ampcert run --dry-run`)."""

    rows: list[dict[str, Any]]
    plan: SuitePlan | None = None  # None for a resumed folder: its plan is stored
    shard: dict[str, Any] | None = None
    planned: int = 0
    probes: int = 0  # of ``rows``, the speed probe's processes (last)

    def to_json(self) -> dict[str, Any]:
        if self.plan is None:
            return {"runs": self.rows}
        return {"suite": self.plan.suite.name, "device": self.plan.device,
                "capabilities": self.plan.capabilities, "shard": self.shard, "runs": self.rows}


def _shard_of(plan: SuitePlan, shard: str | None) -> tuple[list[RunSpec], dict[str, Any] | None]:
    from ampcert.runner import shard as sharding

    if shard is None:
        return plan.runs, None
    index, count = sharding.parse_shard(shard)
    return sharding.select(plan.runs, index, count), sharding.record(plan.runs, index, count)


def plan_suite(suite: str | Path, *, shard: str | None = None) -> PlannedRuns:
    """The run matrix of a suite (a file, or a shipped suite by name: ``"smoke"``),
    validated, capabilities probed, without running it."""
    from ampcert.runner import planning
    from ampcert.runner import shard as sharding
    from ampcert.spec import resolve_suite, speed_probes

    with interruptible():
        where = sharding.parse_shard(shard) if shard is not None else None  # a bad shard before the probe
        plan = planning.plan_suite(resolve_suite(suite))
        runs, info = _shard_of(plan, shard) if where else (plan.runs, None)
        # The speed probe's processes follow where the folder is whole (not a shard's).
        probes = [] if where else speed_probes(plan.suite.speed_probe, plan.runs)
        return PlannedRuns(planning.dump_plan_table(runs + probes), plan, info, len(plan.runs), len(probes))


def _stored_plan(folder: str | Path) -> tuple[Path, StoredPlan]:
    from ampcert.results import ResultsDir

    root = Path(folder)
    if not root.is_dir():
        raise BadArgument("resume", "results folder not found", root)
    return root, ResultsDir(root).read_plan()


def plan_resume(folder: str | Path) -> PlannedRuns:
    """The runs a resumed folder is responsible for (its shard's, or all)."""
    from ampcert.results import check_path_limits
    from ampcert.runner import planning
    from ampcert.runner import shard as sharding

    with interruptible():
        root, stored = _stored_plan(folder)
        runs = sharding.shard_runs(stored)
        # What the resume itself checks before it writes (pending_runs): a dry run says it too.
        check_path_limits(root, [r.run_id for r in runs], "--resume")
        return PlannedRuns(planning.dump_plan_table(runs), None, stored.shard_json(), len(stored.runs))


def check_key(sign_key: str | Path | None) -> None:
    """Refuse a bad signing key before an hour of training, not after."""
    if sign_key is not None:
        from ampcert.report.sign import load_private_key

        load_private_key(sign_key)


def fleet_options(**options: Any) -> FleetOptions:
    """Where runs train (``executor="local"|"ray"|"slurm"`` and that engine's
    options: see :class:`ampcert.runner.executors.FleetOptions`), checked: a
    bad combination is one line (UserError) before anything is planned."""
    from ampcert.runner.executors import FleetOptions

    fleet = FleetOptions(**options)
    fleet.check()
    return fleet


def _open_executor(fleet: FleetOptions, root: Path, runs: list[RunSpec], suite_slurm: SlurmOptions | None) -> Executor:
    """The engine, connected and checked against the runs, before anything is
    written: a cluster engine that is missing, unreachable or too small for a
    run is one line (exit 2) with the folder as it was. This machine is
    checked against the runs it will train, once they are known (_execute)."""
    from ampcert.runner.fleet import check_runs

    check_runs(runs, fleet.executor)
    executor = fleet.open(root, suite_slurm)
    if not fleet.local:
        try:
            executor.check(runs, fleet.run_cpus)
        except BaseException:
            executor.close()
            raise
    return executor


def _execute(root: Path, runs: list[RunSpec], executor: Executor, *, rules: str | RulePack | None,
             shard: dict[str, Any] | None, planned: int, retry_failed: bool, sign_key: str | Path | None,
             on_event: OnEvent | None, fleet: FleetOptions) -> Finished:
    """Run what the folder still needs on ``executor`` (the one driver), then finish the folder."""
    from ampcert.results import ResultsDir
    from ampcert.runner.fleet import run_fleet
    from ampcert.runner.planning import pending_runs

    # A rule pack judges the whole matrix: a shard's folder is certified once merged.
    certify_later = bool(shard and rules)
    emit = on_event or (lambda event: None)
    with folder_lock(root):
        try:
            todo = pending_runs(ResultsDir(root), runs, retry_failed, emit)
            if fleet.local:
                executor.check(todo, fleet.run_cpus)  # a resumed folder's framework may be missing here
            run_fleet(root, todo, executor, retries=fleet.run_retries, cpus_per_run=fleet.run_cpus,
                      total=len(runs), on_event=emit)
            # A shard holds part of the sweep: confirmed where the merged folder is resumed.
            if not shard and any(spec.is_memory_sweep for spec in runs):
                _confirm_memory(root, executor, retry_failed, emit, fleet)
            if not shard:
                _probe_speed(root, executor, retry_failed, emit, fleet)
            done = finish_locked(root, rules=rules, certify=bool(rules) and not certify_later, sign_key=sign_key)
        except WriteFailed as exc:
            # Once runs have started, a write that fails (a full disk) fails the command as a
            # crashed run does: exit 1, not 2 (bad input). What was written stays whole, and
            # `--resume` goes on once there is space.
            raise exc.during_runs() from None
    return replace(done, shard=shard, planned=planned, ran=len(runs), certify_later=certify_later)


def _confirm_memory(root: Path, executor: Executor, retry_failed: bool, emit: OnEvent, fleet: FleetOptions) -> None:
    """The memory sweep's confirming runs (one per subject at its fitted largest batch,
    ampcert.memory.confirming_runs), derived from the stored sweep."""
    from ampcert.memory import confirming_runs, stored_sweep
    from ampcert.results import ResultsDir, load

    rd = ResultsDir(root)
    rs = load(root)
    confirm = confirming_runs(rs, rd.read_plan(), stored_sweep(rd) if rs.memory_runs else None)
    _run_derived(root, confirm, "confirm", lambda spec: spec.sweep.confirms_budget, executor, retry_failed, emit,
                 fleet)


def _probe_speed(root: Path, executor: Executor, retry_failed: bool, emit: OnEvent, fleet: FleetOptions) -> None:
    """The speed probe's processes (ampcert.runner.speed_probes), after the certified runs."""
    from ampcert.results import ResultsDir, load
    from ampcert.runner.speed_probes import planned_probes

    probes = planned_probes(ResultsDir(root).read_plan(), load(root))
    _run_derived(root, probes, "probe", lambda spec: spec.probe.probe_seconds, executor, retry_failed, emit, fleet)


def _run_derived(root: Path, runs: list[RunSpec], kind: str, detail: Callable[[RunSpec], Any], executor: Executor,
                 retry_failed: bool, emit: OnEvent, fleet: FleetOptions) -> None:
    """Runs derived from a folder after its matrix, through the same driver: those still
    pending, announced first as a ``kind`` event with each one's ``detail``."""
    from ampcert.results import ResultsDir
    from ampcert.runner.fleet import run_fleet
    from ampcert.runner.planning import pending_runs

    todo = pending_runs(ResultsDir(root), runs, retry_failed, emit)
    if not todo:
        return
    emit({"kind": kind, "runs": [(spec.run_id, detail(spec)) for spec in todo]})
    if fleet.local:
        executor.check(todo, fleet.run_cpus)
    run_fleet(root, todo, executor, retries=fleet.run_retries, cpus_per_run=fleet.run_cpus,
              total=len(runs), on_event=emit)


def run_suite(suite: str | Path, out: str | Path | None = None, *, shard: str | None = None,
              sign_key: str | Path | None = None, on_event: OnEvent | None = None,
              fleet: FleetOptions | None = None) -> Finished:
    """Run a suite (a file, or a shipped suite by name) into a new results folder and
    finish it (certify, report, sign).

    ``out`` defaults to ``reports/<suite>-<time>``; ``shard="i/n"`` runs only that
    shard's runs (join the folders with :func:`merge`); ``on_event`` receives the
    driver's progress events (:data:`ampcert.vocabulary.Event`: plan, start, step,
    retry, invalid, done); ``fleet`` places the runs on a Ray cluster or under
    Slurm (docs/fleet.md)."""
    from ampcert.runner import planning
    from ampcert.runner.executors import FleetOptions

    fleet = fleet or FleetOptions()
    # SIGINT, SIGTERM and SIGHUP end the command with Interrupted (finished runs
    # kept), naming the folder once its plan.json makes it resumable.
    with interruptible():
        fleet.check()
        check_key(sign_key)
        planned = plan_suite(suite, shard=shard)
        assert planned.plan is not None
        plan = planned.plan
        root = Path(out) if out is not None else planning.default_out_dir(plan.suite.name)
        runs, _ = _shard_of(plan, shard)
        executor = _open_executor(fleet, root, runs, plan.suite.slurm)
        try:
            planning.prepare_out_dir(root, [r.run_id for r in plan.runs])  # name and path limits, exactly
            with folder_lock(root):
                planning.write_plan(root, plan, planned.shard)
            with interruptible(root):
                return _execute(root, runs, executor, rules=plan.suite.certify, shard=planned.shard,
                                planned=len(plan.runs), retry_failed=False, sign_key=sign_key, on_event=on_event,
                                fleet=fleet)
        finally:
            executor.close()


def resume(folder: str | Path, *, retry_failed: bool = False, sign_key: str | Path | None = None,
           on_event: OnEvent | None = None, fleet: FleetOptions | None = None) -> Finished:
    """Finish an interrupted results folder: run what has no result (and, with
    ``retry_failed``, what failed), then finish it as :func:`run_suite` does,
    with any executor (a folder started locally may be finished on a cluster)."""
    from ampcert.runner import shard as sharding
    from ampcert.runner.code_identity import check_same_code, code_identity
    from ampcert.runner.executors import FleetOptions

    fleet = fleet or FleetOptions()
    with interruptible(Path(folder)):  # a signal: Interrupted, as in run_suite
        fleet.check()
        check_key(sign_key)
        root, stored = _stored_plan(folder)
        runs = sharding.shard_runs(stored)
        check_same_code(stored.code, code_identity(stored.runs), f"--resume {root}", "this resume")
        executor = _open_executor(fleet, root, runs, _stored_slurm(root, stored))
        try:
            return _execute(root, runs, executor, rules=_resumed_rules(root, stored), shard=stored.shard_json(),
                            planned=len(stored.runs), retry_failed=retry_failed, sign_key=sign_key,
                            on_event=on_event, fleet=fleet)
        finally:
            executor.close()


def _resumed_rules(root: Path, stored: StoredPlan) -> RulePack | None:
    """The rule pack a resumed folder is certified with: the one its suite names (the
    folder's suite.yaml, a shipped name or the user's path, relative to this working
    folder), held to the digest planning stored. plan.json names the pack too, but a
    plan.json may come from elsewhere: nothing it names is opened."""
    from ampcert.certify.rules import load_rules
    from ampcert.configio import read_yaml
    from ampcert.results import ResultsDir

    if stored.certify is None:
        return None
    rd = ResultsDir(root)
    suite = read_yaml(rd.suite_file, "suite file")
    ref = suite.get("certify") if isinstance(suite, dict) else None
    if not isinstance(ref, str):
        raise UserError(f"{rd.suite_file}: certify: the plan certifies with a rule pack the suite copy "
                        "does not name; the folder was changed after planning")
    own = ("/" in ref or ref.endswith((".yaml", ".yml"))) and rd.rules_file.is_file()
    # The suite's own pack as copied at planning; a shipped pack by name (or, for a folder
    # planned before the copy existed, the suite's path from this working folder).
    pack = load_rules(rd.rules_file if own else ref)
    if stored.certify_sha256 is not None and pack.sha256 != stored.certify_sha256:
        raise UserError(f"--resume {root}: the rule pack {ref!r} ({pack.source}) changed since the folder was "
                        f"planned (sha256 {pack.sha256[:12]}, planned {stored.certify_sha256[:12]}); certify the "
                        "finished folder with `ampcert certify DIR --rules ...` instead")
    # Named as planned (plan.json's label, used as a label only): the verdicts of a resumed
    # folder read like those of one that ran straight through.
    return pack.model_copy(update={"source": stored.certify})


def _stored_slurm(root: Path, stored: StoredPlan) -> SlurmOptions:
    from pydantic import ValidationError

    from ampcert.spec import SlurmOptions

    try:
        return SlurmOptions.model_validate(stored.slurm or {})
    except ValidationError as exc:
        raise UserError(f"{root / 'plan.json'}: slurm: {exc.errors()[0]['msg']}") from None


def merge(out: str | Path, folders: Sequence[str | Path], *, partial: bool = False) -> Finished:
    """Join the shard folders of one suite into ``out`` and finish it (certified if the suite says so)."""
    from ampcert.results import ResultsDir
    from ampcert.runner import shard as sharding

    with interruptible():
        info = sharding.merge(Path(out), [Path(f) for f in folders], partial=partial)
        # The merged folder's own copies (suite, rule pack), held to the plan's digest.
        rules = _resumed_rules(Path(out), ResultsDir(Path(out)).read_plan())
        done = finish(out, rules=rules, certify=bool(rules))
    return replace(done, merged={k: info[k] for k in ("merged", "runs", "missing")})
