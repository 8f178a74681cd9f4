"""Suite validation, matrix expansion and run ids."""

from __future__ import annotations

import os

import pytest
from conftest import REPO

from ampcert.errors import UserError
from ampcert.spec import MemorySweep, apply_capabilities, expand, load_suite, parse_suite

GOOD = """
name: t
precisions: [fp32, bf16]
seeds: [0, 1]
train: {steps: 20, eval_every: 10}
workloads:
  - workload: digits
  - workload: digits
    id: digits-wide
    params: {width: 32}
    seeds: [5]
"""


def test_expansion_order_and_overrides(write_suite):
    suite = load_suite(write_suite(GOOD))
    runs = expand(suite, "cpu")
    # a seed's precisions next to each other, so that they share the machine's state (the
    # in-night speedup, paired by seed, cancels what the machine does to both)
    assert [(r.label, r.precision, r.seed) for r in runs] == [
        ("digits", "fp32", 0), ("digits", "bf16", 0), ("digits", "fp32", 1), ("digits", "bf16", 1),
        ("digits-wide", "fp32", 5), ("digits-wide", "bf16", 5),
    ]
    # Defaults are filled in, so a changed default would change the run id.
    assert runs[0].params["width"] == 16 and runs[4].params["width"] == 32


def test_run_ids_are_stable_unique_and_content_derived(write_suite):
    a = expand(load_suite(write_suite(GOOD)), "cpu")
    b = expand(load_suite(write_suite(GOOD.replace("name: t", "name: renamed"))), "cpu")
    assert [r.run_id for r in a] == [r.run_id for r in b]  # the suite's name is not content
    assert len({r.run_id for r in a}) == len(a)
    c = expand(load_suite(write_suite(GOOD.replace("steps: 20", "steps: 21"))), "cpu")
    assert all(x.run_id != y.run_id for x, y in zip(a, c, strict=True))
    assert a[0].run_id.startswith("digits-fp32-native-s0-")
    assert expand(load_suite(write_suite(GOOD)), "cuda")[0].run_id != a[0].run_id


def test_explicit_default_param_gives_same_id(write_suite):
    plain = expand(load_suite(write_suite(GOOD)), "cpu")[0]
    explicit = expand(load_suite(write_suite(GOOD.replace("- workload: digits\n  - workload",
                                                           "- workload: digits\n    params: {width: 16}\n  - workload"))), "cpu")[0]
    assert plain.run_id == explicit.run_id


