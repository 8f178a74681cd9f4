"""What code a folder ran, and what a folder from elsewhere may make ampcert open.

- --resume and merge hold a folder to the code identity planning recorded (one line, exit 2);
- --resume certifies with the suite's own rule pack held to the planned digest, never
  with a file plan.json names;
- shipped files are recorded as ``ampcert:<path>`` with their digest, never by the absolute
  path of one installation.

The commands run in this process (``ampcert``: the CLI's entry point, its exit code and
streams): what is under test is what a folder records and is held to, not how a process
starts, and each cold `ampcert run` would import torch twice (the CLI and its forkserver).
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
from conftest import assert_one_line_error

import ampcert
from ampcert.results import ResultsDir

PACKAGE = str(Path(ampcert.__file__).resolve().parent)

# A job (no framework: a Python start-up a run) whose accuracy depends on the seed only.
JOB = """\
import json, os, time
def line(t, kind, key, value=None, meta=None):
    return ":::MLLOG " + json.dumps({"namespace": "", "time_ms": t, "event_type": kind, "key": key,
                                     "value": value, "metadata": meta or {}}) + "\\n"
seed = int(os.environ["AMPCERT_SEED"])
t = time.time() * 1000
with open(os.environ["AMPCERT_MLLOG"], "w") as log:
    log.write(line(t, "POINT_IN_TIME", "seed", seed))
    log.write(line(t, "INTERVAL_START", "run_start"))
    for i in (1, 2, 3):
        log.write(line(t + 10 * i, "POINT_IN_TIME", "eval_accuracy", 0.7 + 0.05 * i + 0.001 * seed,
                       {"samples_count": 100 * i}))
    log.write(line(t + 40, "INTERVAL_END", "run_stop", None, {"status": "success"}))
"""

RULES = """\
name: team-pack
version: 1
rules:
  - id: parity.final_metric
    check: accuracy_parity
    measures: final metric, bf16 minus fp32
    margin: 0.02
    min_seeds: 3
    required: true
"""


@pytest.fixture
def run_cli(cli_here):
    return cli_here


def _suite(folder: Path, *, certify: str = "rules/team.yaml") -> Path:
    (folder / "job.py").write_text(JOB)
    (folder / "rules").mkdir(exist_ok=True)
    (folder / "rules" / "team.yaml").write_text(RULES)
    path = folder / "suite.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: identity
        device: cpu
        precisions: [fp32, bf16]
        seeds: [0, 1, 2]
        certify: {certify}
        workloads:
          - id: job
            command: ["{{python}}", job.py]
        """))
    return path


