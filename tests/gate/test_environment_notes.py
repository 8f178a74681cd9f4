"""`compare` names the software each side ran on where it differs (torch, CUDA, driver,
ampcert, each own job's commit), beside its verdict. Synthetic results."""

from __future__ import annotations

from pathlib import Path

from factories import completed, plan

from ampcert.gate import compare
from ampcert.gate.sources import Source, stack, stack_differences

SPECS = plan({"name": "env", "precisions": ["fp32", "bf16"], "seeds": [0, 1, 2],
              "workloads": [{"workload": "digits"}]})


def _source(name: str, **env: str) -> Source:
    gpu = {"torch_cuda": env.pop("cuda", None), "driver": env.pop("driver", None)}  # the plan's fingerprint
    runs = [completed(s, final_metric=0.9, environment=dict(env)) for s in SPECS]
    return Source(Path(name), "results folder", "env", "0" * 64, runs, None,
                  stack(runs, {"gpu": {k: v for k, v in gpu.items() if v}}, {"ampcert": "0.4.0"}))


def test_a_torch_and_driver_upgrade_is_named_beside_the_verdict():
    base = _source("base", torch="2.13.0", cuda="12.8", driver="570.1")
    cand = _source("cand", torch="2.14.1", cuda="12.8", driver="580.2")
    assert stack_differences(base, cand) == ["driver 570.1 -> 580.2", "torch 2.13.0 -> 2.14.1"]
    result = compare(base, cand)
    (note,) = [n for n in result.notes if n.startswith("environment differs")]
    assert "torch 2.13.0 -> 2.14.1" in note and "driver 570.1 -> 580.2" in note


def test_the_same_stack_adds_no_note():
    base, cand = _source("base", torch="2.13.0"), _source("cand", torch="2.13.0")
    assert stack_differences(base, cand) == []
    assert not [n for n in compare(base, cand).notes if n.startswith("environment differs")]
