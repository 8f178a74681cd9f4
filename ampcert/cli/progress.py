"""Live progress in the terminal: runs done/total, the runs under way, their steps, ETA.

Fed by the driver's events (or a fleet's: several runs at once, on
several nodes); on a terminal it draws rich progress bars, and it always
prints one line per finished run and per retried one (what CI logs keep).
"""

from __future__ import annotations

from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from ampcert import formats
from ampcert.console import Output


class RunProgress:
    """The progress display of one invocation, on its message console (stderr with --json)."""

    def __init__(self, out: Output):
        self.console = console = out.console
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
            # Not a terminal (a pipe, a CI log): no bars, and none of rich's closing blank
            # line (Progress.stop prints one there), which would stand before a run's error.
            console=console, transient=True, disable=not console.is_interactive,
        )
        self.suite_task: Any = None
        self.run_tasks: dict[str, Any] = {}  # the runs under way (a fleet trains several at once)
        self.total = 0

    def __enter__(self) -> RunProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def handle(self, event: dict[str, Any]) -> None:
        kind = event["kind"]
        if kind == "invalid":
            self.console.print(f"ampcert: warning: {event['path']}: {event['reason']}; not trusted, "
                               "the run is redone", markup=False, highlight=False, soft_wrap=True)
        elif kind == "plan":
            self.total = event["total"]
            done = self.total - event["todo"]
            if done:
                self.console.print(f"resuming: {done} of {self.total} runs already have results")
            self.suite_task = self.progress.add_task("runs", total=self.total, completed=done)
        elif kind == "confirm":  # the memory sweep is fitted: its line tried at the largest batch it allows
            for run_id, budget in event["runs"]:
                self.console.print(f"memory: confirming the fit's largest batch within {formats.budget(budget)}: "
                                   f"{run_id}", markup=False, highlight=False, soft_wrap=True)
        elif kind == "probe":  # the certified runs are done: the speed probe times both paths in one process
            for run_id, seconds in event["runs"]:
                self.console.print(f"speed probe: {run_id}, {seconds:g} s of alternating windows (not a "
                                   "certified run)", markup=False, highlight=False, soft_wrap=True)
        elif kind == "start":
            self._drop(event["run_id"])
            where = f" on {event['node']}" if event.get("node") else ""
            self.run_tasks[event["run_id"]] = self.progress.add_task(f"  {event['run_id']}{where}",
                                                                     total=event["limit"])
        elif kind == "step" and event["run_id"] in self.run_tasks:
            # An own job's events carry no loss (its log reports evaluations only).
            loss = f" loss {event['loss']:.4g}" if event.get("loss") is not None else ""
            desc = f"  {event['run_id']}{loss} metric {event['metric']:.4g}"
            self.progress.update(self.run_tasks[event["run_id"]], completed=event["step"], total=event["limit"],
                                 description=desc)
        elif kind == "retry":
            self._drop(event["run_id"])
            self.console.print(f"[retry] {event['run_id']}: attempt {event['attempt']} after {event['reason']}",
                               markup=False, highlight=False, soft_wrap=True)
        elif kind == "done":
            result = event["result"]
            self._drop(result.run_id)
            self.progress.advance(self.suite_task)
            line = f"[{result.status}] {result.run_id}"
            if result.status == "completed" and result.speed_probe is not None:
                probe = result.speed_probe
                line += f": {probe.rounds} rounds of {probe.precision} and {probe.reference}"
                if result.wall_s is not None:
                    line += f", {result.wall_s:.1f} s"
            elif result.status == "completed":
                done = (f"{result.train_samples} samples" if result.spec.command is not None
                        else f"{result.steps} steps")  # an own job's steps are its own
                line += f": {result.metric} {result.final_metric:.4g} after {done}"
                if result.wall_s is not None:
                    line += f", {result.wall_s:.1f} s"
            else:
                line += f": {result.reason}"
            self.console.print(line, markup=False, highlight=False)

    def _drop(self, run_id: str) -> None:
        task = self.run_tasks.pop(run_id, None)
        if task is not None:
            self.progress.remove_task(task)
