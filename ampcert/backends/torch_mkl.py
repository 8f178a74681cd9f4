"""MKL's reproducible mode for a run's CPU matmuls: the cause of issue 52's first-run difference.

torch's x86 builds (CPU and CUDA wheels alike) link Intel MKL into ``libtorch_cpu`` and
send CPU matmuls to it: fp32 ones to its SGEMM (``nn.Linear``, ``addmm``, the blocks of
the CPU attention kernel), bf16 ones to its ``GEMM_BF16BF16F32``. Convolutions go to
oneDNN, which is reproducible from run to run on one machine by design.

MKL is not, unless asked. Without Conditional Numerical Reproducibility (CNR, the
``MKL_CBWR`` setting) MKL chooses its code path and the split of its work at run time, and
its documentation lists what then changes results between two runs of one program on one
machine: where the arrays lie in memory, and parallel work that is not done in a fixed
order ("Obtaining Numerically Reproducible Results", oneMKL developer guide; psi4 saw
run-to-run differences of 1e-8 on Intel CPUs with ``MKL_CBWR`` unset and none with
``AUTO``). MKL picks its paths by CPU vendor and model, so the effect depends on the
machine. It is what the smoke suite met on a 2-core AMX Xeon: gpt's fp32 runs, whose every matmul is
an SGEMM (``MKL_VERBOSE=1``: 19,000 calls in two steps and an evaluation of gpt tiny),
sometimes computed other bits than their repeat, from step 11 or 12 on; ResNet's
training, all convolutions but its last layer, never did. Nothing of it reproduced on the
AMD EPYCs tried since, where MKL reports ``CNR:OFF`` just the same.

``MKL_CBWR=AUTO`` keeps the branch MKL would choose on this CPU (so the speed of the code
it picks) and fixes the order of its operations, independent of alignment and of timing.
MKL reads the variable once, at its first call in a process, so :func:`request_reproducible`
sets it before a run computes anything (a user's own ``MKL_CBWR`` is kept) and then reads
back, from MKL itself, the mode it runs in: that is what the run's result records.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

ENV = "MKL_CBWR"
REQUESTED = "AUTO"
# mkl_cbwr.h: what mkl_cbwr_get(MKL_CBWR_BRANCH) returns, and the STRICT bit of MKL_CBWR_ALL.
_BRANCH, _ALL, _STRICT = 1, -1, 0x10000
_NAMES = {1: "OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_1", 8: "SSE4_2",
          9: "AVX", 10: "AVX2", 11: "AVX512_MIC", 12: "AVX512", 13: "AVX512_MIC_E1", 14: "AVX512_E1"}


def request_reproducible() -> str | None:
    """Ask MKL for CNR mode ``AUTO`` (unless ``MKL_CBWR`` is set already) and return the
    mode MKL runs in: ``"AUTO"``, ``"OFF"`` (MKL had been called before, or the user
    asked for it), another branch's name, or None where this torch has no MKL."""
    os.environ.setdefault(ENV, REQUESTED)
    return cnr_mode()


def cnr_mode() -> str | None:
    """MKL's CNR mode in this process as MKL reports it (``"AUTO,STRICT"`` with strict
    mode), or None where torch's library holds no MKL (ARM, macOS, a build without it)."""
    get = _mkl_cbwr_get()
    if get is None:
        return None
    branch, every = get(_BRANCH), get(_ALL)
    name = _NAMES.get(branch, f"code {branch}")
    return f"{name},STRICT" if every & _STRICT else name


def _mkl_cbwr_get():
    import torch

    lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        get = ctypes.CDLL(str(lib)).mkl_serv_cbwr_get  # MKL's mkl_cbwr_get, as linked into torch
    except (OSError, AttributeError):
        return None
    get.restype, get.argtypes = ctypes.c_int, [ctypes.c_int]
    return get
