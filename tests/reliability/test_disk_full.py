"""A full disk (issue 24, part 4): every command that writes ends with one line
naming the file and the errno, never a traceback; exit 2, or 1 for `ampcert
run` (its runs failed); what was written before is left whole (atomic
writes: temp file removed, old file kept); `--resume` finishes once there is
space again.

Two ways to fill the disk: an injected ENOSPC (``os.fsync`` of the atomic
writers' temp files raising it: fast, exact, anywhere), and a real tmpfs
filled to the last page, where mounting is permitted (root; skipped, saying
why, elsewhere). The real one also fails the worker's own writes (run.mllog,
error.txt), which do not fsync."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import cli_env, run_cli, snapshot
from factories import warm_cli

from ampcert.report.sign import keygen, load_public_key, verify_envelope
from ampcert.results import ResultsDir, load

ENOSPC = "[Errno 28] No space left on device"

# Two quick runs: the first finishes, then the disk is full for the second.
SUITE = """\
name: diskfull
device: cpu
precisions: [fp32]
seeds: [0, 1]
workloads:
  - workload: underflow
    train: {steps: 4, eval_every: 4}
"""

# Loaded by every interpreter of a `run` (the CLI, the forkserver, so every worker):
# fsync of a temp file whose name matches AMPCERT_TEST_ENOSPC fails with ENOSPC, once a
# file matches the glob AMPCERT_TEST_ENOSPC_AFTER (if given). Only the atomic writers fsync.
SITECUSTOMIZE = """\
import errno, glob, os, re

