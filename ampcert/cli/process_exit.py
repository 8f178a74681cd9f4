"""How the ``ampcert`` process ends where triton is loaded: without the interpreter's teardown.

torch's CUDA builds load triton with Dynamo (which ampcert's autocast and the audit import).
When the interpreter finalizes its modules, triton's nanobind bindings report their objects
as leaked: about twenty lines of ``nanobind: leaked ...`` after a command's last line (every
command that loads Dynamo, on torch 2.15). :func:`ending_without_triton_teardown` wraps the
command: its exit hook, registered first so that it runs last, after every other exit hook,
flushes logging and the standard streams and ends the process with the command's own exit
code through ``os._exit``, where triton is loaded. ampcert's own files are closed, and
fsynced, as they are written; nothing is left for the teardown to do.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterator

# The code the command exits with (an exit hook has no other way to it).
_EXIT_CODE = [0]


@contextlib.contextmanager
def ending_without_triton_teardown() -> Iterator[None]:
    atexit.unregister(_skip_teardown_with_triton)
    atexit.register(_skip_teardown_with_triton)
    try:
        yield
    except SystemExit as exc:  # every exit
        _EXIT_CODE[0] = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        raise
    except KeyboardInterrupt:
        _EXIT_CODE[0] = 128 + signal.SIGINT
        raise
    except BaseException:  # a traceback: the interpreter exits 1 once it is printed
        _EXIT_CODE[0] = 1
        raise


def _skip_teardown_with_triton() -> None:
    if "triton" not in sys.modules:
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(_EXIT_CODE[0])
