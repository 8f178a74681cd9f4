"""The own-job zygote: a process that has imported what the examples in examples/own_job/
import (torch, transformers' Trainer, Lightning, mlperf_logging: 2 to 7 s of CPU, most of
each job's), and forks a child per job that sitecustomize.py (beside this file) hands over. The child takes the job's standard streams, working folder, environment and argv,
leads a session of its own and runs the script as `python SCRIPT` does (sys.path[0] its
folder, __name__ "__main__", then the interpreter's exit: threads joined, atexit handlers
run). Not imported here: ampcert, which the job imports itself.

    python zygote.py SOCKET      # prints "ready"; when stdin closes, reaps its children,
                                 # prints "jobs N" (how many it ran) and ends

Each connection brings a request (JSON: argv, cwd, env) and the three streams (SCM_RIGHTS);
the reply is the child's pid, then its exit code (-N: killed by signal N) once reaped here,
so that its CPU time adds up in this process's children and in the test run's. A
connection that closes first (the job's interpreter was killed) kills the child; a request
from another PYTHONPATH (another sys.path) gets "cold": its interpreter runs the script.
"""

import json
import os
import runpy
import selectors
import signal
import socket
import sys
import threading

import lightning.pytorch  # noqa: F401
import numpy  # noqa: F401
import torch  # noqa: F401
import torch.utils.data  # noqa: F401
from mlperf_logging import mllog  # noqa: F401
from mlperf_logging.mllog import constants  # noqa: F401
from transformers import (  # noqa: F401
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainingArguments,
)


def run_child(req: dict, fds: list[int]) -> int:
    """In the forked child: the job, as `python ARGV` runs it; its exit code."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()  # as ampcert starts a job: a session of its own
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    script = req["argv"][0]
    sys.argv = list(req["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - as the interpreter reports an uncaught exception
        sys.excepthook(*sys.exc_info())
        code = 1
    # What the interpreter does at exit: wait for the threads, run the atexit handlers.
    getattr(threading, "_shutdown", lambda: None)()
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return code


def serve(path: str) -> None:
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(16)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(sys.stdin, selectors.EVENT_READ, "stdin")
    jobs: dict[int, socket.socket] = {}  # child pid -> its job's connection
    closing = False
    forked = 0
    print("ready", flush=True)
    while not closing or jobs:
        for key, _ in sel.select(timeout=0.05):
            if key.data == "accept":
                conn, _ = listener.accept()
                data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                req = json.loads(data)
                if req["env"].get("PYTHONPATH", "") != os.environ.get("PYTHONPATH", ""):
                    for fd in fds:
                        os.close(fd)
                    conn.sendall(b"cold\n")
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    code = 70
                    try:
                        sel.close()
                        listener.close()
                        conn.close()
                        for other in jobs.values():
                            other.close()
                        code = run_child(req, fds)
                    finally:
                        os._exit(code)
                forked += 1
                for fd in fds:
                    os.close(fd)
                conn.sendall(b"%d\n" % pid)
                jobs[pid] = conn
                sel.register(conn, selectors.EVENT_READ, pid)
            elif key.data == "stdin":
                if not os.read(sys.stdin.fileno(), 1 << 16):
                    sel.unregister(sys.stdin)
                    closing = True
                    for pid in jobs:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
            else:  # the job's interpreter is gone before its child: end the child
                try:
                    if not key.fileobj.recv(1 << 16):
                        sel.unregister(key.fileobj)
                        os.kill(key.data, signal.SIGKILL)
                except OSError:
                    pass
        while jobs:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = jobs.pop(pid, None)
            if conn is None:
                continue
            try:
                conn.sendall(b"%d\n" % os.waitstatus_to_exitcode(status))
            except OSError:
                pass
            try:
                sel.unregister(conn)
            except (KeyError, ValueError):
                pass
            conn.close()
    print(f"jobs {forked}", flush=True)


if __name__ == "__main__":
    serve(sys.argv[1])
