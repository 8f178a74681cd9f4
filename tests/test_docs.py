"""The documentation cannot rot: every `runnable` block in docs/*.md runs, in page order,
in one scratch folder, and every suite field is documented."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from warm_server import WarmServer

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


@pytest.fixture(scope="module")
def warm_bin():
    """A folder with `ampcert` and `python` that run through a warm server (for the blocks' PATH):
    the blocks' commands are forked from it (tests/warm_server.py), a python block as
    `python -c CODE`; what a block starts with sys.executable (own-job.md's command
    workload) runs cold."""
    server = WarmServer(_base_env())
    try:
        yield server.bin_dir(("ampcert", "python"))
    finally:
        server.close()


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
