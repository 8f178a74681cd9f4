"""Hands `python SCRIPT ...` over to the own-job zygote (zygote.py beside this file), for
tests/integrations/test_own_job_suite.py only: a no-op in every other interpreter.

The suite's jobs are the shipped examples, run as the shipped suite says (`{python}
hf_trainer.py` in examples/own_job/, a session of their own, the AMPCERT_* variables): each
one a fresh interpreter that spends most of its few seconds importing torch, transformers
and lightning. Where OWN_JOB_ZYGOTE_SOCKET names a zygote, this folder is on PYTHONPATH and
the script lies in OWN_JOB_ZYGOTE_SCRIPTS, the interpreter sends its argv, working folder,
environment and standard streams to the zygote, which forks a child that has those imported
already and runs the script there as `python SCRIPT` would. This process waits, passes the
signals ampcert ends a job with on to that child, and exits with its exit code. Where there
is no zygote, or it declines (another PYTHONPATH), the interpreter runs the script itself.
"""

import os
import sys


def _hand_over() -> None:
    import json
    import signal
    import socket

    path = os.environ.get("OWN_JOB_ZYGOTE_SOCKET")
    scripts = os.environ.get("OWN_JOB_ZYGOTE_SCRIPTS")
    script = sys.argv[0] if sys.argv else ""
    if not path or not scripts or not script.endswith(".py") \
            or os.path.dirname(os.path.abspath(script)) != scripts:
        return
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.connect(path)
        request = {"argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ)}
        socket.send_fds(sock, [json.dumps(request).encode()], [0, 1, 2])
        replies = sock.makefile("rb")
        first = replies.readline().strip()
    except OSError:  # no zygote there (any more): a cold start
        first = b"cold"
    if first in (b"cold", b""):
        sock.close()
        return
    child = int(first)

    def forward(signum, frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    # The child's exit code, once the zygote has reaped it (-N: killed by signal N; a
    # forwarded signal interrupts the read, which is retried: PEP 475); none: the zygote
    # is gone, taking its children with it.
    line = replies.readline().strip()
    code = int(line) if line else -signal.SIGKILL
    if code < 0:  # the child died of signal -code: so does this process
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


_hand_over()
