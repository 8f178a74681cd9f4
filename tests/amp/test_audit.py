"""The audit: ampcert's autocast vs native torch.autocast, op by op, on this machine's CPU."""

from __future__ import annotations

import textwrap
from importlib.resources import files
from pathlib import Path

import pytest
import torch

from ampcert.amp.audit import (
    KNOWN_DIVERGENCES,
    NATIVE_REFERENCE,
    SAMPLES,
    AuditRow,
    audit_torch,
    coverage,
    format_coverage,
    format_table,
    probe_native,
)
from ampcert.amp.policy import FAMILIES, load_policy, shipped_policy
from ampcert.amp.torch import kernels as torch_autocast_kernels
from ampcert.amp.torch.autocast import OP_TORCH_VERSIONS, op_in_torch, torch_version


@pytest.fixture(scope="module")
def cpu_rows() -> list[AuditRow]:
    return audit_torch("cpu")


def test_every_shipped_policy_op_has_sample_inputs():
    for device in ("cpu", "cuda"):
        missing = [op for op in shipped_policy(device).ops if op not in SAMPLES]
        assert missing == [], (device, missing)


def test_cpu_audit_agrees_on_100_percent_of_the_shipped_policy(cpu_rows):
    policy = shipped_policy("cpu")
    assert sorted(r.op for r in cpu_rows) == sorted(policy.ops)
    bad = [r for r in cpu_rows if not r.agree]
    assert bad == [], format_table(bad)
    for r in cpu_rows:
        assert r.family == policy.family(r.op)
        assert r.ampcert_dtype == r.native_dtype


def test_audit_rows_show_the_dtype_decisions(cpu_rows):
    by_op = {r.op: r for r in cpu_rows}
    assert by_op["linear"].native_dtype.startswith("0:f32>bf16 0:low>bf16")
    assert by_op["mse_loss"].ampcert_dtype == "f32>f32 low>f32 mix>f32"
    assert "mix>f32" in by_op["index_copy"].ampcert_dtype


def test_format_table_and_coverage(cpu_rows):
    text = format_table(cpu_rows)
    n = len(cpu_rows)
    assert text.splitlines()[-1] == f"{n}/{n} ops agree with native torch.autocast"
    assert "linear" in text and "lower_precision" in text
    cov = coverage(cpu_rows, "cpu", shipped_policy("cpu"))
    for fam in FAMILIES:
        assert cov[fam]["ops"] == cov[fam]["audited"] == cov[fam]["agree"]
        assert cov[fam]["native"] == len(NATIVE_REFERENCE["cpu"][fam])
    # everything native CPU autocast lists is covered except entries without a usable
    # public entry point (documented in torch-cpu.yaml)
    assert cov["lower_precision"]["missing"] == ["_convolution", "mkldnn_rnn_layer"]
    assert cov["fp32"]["missing"] == ["multilabel_margin_loss_forward"]
    assert cov["promote"]["missing"] == []
    assert "tensordot" in cov["lower_precision"]["extra"]  # composite, derived by probing
    assert "native" in format_coverage(cpu_rows, "cpu")


