"""Commands that do not train import neither torch nor JAX (issue 17): they
start fast and run where neither framework is installed.

Each command runs in a fresh interpreter on a real results folder, with a
watcher on the import system; at exit it records which of torch, jax and
jaxlib are in ``sys.modules`` and, for each, the stack of its first import
(to name the culprit in the failure)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, cli_env
from test_cli_output import shared_folder

GUARD = r"""
import atexit, json, sys, traceback
LOG = sys.argv.pop(1)
WATCH = ("torch", "jax", "jaxlib")
first = {}

class Watch:
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in WATCH and top not in first:
            first[top] = "".join(traceback.format_stack(limit=25)[:-1])
        return None

sys.meta_path.insert(0, Watch())

@atexit.register
def _dump():
    loaded = sorted(m for m in WATCH if m in sys.modules)
    with open(LOG, "w") as f:
        json.dump({"loaded": loaded, "where": {m: first.get(m, "?") for m in loaded}}, f)

sys.argv[0] = "ampcert"
from ampcert.cli import main
main()
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return shared_folder(tmp_path_factory)


COMMANDS = {
    "--version": lambda f, tmp: ["--version"],
    "--help": lambda f, tmp: ["--help"],
    "report": lambda f, tmp: ["report", f.root],
    "report --json": lambda f, tmp: ["report", f.root, "--json"],
    "compare": lambda f, tmp: ["compare", f.root, f.root],
    "plan": lambda f, tmp: ["plan", f.root, "--target-samples", "1000"],
    "verify": lambda f, tmp: ["verify", f.signed / "report.dsse.json", "--pubkey", f.pub],
    "check": lambda f, tmp: ["check", f.root],
    "certify": lambda f, tmp: ["certify", f.root],
    "merge": lambda f, tmp: ["merge", tmp / "merged", f.root],
    "list": lambda f, tmp: ["list"],
    "show": lambda f, tmp: ["show", "policy", "torch-cpu"],
}


def _imports(args, tmp_path) -> dict:
    log = tmp_path / "imports.json"
    proc = subprocess.run([sys.executable, "-c", GUARD, str(log), *map(str, args)], cwd=REPO, env=cli_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr  # 1: a certificate may FAIL
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(log.read_text())


@pytest.mark.parametrize("name", list(COMMANDS))
def test_command_imports_neither_torch_nor_jax(name, folder, tmp_path):
    record = _imports(COMMANDS[name](folder, tmp_path), tmp_path)
    assert record["loaded"] == [], "\n\n".join(f"{m} imported by:\n{w}" for m, w in record["where"].items())


def test_the_watcher_sees_an_import(tmp_path):
    """`ampcert env` asks torch about CUDA: the watcher must see that, or the tests above prove nothing."""
    pytest.importorskip("torch")
    record = _imports(["env", "--json"], tmp_path)
    assert "torch" in record["loaded"] and "gpu_info" in record["where"]["torch"]