@pytest.mark.parametrize(
    "text, expected",
    [
        ("name: t\nworkloads: [{workload: nosuch}]\n", "workloads[0](nosuch): unknown workload 'nosuch'"),
        ("name: t\nprecisions: [fp4]\nworkloads: [{workload: digits}]\n", "precisions[0]: got 'fp4'"),
        ("name: t\ntrain: {steps: -3}\nworkloads: [{workload: digits}]\n", "train.steps: Input should be greater than 0"),
        ("name: t\nworkloads: [{workload: digits}, {workload: digits}]\n", "duplicate workload entry 'digits'"),
        ("name: t\nworkloads: [{workload: digits, params: {wdith: 3}}]\n",
         "params: wdith: unknown parameter; did you mean `width`?"),
        ("name: t\nworkloads: [{workload: digits}]\nbogus: 1\n", "bogus: unknown field"),
        ("name: t\ntrain: {target: 0.9}\nworkloads: [{workload: digits}]\n", "a `target` needs a `max_steps` cap"),
        ("name: t\nworkloads: []\n", "workloads: List should have at least 1 item"),
        ("name: t\nunaccelerated: cap\nworkloads: [{workload: digits}]\n", "needs `unaccelerated_max_steps`"),
        ("- just\n- a list\n", "expected a mapping of suite fields"),
        ("name: t\nworkloads: [{workload: 'fault_workloads:not_a_workload'}]\n", "lacks the workload protocol"),
        ("name: t\nworkloads: [{workload: 'no_such_pkg.mod:thing'}]\n", "does not import: ModuleNotFoundError"),
        ("name: t\nprecisions: [fp32, bf16]\ninject_slowdown: {fp16: 0.05}\nworkloads: [{workload: digits}]\n",
         "`inject_slowdown` names fp16, which no entry trains (the suite trains bf16, fp32)"),
        ("name: t\ninject_slowdown: {bf16: 1.5}\nworkloads: [{workload: digits}]\n",
         "inject_slowdown.bf16: Input should be less than or equal to 1"),
        ("name: t\ninject_slowdown: {all: 0.1}\nworkloads: [{command: [python, job.py], id: job}]\n",
         "the command entry 'job' trains itself"),
        ("name: t\nmemory: {batch_sizes: [16, 32]}\nworkloads: [{workload: digits}]\n",
         "memory.batch_sizes: List should have at least 3 items"),
        ("name: t\nmemory: {batch_sizes: [16, 32, 16]}\nworkloads: [{workload: digits}]\n",
         "`memory.batch_sizes` lists a size twice"),
        ("name: t\nmemory: {batch_sizes: [16, 32, 64], budgets: [lots]}\nworkloads: [{workload: digits}]\n",
         "memory.budgets[0]: could not parse value and unit from byte string"),
        ("name: t\nmemory: {batch_sizes: [16, 32, 64], budgets: [24 GiBs]}\nworkloads: [{workload: digits}]\n",
         "memory.budgets[0]: could not interpret byte unit: GiBs"),
        ("name: t\nmemory: {batch_sizes: [16, 32, 0]}\nworkloads: [{workload: digits}]\n",
         "memory.batch_sizes[2]: Input should be greater than 0"),
        ("name: t\nmemory: {batch_sizes: [16, 32, 64], steps: 1}\nworkloads: [{workload: digits}]\n",
         "memory.steps: Input should be greater than or equal to 2"),
        ("name: t\nmemory: {batch_sizes: [16, 32, 64]}\nworkloads: [{command: [python, job.py], id: job}]\n",
         "the command entry 'job' sets its own batch"),
    ],
)
def test_bad_suites_give_one_line_naming_file_and_field(write_suite, text, expected):
    path = write_suite(text)
    with pytest.raises(UserError) as info:
        load_suite(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    assert expected in message


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(UserError, match="suite file not found"):
        load_suite(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: t\nworkloads: [unclosed\n")
    with pytest.raises(UserError, match=r"bad.yaml: malformed YAML at line \d+"):
        load_suite(bad)
    with pytest.raises(UserError, match="expected a suite file, found a folder"):
        load_suite(tmp_path)


def _suite(policy: str, extra: str = ""):
    return parse_suite({"name": "t", "train": {"steps": 400}, "unaccelerated": policy,
                        "workloads": [{"workload": "digits"}], **({"unaccelerated_max_steps": 50} if extra else {})})


CAPS = {"fp32": {"accelerated": True, "note": "reference"},
        "bf16": {"accelerated": True, "note": "accelerated"},
        "fp16": {"accelerated": False, "note": "not accelerated on cpu: 0.01x"}}


def test_unaccelerated_runs_are_marked_never_silently_dropped():
    suite = _suite("run")
    runs = apply_capabilities(suite, expand(suite, "cpu"), CAPS)
    fp16 = [r for r in runs if r.precision == "fp16"][0]
    assert not fp16.accelerated and "not accelerated on cpu" in fp16.capability_note
    assert fp16.skip_reason is None and fp16.train.steps == 400


def test_unaccelerated_skip_and_cap_policies():
    suite = _suite("skip")
    by_prec = {r.precision: r for r in apply_capabilities(suite, expand(suite, "cpu"), CAPS)}
    assert "skipped by the suite's `unaccelerated: skip`" in by_prec["fp16"].skip_reason
    assert by_prec["bf16"].skip_reason is None

    suite = _suite("cap", extra="cap")
    by_prec = {r.precision: r for r in apply_capabilities(suite, expand(suite, "cpu"), CAPS)}
    assert by_prec["fp16"].train.steps == 50 and "capped at 50" in by_prec["fp16"].capability_note
    assert by_prec["fp32"].train.steps == 400


# --------------------------------------------------------------------------- messages that help


@pytest.mark.parametrize("text, where, close, fields", [
    # `precision:` for `precisions:`, at the top and in an entry: the closest field, and every valid one
    ("name: t\nprecision: [bf16]\nworkloads: [{workload: digits}]\n", ": precision: unknown field",
     "precisions", ["name", "precisions", "seeds", "workloads", "certify"]),
    ("name: t\nworkloads: [{workload: digits, precision: [fp32, bf16]}]\n",
     "workloads[0](digits).precision: unknown field", "precisions", ["workload", "params", "train", "seeds"]),
    ("name: t\nworkloads: [{workload: digits, train: {stepz: 5}}]\n", "train.stepz: unknown field", "steps",
     ["steps", "target", "max_steps", "eval_every"]),
    # a misspelled field is named even where pydantic first reports the field it left missing
    ("name: t\nworkloads: [{workload: digits, torchrun: {nproc: 2}}]\n", "torchrun.nproc: unknown field",
     "nproc_per_node", ["nproc_per_node", "nnodes"]),
])
def test_a_misspelled_field_names_the_closest_one_and_the_valid_fields(write_suite, text, where, close, fields):
    with pytest.raises(UserError) as info:
        load_suite(write_suite(text))
    message = str(info.value)
    assert "\n" not in message and where in message, message
    assert f"did you mean `{close}`?" in message, message
    listed = message.split("valid fields: ", 1)[1]
    assert all(f in listed.split(")")[0].split(", ") for f in fields), message


def test_an_unknown_workload_parameter_lists_the_workload_s_parameters(write_suite):
    from ampcert.workloads.digits import DigitsParams

    with pytest.raises(UserError) as info:
        load_suite(write_suite("name: t\nworkloads: [{workload: digits, params: {size: tiny}}]\n"))
    message = str(info.value)
    assert "workloads[0](digits).params: size: unknown parameter" in message, message
    assert f"(the parameters of workload digits: {', '.join(DigitsParams.model_fields)})" in message, message
    with pytest.raises(UserError, match="did you mean `size`"):
        load_suite(write_suite("name: t\nworkloads: [{workload: gpt, params: {sise: tiny}}]\n"))


@pytest.mark.parametrize("text, expected", [
    ("name: t\nprecisions: bf16\nworkloads: [{workload: digits}]\n",
     "precisions: expected a list, got 'bf16'; write [bf16] for a list of one"),
    ("name: t\nworkloads: [{workload: digits, precisions: bf16}]\n", "precisions: expected a list, got 'bf16'"),
    ("name: t\nseeds: 3\nworkloads: [{workload: digits}]\n", "seeds: expected a list, got 3"),
    ("name: t\ntrain: {steps: ten}\nworkloads: [{workload: digits}]\n",
     "train.steps: expected a whole number, got 'ten'"),
    ("name: t\ntrain: 5\nworkloads: [{workload: digits}]\n", "train: expected a mapping (key: value), got 5"),
    ("name: [a]\nworkloads: [{workload: digits}]\n", "name: expected text, got a list"),
    ("name: t\nworkloads: [{workload: digits, loss_scaling: maybe}]\n",
     "loss_scaling: expected true or false, got 'maybe'"),
    ("name: t\ntimeout_s: null\nworkloads: [{workload: digits}]\n", "timeout_s: expected a whole number, got nothing"),
    ("name: t\nworkloads: [{workload: digits, params: {lr: fast}}]\n", "params: lr: expected a number, got 'fast'"),
    ("name: t\nlauncher: torchrn\nworkloads: [{workload: digits}]\n",
     "launcher: got 'torchrn', expected 'process' or 'torchrun'; did you mean 'torchrun'?"),
    ("name: t\ntorchrun: {nnodes: 2}\nworkloads: [{workload: digits}]\n", "nproc_per_node: required, but missing"),
])
def test_a_value_of_the_wrong_type_is_said_in_plain_words(write_suite, text, expected):
    with pytest.raises(UserError) as info:
        load_suite(write_suite(text))
    message = str(info.value)
    assert expected in message, message
    assert "Input should" not in message and "valid" not in message and "Field required" not in message, message


def test_a_mistyped_policy_name_lists_the_shipped_ones(write_suite):
    from ampcert.amp.policy import POLICY_DIR, shipped_policy_names

    with pytest.raises(UserError) as info:
        load_suite(write_suite("name: t\namp: ampcert\npolicy: torch-cpuu\nworkloads: [{workload: digits}]\n"))
    message = str(info.value)
    assert ": policy: no shipped policy is called 'torch-cpuu'; did you mean 'torch-cpu'?" in message, message
    assert f"shipped: {', '.join(shipped_policy_names())}" in message and "torch-cuda" in message, message
    assert str(POLICY_DIR) not in message and "site-packages" not in message, message  # no path the user never typed
    with pytest.raises(UserError) as info:
        load_suite(write_suite("name: t\namp: ampcert\npolicy: mine/policy.yaml\nworkloads: [{workload: digits}]\n"))
    assert "mine/policy.yaml: expected an existing policy file, not found" in str(info.value)
    assert str(POLICY_DIR) not in str(info.value)



def test_an_injected_slowdown_changes_only_the_slowed_runs_ids():
    plain = parse_suite({"name": "t", "precisions": ["fp32", "bf16"], "workloads": [{"workload": "digits"}]})
    slowed = plain.model_copy(update={"inject_slowdown": {"bf16": 0.05}})
    before, after = expand(plain, "cpu"), expand(slowed, "cpu")
    assert [r.fault.injected_slowdown for r in after] == [0.0, 0.05]
    assert before[0].run_id == after[0].run_id and before[1].run_id != after[1].run_id
    # Not written where not set: results of ordinary runs keep their bytes.
    assert "injected_slowdown" not in before[1].model_dump_json()
    every = plain.model_copy(update={"inject_slowdown": {"all": 0.1}})
    assert [r.fault.injected_slowdown for r in expand(every, "cpu")] == [0.1, 0.1]


def test_a_memory_sweep_adds_short_runs_at_each_batch_beside_the_matrix():
    plain = parse_suite({"name": "t", "precisions": ["fp32", "bf16"], "seeds": [3, 4], "train": {"steps": 50},
                         "workloads": [{"workload": "digits"}]})
    swept = plain.model_copy(update={"memory": MemorySweep(batch_sizes=[8, 16, 32], budgets=["1GiB"], steps=3)})
    before, after = expand(plain, "cpu"), expand(swept, "cpu")
    assert [r.run_id for r in after[:len(before)]] == [r.run_id for r in before]  # the matrix is untouched
    sweep = after[len(before):]
    assert [(r.precision, r.sweep.batch_size, r.seed, r.train.steps) for r in sweep] == [
        (p, b, 3, 3) for p in ("fp32", "bf16") for b in (8, 16, 32)]
    assert all(r.is_memory_sweep and r.run_id.split("-")[-2] == f"b{r.sweep.batch_size}" for r in sweep)
    assert len({r.run_id for r in after}) == len(after)
    # Not written where not set: results of ordinary runs keep their bytes.
    assert "batch_size" not in before[0].model_dump(mode="json", exclude={"params"}) and not before[0].is_memory_sweep


def test_unaccelerated_cap_leaves_memory_sweep_runs_their_steps():
    suite = parse_suite({"name": "t", "precisions": ["fp32", "fp16"], "train": {"steps": 400}, "unaccelerated": "cap",
                         "unaccelerated_max_steps": 1, "memory": {"batch_sizes": [8, 16, 32], "steps": 4},
                         "workloads": [{"workload": "digits"}]})
    planned = apply_capabilities(suite, expand(suite, "cpu"), CAPS)
    capped = [r for r in planned if r.precision == "fp16" and not r.is_memory_sweep]
    swept = [r for r in planned if r.precision == "fp16" and r.is_memory_sweep]
    assert capped[0].train.steps == 1 and "capped at 1" in capped[0].capability_note
    assert [r.train.steps for r in swept] == [4, 4, 4]
    assert all("memory-sweep run is not capped" in r.capability_note for r in swept)


def test_a_framework_release_outside_the_tested_range_is_one_line_unless_allowed(tmp_path):
    """Installing ampcert never replaces a team's torch (the extra admits the tested range); a
    release outside it is named, with the range, before anything is planned or written."""
    from conftest import TESTS, assert_one_line_error, run_cli

    fake = tmp_path / "site" / "torch-2.16.0.dist-info"  # found before the real torch's metadata
    fake.mkdir(parents=True)
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.16.0\n")
    path = os.pathsep.join([str(tmp_path / "site"), str(TESTS), str(REPO)])
    proc = run_cli("run", REPO / "suites" / "smoke.yaml", "--dry-run", cwd=tmp_path, env={"PYTHONPATH": path})
    assert_one_line_error(proc, "torch 2.16.0 is installed; ampcert supports torch>=2.11,<2.16",
                          "AMPCERT_ALLOW_UNSUPPORTED=1")
    allowed = run_cli("run", REPO / "suites" / "smoke.yaml", "--dry-run", cwd=tmp_path,
                      env={"PYTHONPATH": path, "AMPCERT_ALLOW_UNSUPPORTED": "1"})
    assert allowed.returncode == 0 and "suite smoke: 24 runs" in allowed.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]  # nothing written either way


def test_a_whole_step_compiled_on_a_torch_that_cannot_trace_the_region_is_one_line(tmp_path):
    """torch 2.11's Dynamo does not trace ampcert's region entered inside a compiled step
    (amp/torch/support.py): planning says so, naming the release and what to change."""
    from conftest import TESTS, assert_one_line_error, run_cli

    fake = tmp_path / "site" / "torch-2.11.0+cu130.dist-info"
    fake.mkdir(parents=True)
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0+cu130\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(TESTS), str(REPO)])}
    suite = tmp_path / "step.yaml"
    suite.write_text("name: step\namp: ampcert\nprecisions: [fp32, bf16]\nseeds: [0]\ncompile: [true]\n"
                     "torch_compile: {scope: step}\nworkloads: [{workload: digits, train: {steps: 4, eval_every: 2}}]\n")
    proc = run_cli("run", suite, "--dry-run", cwd=tmp_path, env=env)
    assert_one_line_error(proc, "scope step compiles ampcert's autocast region inside the step",
                          "needs torch 2.13 or newer (this is torch 2.11)", "use scope forward")
    suite.write_text(suite.read_text().replace("scope: step", "scope: forward"))
    assert run_cli("run", suite, "--dry-run", cwd=tmp_path, env=env).returncode == 0


