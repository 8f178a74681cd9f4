"""One fork server for the tests' commands: ``ampcert`` and ``python`` as a user runs them
(its own process, argv, working folder, environment, standard streams and sys.path; exit
code, stdout and stderr as they see them), forked from an interpreter that has already
imported the heavy libraries: about 0.5 s a command instead of 3, and a python block saves
torch's import (~2 s).

Used by tests/factories.py's ``warm_cli`` (commands from a test) and tests/test_docs.py's
``warm_bin`` (the documentation's shell blocks, through ``ampcert`` and ``python`` shims on
PATH). How commands start cold (what they import, the installed entry point) is tested by
test_cli_imports.py and test_wheel.py with real interpreters.

The server imports what the commands import that takes seconds: torch too, where it is
installed (its import starts no thread, so the fork is safe), but not ampcert itself, not
JAX (which reads JAX_PLATFORMS on import), not rich or typer (which read the terminal's
settings from the environment). Each connection brings an argv, a working folder, an
environment and the three standard streams (file descriptors, SCM_RIGHTS); the server
forks, and the child runs the command as an interpreter started there would: sys.path from
its PYTHONPATH (relative entries from its folder, as at startup; an entry holding a module
the server has already imported fails the command rather than run it otherwise), ended as
an interpreter ends (non-daemon threads joined, atexit handlers run); it sends back its pid
and its exit code. Any other form of ``python`` (an option, no arguments) execs the real
interpreter. The server ends when its stdin closes (the test process is gone).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

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
    real_exit, command_pid = os._exit, os.getpid()

    def end(status):
        # The exit code is sent once, by whatever ends the process: the command itself through
        # os._exit (ampcert's CLI does, in an exit hook, where triton is loaded), or below.
        # A process the command forked ends as it would, reporting nothing.
        if os.getpid() != command_pid:
            real_exit(status)
        os._exit = real_exit
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        try:
            conn.sendall(b"%d\n" % status)
        finally:
            real_exit(status)

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
        os._exit = end
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
        try:  # as an interpreter ends: non-daemon threads joined, atexit handlers run
            getattr(threading, "_shutdown", lambda: None)()
            atexit._run_exitfuncs()
        except BaseException:  # an interpreter prints what its shutdown raised and keeps the exit code
            traceback.print_exc()
        end(code)
    finally:
        real_exit(code)
"""

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


class WarmServer:
    """A fork server started on first use with ``env`` (its PYTHONPATH is what the commands'
    own is read against), and stopped by :meth:`close`."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.dir = ""
        self.lock = threading.Lock()

    def socket_path(self) -> str:
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self.dir = tempfile.mkdtemp(prefix="warm-server-")
                path = os.path.join(self.dir, "socket")
                self.proc = subprocess.Popen([sys.executable, "-c", _SERVER, path], env=self.env,
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                assert self.proc.stdout is not None
                assert self.proc.stdout.readline() == b"ready\n", "the warm server did not start"
            return os.path.join(self.dir, "socket")

    def bin_dir(self, names: Iterable[str] = ("ampcert",)) -> Path:
        """A folder holding executables ``names`` (``ampcert``, ``python``) that run through
        this server: put it first on PATH."""
        sock = self.socket_path()
        path = Path(self.dir) / "bin"
        path.mkdir(exist_ok=True)
        for name in names:
            if not (path / name).exists():
                (path / name).write_text(_SHIM.format(python=sys.executable, socket=sock))
                (path / name).chmod(0o755)
        return path

    def run(self, argv: Sequence[str], cwd: Path | str, env: dict[str, str], timeout: float = 300,
            text: bool = True) -> subprocess.CompletedProcess:
        """``argv`` (``ampcert ...`` or ``python -c ...``) in ``cwd`` with ``env``, its standard
        input empty, as subprocess.run(capture_output=True) would give it back."""
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
                open(os.devnull) as null, socket.socket(socket.AF_UNIX) as sock:
            sock.connect(self.socket_path())
            socket.send_fds(sock, [json.dumps({"argv": list(argv), "cwd": str(cwd), "env": env}).encode()],
                            [null.fileno(), out.fileno(), err.fileno()])
            sock.settimeout(timeout)
            replies = sock.makefile("rb")
            pid = int(replies.readline())
            try:
                line = replies.readline()
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(list(argv), timeout) from None
            code = int(line) if line.strip() else -signal.SIGKILL
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(), err.read()
        if text:  # as subprocess.run(text=True) decodes
            return subprocess.CompletedProcess(list(argv), code, *(
                b.decode().replace("\r\n", "\n").replace("\r", "\n") for b in (stdout, stderr)))
        return subprocess.CompletedProcess(list(argv), code, stdout, stderr)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