def test_resume_certifies_with_the_suites_own_pack_never_one_plan_json_names(tmp_path, run_cli):
    out = tmp_path / "out"
    assert run_cli("run", _suite(tmp_path), "--out", out, "--shard", "1/2", cwd=tmp_path).returncode == 0
    rd = ResultsDir(out)
    plan = json.loads(rd.plan_file.read_text())
    assert plan["certify_sha256"] and (out / "rules.yaml").read_text() == RULES  # the pack, copied
    # A plan.json from elsewhere names another file: resume must not open it.
    bait = tmp_path / "bait.yaml"
    bait.write_text(RULES.replace("team-pack", "bait-pack").replace("0.02", "0.5"))
    plan["certify"] = str(bait)
    rd.plan_file.write_text(json.dumps(plan))
    bait.chmod(0)  # (root reads it anyway: the verdicts below tell which pack judged)
    (tmp_path / "rules" / "team.yaml").unlink()  # nor the suite's original path: the folder's copy
    proc = run_cli("run", "--resume", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # (a shard certifies once merged: merge the folder alone, partial, to see which pack judges)
    merged = tmp_path / "merged"
    proc = run_cli("merge", merged, out, "--partial", cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    verdicts = json.loads((merged / "verdicts.json").read_text())
    assert verdicts["rules"]["name"] == "team-pack" and verdicts["rules"]["sha256"] == plan["certify_sha256"]


def test_resume_refuses_a_pack_changed_since_planning(tmp_path, run_cli):
    out = tmp_path / "out"
    assert run_cli("run", _suite(tmp_path), "--out", out, "--shard", "1/2", cwd=tmp_path).returncode == 0
    (out / "rules.yaml").write_text(RULES.replace("0.02", "0.5"))
    assert_one_line_error(run_cli("run", "--resume", out, cwd=tmp_path), "changed since the folder was planned")


def test_merge_refuses_shards_that_ran_other_code(tmp_path, run_cli):
    suite = _suite(tmp_path)
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, shard in ((a, "1/2"), (b, "2/2")):
        assert run_cli("run", suite, "--out", folder, "--shard", shard, cwd=tmp_path).returncode == 0
    plan = json.loads(ResultsDir(b).plan_file.read_text())
    plan["code"]["jobs"]["job"]["files"]["job.py"] = "0" * 64  # shard b ran another job.py
    ResultsDir(b).plan_file.write_text(json.dumps(plan))
    proc = run_cli("merge", tmp_path / "m", a, b, cwd=tmp_path)
    assert_one_line_error(proc, f"{b}: ran other code than {a}", "job job: job.py changed")
    assert not (tmp_path / "m").exists()


def test_shipped_files_are_named_by_package_path_never_by_install_path(tmp_path, run_cli):
    suite = tmp_path / "suite.yaml"
    suite.write_text(textwrap.dedent("""\
        name: labels
        device: cpu
        amp: ampcert
        precisions: [fp32, bf16]
        seeds: [0]
        certify: default
        train: {steps: 4, eval_every: 2}
        workloads:
          - workload: digits
        """))
    out = tmp_path / "out"
    run_cli("run", suite, "--out", out, cwd=tmp_path)
    shutil.copytree(out, tmp_path / "again")
    compared = run_cli("compare", out, tmp_path / "again", "--json", cwd=tmp_path)
    assert compared.returncode == 0, compared.stdout + compared.stderr
    written = {"compare --json": compared.stdout}
    for path in [out / "plan.json", out / "verdicts.json", *out.glob("runs/*/result.json")]:
        written[str(path.relative_to(out))] = path.read_text()
    for name, text in written.items():
        assert PACKAGE not in text, f"{name} holds the install path {PACKAGE}"
    assert '"source": "ampcert:configs/rules/default.yaml"' in written["verdicts.json"]
    assert '"certify": "ampcert:configs/rules/default.yaml"' in written["plan.json"]
    bf16 = next(t for n, t in written.items() if n.endswith("result.json") and '"precision": "bf16"' in t)
    assert "ampcert:configs/policies/torch-cpu.yaml" in bf16


# The job's accuracy comes from a helper module it imports (never named in argv).
HELPER_JOB = JOB.replace("import json, os, time\n", "import json, os, time\nfrom helper import BASE\n").replace(
    "0.7 + 0.05 * i", "BASE + 0.05 * i")


@pytest.mark.parametrize("where", ["untracked in git", "outside git"])
def test_resume_refuses_an_edited_helper_the_job_imports(tmp_path, run_cli, where):
    """job.py is committed and the helper.py it imports is not (or no git at all): editing the
    helper then resuming ran the new code beside the old results, with exit 0 and dirty: False."""
    import subprocess

    suite = _suite(tmp_path)
    (tmp_path / "job.py").write_text(HELPER_JOB)
    (tmp_path / "helper.py").write_text("BASE = 0.7\n")
    if where == "untracked in git":
        git = ["git", "-C", str(tmp_path), "-c", "user.email=t@t", "-c", "user.name=t"]
        subprocess.run([*git, "init", "-q"], check=True)
        subprocess.run([*git, "add", "job.py"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", "job"], check=True)
    out = tmp_path / "out"
    assert run_cli("run", suite, "--out", out, "--shard", "1/2", cwd=tmp_path).returncode == 0
    source = json.loads(ResultsDir(out).plan_file.read_text())["code"]["jobs"]["job"]
    if where == "untracked in git":
        assert source["git"]["dirty"] and set(source["git"]["untracked"]) == {"helper.py"}
    else:
        assert set(source["folder"]["files"]) == {"job.py", "helper.py"}  # not the results folder's files
    assert run_cli("run", "--resume", out, cwd=tmp_path).returncode == 0  # nothing changed: resumes
    (tmp_path / "helper.py").write_text("BASE = 0.6\n")
    proc = run_cli("run", "--resume", out, "--retry-failed", cwd=tmp_path)
    assert_one_line_error(proc, "planned with other code", "helper.py changed")
