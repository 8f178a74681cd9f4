"""Policy files: loading, derivation, hashing and one-line validation errors."""

from __future__ import annotations

import dataclasses
import hashlib
import textwrap
from pathlib import Path

import pytest

from ampcert.amp.policy import (
    FAMILIES,
    POLICY_DIR,
    OpPolicy,
    PolicyError,
    load_policy,
    shipped_policy,
)
from ampcert.amp.torch.autocast import OP_TORCH_VERSIONS, known_op_names, op_callables, op_in_torch

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "policy.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_policy_dir_is_repo_configs():
    assert POLICY_DIR == REPO / "ampcert" / "configs" / "policies"
    assert (REPO / "configs" / "policies").resolve() == POLICY_DIR  # the checkout's link


def test_shipped_cpu_policy_shape():
    pol = shipped_policy("cpu")
    assert isinstance(pol, OpPolicy)
    assert (pol.name, pol.device_type) == ("torch-cpu", "cpu")
    assert pol.source == POLICY_DIR / "torch-cpu.yaml"
    assert pol.sha256 == hashlib.sha256(pol.source.read_bytes()).hexdigest()
    sizes = pol.family_sizes()
    assert set(sizes) == set(FAMILIES)
    assert sizes["lower_precision"] >= 20 and sizes["fp32"] >= 80 and sizes["promote"] == 3
    assert sizes["fp32_with_dtype"] == 0 and sizes["banned"] == 0  # CPU autocast has neither
    assert pol.family("linear") == "lower_precision"
    assert pol.family("cross_entropy_loss") == "fp32"
    assert pol.family("cat") == "promote"
    assert pol.family("softmax") is None and pol.family("relu") is None
    assert "tensordot" in pol.uncast_if_mixed


def test_shipped_cuda_policy_shape():
    pol = shipped_policy("cuda:0")
    assert pol.device_type == "cuda"
    assert pol.ops_in("banned") == ("binary_cross_entropy",)
    assert pol.family("softmax") == "fp32_with_dtype"
    assert pol.family("layer_norm") == "fp32"
    assert pol.family("scaled_dot_product_attention") == "lower_precision"
    assert pol.family("scatter_add") == "promote"


def test_shipped_policy_is_frozen_and_cached():
    pol = shipped_policy("cpu")
    with pytest.raises(dataclasses.FrozenInstanceError):
        pol.name = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        pol.ops["linear"] = "fp32"  # type: ignore[index]
    assert shipped_policy("cpu") is pol
    assert hash(pol) == hash(shipped_policy("cpu"))


def test_every_shipped_op_maps_to_a_torch_callable():
    for device in ("cpu", "cuda"):
        for op in shipped_policy(device).ops:
            assert op in known_op_names()
            # an op of another torch release in range (OP_TORCH_VERSIONS) may have none here
            assert op_callables(op) or not op_in_torch(op), op


def test_a_policy_may_name_ops_of_other_torch_releases_in_range(tmp_path):
    """linalg_matrix_sqrth (torch >= 2.14) and cholesky (torch < 2.14) load on any torch."""
    path = write(tmp_path, "name: p\ndevice_type: cpu\nfamilies:\n  fp32: [linalg_matrix_sqrth, cholesky]\n")
    assert load_policy(path).family("linalg_matrix_sqrth") == "fp32"
    assert set(OP_TORCH_VERSIONS) <= known_op_names()


def test_load_by_name_and_by_path_agree():
    by_name = load_policy("torch-cuda")
    by_path = load_policy(POLICY_DIR / "torch-cuda.yaml")
    assert by_name.ops == by_path.ops
    assert by_name.sha256 == by_path.sha256


def test_example_policy_extends_torch_cuda():
    pol = load_policy(REPO / "configs/policies/examples/fp32-attention-softmax.yaml")
    base = shipped_policy("cuda")
    assert pol.device_type == "cuda" and pol.extends == "torch-cuda"
    for op in ("scaled_dot_product_attention", "bmm", "baddbmm", "softmax", "log_softmax"):
        assert pol.family(op) == "fp32"
    changed = {op for op in base.ops if pol.family(op) != base.family(op)}
    assert changed == {"scaled_dot_product_attention", "bmm", "baddbmm", "softmax", "log_softmax"}
    assert pol.effective_sha256 != base.effective_sha256


