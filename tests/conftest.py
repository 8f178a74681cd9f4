"""Shared helpers: run the real CLI in a subprocess, write suite files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

# Under pytest-xdist (`-n 2` on the 2-core CI machine) each worker, and each process it
# starts (the CLI, its forkserver and workers inherit the environment), computes with one
# OpenMP thread: two processes that each spin a thread per core fight over the cores, and a
# torch matmul then runs several times slower (measured: a plugin + certify pair of test
# files, 113 s -> 90 s). The serial run, where speed is under test, keeps the defaults.
# XLA's CPU backend likewise: one Eigen thread, no intra-op pool (the JAX suite of
# test_jax_backend.py: 96 -> 88 s of CPU alone on this 2-core machine, for the same runs).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

# The README's test command installs with `pip install --no-compile` (compiling all of torch,
# transformers, JAX and Ray cost ~90 s of the 2-core CI machine, for modules the tests mostly
# never import). So the first interpreter to import a module compiles it, and every later
# one (the tests start hundreds: CLIs, workers, nodes) must find the bytecode it wrote:
# where PYTHONDONTWRITEBYTECODE is set, each would compile torch again (~12 s of CPU).
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    # tests/ on the path makes tests/fault_workloads.py importable as a plugin workload.
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(REPO), env.get("PYTHONPATH", "")])
    env["COLUMNS"] = "200"
    return env


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 300,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``ampcert ARGS`` in a subprocess; ``env`` is laid over :func:`cli_env`."""
    return subprocess.run(
        [sys.executable, "-m", "ampcert", *map(str, args)],
        cwd=cwd or REPO, env=cli_env() | (env or {}), capture_output=True, text=True, timeout=timeout,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    """Bad input as the CLI must report it: exit 2, no traceback, one ``ampcert: error:``
    line on stderr holding every fragment."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ampcert: error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture(autouse=True)
def _deterministic_algorithms_restored():
    """A test that trains in its own process leaves torch as it found it: torch_backend.train
    turns deterministic algorithms on for the process (a worker's whole life), and an op
    without a deterministic kernel then raises in whatever test the process runs next."""
    torch = sys.modules.get("torch")
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
              ) if torch else (False, False)
    yield
    torch = sys.modules.get("torch")
    if torch is not None and (torch.are_deterministic_algorithms_enabled(),
                              torch.is_deterministic_algorithms_warn_only_enabled()) != before:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


@pytest.fixture
def cli_here(monkeypatch, capsys):
    """``ampcert ARGS`` through the entry point (``cli.main``) in this process, in the folder
    ``cwd``, as :func:`run_cli`'s CompletedProcess: exit code and streams as a user sees them
    (errors are main()'s one line). For commands whose process start is not under test:
    each cold ``ampcert run`` or dry run imports torch for its device probe."""
    from ampcert.cli import main

    def run(*args: object, cwd: Path = REPO) -> subprocess.CompletedProcess:
        argv = ["ampcert", *map(str, args)]
        with monkeypatch.context() as m:
            m.chdir(cwd)
            m.setattr(sys, "argv", argv)
            capsys.readouterr()
            with pytest.raises(SystemExit) as exit_:
                main()
            out, err = capsys.readouterr()
        code = exit_.value.code
        return subprocess.CompletedProcess(argv, code if isinstance(code, int) else 1, out, err)

    return run


@pytest.fixture
def write_suite(tmp_path):
    def write(text: str, name: str = "suite.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes, to prove nothing was touched."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def chromium() -> str | None:
    import shutil

    return shutil.which("chromium") or shutil.which("chromium-browser")


# Each test file's seconds in a CI run (its tests' setup, call and teardown summed; files under
# 5 s left out). Refresh after a change of weight, from a run's JUnit XML:
#   pytest -n 2 --dist loadfile -m 'not serial' --junitxml=ci.xml && python tests/file_seconds.py ci.xml
FILE_SECONDS = TESTS / "file_seconds.json"


def pytest_configure(config):
    # `--dist loadfile` hands whole files to the workers in the order the queue holds them,
    # which xdist sorts by test count: the files of a few long tests (the wheel's, the own-job
    # suite's: minutes each) came last, and one worker ran them alone while the other had
    # nothing left. The queue keeps the collection order instead, longest first (below).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_ignore_collect(collection_path, config):
    """The README's second run (`-m serial`) imports only the test files that name the mark:
    importing every test module (torch, JAX, Ray, transformers) to deselect all but a few
    tests cost 13 s of a 60 s run. A test marked serial is marked in its own file."""
    if (config.option.markexpr.strip() == "serial" and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_") and "serial" not in collection_path.read_text()):
        return True
    return None


def pytest_collection_modifyitems(config, items):
    """Files longest first (FILE_SECONDS; a stable sort, so each file's tests stay
    together and in order). `gpu` tests run where CUDA is (nox -s gpu), `browser` tests
    where Chromium is installed (nox -s browser); elsewhere they are skipped, visibly."""
    seconds = json.loads(FILE_SECONDS.read_text())
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::", 1)[0], 0))
    try:
        import torch
    except ImportError:  # a torch-free JAX environment (nox -s jax_current): no CUDA through torch
        torch = None

    no_gpu = torch is None or not torch.cuda.is_available()
    no_browser = chromium() is None
    for item in items:
        if "gpu" in item.keywords and no_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (run `nox -s gpu` on a GPU machine)"))
        if "browser" in item.keywords and no_browser:
            item.add_marker(pytest.mark.skip(reason="needs Chromium (apt-get install chromium; nox -s browser)"))


@pytest.fixture
def python_engine(monkeypatch):
    """Every ampcert torch region decided by the Python engine (the TorchFunctionMode), never
    by the dispatcher's kernels (amp/torch/kernels.py): for the tests of what only
    the Python engine does (its weight cache, its fast path, the nn.RNN decomposition, its
    trace under torch.compile)."""
    from ampcert.amp.torch import autocast as torch_autocast

    monkeypatch.setattr(torch_autocast, "_dispatcher_serial", lambda key: -1)
