"""plan.json as a type: what ``ampcert run`` stored about a results folder before its first run.

Written once by :func:`ampcert.runner.planning.write_plan` (and by ``merge``
for the merged folder), read back by everything that opens a results folder
(resume, merge, report, certify, compare, history) through
:meth:`ampcert.results.ResultsDir.read_plan`, which checks it as input from
elsewhere first. Fields are declared in the order they are written, so a
plan written through this model has the bytes it had when it was a dict.
Keys this version does not know (``merged_at``, ``merged_from``, a newer
ampcert's) are kept as they are, after the known ones.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from ampcert.spec import RunSpec, SpeedProbe


class ShardRecord(BaseModel):
    """``run --shard i/n``: which shard this folder holds (the plan keeps every run)."""

    model_config = ConfigDict(extra="allow")

    index: int | None = None
    count: int | None = None
    numbering: str | None = None
    rule: str | None = None
    run_ids: list[str] | None = None


class StoredPlan(BaseModel):
    """plan.json: the suite as run, the run matrix, the device and what it accelerates."""

    model_config = ConfigDict(extra="allow")

    tool: str | None = None              # "ampcert <version>" that planned it
    created_at: str | None = None        # ISO 8601, UTC
    suite: str                           # the suite's name
    suite_source: str | None = None      # the suite file as given, or a shipped one's label (ampcert:suites/smoke.yaml)
    suite_sha256: str | None = None      # of suite.yaml, byte for byte: shards of one suite share it
    device: str | None = None            # cpu or cuda, resolved
    capabilities: dict[str, Any] | None = None  # precision -> accelerated, speedup, note
    certify: str | None = None           # the rule pack (ampcert:configs/rules/<name>.yaml or the user's path), or None
    certify_sha256: str | None = None    # its digest: --resume certifies with the suite's pack only if it still matches
    environment: dict[str, Any] | None = None   # the fingerprint (envinfo)
    code: dict[str, Any] | None = None  # what code the runs run (runner/code_identity.py): resume and merge hold to it
    runs: list[RunSpec]                  # every run of the suite, in plan order
    shard: ShardRecord | None = None
    slurm: dict[str, Any] | None = None  # the suite's `slurm:` block, for --resume --executor slurm
    # The suite's speed probe where it is on (spec.speed_probes derives its processes from the runs).
    speed_probe: SpeedProbe | None = None

    def my_runs(self) -> list[RunSpec]:
        """The runs this folder answers for: its shard's, or all of them."""
        if not self.shard:
            return list(self.runs)
        mine = set(self.shard.run_ids or [])
        return [r for r in self.runs if r.run_id in mine]

    def shard_json(self) -> dict[str, Any] | None:
        """The ``shard`` entry as stored (None for a whole suite's folder)."""
        return self.shard.model_dump(mode="json", exclude_unset=True) if self.shard else None

    def to_json(self) -> dict[str, Any]:
        """The JSON object plan.json holds: the fields that were set, in their order (each
        run whole), then any others as they were read."""
        out: dict[str, Any] = {}
        for name in type(self).model_fields:
            if name not in self.model_fields_set:
                continue
            value = getattr(self, name)
            if name == "runs":
                out[name] = [r.model_dump(mode="json") for r in self.runs]
            elif name == "shard":
                out[name] = self.shard_json()
            elif isinstance(value, BaseModel):
                out[name] = value.model_dump(mode="json")
            else:
                out[name] = value
        return {**out, **(self.model_extra or {})}