def test_extends_overrides_and_none_removal(tmp_path):
    path = write(tmp_path, """
        name: mine
        extends: torch-cpu
        families:
          fp32: [softmax]
        overrides:
          layer_norm: lower_precision
          linear: none
          prod: fp32_with_dtype
    """)
    pol = load_policy(path)
    assert pol.device_type == "cpu"
    assert pol.family("softmax") == "fp32"
    assert pol.family("layer_norm") == "lower_precision"
    assert pol.family("linear") is None
    assert pol.family("prod") == "fp32_with_dtype"
    assert pol.family("conv2d") == "lower_precision"  # inherited
    assert pol.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_with_overrides_programmatic():
    base = shipped_policy("cpu")
    pol = base.with_overrides({"softmax": "fp32", "mm": "none"}, name="derived")
    assert pol.name == "derived" and pol.family("softmax") == "fp32" and pol.family("mm") is None
    assert base.family("softmax") is None  # base untouched
    with pytest.raises(PolicyError, match="unknown op"):
        base.with_overrides({"softmaxx": "fp32"})


BAD_CASES = {
    "unknown_op": (
        """
        name: bad
        device_type: cpu
        families:
          fp32: [softmax, softmaxx]
        """,
        ["families.fp32[1]", "unknown op 'softmaxx'"],
    ),
    "unknown_family": (
        """
        name: bad
        device_type: cpu
        families:
          fp16: [linear]
        """,
        ["families.fp16", "expected a family in"],
    ),
    "op_in_two_families": (
        """
        name: bad
        device_type: cpu
        families:
          fp32: [softmax]
          lower_precision: [linear, softmax]
        """,
        ["families.lower_precision[1]", "'softmax' in both 'fp32' and 'lower_precision'"],
    ),
    "op_listed_twice": (
        """
        name: bad
        device_type: cpu
        families:
          fp32: [softmax, softmax]
        """,
        ["families.fp32[1]", "listed twice"],
    ),
    "malformed_yaml": (
        """
        name: bad
        families:
          fp32: [softmax
        """,
        ["YAML", "expected well-formed YAML", "line"],
    ),
    "families_not_a_list": (
        """
        name: bad
        device_type: cpu
        families:
          fp32: softmax
        """,
        ["families.fp32", "expected a list of op names, got str 'softmax'"],
    ),
    "op_not_a_string": (
        """
        name: bad
        device_type: cpu
        families:
          fp32: [3]
        """,
        ["families.fp32[0]", "expected an op name (string), got int 3"],
    ),
    "missing_name": (
        """
        device_type: cpu
        families: {fp32: [softmax]}
        """,
        ["name", "expected a non-empty string"],
    ),
    "bad_device": (
        """
        name: bad
        device_type: tpu
        families: {fp32: [softmax]}
        """,
        ["device_type", "expected one of"],
    ),
    "unknown_key": (
        """
        name: bad
        device_type: cpu
        familes: {fp32: [softmax]}
        """,
        ["familes", "expected one of the keys"],
    ),
    "top_level_list": (
        """
        - softmax
        """,
        ["top level", "expected a mapping"],
    ),
    "in_place_op": (
        """
        name: bad
        device_type: cpu
        families: {fp32: [exp_]}
        """,
        ["families.fp32[0]", "in-place"],
    ),
    "override_bad_family": (
        """
        name: bad
        extends: torch-cpu
        overrides: {softmax: fp64}
        """,
        ["overrides.softmax", "expected a family in"],
    ),
    "extends_missing": (
        """
        name: bad
        extends: no-such-policy
        """,
        ["extends", "expected a shipped policy name", "'no-such-policy'"],
    ),
    "device_mismatch_with_base": (
        """
        name: bad
        extends: torch-cpu
        device_type: cuda
        """,
        ["device_type", "expected 'cpu'"],
    ),
    "name_with_control_characters": (
        """
        name: "mine\\e[31m"
        device_type: cpu
        families: {fp32: [softmax]}
        """,
        ["name", "expected one line of printable text"],
    ),
    "description_with_control_characters": (
        """
        name: mine
        description: "fine\\x07"
        device_type: cpu
        families: {fp32: [softmax]}
        """,
        ["description", "expected printable text"],
    ),
    "shipped_name_for_other_ops": (
        """
        name: torch-cpu
        extends: torch-cpu
        overrides: {softmax: fp32}
        """,
        ["name: expected a name of its own", "'torch-cpu'", "extends: torch-cpu"],
    ),
    "uncast_if_mixed_not_in_policy": (
        """
        name: bad
        device_type: cpu
        families: {fp32: [softmax]}
        uncast_if_mixed: [tensordot]
        """,
        ["uncast_if_mixed[0]", "in a family"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_validation_errors_are_one_line_and_name_file_and_field(tmp_path, case):
    text, fragments = BAD_CASES[case]
    path = write(tmp_path, text, name=f"{case}.yaml")
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    msg = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "\n" not in msg
    assert str(path) in msg
    for frag in fragments:
        assert frag in msg, (frag, msg)


def test_extends_cycle_is_reported(tmp_path):
    write(tmp_path, "name: a\nextends: b.yaml\n", name="a.yaml")
    write(tmp_path, "name: b\nextends: a.yaml\n", name="b.yaml")
    with pytest.raises(PolicyError) as info:
        load_policy(tmp_path / "a.yaml")
    assert "extends" in str(info.value) and "cycle" in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_file_and_unknown_device():
    with pytest.raises(PolicyError, match="expected an existing policy file"):
        load_policy("/nonexistent/policy.yaml")
    with pytest.raises(PolicyError, match="device_type"):
        shipped_policy("tpu")


# ---- fields a file cannot set ------------------------------------------------------
def test_the_effective_digest_is_computed_never_given():
    with pytest.raises(TypeError, match="effective_sha256"):
        OpPolicy(name="p", device_type="cpu", ops={"mm": "fp32"}, effective_sha256="0" * 64)  # type: ignore[call-arg]
    pol = OpPolicy(name="p", device_type="cpu", ops={"mm": "fp32"})
    assert pol.effective_sha256 == dataclasses.replace(pol, name="q").effective_sha256 != ""


def test_a_file_can_set_none_of_the_computed_fields(tmp_path):
    """sha256, source and effective_sha256 describe the file; a file naming them is refused."""
    for key in ("sha256", "effective_sha256", "source", "ops"):
        path = write(tmp_path, f"name: p\ndevice_type: cpu\nfamilies: {{fp32: [mm]}}\n{key}: x\n", name=f"{key}.yaml")
        with pytest.raises(PolicyError, match=f"{key}: expected one of the keys"):
            load_policy(path)


def test_a_verbatim_copy_of_a_shipped_policy_keeps_its_name(tmp_path):
    """`ampcert show policy torch-cpu > mine.yaml` loads: it is that policy. Once its ops
    differ it may no longer carry the shipped name (see BAD_CASES)."""
    shipped = shipped_policy("cpu")
    copy = write(tmp_path, shipped.source.read_text(), name="mine.yaml")
    pol = load_policy(copy)
    assert pol.name == "torch-cpu" and pol.effective_sha256 == shipped.effective_sha256
    assert pol.source == copy.resolve()


def test_a_shipped_policy_is_named_by_its_file(tmp_path, monkeypatch):
    import ampcert.amp.policy as policy_mod

    (tmp_path / "torch-cpu.yaml").write_text(shipped_policy("cpu").source.read_text())
    (tmp_path / "torch-other.yaml").write_text(shipped_policy("cpu").source.read_text())
    monkeypatch.setattr(policy_mod, "POLICY_DIR", tmp_path)
    assert load_policy(tmp_path / "torch-cpu.yaml").name == "torch-cpu"
    with pytest.raises(PolicyError, match="name: expected 'torch-other' .a shipped policy is named by its file."):
        load_policy(tmp_path / "torch-other.yaml")
