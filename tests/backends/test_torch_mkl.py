"""MKL's reproducible mode, asked for and read back from MKL itself (issue 52)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("torch")

PROBE = """
import os, sys
from ampcert.backends import torch_mkl
import torch
if sys.argv[1] == "called-first":
    torch.randn(64, 64) @ torch.randn(64, 64)  # MKL's first call: it reads MKL_CBWR now
print(torch_mkl.request_reproducible(), os.environ.get("MKL_CBWR"))
"""


def _mode(case: str, env_value: str | None) -> list[str]:
    import os

    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    if env_value is not None:
        env["MKL_CBWR"] = env_value
    out = subprocess.run([sys.executable, "-c", PROBE, case], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    return out


def test_a_process_that_has_not_called_mkl_gets_the_reproducible_mode():
    assert _mode("fresh", None) == ["AUTO", "AUTO"]


def test_a_users_own_setting_is_kept_and_what_mkl_runs_is_what_is_reported():
    assert _mode("fresh", "AUTO,STRICT") == ["AUTO,STRICT", "AUTO,STRICT"]


def test_asked_too_late_it_reports_that_mkl_runs_without_it():
    # MKL had been called before the request: the variable is set, MKL ignores it, and the
    # result says so rather than what was asked.
    assert _mode("called-first", None) == ["OFF", "AUTO"]
