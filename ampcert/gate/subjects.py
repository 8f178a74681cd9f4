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
from ampcert.aggregate import group_key, is_repeat
from ampcert.results import RunResult
from ampcert.vocabulary import Subject

#: a subject as the gate's functions name it: the groups of every view (ampcert.aggregate)
Key = Subject
subject_key = group_key


def is_replicate(run: RunResult) -> bool:
    """Seeds are the replicates: repeats of a seed (determinism checks) and skipped runs are left out."""
    return not is_repeat(run) and run.status != "skipped"


def group_runs(runs: Iterable[RunResult]) -> dict[Subject, list[RunResult]]:
    """The replicate runs by subject (ampcert.aggregate's grouping), each subject's in
    seed order (so a report.json, whose runs are sorted by id, and its folder give the same answer)."""
    return aggregate.group_runs(sorted(runs, key=lambda r: (r.spec.seed, r.run_id)), skipped=False)


def as_subject(key: Subject) -> Subject:
    """The subject itself (keys and subjects were two types once; this is kept for code that converts)."""
    return key


def match_subjects(base: Iterable[Subject], cand: Iterable[Subject]) -> tuple[
        list[tuple[Subject, Subject]], list[Subject], list[Subject], list[str]]:
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

    def wbp(k: Subject) -> tuple[str, str, str]:
        return (k.workload, k.backend, k.precision)

    for k in list(only_b):
        ob = [x for x in only_b if wbp(x) == wbp(k)]
        oc = [x for x in only_c if wbp(x) == wbp(k)]
        if len(ob) == 1 and len(oc) == 1:
            pairs.append((ob[0], oc[0]))
            only_b.remove(ob[0])
            only_c.remove(oc[0])
            notes.append(f"{k.workload}/{k.backend}/{k.precision}: AMP implementation changed from {ob[0].amp} "
                         f"to {oc[0].amp}; compared")
    return sorted(pairs), only_b, only_c, notes
