"""A run that stops and resumes from its own checkpoint (``resume_after_window``: the
rule ``resume_equivalence``, certify/rules.py), as a job preempted mid-training
would: after that window, before its evaluation, the framework's ``checkpoint()`` goes
to a file, the live state is scrambled (weights, optimizer state, random generators),
the file is read back and ``restore()``-d, and training goes on (torch and JAX alike).
Its result records the step it resumed after (``determinism.resumed_after_step``); the
check holds its losses and final weights to the seed's uninterrupted run."""

from __future__ import annotations

import pickle
import tempfile
from pathlib import Path
from typing import Any

from ampcert.backends.training_loop import Feature, Run


class ResumeFromCheckpoint(Feature):
    def __init__(self) -> None:
        self.windows = 0

    def after_window(self, run: Run, step: int) -> None:
        self.windows += 1
        if self.windows != run.spec.resume.resume_after_window:
            return
        fw: Any = run.framework
        with tempfile.TemporaryDirectory(prefix="ampcert-resume-") as folder:
            path = Path(folder) / "checkpoint.pickle"
            # pickle, which torch.save also is (tensors pickle their storage) and which reads
            # JAX's host arrays without torch: written by this process a moment ago, in a
            # folder of its own, so nothing from elsewhere is unpickled
            with path.open("wb") as out:
                pickle.dump(fw.checkpoint(), out, protocol=pickle.HIGHEST_PROTOCOL)
            fw.scramble()
            with path.open("rb") as back:
                state = pickle.load(back)  # noqa: S301 - this run's own file, see above
        fw.restore(state, step)
        run.tally.determinism["resumed_after_step"] = step
