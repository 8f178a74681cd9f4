"""The examples install what they run: examples/nightly-gpu.yml's pip install line names
extras that pyproject.toml has, installs ampcert as a user does (the wheel, not editable),
and brings the framework the suite it runs trains with. Its first night must not stop
with "needs PyTorch". Read, not run: no network, nothing installed."""

from __future__ import annotations

import re
import shlex
from typing import Any

import pytest
import yaml
from conftest import REPO
from packaging.requirements import Requirement

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

NIGHTLY = REPO / "examples" / "nightly-gpu.yml"
EXTRAS: dict[str, list[str]] = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
    "optional-dependencies"]


def pip_installs(workflow: dict[str, Any]) -> list[list[str]]:
    """The arguments after `pip install` of every step's `run:` script, in step order."""
    commands = []
    for job in workflow["jobs"].values():
        for step in job.get("steps", []):
            script = str(step.get("run", "")).replace("\\\n", " ")  # continued lines as one
            for line in script.splitlines():
                if "pip" not in line:
                    continue  # other commands need not split as the shell would (`$(...)`, heredocs)
                words = shlex.split(line, comments=True)
                for i in range(len(words) - 1):
                    if words[i].endswith("pip") and words[i + 1] == "install":
                        commands.append(words[i + 2:])
    return commands


def _extras_of(word: str) -> set[str]:
    """`.[torch,fp8]` -> {"torch", "fp8"}; `.` -> none."""
    found = re.fullmatch(r"\.\[(.*)\]", word)
    return {e.strip() for e in found.group(1).split(",")} if found else set()


def _with_extras(extras: set[str]) -> set[str]:
    """The distributions these extras install, an extra that names others (`ampcert[torch]`) followed."""
    names, todo, seen = set(), list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen or extra not in EXTRAS:
            continue
        seen.add(extra)
        for line in EXTRAS[extra]:
            requirement = Requirement(line)
            if requirement.name == "ampcert":
                todo += sorted(requirement.extras)
            else:
                names.add(requirement.name.lower())
    return names


def _suites(workflow: dict[str, Any]) -> list[str]:
    """The suite files the workflow runs when no one overrides them: the SUITE variable's
    fallback and the manual trigger's default."""
    triggers = workflow.get("on", workflow.get(True, {}))  # YAML 1.1 reads a bare `on` as True
    suites = set(re.findall(r"'([^']+\.ya?ml)'", workflow["env"]["SUITE"]))
    dispatch = (triggers.get("workflow_dispatch") or {}).get("inputs", {})
    if "suite" in dispatch:
        suites.add(dispatch["suite"]["default"])
    return sorted(suites)


def _needed(suite_file: str) -> set[str]:
    """What the suite's runs on a GPU import: its backend's frameworks, and torchao for FP8
    under `amp: native` (torchao's layers; ampcert's own FP8 needs only torch)."""
    from ampcert.amp.precision import FP8_PRECISIONS
    from ampcert.frameworks import BACKEND_MODULES
    from ampcert.spec import expand, load_suite

    needs = set()
    for run in expand(load_suite(REPO / suite_file), "cuda"):
        needs |= {module for module, _ in BACKEND_MODULES[run.backend]}
        if run.amp == "native" and run.precision in FP8_PRECISIONS:
            needs.add("torchao")
    return needs


def install_problems(workflow_text: str) -> list[str]:
    """Why the workflow's install would not run its suite (empty when it would)."""
    workflow = yaml.safe_load(workflow_text)
    commands = pip_installs(workflow)
    ours = [words for words in commands if any(w == "." or w.startswith(".[") for w in words)]
    if not ours:
        return ["no `pip install .` step installs ampcert"]
    problems, installed = [], set()
    for words in commands:
        if words in ours and ({"-e", "--editable"} & set(words)):
            problems.append(f"installs ampcert editable ({shlex.join(words)}): the wheel is what ships")
        for word in words:
            if word.startswith("-"):
                continue
            if word == "." or word.startswith(".["):
                unknown = _extras_of(word) - EXTRAS.keys()
                if unknown:
                    problems.append(f"{word}: pyproject.toml has no extra {sorted(unknown)}")
                installed |= _with_extras(_extras_of(word))
            else:  # an explicit requirement beside ampcert (`torch==2.13.0`)
                installed.add(Requirement(word).name.lower())
    for suite in _suites(workflow):
        missing = _needed(suite) - installed
        if missing:
            problems.append(f"{suite} needs {sorted(missing)}, which the install line does not bring")
    if "postgresql://" in workflow_text and "psycopg" not in installed:
        problems.append("offers a PostgreSQL history store without the history-postgres extra")
    return problems


def test_the_nightly_installs_the_wheel_with_what_its_suite_needs():
    text = NIGHTLY.read_text()
    assert install_problems(text) == []
    assert _suites(yaml.safe_load(text)) == ["suites/vision.yaml"]  # the suite it was checked against


def test_the_check_fails_on_the_install_line_that_stopped_the_first_night():
    """The old `pip install -e .`: editable, and no torch for suites/vision.yaml."""
    text = NIGHTLY.read_text()
    (line,) = [ln for ln in text.splitlines() if ".venv/bin/pip install '." in ln]
    old = text.replace(line, line.split("pip install")[0] + "pip install -e .")
    problems = install_problems(old)
    assert any("editable" in p for p in problems), problems
    assert any("needs ['torch']" in p for p in problems), problems
    unknown = text.replace(line, line.split("pip install")[0] + "pip install '.[torch,cuda]'")
    assert any("no extra ['cuda']" in p for p in install_problems(unknown))
    jax_night = text.replace("suites/vision.yaml", "suites/jax-smoke.yaml")
    assert any("needs ['jax', 'optax']" in p for p in install_problems(jax_night))


def test_an_explicit_torch_beside_the_wheel_is_enough():
    text = NIGHTLY.read_text()
    (line,) = [ln for ln in text.splitlines() if ".venv/bin/pip install '." in ln]
    explicit = text.replace(line, line.split("pip install")[0] + "pip install torch '.[history-postgres]'")
    assert install_problems(explicit) == []
