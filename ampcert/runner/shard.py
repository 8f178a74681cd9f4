"""Spread one suite over machines: ``run --shard i/n``, then ``merge``.

Shards are numbered from 1: ``--shard i/n`` runs the runs whose 0-based
position in the plan's stable order (workload entry, precision, seed,
repeat) is congruent to ``i - 1`` modulo ``n``, so the shards together cover
the matrix exactly once and neighbouring runs (a seed and its repeat, fp32
and its low precisions) land on different machines. Every shard's plan.json
holds the complete plan plus a ``shard`` record naming its own runs.

``merge OUT DIR...`` joins the shard folders into one results folder that
``certify``, ``report`` and ``sign`` treat like any other: it refuses
folders planned from different suites (their ``suite_sha256`` differs) or
with different run matrices, a run with results in two folders, and
(without ``--partial``) runs that have no result in any of them. The source
folders are read, never changed. They are input from elsewhere: one that
holds a symbolic link (or a FIFO, a device) anywhere is refused, naming it,
and merge copies files, never what a link points to.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NoReturn

from ampcert.errors import UserError
from ampcert.results import ResultsDir, atomic_write_json, atomic_write_text, check_path_limits
from ampcert.spec import RunSpec
from ampcert.stored_plan import StoredPlan

_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` -> ``(i, n)`` with ``1 <= i <= n``."""
    m = _SHARD.match(text)
    if not m:
        raise UserError(f"--shard {text}: expected i/n, shard i of n counted from 1 (e.g. --shard 1/3)")
    index, count = int(m.group(1)), int(m.group(2))
    if count < 1 or not 1 <= index <= count:
        raise UserError(f"--shard {text}: there is no shard {index} of {count}; shards are numbered 1 to "
                        f"{max(count, 1)} (--shard 1/{max(count, 1)} ... {max(count, 1)}/{max(count, 1)})")
    return index, count


def select(runs: list[RunSpec], index: int, count: int) -> list[RunSpec]:
    """The runs of shard ``index`` (1-based) of ``count``."""
    return [r for k, r in enumerate(runs) if k % count == index - 1]


def record(runs: list[RunSpec], index: int, count: int) -> dict[str, Any]:
    """The ``shard`` entry of a shard's plan.json."""
    return {"index": index, "count": count, "numbering": "1-based",
            "rule": f"runs whose 0-based position in `runs` is {index - 1} modulo {count}",
            "run_ids": [r.run_id for r in select(runs, index, count)]}


def shard_runs(plan: StoredPlan) -> list[RunSpec]:
    """The runs a results folder is responsible for: its shard's, or all of them."""
    return plan.my_runs()


def _live_lock(root: Path) -> int | None:
    """The pid of a live ampcert writing to ``root``, if any (read-only check)."""
    from ampcert.runner.procs import alive as _alive

    try:
        pid = int((root / ".lock").read_text().strip() or 0)
    except (OSError, ValueError):
        return None
    return pid if pid and _alive(pid) else None


def _refuse_links(root: Path) -> None:
    """Refuse, naming it, a symbolic link or anything but files and folders
    under a shard folder: merge copies from it, and a link (to a 0600 file, to
    a folder outside) would put what it points to into the merged folder; a
    FIFO would hang the copy."""
    def unreadable(exc: OSError) -> NoReturn:
        raise UserError(f"{exc.filename or root}: cannot be read ({exc.strerror or exc})")

    for dirpath, dirnames, filenames in os.walk(root, onerror=unreadable):  # never descends into links
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            try:
                mode = os.lstat(path).st_mode
            except OSError as exc:
                unreadable(exc)
            if stat.S_ISLNK(mode):
                try:
                    target = f" (to {os.readlink(path)!r})"
                except OSError:
                    target = ""
                raise UserError(f"{path}: is a symbolic link{target}; merge copies files, never what links "
                                f"point to, and refuses a shard folder that holds one ({root})")
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise UserError(f"{path}: is not a regular file or folder; merge refuses a shard folder "
                                f"that holds one ({root})")


