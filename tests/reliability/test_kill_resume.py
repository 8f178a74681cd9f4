"""Fault injection: `ampcert run` SIGKILLed at random points, again and again,
then `--resume`d to the end, loses nothing, corrupts nothing, duplicates
nothing, and certifies exactly what an uninterrupted run certifies; result
files spoilt in the folder are reported, never trusted, and their runs redone."""

from __future__ import annotations

import json

import pytest
from rel_lab import PLANNED_RUNS, lab

from ampcert.certify.compliance import check_log, load_compliance_rules
from ampcert.results import ResultsDir, load


@pytest.fixture(scope="module")
def the_lab(tmp_path_factory):
    return lab(tmp_path_factory).wait()


def _outcome(result) -> dict:
    """What a run computed (not how fast): equal between any two runs of one spec."""
    return {"status": result.status, "steps": result.steps, "loss": result.loss,
            "evals": [(e.step, e.samples, e.value) for e in result.evals],
            "final_metric": result.final_metric, "weights_sha256": result.weights_sha256,
            "loss_scale": result.loss_scale, "skipped_steps": result.skipped_steps}


def _verdicts(root) -> list[dict]:
    cert = json.loads((root / "verdicts.json").read_text())
    return [{k: v[k] for k in ("rule", "check", "subject", "status", "required", "summary", "evidence")}
            for v in cert["verdicts"]] + [{"overall": cert["status"]}]


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume_equals_an_uninterrupted_run(the_lab):
    a = the_lab.procs["a"]
    assert a.returncode == 0, a.stdout + a.stderr
    reference = {r.run_id: _outcome(r) for r in load(the_lab.root / "a").runs}
    assert len(reference) == PLANNED_RUNS
    rules = load_compliance_rules()
    chains = the_lab.chains
    for chain in chains:
        assert chain.tracebacks == []
        assert chain.orphans == [], "a worker outlived its SIGKILLed orchestrator"
        assert chain.violations == []
        assert chain.resumes_completed == 2  # the one left alone midway, and the last
        rd = ResultsDir(chain.out)
        rs = load(chain.out)
        assert rs.missing == [] and len(rs.runs) == PLANNED_RUNS
        # Nothing missing, nothing duplicated, nothing stray: one folder per planned run, each
        # with one whole result, its log and (maybe) its telemetry; no temp file left anywhere.
        assert sorted(p.name for p in (chain.out / "runs").iterdir()) == sorted(reference)
        for run_dir in (chain.out / "runs").iterdir():
            names = {p.name for p in run_dir.iterdir()}
            assert {"result.json", "run.mllog"} <= names <= {"result.json", "run.mllog", "telemetry.csv"}, names
        assert [p for p in chain.out.rglob("*.tmp")] == [] and not (chain.out / ".lock").exists()
        for r in rs.runs:
            assert _outcome(r) == reference[r.run_id], r.run_id
            # the log describes one whole attempt: redone runs start theirs afresh
            assert check_log(rd.mllog_file(r.run_id), rules) == [], r.run_id
        assert _verdicts(chain.out) == _verdicts(the_lab.root / "a")
        for name in ("summary.json", "report.json", "report.html"):
            assert (chain.out / name).is_file()
    kills = sum(c.kills for c in chains)
    spoilt = [c for c in chains if c.corrupted]
    assert spoilt, "no chain had its results spoilt before its last resume"
    for chain in spoilt:
        # every spoilt result was reported (file and reason), never trusted, and its run redone (above: equal)
        warnings = [line for line in (chain.logs / "final.log").read_text().splitlines()
                    if line.startswith("ampcert: warning: ")]
        assert len(warnings) == len(chain.corrupted) == PLANNED_RUNS, warnings
        for run_id, why in chain.corrupted.items():
            line = next(w for w in warnings if f"/{run_id}/result.json: " in w)
            assert why in line and line.endswith("not trusted, the run is redone"), line
    print(f"\nkill/resume: {kills} SIGKILLs injected ({sum(c.main_only_kills for c in chains)} of the "
          f"orchestrator alone, {sum(c.group_kills for c in chains)} of its whole process group) over "
          f"{sum(c.invocations for c in chains)} invocations; {sum(c.fresh_restarts for c in chains)} kills "
          f"landed before plan.json; {sum(c.temp_files_seen for c in chains)} temp files seen after kills; "
          f"{sum(c.resumes_completed for c in chains)} resumes ran to completion; kill delays "
          f"{sorted(t for c in chains for t in c.kill_times)}; wall {the_lab.wall}")
    assert kills >= 20
    assert sum(c.main_only_kills for c in chains) >= 3 and sum(c.group_kills for c in chains) >= 3
