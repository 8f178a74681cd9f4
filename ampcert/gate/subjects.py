"""Subjects: which runs the gate compares with which.

A *subject* is one (workload entry, backend, AMP, precision) of a suite; its
seeds are the replicates the statistics run over. :func:`group_runs` is the
one place that decides which runs count (not determinism repeats of a seed,
not skipped runs) and how they are grouped (:func:`subject_key`);
:func:`match_subjects` pairs the baseline's subjects with the candidate's.
"""

from __future__ import annotations

from collections.abc import Iterable

from ampcert import aggregate
from ampcert.aggregate import GroupKey, group_key, is_repeat
from ampcert.gate.result import SubjectKey
from ampcert.results import RunResult

#: (workload entry label, backend, AMP, precision): the groups of every view (ampcert.aggregate)
Key = GroupKey
subject_key = group_key


def is_replicate(run: RunResult) -> bool:
    """Seeds are the replicates: repeats of a seed (determinism checks) and skipped runs are left out."""
    return not is_repeat(run) and run.status != "skipped"


def group_runs(runs: Iterable[RunResult]) -> dict[Key, list[RunResult]]:
    """The replicate runs by subject (ampcert.aggregate's grouping), each subject's in
    seed order (so a report.json, whose runs are sorted by id, and its folder give the same answer)."""
    return aggregate.group_runs(sorted(runs, key=lambda r: (r.spec.seed, r.run_id)), skipped=False)


def as_subject(key: Key) -> SubjectKey:
    return SubjectKey(workload=key[0], backend=key[1], amp=key[2], precision=key[3])


def match_subjects(base: Iterable[Key], cand: Iterable[Key]) -> tuple[list[tuple[Key, Key]], list[Key], list[Key],
                                                                      list[str]]:
    """Pairs of (baseline key, candidate key), keys only in one side, notes.

    Subjects match on (workload, backend, amp, precision). Where a (workload,
    backend, precision) has exactly one unmatched AMP implementation on each
    side (a change from native to ampcert AMP, say), those are paired too,
    with a note: that change is exactly what a gate should judge."""
    bk = sorted(set(base))
    ck = sorted(set(cand))
    pairs = [(k, k) for k in bk if k in ck]
    only_b = [k for k in bk if k not in ck]
    only_c = [k for k in ck if k not in bk]
    notes = []

    def wbp(k: Key) -> tuple[str, str, str]:
        return (k[0], k[1], k[3])

    for k in list(only_b):
        ob = [x for x in only_b if wbp(x) == wbp(k)]
        oc = [x for x in only_c if wbp(x) == wbp(k)]
        if len(ob) == 1 and len(oc) == 1:
            pairs.append((ob[0], oc[0]))
            only_b.remove(ob[0])
            only_c.remove(oc[0])
            notes.append(f"{k[0]}/{k[1]}/{k[3]}: AMP implementation changed from {ob[0][2]} to {oc[0][2]}; compared")
    return sorted(pairs), only_b, only_c, notes
