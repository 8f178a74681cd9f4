"""What code a results folder's runs ran, so that a folder never mixes two versions.

Run ids hash what a run computes as the suite says it (workload, params,
precision, seed, the command's argv ...), not the code behind it: after an
upgrade of ampcert, torch or the team's own training script, the same suite
plans the same ids. So planning records the *code identity* in plan.json,
and ``--resume`` and ``merge`` hold a folder to it (one line, exit 2, naming
what changed):

- ampcert's version;
- the resolved package list (every installed distribution, ``name==version``): a version
  that changed is a different stack; a package added or removed since is not (a plugin
  installed beside is not a change of what ran);
- for each command entry: the git commit of the folder it runs in, whether the
  tree is dirty and a digest of the uncommitted change, and a digest of each
  argv word that names a file there (``train.py``), which catches edits
  outside git.

The suite's own digest is in plan.json already (``suite_sha256``).
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any

from ampcert.envinfo import installed_packages
from ampcert.errors import UserError
from ampcert.spec import RunSpec
from ampcert.version import __version__


def _git(workdir: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(workdir), *args], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.decode("utf-8", "replace") if done.returncode == 0 else None


def job_source(workdir: Path, argv: list[str] | None = None) -> dict[str, Any]:
    """The job's code: its repository's commit, dirty flag and the digest of its
    uncommitted change (where ``workdir`` is in a git repository), and the digest of
    each argv word that names a file in ``workdir``."""
    out: dict[str, Any] = {}
    commit = _git(workdir, "rev-parse", "HEAD")
    if commit is None:
        out["git"] = None  # not a repository (or no git): the file digests below still hold
    else:
        diff = _git(workdir, "diff", "HEAD", "--no-ext-diff", "--binary") or ""
        out["git"] = {"commit": commit.strip(), "dirty": bool(diff),
                      **({"diff_sha256": hashlib.sha256(diff.encode()).hexdigest()} if diff else {})}
    files = {}
    for word in argv or []:
        path = workdir / word
        try:
            if "{" not in word and path.is_file():
                files[word] = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            continue
    if files:
        out["files"] = files
    return out


def code_identity(runs: list[RunSpec]) -> dict[str, Any]:
    """The code identity of a planned folder (see the module docstring)."""
    packages = installed_packages()
    jobs = {}
    for run in runs:
        if run.command is not None and run.label not in jobs:
            jobs[run.label] = job_source(Path(run.command.workdir or "."), run.command.argv)
    return {"ampcert": __version__, "packages_sha256": hashlib.sha256("\n".join(packages).encode()).hexdigest(),
            "packages": packages, **({"jobs": jobs} if jobs else {})}


def _package_changes(before: list[str], now: list[str]) -> list[str]:
    """Packages whose version differs. One installed or removed since is not a change of
    what ran (a plugin installed beside, a tool's helper); a framework that is gone fails
    the resumed runs by itself, with its own one line."""
    old = dict(p.split("==", 1) for p in before if "==" in p)
    new = dict(p.split("==", 1) for p in now if "==" in p)
    return [f"{n} {old[n]} -> {new[n]}" for n in sorted(set(old) & set(new)) if old[n] != new[n]]


def differences(stored: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between two code identities, each as a short phrase."""
    out = []
    if stored.get("ampcert") != now.get("ampcert"):
        out.append(f"ampcert {stored.get('ampcert')} -> {now.get('ampcert')}")
    if stored.get("packages_sha256") != now.get("packages_sha256"):
        changes = _package_changes(stored.get("packages") or [], now.get("packages") or [])
        if changes:
            shown = ", ".join(changes[:3]) + (f" and {len(changes) - 3} more" if len(changes) > 3 else "")
            out.append(f"packages: {shown}")
    old_jobs, new_jobs = stored.get("jobs") or {}, now.get("jobs") or {}
    for label in sorted(set(old_jobs) | set(new_jobs)):
        a, b = old_jobs.get(label) or {}, new_jobs.get(label) or {}
        ga, gb = a.get("git") or {}, b.get("git") or {}
        if ga.get("commit") != gb.get("commit"):
            out.append(f"job {label}: commit {str(ga.get('commit'))[:12]} -> {str(gb.get('commit'))[:12]}")
        elif (ga.get("dirty"), ga.get("diff_sha256")) != (gb.get("dirty"), gb.get("diff_sha256")):
            out.append(f"job {label}: uncommitted changes differ")
        for name in sorted(set(a.get("files") or {}) | set(b.get("files") or {})):
            if (a.get("files") or {}).get(name) != (b.get("files") or {}).get(name):
                out.append(f"job {label}: {name} changed")
    return out


def check_same_code(stored: dict[str, Any] | None, now: dict[str, Any], where: str, action: str) -> None:
    """Refuse, with one line, to ``action`` a folder planned with other code (a folder
    planned before ampcert recorded its code has nothing to hold to)."""
    if stored is None:
        return
    changed = differences(stored, now)
    if changed:
        raise UserError(f"{where}: planned with other code than {action} would run now: {'; '.join(changed[:4])}"
                        f"{f' and {len(changed) - 4} more' if len(changed) > 4 else ''}; results from two "
                        "versions would mix: run the suite into a new folder")