def test_a_run_spec_is_grouped_in_memory_and_stored_flat_as_schema_v1():
    """launch, sweep point and fault are groups a feature reads; a stored RunSpec (plan.json,
    result.json, report.json) keeps their fields flat, in their old order, and reads back whole."""
    import json

    from ampcert.report.model import json_schema
    from ampcert.spec import FaultInjection, Launch, RunSpec, SweepPoint

    suite = parse_suite({"name": "t", "precisions": ["fp32", "bf16"], "seeds": [0], "train": {"steps": 4},
                         "launcher": "torchrun", "torchrun": {"nproc_per_node": 2, "rdzv_id": "job"},
                         "inject_slowdown": {"bf16": 0.05},
                         "memory": {"batch_sizes": [8, 16, 32], "confirm": False},
                         "workloads": [{"workload": "digits"}]})
    runs = expand(suite, "cpu")
    slowed = next(r for r in runs if r.fault.injected_slowdown)
    point = next(r for r in runs if r.is_memory_sweep)
    assert slowed.launch == Launch(launcher="torchrun", nproc_per_node=2, rdzv_id="job") and slowed.world_size == 2
    assert slowed.fault == FaultInjection(injected_slowdown=0.05) and slowed.sweep == SweepPoint()
    assert point.sweep == SweepPoint(batch_size=8) and point.fault == FaultInjection()
    for run in (slowed, point):
        stored = json.loads(run.model_dump_json())
        assert not {"launch", "sweep", "fault"} & set(stored)
        keys = list(stored)
        assert keys[keys.index("repeat") + 1:keys.index("repeat") + 8] == [
            "launcher", "nproc_per_node", "nnodes", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "node_rank"]
        again = RunSpec.model_validate_json(run.model_dump_json())
        assert again == run and again.run_id == run.run_id
    assert json.loads(slowed.model_dump_json())["injected_slowdown"] == 0.05
    assert "batch_size" not in json.loads(slowed.model_dump_json())  # written only when set, as before
    assert json.loads(point.model_dump_json())["batch_size"] == 8
    # The published schema describes the stored form.
    stored_spec = json.loads(json_schema())["$defs"]["RunSpec"]["properties"]
    assert {"launcher", "nnodes", "batch_size", "injected_slowdown"} <= set(stored_spec)
    assert not {"launch", "sweep", "fault"} & set(stored_spec)


