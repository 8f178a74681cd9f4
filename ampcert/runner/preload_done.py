"""The last module the forkserver preloads (local_executor._PRELOAD): it freezes what the
preload built.

``gc.freeze()`` moves every object alive now (torch, the harness, their modules) into the
collector's permanent generation, as the gc docs advise before forking: a worker forked
from the forkserver never scans them in a collection (nor writes to their pages, which
stay shared), and the forkserver's own exit, once ampcert's run ends, does not collect
them either (a second of CPU per ``ampcert run`` with torch loaded).


The forkserver also ends without the interpreter's teardown: an exit hook registered
here, after every preloaded module's own, runs first and calls ``os._exit``. The server
holds nothing to flush or close (its workers are processes of their own, which exit
through ``os._exit`` too), while the teardown of what it preloaded prints: torch's CUDA
builds load triton (through torch._inductor), whose nanobind bindings report their
objects as leaked when the interpreter finalizes them, about twenty lines at the end of
every ``ampcert run`` on torch 2.15.
"""

import atexit
import gc
import os
import sys


def _exit_now() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(0)


gc.freeze()
# Only in the forkserver (started as `python -c 'from multiprocessing.forkserver import main; ...'`):
# anywhere else (a test importing this module) an exit hook must never hide an exit code.
if sys.argv[:1] == ["-c"] and "multiprocessing.forkserver" in sys.modules:
    atexit.register(_exit_now)