def merge(out: Path, sources: list[Path], *, partial: bool = False) -> dict[str, Any]:
    """Join shard folders into ``out`` (a new, empty folder). Returns what was merged."""
    from ampcert.runner.code_identity import differences
    from ampcert.runner.folder_lock import FolderLock
    from ampcert.runner.planning import prepare_out_dir

    if not sources:
        raise UserError("merge: give the shard folders to merge (ampcert merge OUT DIR...)")
    # Before `out` is looked at (a name too long is an OSError there); exact,
    # with the run ids, in prepare_out_dir below.
    check_path_limits(out, None, "merge OUT")
    seen: dict[Path, Path] = {}
    plans: list[StoredPlan] = []
    for d in sources:
        try:
            found = d.is_dir()
            key = d.resolve()
        except OSError as exc:  # a name too long for the file system, a loop of links
            raise UserError(f"{d}: cannot be read ({exc.strerror or exc})") from None
        if not found:
            raise UserError(f"{d}: results folder not found")
        if key in seen:
            raise UserError(f"{d}: given twice (as {seen[key]})")
        if out.exists() and key == out.resolve():
            raise UserError(f"{d}: the merged folder cannot also be a source")
        seen[key] = d
        pid = _live_lock(d)
        if pid is not None:
            raise UserError(f"{d}: ampcert (pid {pid}) is still writing to this folder; merge it when it is done")
        _refuse_links(d)
        plans.append(ResultsDir(d).read_plan())

    ref, ref_dir = plans[0], sources[0]
    ref_ids = [r.run_id for r in ref.runs]
    for d, plan in zip(sources[1:], plans[1:], strict=True):
        if plan.suite_sha256 != ref.suite_sha256:
            raise UserError(f"{d}: planned from a different suite than {ref_dir} (suite {plan.suite!r} "
                            f"sha256 {str(plan.suite_sha256)[:12]}, not {ref.suite!r} "
                            f"{str(ref.suite_sha256)[:12]}); only shards of one suite merge")
        if plan.code is not None and ref.code is not None and differences(ref.code, plan.code):
            changed = differences(ref.code, plan.code)
            raise UserError(f"{d}: ran other code than {ref_dir}: {'; '.join(changed[:4])}; shards of one "
                            "certification must run the same code")
        ids = [r.run_id for r in plan.runs]
        if ids != ref_ids:
            other = next((i for i in ids if i not in set(ref_ids)), None) or next(
                (i for i in ref_ids if i not in set(ids)), None)
            raise UserError(f"{d}: plans other runs than {ref_dir} (e.g. {other or 'a different order'}); "
                            "shards must be planned alike (same suite, device type and capabilities)")

    owner: dict[str, tuple[Path, RunSpec]] = {}
    for d, plan in zip(sources, plans, strict=True):
        rd = ResultsDir(d)
        for spec in plan.runs:
            result = rd.read_result(spec.run_id)
            if result is None:
                if rd.result_file(spec.run_id).exists():
                    raise UserError(f"{rd.result_file(spec.run_id)}: not a trusted result of this run "
                                    "(truncated, not a RunResult, or another run's); resume that folder first")
                continue
            if spec.run_id in owner:
                raise UserError(f"run {spec.run_id} has results in both {owner[spec.run_id][0]} and {d}; "
                                "each run must come from one folder")
            owner[spec.run_id] = (d, spec)
    missing = [i for i in ref_ids if i not in owner]
    if missing and not partial:
        raise UserError(f"{len(missing)} of {len(ref_ids)} planned runs have no result in these folders "
                        f"(first: {missing[0]}); give every shard's folder, or --partial to merge anyway")

    prepare_out_dir(out, ref_ids)  # the merged folder's paths too must fit its file system
    rd_out = ResultsDir(out)
    with FolderLock(out):
        atomic_write_text(rd_out.suite_file, ResultsDir(ref_dir).suite_file.read_text(encoding="utf-8"))
        if ResultsDir(ref_dir).rules_file.is_file():
            atomic_write_text(rd_out.rules_file, ResultsDir(ref_dir).rules_file.read_text(encoding="utf-8"))
        for run_id, (d, _) in owner.items():
            # symlinks=True: a link that appeared after _refuse_links is copied
            # as a link, never as what it points to.
            shutil.copytree(ResultsDir(d).run_dir(run_id), rd_out.run_dir(run_id), symlinks=True,
                            ignore=shutil.ignore_patterns(".*.tmp"))
        merged = {k: v for k, v in ref.to_json().items() if k != "shard"}
        merged["runs"] = [(owner[r.run_id][1] if r.run_id in owner else r).model_dump(mode="json")
                          for r in ref.runs]
        merged["merged_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        merged["merged_from"] = [
            {"path": str(d),
             "shard": ({k: v for k, v in p.shard.model_dump(exclude_unset=True).items() if k != "run_ids"}
                       if p.shard else None) or None,
             "created_at": p.created_at, "device": p.device, "tool": p.tool,
             "environment": p.environment, "capabilities": p.capabilities,
             "runs": [i for i in ref_ids if i in owner and owner[i][0] == d]}
            for d, p in zip(sources, plans, strict=True)
        ]
        atomic_write_json(rd_out.plan_file, merged)
    return {"runs": len(ref_ids), "merged": len(owner), "missing": missing, "certify": ref.certify}
