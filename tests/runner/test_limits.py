"""Limits checked at planning, not found mid-run (issue 24, part 3).

A name longer than the file system allows, or a results folder so deep that
a run's files would pass its PATH_MAX, is one line (exit 2) before anything
is written, not an ENAMETOOLONG traceback in the middle of a suite; and
``max_bytes`` bounds what a text corpus reads, not only what it keeps.
"""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest
from conftest import assert_one_line_error, run_cli, snapshot

from ampcert import results
from ampcert.errors import UserError
from ampcert.results import LONGEST_RUN_FILE, ResultsDir, check_path_limits, fs_limits
from ampcert.runner.planning import pending_runs, prepare_out_dir
from ampcert.spec import expand, load_suite
from ampcert.workloads import text

SUITE = """
name: tiny
precisions: [fp32]
seeds: [0]
device: cpu
train: {{steps: 4, eval_every: 4}}
workloads:
  - workload: underflow{extra}
"""


def suite_file(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "suite.yaml"
    path.write_text(SUITE.format(extra=extra))
    return path


def entries(root: Path) -> tuple[dict[str, bytes], list[str]]:
    """Every file's bytes and every entry (empty folders too) under ``root``."""
    return snapshot(root), sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# --------------------------------------------------------------------------- names and paths


def test_a_240_character_id_is_one_line_before_anything_is_written(tmp_path):
    """It used to fail mid-run with a 92-line ENAMETOOLONG traceback, exit 1."""
    suite = suite_file(tmp_path, "\n    id: " + "a" * 240)
    before = entries(tmp_path)
    proc = run_cli("run", suite, "--out", tmp_path / "out")
    assert_one_line_error(proc, "workloads[0]", ".id: String should have at most 200 characters")
    assert entries(tmp_path) == before


def test_a_300_character_out_component_is_one_line(tmp_path):
    """It used to be a traceback (Path.exists raising ENAMETOOLONG) before any check."""
    suite = suite_file(tmp_path)
    before = entries(tmp_path)
    proc = run_cli("run", suite, "--out", tmp_path / ("o" * 300) / "out")
    assert_one_line_error(proc, "--out ", "is 300 bytes, more than the 255 this file system allows")
    assert entries(tmp_path) == before


def test_a_run_id_longer_than_a_file_name_is_refused_at_planning(tmp_path):
    """A label within the limit with a many-digit seed: the run id itself is too long."""
    suite = load_suite(suite_file(tmp_path, "\n    id: " + "a" * 200 + "\n    seeds: [" + "9" * 80 + "]"))
    with pytest.raises(UserError, match=r"run id .* is longer than the 255 characters .* shorter `id`"):
        expand(suite, "cpu")


def test_a_folder_too_deep_for_its_runs_files_is_refused_before_it_is_made(tmp_path):
    deep = tmp_path.joinpath(*["d" * 250] * 16)  # each name fits; the path does not
    with pytest.raises(UserError, match=r"--out .*: a run's files would have paths of \d+ bytes, more than the 4095"):
        prepare_out_dir(deep)
    assert not (tmp_path / ("d" * 250)).exists()
    # With the run ids known, the check is exact: a folder whose longest run path
    # just fits is taken, one byte more is refused.
    path_max = fs_limits(tmp_path)[1]
    run_id = "r" * 40
    target = path_max - 1 - len(f"/runs/{run_id}/") - LONGEST_RUN_FILE
    fits = str(tmp_path)
    while (left := target - len(fits)) > 0:  # names of at most 200 bytes, none empty
        fits += "/" + "p" * (left - 1 if left <= 201 else 199 if left == 202 else 200)
    assert len(fits) == target
    check_path_limits(fits, [run_id], "--out")
    with pytest.raises(UserError, match="a run's files would have paths"):
        check_path_limits(fits, [run_id + "x"], "--out")


def test_limits_are_the_file_systems_own(tmp_path, monkeypatch):
    """eCryptfs allows 143-byte names: a run id that fits ext4 does not fit there."""
    real = os.pathconf
    monkeypatch.setattr(results.os, "pathconf",
                        lambda p, name: 143 if name == "PC_NAME_MAX" else real(p, name))
    assert fs_limits(tmp_path)[0] == 143
    with pytest.raises(UserError, match=r"run id 'xxx.* is longer than the 143 characters .* shorter `id`"):
        check_path_limits(tmp_path / "out", ["x" * 150], "--out")
    with pytest.raises(UserError, match=r"the name 'n+'\.\.\. is 150 bytes, more than the 143"):
        prepare_out_dir(tmp_path / ("n" * 150))
    check_path_limits(tmp_path / "out", ["x" * 143], "--out")
    assert not (tmp_path / "out").exists()


def test_limits_fall_back_where_the_system_cannot_say(tmp_path, monkeypatch):
    def no_pathconf(path, name):
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(results.os, "pathconf", no_pathconf)
    assert fs_limits(tmp_path) == (255, 4096)
    monkeypatch.setattr(results.os, "pathconf", lambda path, name: -1)  # "no limit" is not infinite
    assert fs_limits(tmp_path) == (255, 4096)


def test_resume_checks_the_limits_before_it_writes(tmp_path, monkeypatch):
    """A folder moved somewhere deeper (or onto a file system with shorter names)
    is refused by the resume before any run folder is made."""
    runs = expand(load_suite(suite_file(tmp_path, "\n    id: " + "w" * 150)), "cpu")
    root = tmp_path / "DIR"
    root.mkdir()
    monkeypatch.setattr(results, "fs_limits", lambda path: (143, 4096))
    with pytest.raises(UserError, match=r"results folder .*DIR: run id 'www.* is longer than the 143"):
        pending_runs(ResultsDir(root), runs, retry_failed=False)
    assert list(root.iterdir()) == []


# --------------------------------------------------------------------------- max_bytes


def _bytes_read() -> int | None:
    """Bytes this process has read through read(2) so far (Linux), else None."""
    try:
        with open("/proc/self/io") as fh:
            fields = dict(line.split(": ") for line in fh.read().splitlines())
        return int(fields["rchar"])
    except (OSError, KeyError, ValueError):
        return None


def test_max_bytes_bounds_what_is_read_not_only_what_is_kept(tmp_path):
    """A sparse 1 GiB file with max_bytes 1 MiB: the reader reads (and holds) about
    1 MiB. It used to read the whole file and cut it afterwards (1.3 GB RSS)."""
    big = tmp_path / "big.txt"
    with big.open("wb") as fh:
        fh.write(b"hello world\n" * 1000)
    os.truncate(big, 1 << 30)  # sparse: costs no disk
    cap = 1 << 20
    assert text.check_text(big, seq_len=64, max_bytes=cap) == cap  # planning: stat only
    read_before = _bytes_read()
    tracemalloc.start()
    try:
        corpus = text.load_text(big, max_bytes=cap)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    read_after = _bytes_read()
    assert len(corpus.data) == cap and corpus.capped and corpus.data.startswith(b"hello world\n")
    assert peak < 8 * cap, f"peak {peak} bytes allocated for a {cap}-byte cap"
    if read_before is not None and read_after is not None:
        assert read_after - read_before < 2 * cap, f"read {read_after - read_before} bytes for a {cap}-byte cap"


def test_max_bytes_in_a_folder_stops_before_the_files_it_does_not_need(tmp_path, monkeypatch):
    folder = tmp_path / "corpus"
    folder.mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        (folder / name).write_bytes(name[0].encode() * 1000)
    opened: list[str] = []
    real_open = Path.open

    def spy(self, *args, **kwargs):
        opened.append(self.name)
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", spy)
    corpus = text.load_text(folder, max_bytes=1500)
    assert opened == ["a.txt", "b.txt"]  # c.txt is not opened at all
    assert corpus.data == b"a" * 1000 + text.SEPARATOR + b"b" * 497 and corpus.capped
    assert corpus.files == ("a.txt", "b.txt")
    # Exactly at the cap: not capped; all of it without one.
    whole = text.load_text(folder)
    assert not whole.capped and len(whole.data) == 3000 + 2 * len(text.SEPARATOR)
    exact = text.load_text(folder, max_bytes=len(whole.data))
    assert exact.data == whole.data and not exact.capped
