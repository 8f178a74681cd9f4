"""The documentation cannot rot: every `runnable` block in docs/*.md runs, in page order,
in one scratch folder, and every suite field is documented."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import REPO

DOCS = REPO / "docs"
FENCE = re.compile(r"^```(\w+) runnable\n(.*?)^```", re.S | re.M)


def pages() -> list[Path]:
    """Pages in the order docs/README.md lists them."""
    index = (DOCS / "README.md").read_text()
    return [DOCS / name for name in re.findall(r"\]\(([\w-]+\.md)\)", index)]


def blocks(page: Path) -> list[tuple[str, str]]:
    return FENCE.findall(page.read_text())


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    folder = tmp_path_factory.mktemp("docs")
    for name in ("suites", "configs", "examples"):
        (folder / name).symlink_to(REPO / name)
    return folder


def _base_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["COLUMNS"] = "160"
    return env


# The blocks' `ampcert` and `python` commands (python blocks are `python -c CODE`) run warm:
# forked from a server that has imported the heavy libraries, as tests/factories.py's WarmCLI
# forks `ampcert` (~0.5 s a command, not 3; a python block saves torch's import, ~2 s). Each
# child is the command as an interpreter started there runs it: its argv, working folder,
# environment, standard streams (pipes and heredocs work) and sys.path, including a
# PYTHONPATH the block sets (`PYTHONPATH=examples/custom_workload/src ampcert ...`; relative
# entries from its folder, as at startup; an entry holding a module the server has already
# imported fails the block rather than run it otherwise). It ends as an interpreter ends
# (non-daemon threads joined, atexit handlers run). Any other form of `python` (an option, no
# arguments) execs the real interpreter, and so does what a block starts with sys.executable
# (own-job.md's command workload). How commands start cold is tested by test_cli_imports.py
# and test_wheel.py.
_SERVER = r"""
import atexit, json, os, runpy, select, signal, socket, sys, threading, traceback, types
import numpy, pandas, scipy.stats, yaml, pydantic, jinja2, psutil  # noqa: E401
import matplotlib
matplotlib.use("svg")
import matplotlib.pyplot  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ed25519  # noqa: E402
try:
    import torch  # noqa: F401
except ImportError:  # a torch-free JAX environment (nox -s jax_current)
    pass


def python_path(env):
    # PYTHONPATH as an interpreter reads it at startup: every entry absolute ('' is the folder)
    raw = env.get("PYTHONPATH", "")
    return [os.path.abspath(p) for p in raw.split(os.pathsep)] if raw else []


OWN = python_path(os.environ)
SYSTEM = [p for p in sys.path[1:] if p not in OWN]  # the standard library and site-packages


def run(prog, args):
    extra = [p for p in python_path(os.environ) if p not in OWN]
    loaded = {name.partition(".")[0] for name in sys.modules}
    shadows = sorted({name.removesuffix(".py") for p in extra if os.path.isdir(p) for name in os.listdir(p)} & loaded)
    if shadows:  # a cold interpreter would import these from PYTHONPATH, not what the server has loaded
        raise SystemExit(f"warm docs server: PYTHONPATH holds {shadows}, imported before it was set; run cold")
    path = python_path(os.environ) + SYSTEM
    if prog == "ampcert":  # the console script: its folder first on sys.path
        sys.path[:] = [os.path.dirname(sys.executable), *path]
        sys.argv = ["ampcert", *args]
        runpy.run_module("ampcert", run_name="__main__", alter_sys=True)
    elif args[0] == "-m":
        sys.path[:] = [os.getcwd(), *path]
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif args[0] in ("-c", "-"):
        sys.path[:] = ["", *path]
        code, name = (args[1], "<string>") if args[0] == "-c" else (sys.stdin.read(), "<stdin>")
        sys.argv = ["-c", *args[2:]] if args[0] == "-c" else args
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(code, name, "exec"), main.__dict__)
    else:
        sys.path[:] = [os.path.dirname(os.path.abspath(args[0])), *path]
        sys.argv = args
        runpy.run_path(args[0], run_name="__main__")


listener = socket.socket(socket.AF_UNIX)
listener.bind(sys.argv[1])
listener.listen(16)
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reap themselves
print("ready", flush=True)
while True:
    if sys.stdin in select.select([listener, sys.stdin], [], [])[0]:
        raise SystemExit  # the test process is gone (stdin closed): so is its server
    conn, _ = listener.accept()
    if os.fork():
        conn.close()
        continue
    code = 70
    try:
        listener.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the command waits for its own children
        data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        req = json.loads(data)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        conn.sendall(b"%d\n" % os.getpid())
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.stdin, sys.stdout, sys.stderr = (open(0, closefd=False), open(1, "w", closefd=False),
                                             open(2, "w", closefd=False))
        try:
            run(req["argv"][0], req["argv"][1:])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, int) and exc.code is not None:
                print(exc.code, file=sys.stderr)
        except BaseException as exc:
            tb = exc.__traceback__
            for _ in range(2):  # past this loop's and run()'s frames: the command's, as a cold traceback shows
                tb = tb.tb_next or tb
            traceback.print_exception(type(exc), exc, tb)
            code = 1
        getattr(threading, "_shutdown", lambda: None)()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        conn.sendall(b"%d\n" % code)
    finally:
        os._exit(code)