def test_a_run_spec_refuses_a_group_given_twice_and_a_job_given_twice_or_not_at_all():
    from pydantic import ValidationError

    from ampcert.own_job.entry import OwnJob
    from ampcert.spec import RunSpec, SweepPoint, TrainBudget

    base = {"suite": "s", "label": "digits", "workload": "digits", "params": {}, "backend": "torch",
            "amp": "native", "policy": None, "precision": "fp32", "seed": 0, "device": "cpu",
            "train": TrainBudget(steps=1), "timeout_s": 60}
    with pytest.raises(ValidationError, match="give `launch` or its fields"):
        RunSpec(**base, launch={"launcher": "torchrun", "nproc_per_node": 2}, nnodes=1)
    with pytest.raises(ValidationError, match="a run trains one job"):
        RunSpec(**{**base, "train": None})
    job = OwnJob(argv=["python", "train.py"], workdir="/tmp", metric="accuracy", higher_is_better=True)
    with pytest.raises(ValidationError, match="a run trains one job"):
        RunSpec(**base, command=job)
    with pytest.raises(ValidationError, match="an own job trains itself"):
        RunSpec(**{**base, "train": None}, command=job, injected_slowdown=0.1)
    with pytest.raises(ValidationError, match="needs its `batch_size`"):
        SweepPoint(confirms_budget=1 << 30)
    with pytest.raises(ValidationError, match="not below `nnodes`"):
        RunSpec(**base, launcher="torchrun", nproc_per_node=2, nnodes=2, node_rank=2)
