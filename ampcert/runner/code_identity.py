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
  tree is dirty and a digest of the uncommitted change, a digest of each
  untracked (not ignored) code file in the repository (a ``helper.py`` the
  job imports but nobody committed), and a digest of each argv word that
  names a file there (``train.py``), which catches edits outside git;
  outside git, a digest of each code file in the job's folder, recursively.

"Code files" are those ending in :data:`CODE_SUFFIXES` (Python, its extensions,
shell), so that what a job writes beside its code (logs, checkpoints, a results
folder inside its repository) and the suite's own files (its rule pack, held to
by their own digests) do not look like a change. A config file a job reads is
covered where it is committed (the commit, the diff) or named in argv.
At most :data:`MAX_CODE_FILES` files of at most :data:`MAX_CODE_FILE_BYTES` each
are digested, :data:`MAX_CODE_BYTES` in all (the first in path order); a folder
over that says so (``truncated``), and files beyond the caps go unseen.

The suite's own digest is in plan.json already (``suite_sha256``).
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

from ampcert.envinfo import installed_packages
from ampcert.errors import UserError
from ampcert.results import read_regular_file
from ampcert.spec import RunSpec
from ampcert.version import __version__


def _git(workdir: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(workdir), *args], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.decode("utf-8", "replace") if done.returncode == 0 else None


# What counts as code in a job's folder (see the module docstring), and the caps.
CODE_SUFFIXES = (".py", ".pyi", ".pyx", ".pxd", ".so", ".sh", ".bash")
MAX_CODE_FILES = 2000
MAX_CODE_FILE_BYTES = 4 * 2**20
MAX_CODE_BYTES = 64 * 2**20
# Folders never walked outside git: version control, caches and environments, not code.
_SKIP_DIRS = {"__pycache__", "node_modules", "site-packages"}
# A results folder (ampcert's own: its suite.yaml is written first, its plan.json at
# planning) inside a job's folder is output, not code.
_RESULTS_MARKS = ("plan.json", "suite.yaml")


def _is_results_folder(folder: Path) -> bool:
    return any((folder / mark).is_file() for mark in _RESULTS_MARKS)


def _in_results_folder(root: Path, name: str) -> bool:
    """Whether ``name`` (under ``root``) lies in a results folder below ``root``."""
    return any(_is_results_folder(root / parent) for parent in Path(name).parents if parent != Path("."))


def _digests(root: Path, names: list[str]) -> tuple[dict[str, str], bool]:
    """{name: sha256} of the code files among ``names`` (paths under ``root``), regular
    files only (never through a link), within the caps; and whether a cap was reached."""
    out: dict[str, str] = {}
    total, truncated = 0, False
    for name in sorted(names):
        if not name.endswith(CODE_SUFFIXES):
            continue
        path = root / name
        try:
            st = path.lstat()
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        if len(out) >= MAX_CODE_FILES or st.st_size > MAX_CODE_FILE_BYTES or total + st.st_size > MAX_CODE_BYTES:
            truncated = True
            continue
        try:
            out[name] = hashlib.sha256(read_regular_file(path)).hexdigest()
        except OSError:
            continue
        total += st.st_size
    return out, truncated


def _folder_names(workdir: Path) -> list[str]:
    """Every file under ``workdir`` (relative names), links not followed, hidden folders,
    caches, virtual environments (a ``pyvenv.cfg``) and results folders left out."""
    names = []
    for dirpath, dirs, files in os.walk(workdir, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS
                         and not (Path(dirpath, d) / "pyvenv.cfg").exists() and not _is_results_folder(Path(dirpath, d)))
        rel = Path(dirpath).relative_to(workdir)
        names += [(rel / f).as_posix() for f in files]
        if len(names) > 50 * MAX_CODE_FILES:  # a home folder, not a job's: enough to say so
            break
    return names


def job_source(workdir: Path, argv: list[str] | None = None) -> dict[str, Any]:
    """The job's code: its repository's commit, dirty flag and the digest of its
    uncommitted change, and the digests of its untracked code files (where ``workdir``
    is in a git repository), else of the code files in ``workdir``; and the digest of
    each argv word that names a file in ``workdir``."""
    out: dict[str, Any] = {}
    commit = _git(workdir, "rev-parse", "HEAD")
    if commit is None:
        out["git"] = None  # not a repository (or no git): the job's folder is digested instead
        digests, truncated = _digests(workdir, _folder_names(workdir))
        out["folder"] = {"files": digests, **({"truncated": True} if truncated else {})}
    else:
        diff = _git(workdir, "diff", "HEAD", "--no-ext-diff", "--binary") or ""
        top = Path((_git(workdir, "rev-parse", "--show-toplevel") or str(workdir)).strip())
        listed = _git(top, "ls-files", "--others", "--exclude-standard", "-z") or ""
        untracked, truncated = _digests(top, [n for n in listed.split("\0") if n and not _in_results_folder(top, n)])
        out["git"] = {"commit": commit.strip(), "dirty": bool(diff) or bool(untracked),
                      **({"diff_sha256": hashlib.sha256(diff.encode()).hexdigest()} if diff else {}),
                      "untracked": untracked, **({"untracked_truncated": True} if truncated else {})}
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
        elif ga.get("diff_sha256") != gb.get("diff_sha256"):
            out.append(f"job {label}: uncommitted changes differ")
        # Recorded since ampcert digests untracked code and folders outside git: a folder
        # planned before has nothing to hold these to.
        out += _file_changes(label, "untracked ", ga.get("untracked"), gb.get("untracked"))
        out += _file_changes(label, "", (a.get("folder") or {}).get("files"), (b.get("folder") or {}).get("files"))
        for name in sorted(set(a.get("files") or {}) | set(b.get("files") or {})):
            if (a.get("files") or {}).get(name) != (b.get("files") or {}).get(name):
                out.append(f"job {label}: {name} changed")
    return out


def _file_changes(label: str, what: str, before: dict[str, str] | None, now: dict[str, str] | None) -> list[str]:
    """What changed between two {file: digest} records (none where the stored one predates them)."""
    if before is None or now is None:
        return []
    out = []
    for name in sorted(set(before) | set(now)):
        if name not in now:
            out.append(f"job {label}: {what}{name} removed")
        elif name not in before:
            out.append(f"job {label}: {what}{name} added")
        elif before[name] != now[name]:
            out.append(f"job {label}: {what}{name} changed")
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