def test_ops_without_sample_inputs_are_reported_not_dropped(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(textwrap.dedent("""
        name: with-relu
        extends: torch-cpu
        overrides: {relu: fp32}
    """))
    rows = audit_torch("cpu", policy=load_policy(path), ops=["relu", "linear"])
    by_op = {r.op: r for r in rows}
    assert by_op["relu"].agree is False and by_op["relu"].note == "no sample inputs"
    assert by_op["linear"].agree is True
    assert coverage(rows)["fp32"] == {"ops": 1, "audited": 0, "agree": 0}


def test_audit_detects_a_policy_that_differs_from_native():
    pol = shipped_policy("cpu").with_overrides({"linear": "fp32", "mse_loss": "none", "cat": "lower_precision"})
    rows = {r.op: r for r in audit_torch("cpu", policy=pol, ops=["linear", "mse_loss", "cat", "mm"])}
    assert not rows["linear"].agree and "dtype f32 vs native bf16" in rows["linear"].note
    assert not rows["mse_loss"].agree and rows["mse_loss"].family == "none"
    assert not rows["cat"].agree
    assert rows["mm"].agree


def test_unlisted_ops_are_left_alone_like_native_except_known_composites():
    rows = audit_torch("cpu", unlisted=True, ops=[])
    unlisted = {r.op: r for r in rows}
    assert unlisted and all(r.family == "none" for r in rows)
    assert {"softmax", "layer_norm", "exp", "cumsum", "addmv"} <= set(unlisted)
    bad = {r.op for r in rows if not r.agree}
    assert bad <= set(KNOWN_DIVERGENCES["cpu"]), format_table([r for r in rows if not r.agree])


def test_probe_native_classifies_ops():
    got = probe_native(["linear", "mse_loss", "index_copy", "softmax", "tensordot", "reflection_pad2d"])
    assert got == {
        "linear": "lower_precision",
        "mse_loss": "fp32",
        "index_copy": "promote",
        "softmax": "none",
        "tensordot": "lower_precision",
        "reflection_pad2d": "fp32",
    }


def test_probe_agrees_with_the_shipped_cpu_policy():
    policy = shipped_policy("cpu")
    probed = probe_native(sorted(policy.ops))
    for op, fam in policy.ops.items():
        if not op_in_torch(op):  # e.g. cholesky on torch 2.14, linalg_matrix_sqrth on 2.13
            assert probed[op] == "unavailable", op
        elif op in ("cat", "stack"):  # cat's own type promotion hides autocast's promote
            assert probed[op] == "none"
        else:
            assert probed[op] == fam, op


# ---- torch versions ----------------------------------------------------------------
def test_torch_version_parses_release_local_and_dev_versions():
    assert torch_version("2.14.1+cu130") == (2, 14)
    assert torch_version("2.13.0+cpu") == (2, 13)
    assert torch_version("2.15.0a0+git1234abc") == (2, 15)
    assert torch_version("2.14.0rc1") == (2, 14)
    assert torch_version() == torch_version(torch.__version__)


def test_op_lifetimes_across_the_supported_range():
    for v in ((2, 11), (2, 12), (2, 13)):
        assert op_in_torch("cholesky", v) and op_in_torch("qr", v)
        assert not op_in_torch("linalg_matrix_sqrth", v)
    assert not op_in_torch("cholesky", (2, 14)) and not op_in_torch("qr", (2, 14))
    assert op_in_torch("linalg_matrix_sqrth", (2, 14))
    assert op_in_torch("linear", (2, 11)) and op_in_torch("linear", (2, 14))


def test_op_version_table_matches_the_installed_torch():
    """What the table says the installed torch lacks is uncallable, and the rest runs."""
    probed = probe_native(sorted(OP_TORCH_VERSIONS))
    for op in OP_TORCH_VERSIONS:
        assert op in SAMPLES, op
        assert (probed[op] == "unavailable") == (not op_in_torch(op)), (op, probed[op], torch.__version__)


def test_ops_this_torch_lacks_agree_with_a_note_naming_the_release(cpu_rows):
    absent = [r for r in cpu_rows if not op_in_torch(r.op)]
    # each release in range lacks one: linalg_matrix_sqrth before 2.14, cholesky/qr from 2.14 on
    assert absent or not (2, 11) <= torch_version() < (2, 15)
    for r in absent:
        assert r.agree and r.note.startswith(f"not in torch {torch.__version__} ("), r
        assert "removed in torch" in r.note or "added in torch" in r.note


def test_a_wrong_version_table_is_a_disagreement(monkeypatch):
    monkeypatch.setitem(OP_TORCH_VERSIONS, "mm", (None, torch_version()))  # "gone": but it runs
    (row,) = audit_torch("cpu", ops=["mm"])
    assert not row.agree and "update the table" in row.note


def _autocast_kernels(dispatch_key: str) -> set[str]:
    """aten ops with a native kernel on ``dispatch_key`` in the installed torch (overloads
    folded). ampcert's own kernels (amp/torch/kernels.py, registered once a region of the
    dispatcher engine has run in this process) are not native's: where one replaced
    native's, the dispatcher shows only ours, and its record says native had one."""
    ours = "amp/torch/kernels.py"
    ops = set()
    for name in torch._C._dispatch_get_all_op_names():
        if name.startswith("aten::") and any(
            line.startswith(dispatch_key + ":") and ours not in line for line in torch._C._dispatch_dump(name).splitlines()
        ):
            ops.add(name.removeprefix("aten::").split(".", 1)[0])
    kernels = torch_autocast_kernels.KERNELS.get("cpu" if dispatch_key == "AutocastCPU" else "cuda")
    return ops | (kernels.shadowed if kernels is not None else set())


#: AutocastCUDA kernels outside autocast_mode.cpp's lists: cuDNN's RNN wrapper (CUDA
#: builds only; KNOWN_DIVERGENCES["cuda"]["lstm"]).
_SPECIAL_KERNELS = {"cpu": set(), "cuda": {"_cudnn_rnn"}}


@pytest.mark.skipif(not hasattr(torch._C, "_dispatch_dump"), reason="torch has no dispatcher dump")
@pytest.mark.parametrize("device, key", [("cpu", "AutocastCPU"), ("cuda", "AutocastCUDA")])
def test_native_reference_lists_the_installed_torchs_autocast_kernels(device, key):
    """A torch upgrade that adds or drops an autocast op fails here, op sample or not.
    (The CUDA kernels are compiled into CPU builds too.)"""
    ref = {op for ops in NATIVE_REFERENCE[device].values() for op in ops}
    registered = _autocast_kernels(key) - _SPECIAL_KERNELS[device]
    assert sorted(registered - ref) == [], f"new in torch {torch.__version__}: add to NATIVE_REFERENCE"
    present = {op for op in ref if op_in_torch(op)}
    assert sorted(present - registered) == [], f"gone in torch {torch.__version__}: OP_TORCH_VERSIONS"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_audit_on_gpu():
    rows = audit_torch("cuda")
    assert [r for r in rows if not r.agree] == []


# ---- the audit's data files ------------------------------------------------------------
def test_the_tables_are_package_data():
    from ampcert.amp.audit_samples import DATA_DIR

    assert DATA_DIR == Path(str(files("ampcert").joinpath("amp", "data")))
    assert {p.name for p in DATA_DIR.glob("*.yaml")} == {"torch_audit_samples.yaml", "torch_autocast_reference.yaml"}
    assert set(NATIVE_REFERENCE) == {"cpu", "cuda"} and set(KNOWN_DIVERGENCES) == {"cpu", "cuda"}
    for fams in NATIVE_REFERENCE.values():
        assert list(fams) == list(FAMILIES) and all(isinstance(ops, tuple) for ops in fams.values())


def test_a_builder_is_the_call_it_spells():
    from ampcert.amp.audit_samples import Inputs, parse_builder

    thunk = parse_builder("F.linear(t(4, 8), t(6, 8), bias=t(6))")(Inputs("mix", torch.bfloat16, "cpu"))
    assert thunk.func is torch.nn.functional.linear
    (x, w), bias = thunk.args, thunk.keywords["bias"]
    assert (x.dtype, w.dtype, bias.dtype) == (torch.float32, torch.bfloat16, torch.bfloat16)
    assert x.shape == (4, 8) and bias.shape == (6,)
    same = Inputs("mix", torch.bfloat16, "cpu")  # the same generator, the same values, in order
    assert torch.equal(x, same(4, 8)) and torch.equal(w, same(6, 8))
    first = parse_builder({"let": {"q": "t(2, 3)"}, "call": "first(torch.sort(q, dim=-1))"})
    assert first(Inputs("f32", torch.bfloat16, "cpu"))().shape == (2, 3)  # the values only, not the indices
    cat = parse_builder("torch.cat((t(2), t(3)), dim=-1)")(Inputs("low", torch.float16, "cpu"))
    assert type(cat.args[0]) is tuple and cat().dtype == torch.float16


@pytest.mark.parametrize("text, why", [
    ("__import__('os').system('true')", "expected the op's entry point in ['F', 'torch']"),
    ("torch.exp(__import__('os').system('true'))", "unknown name '__import__'"),
    ("torch.Tensor.__class__.__subclasses__()", "'__subclasses__' is not one of the Tensor operators"),
    ("torch.exp(open('/etc/passwd'))", "unknown name 'open'"),
    ("torch.exp(t(4) * 2)", "unsupported syntax BinOp"),
    ("torch.exp((lambda: t(4))())", "unsupported syntax Lambda"),
    ("torch.exp(t.n_float)", "t.n_float: expected one of"),
    ("t(4)", "expected the op's entry point in ['F', 'torch']"),
    ("torch.exp(first(t(4)))", "first(...) only around the outermost call"),
    ("torch.exp(t(4)", "not a Python expression"),
    ("torch.exp", "expected a call of the op's entry point"),
])
def test_the_builder_language_refuses_anything_else(text, why):
    from ampcert.amp.audit_samples import SampleError, load_samples

    with pytest.raises(SampleError) as info:
        load_samples({"exp": ["torch.exp(t(4))", text]}, "samples.yaml")
    msg = str(info.value)
    assert msg.startswith("samples.yaml: exp[1]: ") and "\n" not in msg
    assert why in msg, msg


def test_missing_data_is_a_one_line_reinstall_error(tmp_path, monkeypatch):
    import ampcert.amp.audit_samples as samples_mod

    monkeypatch.setattr(samples_mod, "DATA_DIR", tmp_path)
    with pytest.raises(samples_mod.SampleError, match="missing from this installation .* reinstall ampcert"):
        samples_mod.read_data("torch_audit_samples.yaml")
    (tmp_path / "bad.yaml").write_text("a: [1\n")
    with pytest.raises(samples_mod.SampleError, match="bad.yaml: expected well-formed YAML"):
        samples_mod.read_data("bad.yaml")
