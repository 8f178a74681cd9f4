"""A team's own training job as a suite entry: ``command:`` and what it is told.

An own job is an argv list, run once per cell of the matrix
(precision x seed x repeat) in a process group of its own. ampcert does not
train it; it tells the job what to run as template fields and environment
variables, samples telemetry around it, and reads the MLLOG the job writes
(MLPerf's format: :mod:`ampcert.mllog.reader`) into the run's result::

    workloads:
      - id: bert-finetune
        command: [python, train.py, --precision, "{precision}", --seed, "{seed}", --log, "{mllog}"]
        metric: accuracy
        target: 0.9
        cwd: ../my-repo           # beside the suite file, unless absolute
        env: {OMP_NUM_THREADS: "2"}

Each ``{field}`` in the argv and the ``env`` values is one of
:data:`TEMPLATE_FIELDS`; the job also gets them as ``AMPCERT_<FIELD>``
variables (``AMPCERT_PRECISION``, ``AMPCERT_SEED``, ``AMPCERT_MLLOG``, ...).
``{{`` and ``}}`` are literal braces. A field that is not one of these is
refused at planning, with one line, before anything runs.

This module is the spec layer's part: the entry's model, the template
fields, and their rendering. Running the job is
:mod:`ampcert.own_job.run`; reading its log into a result is
:mod:`ampcert.own_job.result`.
"""

from __future__ import annotations

import string
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ampcert.amp.precision import Precision

# The fields a command's argv and env values may name, and what each holds.
TEMPLATE_FIELDS: dict[str, str] = {
    "precision": "the run's precision (fp32, bf16, fp16, fp8, ...)",
    "seed": "the run's seed",
    "amp": "which AMP the job uses: native (its framework's) or ampcert",
    "run_dir": "the run's folder (absolute), for the job's own files",
    "mllog": "the MLLOG file the job must write (absolute)",
    "run_id": "the run's id",
    "device": "cpu or cuda",
    "repeat": "0, or the determinism repeat of the seed (1, 2, ...)",
    "label": "the entry's label",
    "python": "the Python interpreter ampcert runs in (a job in the same environment)",
}
ENV_PREFIX = "AMPCERT_"


# A run's command: what a RunSpec of a command entry carries. argv, env, cwd (as the suite
# wrote it), the metric and the target decide what the run computes, so they enter its id;
# workdir (cwd resolved beside the suite file) says where it ran on this machine, so it does
# not (moving a checkout keeps the ids). (No docstring: pydantic would write it into
# report.v1.schema.json.)
class OwnJob(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    argv: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    # Written (and so in the run id) only where set: jobs planned before it keep their ids.
    inherit_env: list[str] | None = Field(
        default=None, exclude_if=lambda v: v is None,
        description="the variables of ampcert's environment the job inherits; absent: all of them")
    cwd: str | None = None
    workdir: str | None = None
    metric: str = "accuracy"
    higher_is_better: bool = True
    target: float | None = None

    def identity(self) -> dict[str, Any]:
        return self.model_dump(exclude={"workdir"})


def fields_named(template: str) -> list[str]:
    """The ``{field}`` names ``template`` uses (a malformed template raises ValueError)."""
    names = []
    for _, name, spec, conversion in string.Formatter().parse(template):
        if name is None:
            continue
        if spec or conversion:
            raise ValueError(f"{{{name}}}: a template field takes no format spec or conversion")
        names.append(name)
    return names


def check_templates(argv: list[str], env: dict[str, str]) -> None:
    """Raise ValueError naming the first unknown or malformed template field."""
    for where, template in [*((f"command[{i}]", a) for i, a in enumerate(argv)),
                            *((f"env.{k}", v) for k, v in env.items())]:
        try:
            names = fields_named(template)
        except ValueError as exc:
            raise ValueError(f"{where}: {template!r}: {exc}") from None
        for name in names:
            if name not in TEMPLATE_FIELDS:
                known = ", ".join(f"{{{f}}}" for f in TEMPLATE_FIELDS)
                raise ValueError(f"{where}: unknown template field {{{name}}} in {template!r}; "
                                 f"the fields are {known} (write {{{{ and }}}} for literal braces)")


def render(template: str, values: dict[str, str]) -> str:
    return template.format_map(values)


def job_values(*, precision: Precision, seed: int, amp: str, run_dir: Path, mllog: Path, run_id: str,
               device: str, repeat: int, label: str) -> dict[str, str]:
    """The template fields' values for one run (strings, as a command line holds them)."""
    return {"precision": precision, "seed": str(seed), "amp": amp, "run_dir": str(run_dir.resolve()),
            "mllog": str(mllog.resolve()), "run_id": run_id, "device": device, "repeat": str(repeat),
            "label": label, "python": sys.executable}


def job_environment(base: dict[str, str], job: OwnJob, values: dict[str, str]) -> dict[str, str]:
    """The job's environment: ``base`` (ampcert's: all of it, or only the variables the
    entry's ``inherit_env`` names), every field as ``AMPCERT_<FIELD>``, then the entry's
    own ``env`` (rendered), which wins."""
    env = dict(base) if job.inherit_env is None else {k: base[k] for k in job.inherit_env if k in base}
    env.update({ENV_PREFIX + name.upper(): value for name, value in values.items()})
    env.setdefault("PYTHONUNBUFFERED", "1")
    if values["device"] == "cpu":  # a CPU run leaves the GPUs alone, as a built-in CPU run does
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update({k: render(v, values) for k, v in job.env.items()})
    return env