"""

# `ampcert` and `python` on PATH: hand argv, folder, environment and standard streams to the server.
_SHIM = """#!{python} -S
import json, os, socket, sys
argv = [os.path.basename(sys.argv[0]), *sys.argv[1:]]
if argv[0] == "python" and not (len(argv) > 2 and argv[1] in ("-c", "-m") or len(argv) > 1 and (
        argv[1] == "-" or not argv[1].startswith("-"))):
    os.execv({python!r}, [{python!r}, *argv[1:]])
sock = socket.socket(socket.AF_UNIX)
sock.connect({socket!r})
socket.send_fds(sock, [json.dumps({{"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}}).encode()], [0, 1, 2])
replies = sock.makefile("rb")
replies.readline()
code = replies.readline()
sys.exit(int(code) if code.strip() else 128 + 9)
"""


@pytest.fixture(scope="module")
def warm_bin():
    """A folder with `ampcert` and `python` that run through a warm server (for the blocks' PATH)."""
    folder = Path(tempfile.mkdtemp(prefix="docs-warm-"))
    sock = str(folder / "socket")
    server = subprocess.Popen([sys.executable, "-c", _SERVER, sock], env=_base_env(), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    try:
        assert server.stdout.readline() == b"ready\n", "the warm server did not start"
        (folder / "bin").mkdir()
        for name in ("ampcert", "python"):
            (folder / "bin" / name).write_text(_SHIM.format(python=sys.executable, socket=sock))
            (folder / "bin" / name).chmod(0o755)
        yield folder / "bin"
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(folder, ignore_errors=True)


def _env(warm_bin: Path) -> dict[str, str]:
    env = _base_env()
    env["PATH"] = os.pathsep.join([str(warm_bin), env["PATH"]])
    return env


def test_the_index_lists_every_page():
    listed = {p.name for p in pages()}
    assert listed == {p.name for p in DOCS.glob("*.md")} - {"README.md"}
    assert all(p.is_file() for p in pages())


@pytest.mark.parametrize("page", [p.name for p in pages()])
def test_runnable_blocks(page, scratch, warm_bin):
    for lang, code in blocks(DOCS / page):
        if lang == "python":
            cmd = [str(warm_bin / "python"), "-c", code]
        else:
            assert lang == "bash", lang
            cmd = ["bash", "-o", "pipefail", "-c", code]
        proc = subprocess.run(cmd, cwd=scratch, env=_env(warm_bin), capture_output=True, text=True, timeout=600)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"{page}: block failed:\n{code}\n---\n{out[-3000:]}"
        assert "Traceback" not in out, f"{page}:\n{code}\n---\n{out[-3000:]}"


def test_every_suite_field_is_documented():
    from ampcert.spec import (
        Fp8,
        MemorySweep,
        SlurmOptions,
        Submission,
        Suite,
        TelemetryConfig,
        TorchCompile,
        TrainBudget,
        WorkloadEntry,
    )

    text = (DOCS / "suites.md").read_text()
    for model in (Suite, WorkloadEntry, TrainBudget, TelemetryConfig, Submission, TorchCompile, Fp8,
                  SlurmOptions, MemorySweep):
        for name in model.model_fields:
            assert f"| `{name}` |" in text, f"{model.__name__}.{name} is not in docs/suites.md"


def test_readme_links_the_docs():
    assert "docs/README.md" in (REPO / "README.md").read_text()


def _test_command() -> str:
    """The README's command that runs the tests (the block after "Run the tests:")."""
    after = (REPO / "README.md").read_text().split("Run the tests:", 1)[1]
    return re.search(r"```sh\n(.*?)\n```", after, re.S).group(1).strip()


def test_ci_runs_the_readme_test_command_verbatim():
    command = _test_command()
    assert "pytest" in command and "\n" not in command
    assert command in (REPO / ".ci" / "run").read_text().splitlines()
    # the parallel run leaves out exactly what the serial run takes: together, every test
    assert "-m 'not serial'" in command and command.endswith("pytest -m serial")


def _install_command(text: str) -> list[str]:
    """The arguments of the first code block's `pip install` in ``text``."""
    block = re.search(r"```(?:sh|bash)\n(.*?)\n```", text, re.S).group(1)
    return shlex.split(re.search(r"pip install ([^&\n]+)", block).group(1))


def test_the_quickstart_installs_as_the_readmes_main_job_does():
    """Both install the wheel (not editable) with the torch extra, so the quick start's
    `ampcert` is what ships, from any folder."""
    main_job = _install_command((REPO / "README.md").read_text().split("Run the main job", 1)[1])
    quickstart = _install_command((DOCS / "quickstart.md").read_text().split("## 1. Install", 1)[1])
    assert quickstart == main_job
    assert not {"-e", "--editable"} & set(main_job) and "'.[torch]'" in shlex.join(main_job)


def test_the_readmes_audit_count_is_what_the_cpu_audit_audits():
    """README's "N/N ops agree" is the count `ampcert audit --device cpu` prints: one row per
    op of the shipped CPU policy and one per composite module (nn.RNN, nn.GRU). That every
    row agrees is tests/amp/test_audit.py's and test_torch_rnn.py's to check; this keeps the
    number the README quotes from going stale when ops are added (it said 122 at 125)."""
    pytest.importorskip("torch")
    from ampcert.amp.audit import audit_modules
    from ampcert.amp.policy import shipped_policy

    quoted = re.findall(r"\((\d+)/(\d+) ops agree", (REPO / "README.md").read_text())
    audited = len(shipped_policy("cpu").ops) + len(audit_modules("cpu"))
    assert quoted == [(str(audited), str(audited))]
