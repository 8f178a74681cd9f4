"""One writer per results folder, across real processes; what a killed
invocation leaves behind is taken over; a worker never outlives its
orchestrator. (Refusals of real `ampcert` invocations on a folder in use:
test_worker_faults.py::test_invocations_on_a_folder_in_use_are_refused_with_a_clear_line.)"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rel_lab import start_early

from ampcert.errors import UserError
from ampcert.runner.folder_lock import FolderLock
from ampcert.runner.planning import prepare_out_dir, write_plan


@pytest.fixture(scope="module", autouse=True)
def _lab_in_background(request, tmp_path_factory):
    start_early(request, tmp_path_factory)


def _contend(root: str, barrier, events) -> None:
    barrier.wait()
    try:
        with FolderLock(Path(root)):
            events.put(("in", os.getpid(), time.monotonic()))
            time.sleep(0.15)
            events.put(("out", os.getpid(), time.monotonic()))
    except UserError as exc:
        events.put(("refused", os.getpid(), str(exc)))


def test_processes_racing_for_a_stale_lock_never_hold_it_together(tmp_path):
    """A lock left by a SIGKILLed owner is taken over; when several processes
    find it at once, one wins and the others are refused (a pid-file lock
    let two or three in at once in about a third of such races)."""
    ctx = mp.get_context("fork")
    contenders, rounds = 6, 12
    for round_ in range(rounds):
        root = tmp_path / f"r{round_}"
        root.mkdir()
        (root / ".lock").write_text("999999999")  # its owner is dead
        barrier, events = ctx.Barrier(contenders), ctx.Queue()
        procs = [ctx.Process(target=_contend, args=(str(root), barrier, events)) for _ in range(contenders)]
        for p in procs:
            p.start()
        got = []
        while len([e for e in got if e[0] in ("out", "refused")]) < contenders:
            got.append(events.get(timeout=60))
        for p in procs:
            p.join(timeout=60)
        spans = sorted((e[2], next(f[2] for f in got if f[0] == "out" and f[1] == e[1])) for e in got if e[0] == "in")
        assert spans, "nobody took the stale lock"
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), f"round {round_}: held together"
        for e in got:
            if e[0] == "refused":
                assert "another ampcert (pid" in e[2] and "is writing to this folder" in e[2]
        assert not (root / ".lock").exists()


def test_a_folder_killed_before_its_plan_is_taken_over_and_nothing_else_is(tmp_path):
    # What `ampcert run --out DIR` leaves when SIGKILLed between creating the folder and writing plan.json.
    left = tmp_path / "left"
    left.mkdir()
    (left / ".lock").write_text("999999999")
    (left / "suite.yaml").write_text("name: x\n")
    (left / ".plan.json.abc123.tmp").write_text("{")
    (left / ".write-test").write_text("")
    prepare_out_dir(left)  # accepted: nothing there is a result
    with FolderLock(left):
        assert not (left / ".plan.json.abc123.tmp").exists()  # a dead writer's temp file, swept
    # Anything else is someone's: refused, and kept.
    for name, files in {"user-file": ["notes.txt"], "suite-without-lock": ["suite.yaml"],
                        "with-plan": [".lock", "plan.json"], "with-runs": [".lock", "runs"]}.items():
        folder = tmp_path / name
        folder.mkdir()
        for f in files:
            (folder / f).write_text("mine")
        with pytest.raises(UserError, match="folder is not empty"):
            prepare_out_dir(folder)
        assert sorted(p.name for p in folder.iterdir()) == sorted(files)


def test_a_live_lock_is_refused_and_a_second_plan_never_overwrites_the_first(tmp_path):
    with FolderLock(tmp_path):
        with pytest.raises(UserError, match=rf"another ampcert \(pid {os.getpid()}\) is writing"):
            FolderLock(tmp_path).__enter__()
    (tmp_path / "plan.json").write_text('{"suite": "first"}')

    class Plan:  # what write_plan reads
        suite_path = tmp_path / "other.yaml"

    Plan.suite_path.write_text("name: other\n")
    with pytest.raises(UserError, match="another ampcert invocation has started writing to this folder"):
        write_plan(tmp_path, Plan())
    assert (tmp_path / "plan.json").read_text() == '{"suite": "first"}'


def test_a_worker_ends_when_its_orchestrator_dies(tmp_path):
    """Workers are the forkserver's children, so only they can notice their
    orchestrator is gone; one that hangs would otherwise live forever."""
    orchestrator = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    worker = subprocess.Popen([sys.executable, "-c",
                               "import sys, time\nfrom ampcert.runner.worker import exit_with\n"
                               f"exit_with({orchestrator.pid}, interval_s=0.05)\nprint('watching', flush=True)\n"
                               "time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline().strip() == "watching"
        time.sleep(0.3)
        assert worker.poll() is None  # the orchestrator lives: the worker goes on
        orchestrator.send_signal(signal.SIGKILL)  # and not reaped yet: a zombie is dead too
        assert worker.wait(timeout=10) == 70
    finally:
        for p in (orchestrator, worker):
            if p.poll() is None:
                p.kill()
                p.wait()
