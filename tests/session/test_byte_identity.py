"""A stored results folder re-finished by this code gives the very bytes it gave when stored.

``tests/data/golden/folder`` is a real run of ``tests/data/golden/golden.yaml``
(digits, fp32 and bf16, three seeds and a repeat, the default rule pack)
made before the session and runner were split into their packages;
``expected/`` holds the verdicts, summary and report that code wrote. A
refactoring that changes a byte of them (a field's order, a number's
rounding, a verdict) fails here, and so does one that changes the exit code.
The install path of the shipped rule pack and policy is the one part that depends on the machine: it
is written as ``<ampcert>`` in the stored files.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import run_cli

import ampcert

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
PACKAGE = str(Path(ampcert.__file__).parent)
OUTPUTS = ("verdicts.json", "summary.json", "report.json", "summary.html", "report.html")


def _stored_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "folder"
    shutil.copytree(GOLDEN / "folder", folder)
    for stored in [folder / "plan.json", *folder.glob("runs/*/result.json")]:
        stored.write_text(stored.read_text().replace("<ampcert>", PACKAGE))
    return folder


def _assert_as_stored(folder: Path) -> None:
    for name in OUTPUTS:
        written = (folder / name).read_text(encoding="utf-8").replace(PACKAGE, "<ampcert>")
        expected = (GOLDEN / "expected" / name).read_text(encoding="utf-8")
        assert written == expected, f"{name} differs from the stored bytes"


@pytest.mark.parametrize("command", ["certify", "report"])
def test_a_stored_folder_finishes_to_the_same_bytes_and_exit_code(tmp_path, command):
    folder = _stored_folder(tmp_path)
    if command == "report":  # report re-renders from the stored verdicts
        verdicts = (GOLDEN / "expected" / "verdicts.json").read_text().replace("<ampcert>", PACKAGE)
        (folder / "verdicts.json").write_text(verdicts)
    proc = run_cli(command, folder, cwd=tmp_path)
    # certify: the certificate FAILs (seed spread over 40 steps); report renders and exits 0.
    assert proc.returncode == (1 if command == "certify" else 0), proc.stdout + proc.stderr
    _assert_as_stored(folder)
