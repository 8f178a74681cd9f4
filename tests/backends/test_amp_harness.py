"""ampcert's AMP as the harness uses it: suite policies, run ids, the audit command."""

from __future__ import annotations

import shutil

import pytest
from conftest import REPO
from factories import warm_cli  # the CLI forked warm: 2-3 s less a command than a cold start

from ampcert.errors import UserError
from ampcert.spec import expand, load_suite

EXAMPLE = REPO / "configs" / "policies" / "examples" / "cpu-lower-layer-norm.yaml"


def _suite(write_suite, policy_line: str, amp: str = "ampcert"):
    return write_suite(f"""
        name: t
        amp: {amp}
        {policy_line}
        precisions: [bf16]
        train: {{steps: 10}}
        workloads: [{{workload: digits}}]
        """)


def test_policy_is_found_beside_the_suite_and_hashed_into_run_ids(tmp_path, write_suite):
    shutil.copy(EXAMPLE, tmp_path / "mine.yaml")
    (custom,) = expand(load_suite(_suite(write_suite, "policy: mine.yaml")), "cpu")
    (default,) = expand(load_suite(_suite(write_suite, "")), "cpu")
    assert custom.policy == str((tmp_path / "mine.yaml").resolve())
    assert custom.policy_sha256 and custom.policy_sha256 != default.policy_sha256
    assert custom.run_id != default.run_id
    # Moving the file keeps the id (content, not path); editing it changes the id.
    (tmp_path / "moved").mkdir()
    shutil.copy(EXAMPLE, tmp_path / "moved" / "mine.yaml")
    (moved,) = expand(load_suite(_suite(write_suite, "policy: moved/mine.yaml")), "cpu")
    assert moved.run_id == custom.run_id
    (tmp_path / "mine.yaml").write_text(EXAMPLE.read_text().replace("layer_norm: lower_precision",
                                                                      "group_norm: lower_precision"))
    (edited,) = expand(load_suite(_suite(write_suite, "policy: mine.yaml")), "cpu")
    assert edited.run_id != custom.run_id


@pytest.mark.parametrize(
    "policy_text, fragment",
    [
        ("name: p\ndevice_type: cpu\nfamilies:\n  lower_precision: [no_such_op]\n", "no_such_op"),
        ("name: p\ndevice_type: cpu\nfamilies:\n  sometimes: [linear]\n", "sometimes"),
        ("name: p\ndevice_type: cpu\nfamilies:\n  lower_precision: [linear\n", "YAML"),
    ],
)
def test_bad_policy_in_a_suite_is_one_line_exit_2(tmp_path, write_suite, policy_text, fragment):
    (tmp_path / "bad.yaml").write_text(policy_text)
    proc = warm_cli("run", _suite(write_suite, "policy: bad.yaml"), "--dry-run")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("ampcert: error: ") and "suite.yaml: policy: " in line
    assert "bad.yaml" in line and fragment in line


def test_policy_needs_amp_ampcert(write_suite):
    with pytest.raises(UserError, match="applies to `amp: ampcert`, not `amp: native`"):
        load_suite(_suite(write_suite, "policy: torch-cpu", amp="native"))


def test_audit_command_agrees_on_the_shipped_cpu_policy():
    proc = warm_cli("audit", "--backend", "torch", "--device", "cpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    total = sum(1 for line in proc.stdout.splitlines() if line.split()[2:3] in (["yes"], ["NO"]))
    assert total > 100 and f"{total}/{total} ops agree with native torch.autocast" in proc.stdout


def test_audit_lists_a_user_policys_intended_differences():
    proc = warm_cli("audit", "--device", "cpu", "--policy", EXAMPLE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "differ from native torch.autocast, as this policy chooses: layer_norm" in proc.stdout


def test_audit_bad_input():
    for args, fragment in [(["--device", "tpu"], "--device"), (["--backend", "mxnet"], "--backend"),
                           (["--policy", "nope"], "nope"), (["--device", "cuda"], "cuda")]:
        proc = warm_cli("audit", *args)
        if args[1] == "cuda" and proc.returncode != 2:
            pytest.skip("a CUDA device is present")
        assert proc.returncode == 2 and fragment in proc.stderr and "Traceback" not in proc.stderr