_pattern, _after = os.environ.get("AMPCERT_TEST_ENOSPC"), os.environ.get("AMPCERT_TEST_ENOSPC_AFTER")
if _pattern:
    _fsync = os.fsync

    def fsync(fd):
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd if isinstance(fd, int) else fd.fileno()}"))
        if re.search(_pattern, name) and (not _after or glob.glob(_after)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return _fsync(fd)

    os.fsync = fsync
"""


@dataclass
class Built:
    """SUITE run with the disk filling after its first run, then resumed with space
    (signed): what the failed invocation printed and left, and the folder at the end."""

    out: Path
    key: Path
    run_ids: tuple[str, str]
    failed: subprocess.CompletedProcess
    left: dict[str, bytes]          # the folder as the failed run left it
    resumed: subprocess.CompletedProcess


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Built:
    """One cold `ampcert run` with the injected full disk (the fresh interpreters of a
    run must load the hook), one warm `--resume`: the folder every test here starts from."""
    base = tmp_path_factory.mktemp("diskfull")
    suite, hook, out = base / "suite.yaml", base / "hook", base / "out"
    suite.write_text(SUITE)
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    key, _ = keygen(base / "keys" / "k")
    env = {"PYTHONPATH": os.pathsep.join([str(hook), cli_env()["PYTHONPATH"]]),
           "AMPCERT_TEST_ENOSPC": r"^\.result\.json\..*\.tmp$",
           "AMPCERT_TEST_ENOSPC_AFTER": str(out / "runs" / "*" / "result.json")}
    failed = run_cli("run", suite, "--out", out, "--sign-key", key, env=env)
    left = snapshot(out)
    resumed = warm_cli("run", "--resume", out, "--sign-key", key)
    run_ids = tuple(r.run_id for r in ResultsDir(out).read_plan().runs)
    return Built(out, key, run_ids, failed, left, resumed)  # type: ignore[arg-type]


def _copy(built: Built, tmp_path: Path, name: str = "work") -> Path:
    work = tmp_path / name
    shutil.copytree(built.out, work)
    return work


def assert_one_line(proc_or_code, stderr: str, code: int, *fragments: str) -> str:
    """Exit ``code``, no traceback, exactly one ``ampcert: error:`` line holding every fragment."""
    assert proc_or_code == code, stderr
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ampcert: error: "), stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def _main(monkeypatch, capsys, *args) -> tuple[int, str]:
    """``ampcert ARGS`` in this process (the entry point itself): (exit code, stderr)."""
    from ampcert.cli import main

    monkeypatch.setattr(sys, "argv", ["ampcert", *map(str, args)])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main()
    return exit_.value.code, capsys.readouterr().err


def _full_for(monkeypatch, name: str) -> None:
    """From now on, in this process, writing ``name`` atomically fails as on a full disk."""
    real = os.fsync

    def fsync(fd):
        if re.fullmatch(rf"\.{re.escape(name)}\..*\.tmp", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def _no_temp_files(folder: Path) -> None:
    assert [p for p in folder.rglob("*.tmp")] == []


# --------------------------------------------------------------------------- injected ENOSPC


@pytest.mark.parametrize("command, fails", [
    (["report"], "report.html"),        # after summary.* and report.json: each a whole file
    (["certify", "--rules", "default", "--force"], "verdicts.json"),
    (["sign", "--key"], "report.dsse.json"),
])
def test_report_certify_sign_on_a_full_disk_are_one_line_exit_2_and_keep_the_folder(
        built, tmp_path, monkeypatch, capsys, command, fails):
    work = _copy(built, tmp_path)
    before = snapshot(work)
    args = [command[0], work, *command[1:]] + ([built.key] if command[0] == "sign" else [])
    _full_for(monkeypatch, fails)
    code, err = _main(monkeypatch, capsys, *args)
    assert_one_line(code, err, 2, f"cannot write {work / fails}: {ENOSPC}")
    # Whatever was rewritten before the failure has the same bytes (rendering is
    # reproducible); the file that failed is the old one; no temp file is left.
    assert snapshot(work) == before
    _no_temp_files(work)
    assert verify_envelope(work / "report.dsse.json", load_public_key(built.key.with_name("k.pub")))


def test_run_whose_disk_fills_after_its_first_run_exits_1_and_resumes(built):
    out, (first, second) = built.out, built.run_ids
    # The worker could not store its result, nor the orchestrator the failure: one line, exit 1,
    # and no traceback from the worker either (its stderr is this stderr).
    assert_one_line(built.failed.returncode, built.failed.stderr, 1,
                    f"cannot write {out / 'runs' / second / 'result.json'}: {ENOSPC}")
    left = built.left
    assert f"runs/{first}/result.json" in left and f"runs/{second}/result.json" not in left
    assert not any(name.endswith(".tmp") or name == ".lock" for name in left)
    assert "report.html" not in left  # it stopped at the run: nothing was rendered from half a suite
    # Space again: --resume runs what has no result and finishes (and signs) the folder.
    assert built.resumed.returncode == 0, built.resumed.stdout + built.resumed.stderr
    assert "resuming: 1 of 2 runs already have results" in built.resumed.stdout
    assert (out / "runs" / first / "result.json").read_bytes() == left[f"runs/{first}/result.json"]
    assert [r.status for r in load(out).runs] == ["completed", "completed"]
    assert verify_envelope(out / "report.dsse.json", load_public_key(built.key.with_name("k.pub")))
    _no_temp_files(out)


def test_keygen_on_a_full_disk_leaves_no_half_key_pair(tmp_path, monkeypatch, capsys):
    _full_for(monkeypatch, "k.pub")
    code, err = _main(monkeypatch, capsys, "keygen", tmp_path / "k")
    assert_one_line(code, err, 2, f"cannot write {tmp_path / 'k.pub'}: {ENOSPC}")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # so keygen can just be run again


# --------------------------------------------------------------------------- a real full disk


@pytest.fixture
def tmpfs(tmp_path):
    """A 4 MiB tmpfs mounted for this test (root only; skipped where mounting is refused)."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                                 capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"a real full disk needs `mount -t tmpfs` (root): {exc}")
    if mounted.returncode != 0:
        pytest.skip(f"a real full disk needs `mount -t tmpfs` (root): {mounted.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def _fill(mnt: Path) -> Path:
    """Fill the tmpfs to its last page (4 KiB writes, unbuffered, until ENOSPC)."""
    filler = mnt / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def test_a_real_full_disk(built, tmpfs):
    work = tmpfs / "out"
    shutil.copytree(built.out, work)
    first, second = built.run_ids
    shutil.rmtree(work / "runs" / second)  # as if the disk had filled before the second run
    before = snapshot(work)
    filler = _fill(tmpfs)
    # Not one page left: even the folder lock's pid cannot be written (a bare OSError, one line).
    proc = warm_cli("report", work)
    assert_one_line(proc.returncode, proc.stderr, 2, ENOSPC)
    assert {k: v for k, v in snapshot(work).items() if k != ".lock"} == before
    (work / ".lock").unlink(missing_ok=True)
    # One page left, which the lock takes: every later write fails, each named with its file.
    os.truncate(filler, filler.stat().st_size - 4096)
    for args, fails in ((["report", work], "summary.json"),
                        (["certify", work, "--rules", "default", "--force"], "verdicts.json"),
                        (["sign", work, "--key", built.key], "report.dsse.json")):
        proc = warm_cli(*args)
        assert_one_line(proc.returncode, proc.stderr, 2, f"cannot write {work / fails}: {ENOSPC}")
        assert snapshot(work) == before
    # The second run: its log, its error.txt, its result and the orchestrator's record of the
    # failure all fail; the run is left without a result, for --resume.
    proc = warm_cli("run", "--resume", work)
    assert_one_line(proc.returncode, proc.stderr, 1,
                    f"cannot write {work / 'runs' / second / 'result.json'}: {ENOSPC}")
    assert (work / "runs" / first / "result.json").read_bytes() == before[f"runs/{first}/result.json"]
    assert not (work / "runs" / second / "result.json").exists()
    _no_temp_files(work)
    filler.unlink()
    done = warm_cli("run", "--resume", work)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [r.status for r in load(work).runs] == ["completed", "completed"]
    assert (work / "runs" / first / "result.json").read_bytes() == before[f"runs/{first}/result.json"]

