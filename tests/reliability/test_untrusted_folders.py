"""A results folder is untrusted input (issue 24, part 2).

`run --resume DIR`, `merge OUT DIR...` and the commands that read a folder
take its plan.json and its run folders from wherever the folder came from.
Nothing read from it may become a path outside it: labels and run ids must
match the id pattern, run folders must be real folders inside DIR (no link
is followed out), and merge copies files, never what links point to. Each
refusal is one line, exit 2, before anything is written; the folders given
and everything around them stay byte for byte as they were.

One tiny suite runs for real once (module fixture); each test tampers with a
copy of its folder.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import assert_one_line_error, cli_env, snapshot
from factories import warm_cli as run_cli  # `ampcert ARGS` in a process of its own, forked warm
from pydantic import ValidationError

from ampcert.errors import UserError
from ampcert.results import ResultsDir, load
from ampcert.spec import RunSpec, load_suite, parse_suite

TINY = """
name: tiny
precisions: [fp32]
seeds: [0]
device: cpu
train: {steps: 4, eval_every: 4}
timeout_s: 120
workloads:
  - workload: underflow
"""


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A results folder with one finished run, made once; tests copy it."""
    folder = tmp_path_factory.mktemp("finished")
    suite = folder / "suite.yaml"
    suite.write_text(TINY)
    out = folder / "out"
    proc = run_cli("run", suite, "--out", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


@pytest.fixture
def folder(finished, tmp_path) -> Path:
    """A copy of the finished folder, at tmp_path/work/DIR (so that `DIR/../x`
    and `DIR/../../x` both land inside tmp_path, where the test looks)."""
    dest = tmp_path / "work" / "DIR"
    shutil.copytree(finished, dest, symlinks=True)
    return dest


def everything(root: Path) -> tuple[dict[str, bytes], list[str]]:
    """Every file's bytes, and every entry (folders and links too) under ``root``."""
    entries = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    return snapshot(root), entries


def run_id_of(folder: Path) -> str:
    (run_dir,) = (folder / "runs").iterdir()
    return run_dir.name


def edit_plan(folder: Path, edit) -> None:
    plan = json.loads((folder / "plan.json").read_text())
    edit(plan)
    (folder / "plan.json").write_text(json.dumps(plan, indent=1))


# --------------------------------------------------------------------------- crafted plan.json


@pytest.mark.parametrize("label", ["../../x", "/tmp/escaped"])
def test_resume_refuses_a_plan_whose_label_is_not_a_name(folder, tmp_path, label):
    edit_plan(folder, lambda plan: plan["runs"][0].update(label=label))
    before = everything(tmp_path)
    proc = run_cli("run", "--resume", folder)
    assert_one_line_error(proc, "plan.json: runs[0]: label", "may hold only letters")
    assert everything(tmp_path) == before  # no DIR/../x-...: nothing written anywhere
    assert not list(tmp_path.rglob("x-*")) and not list(Path("/tmp").glob("escaped-*"))


@pytest.mark.parametrize("label", ["../x", ".hidden", "a/b", "ok\n", "-x", "a" * 201, ""])
def test_reading_a_plan_refuses_labels_that_are_not_names(folder, tmp_path, label):
    edit_plan(folder, lambda plan: plan["runs"][0].update(label=label))
    before = everything(tmp_path)
    with pytest.raises(UserError, match=r"plan\.json: runs\[0\]: label "):
        ResultsDir(folder).read_plan()
    assert everything(tmp_path) == before


def test_merge_refuses_a_shard_whose_label_escapes(folder, tmp_path):
    edit_plan(folder, lambda plan: plan["runs"][0].update(label="../../x"))
    out = tmp_path / "work" / "OUT"
    before = everything(tmp_path)
    proc = run_cli("merge", out, folder)
    assert_one_line_error(proc, "plan.json: runs[0]: label '../../x'")
    assert everything(tmp_path) == before and not out.exists()


def test_a_shard_record_with_bad_run_ids_is_refused(folder, tmp_path):
    edit_plan(folder, lambda plan: plan.update(shard={"index": 1, "count": 1, "run_ids": ["../../x"]}))
    before = everything(tmp_path)
    proc = run_cli("run", "--resume", folder)
    assert_one_line_error(proc, "plan.json: shard.run_ids: expected a list of run ids")
    assert everything(tmp_path) == before
    for run_ids in (["/etc"], "not-a-list", [7], [""]):
        edit_plan(folder, lambda plan, ids=run_ids: plan["shard"].update(run_ids=ids))
        with pytest.raises(UserError, match=r"shard\.run_ids"):
            ResultsDir(folder).read_plan()


def test_run_specs_refuse_labels_and_run_ids_that_are_not_names(folder):
    """Wherever a RunSpec is built or parsed (plan.json, result.json, a worker's
    argument), its label must be a name and its run id fit a file name."""
    spec = json.loads((folder / "plan.json").read_text())["runs"][0]
    RunSpec.model_validate(spec)
    for bad in ({"label": "../../x"}, {"label": "a" * 201}, {"seed": 10 ** 300}):
        with pytest.raises(ValidationError):
            RunSpec.model_validate(spec | bad)
    rd = ResultsDir(folder)
    for run_id in ("../../x", "/abs", "", "x" * 256):
        with pytest.raises(UserError, match="run id"):
            rd.run_dir(run_id)


# --------------------------------------------------------------------------- links in the folder


def test_resume_refuses_a_run_folder_that_is_a_symlink(folder, tmp_path):
    """runs/<id> pointing elsewhere: resume used to delete run.mllog, telemetry.csv
    and error.txt there and write result.json there."""
    run_id = run_id_of(folder)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(folder / "runs" / run_id, elsewhere)
    (elsewhere / "result.json").unlink()  # so that the run would be redone, into the link
    (elsewhere / "error.txt").write_text("a file of someone else's\n")
    (folder / "runs" / run_id).symlink_to(elsewhere, target_is_directory=True)
    before = everything(tmp_path)
    for args in (["run", "--resume", folder], ["run", "--resume", folder, "--dry-run"], ["report", folder]):
        proc = run_cli(*args)
        assert_one_line_error(proc, f"runs/{run_id}: is a symbolic link", str(elsewhere))
    assert everything(tmp_path) == before  # elsewhere's files are all still there, unchanged


def test_resume_refuses_a_runs_folder_that_is_a_symlink(folder, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    shutil.move(folder / "runs", elsewhere)
    (folder / "runs").symlink_to(elsewhere, target_is_directory=True)
    before = everything(tmp_path)
    proc = run_cli("run", "--resume", folder)
    assert_one_line_error(proc, "DIR/runs: is a symbolic link")
    assert everything(tmp_path) == before


def test_a_result_file_that_is_a_link_is_not_trusted(folder, tmp_path):
    """A result.json symlinked to a (valid) result elsewhere is not read through the link."""
    run_id = run_id_of(folder)
    rd = ResultsDir(folder)
    real = tmp_path / "result.json"
    shutil.move(rd.result_file(run_id), real)
    rd.result_file(run_id).symlink_to(real)
    result, problem = rd.check_result(run_id)
    assert result is None and "symbolic link" in problem
    assert load(folder).missing == [run_id]


def test_merge_refuses_a_shard_holding_a_link_to_a_private_file(folder, tmp_path):
    """merge used to copy what a link points to: a link to a 0600 file put its
    contents into OUT."""
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the merged folder\n")
    secret.chmod(0o600)
    link = folder / "runs" / run_id_of(folder) / "notes.txt"
    link.symlink_to(secret)
    out = tmp_path / "work" / "OUT"
    before = everything(tmp_path)
    proc = run_cli("merge", out, folder)
    assert_one_line_error(proc, f"{link}: is a symbolic link", str(secret))
    assert everything(tmp_path) == before and not out.exists()
    # Anywhere in the shard folder, not only in run folders (merge copies suite.yaml too).
    link.unlink()
    (folder / "suite.yaml").unlink()
    (folder / "suite.yaml").symlink_to(secret)
    proc = run_cli("merge", out, folder)
    assert_one_line_error(proc, "suite.yaml: is a symbolic link")
    assert not out.exists()


def test_merge_of_a_clean_shard_copies_files(folder, tmp_path):
    """The refusals above do not stop an ordinary merge: its run folders are copies."""
    from ampcert.runner.shard import merge

    out = tmp_path / "work" / "OUT"
    source = everything(folder)
    assert merge(out, [folder])["merged"] == 1
    run_id = run_id_of(folder)
    assert (out / "runs" / run_id / "result.json").read_bytes() == (folder / "runs" / run_id / "result.json").read_bytes()
    assert not any(p.is_symlink() for p in out.rglob("*"))
    assert everything(folder) == source  # the shard was read, never changed


# --------------------------------------------------------------------------- workload import paths


EVIL_MODULE = '''
def __getattr__(name):  # any attribute, even "/abs/path", is the underflow workload
    from ampcert.workloads.numerics import UNDERFLOW
    return UNDERFLOW
'''


def test_an_import_path_workload_cannot_make_a_label_outside_the_pattern(tmp_path, monkeypatch):
    """`mod:/abs/path` used to give the label `/abs/path`, and run folders outside --out."""
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "evilmod.py").write_text(EVIL_MODULE)
    escaped = tmp_path / "escaped"
    suite = tmp_path / "suite.yaml"
    suite.write_text(TINY.replace("workload: underflow", f'workload: "evilmod:{escaped}"'))
    out = tmp_path / "out"
    before = everything(tmp_path)
    proc = run_cli("run", suite, "--out", out, env={"PYTHONPATH": os.pathsep.join([str(mods), cli_env()["PYTHONPATH"]])})
    assert_one_line_error(proc, "workloads[0]", f"run label {str(escaped)!r}", "give the entry an `id`")
    assert everything(tmp_path) == before and not out.exists()
    assert not list(tmp_path.glob("escaped*"))
    # With an `id` the same workload is fine: the label is the id.
    monkeypatch.syspath_prepend(str(mods))
    data = {"name": "tiny", "workloads": [{"workload": f"evilmod:{escaped}", "id": "evil"}]}
    assert parse_suite(data).workloads[0].label == "evil"


def test_an_id_outside_the_pattern_is_refused_when_the_suite_is_read(write_suite):
    path = write_suite(TINY.replace("workload: underflow", "workload: underflow\n    id: ../x"))
    with pytest.raises(UserError, match=r"workloads\[0\].*id: String should match pattern"):
        load_suite(path)
