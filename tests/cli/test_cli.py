"""The command line as a user meets it: bad input is one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO, assert_one_line_error, cli_env, snapshot
from factories import warm_cli


@pytest.mark.parametrize(
    "text, fragments",
    [
        ("name: t\nworkloads: [{workload: nosuch}]\n", ["suite.yaml", "workloads[0]", "unknown workload"]),
        ("name: t\nprecisions: [fp64]\nworkloads: [{workload: digits}]\n", ["precisions[0]", "'fp64'"]),
        ("name: t\ntrain: {steps: -1}\nworkloads: [{workload: digits}]\n", ["train.steps", "greater than 0"]),
        ("name: t\nworkloads: [{workload: digits}, {workload: digits}]\n", ["duplicate workload entry"]),
        ("name: t\nworkloads: [{workload: digits\n", ["malformed YAML at line"]),
        ("name: t\nworkloads: [{workload: resnet, params: {data: cifar10, path: /no/such/cifar}}]\n",
         ["workloads[0](resnet): data: /no/such/cifar"]),
        ("name: t\nworkloads: [{workload: gpt, params: {data: text, path: /no/such/corpus.txt}}]\n",
         ["workloads[0](gpt): data: /no/such/corpus.txt"]),
    ],
)
def test_bad_suite_is_one_line_exit_2_and_output_untouched(tmp_path, write_suite, text, fragments):
    out = tmp_path / "existing"
    (out / "runs" / "r1").mkdir(parents=True)
    (out / "runs" / "r1" / "result.json").write_text('{"precious": true}')
    before = snapshot(out)
    proc = warm_cli("run", write_suite(text), "--out", out)
    assert_one_line_error(proc, *fragments)
    assert snapshot(out) == before


def test_missing_suite_file(tmp_path):
    assert_one_line_error(warm_cli("run", tmp_path / "nope.yaml"), "nope.yaml", "not found")


def test_refuses_non_empty_out_folder_and_keeps_it(tmp_path):
    out = tmp_path / "old"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    before = snapshot(out)
    proc = warm_cli("run", "suites/smoke.yaml", "--out", out)
    assert_one_line_error(proc, "not empty", "--resume")
    assert snapshot(out) == before


def test_unwritable_out_folder(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert_one_line_error(warm_cli("run", "suites/smoke.yaml", "--out", blocker / "sub"), "cannot write there")


def test_resume_needs_a_results_folder(tmp_path):
    assert_one_line_error(warm_cli("run", "--resume", tmp_path / "nope"), "--resume", "results folder not found")
    assert_one_line_error(warm_cli("run", "--resume", tmp_path), "not an ampcert results folder")
    assert_one_line_error(warm_cli("report", tmp_path), "no plan.json")


def test_dry_run_prints_the_matrix_and_writes_nothing(tmp_path):
    # from an empty working folder, where a run would write its default reports/<suite>-<time>/
    before = snapshot(REPO / "reports")
    proc = warm_cli("run", REPO / "suites" / "smoke.yaml", "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # 2 workloads x 2 precisions x 5 seeds, and a repeat of seed 0 each (the default rule pack's)
    assert "suite smoke: 24 runs on" in proc.stdout
    for precision in ("fp32", "bf16"):
        for workload in ("resnet", "gpt"):
            assert f"{workload}-{precision}-native-s0-" in proc.stdout
            assert f"{workload}-{precision}-native-s0-r1-" in proc.stdout
        assert f"{precision}: " in proc.stdout  # capability line per precision
    assert list(tmp_path.iterdir()) == []
    assert snapshot(REPO / "reports") == before


def test_list_and_env():
    listing = warm_cli("list")
    assert listing.returncode == 0 and "digits" in listing.stdout and "smoke" in listing.stdout
    env = warm_cli("env", "--json")
    assert env.returncode == 0, env.stderr
    fp = json.loads(env.stdout)
    assert fp["packages"]["torch"] and fp["cpu"]["logical_cores"] >= 1
    assert "avx2" in fp["cpu"]["flags"]
    # CPU-only: GPU telemetry is reported as unavailable with a reason, never faked.
    if not fp["gpu"].get("cuda_available"):
        assert "unavailable" in fp["gpu"].get("nvml", "unavailable")


# --------------------------------------------------------------------------- shipped suites


def test_list_names_the_shipped_suites_from_an_empty_folder(tmp_path):
    from ampcert import resources

    names = resources.shipped_names("suite")
    assert {"smoke", "vision", "numerics"} <= set(names)
    listing = warm_cli("list", cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    assert "no suites" not in listing.stdout
    data = json.loads(warm_cli("list", "--json", cwd=tmp_path).stdout)
    assert [s["name"] for s in data["suites"]] == list(names) and data["suite_files"] == []
    rows = {line.split()[0]: line for line in listing.stdout.splitlines() if line.split()}
    for suite in data["suites"]:  # a row each: the name, then its description
        assert suite["description"] and suite["description"] in rows[suite["name"]]
    # a folder's own suites/*.yaml are listed beside them; the checkout's (links to the shipped ones) are not
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "mine.yaml").write_text("name: mine\nworkloads: [{workload: digits}]\n")
    assert json.loads(warm_cli("list", "--json", cwd=tmp_path).stdout)["suite_files"] == ["suites/mine.yaml"]
    assert json.loads(warm_cli("list", "--json").stdout)["suite_files"] == []


def test_show_suite_prints_one_to_copy_and_run(tmp_path):
    import yaml

    from ampcert import resources
    from ampcert.spec import load_suite, parse_suite

    proc = warm_cli("show", "suite", "smoke", cwd=tmp_path)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    assert proc.stdout == resources.shipped_text("suite", "smoke")
    assert parse_suite(yaml.safe_load(proc.stdout), "smoke.yaml") == load_suite("smoke")
    (tmp_path / "copy.yaml").write_text(proc.stdout)
    dry = warm_cli("run", "copy.yaml", "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0 and "suite smoke:" in dry.stdout, dry.stderr


def test_run_by_shipped_name_and_a_path_wins(tmp_path, cli_here):
    by_name = warm_cli("run", "smoke", "--dry-run", cwd=tmp_path)  # a process of its own, as a user runs it
    assert by_name.returncode == 0 and "suite smoke:" in by_name.stdout, by_name.stderr
    assert list(tmp_path.iterdir()) == []
    # the checkout's suites/ (a link to the shipped ones) by path, as the README runs it
    here = cli_here("run", "suites/smoke.yaml", "--dry-run")  # in this process: no torch import each
    assert here.returncode == 0 and "suite smoke:" in here.stdout, here.stderr
    # a file of that name in the working folder wins over the shipped suite; a folder does not
    (tmp_path / "smoke").write_text("name: mine\nseeds: [0]\nprecisions: [fp32]\nworkloads: [{workload: digits}]\n")
    here = cli_here("run", "smoke", "--dry-run", cwd=tmp_path)
    assert here.returncode == 0 and "suite mine:" in here.stdout, here.stderr
    (tmp_path / "smoke").unlink()
    (tmp_path / "smoke").mkdir()
    here = cli_here("run", "smoke", "--dry-run", cwd=tmp_path)
    assert here.returncode == 0 and "suite smoke:" in here.stdout, here.stderr
    # a name ampcert does not ship, and a path that does not exist: one line each
    assert_one_line_error(warm_cli("run", "nosuch", "--dry-run", cwd=tmp_path), "nosuch",
                          "no suite of that name", "smoke", "vision")
    assert_one_line_error(warm_cli("run", "nosuch.yaml", "--dry-run", cwd=tmp_path), "nosuch.yaml", "not found")


def test_a_run_s_error_has_no_blank_line_before_it(tmp_path, write_suite):
    """The error of a run that stops while planning (inside the progress display) is the
    one line, with nothing before it: no stray blank line on stdout either."""
    suite = write_suite("name: t\nprecisions: [fp32, bf16]\ncertify: procurment\n"
                        "train: {steps: 4, eval_every: 2}\nworkloads: [{workload: digits}]\n")
    proc = warm_cli("run", suite, "--out", tmp_path / "out")
    assert_one_line_error(proc, "no shipped rule pack is called 'procurment'; did you mean 'procurement'?")
    assert proc.stdout == "" and proc.stderr.startswith("ampcert: error: "), repr(proc.stdout + proc.stderr)


@pytest.mark.parametrize("text, fragments", [
    ("certify: procurment\n", ["rules: no shipped rule pack is called 'procurment'", "did you mean 'procurement'?",
                               "shipped: default, fp8, procurement, recipes"]),
    ("amp: ampcert\npolicy: torch-cpuu\n", ["policy: no shipped policy is called 'torch-cpuu'",
                                            "did you mean 'torch-cpu'?", "shipped: jax, torch-cpu, torch-cuda"]),
    ("precision: [fp32, bf16]\n", ["precision: unknown field; did you mean `precisions`?", "valid fields: name,"]),
    ("precisions: bf16\n", ["precisions: expected a list, got 'bf16'; write [bf16]"]),
])
def test_mistyped_names_and_fields_name_what_was_meant(write_suite, text, fragments):
    from ampcert.resources import config_path

    proc = warm_cli("run", write_suite("name: t\n" + text + "workloads: [{workload: digits}]\n"), "--dry-run")
    assert_one_line_error(proc, *fragments)
    assert str(config_path()) not in proc.stderr and "Input should" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("triton", [True, False])
def test_with_triton_loaded_the_process_ends_without_teardown_and_keeps_its_exit_code(tmp_path, triton):
    """torch's CUDA builds load triton with Dynamo; its nanobind bindings print ~20 'leaked'
    lines when the interpreter finalizes them, after a command's last line (torch 2.15). With
    triton loaded, ampcert ends after its exit hooks, skipping the teardown (here: an object
    that speaks when finalized), and exits with the command's code all the same."""
    script = textwrap.dedent(f"""\
        import sys, types
        class Speaks:
            def __del__(self):
                print("teardown ran", flush=True)
        sys.modules["leaky"] = leaky = types.ModuleType("leaky")
        leaky.obj = Speaks()
        if {triton}:
            sys.modules["triton"] = types.ModuleType("triton")
        sys.argv = ["ampcert", "show", "suite", "no-such-suite"]
        from ampcert.cli import main
        main()
        """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path,
                          env=cli_env(), timeout=120)
    assert proc.returncode == 2 and "ampcert: error:" in proc.stderr
    assert ("teardown ran" in proc.stdout) is (not triton)
