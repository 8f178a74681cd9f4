"""Telemetry of :class:`~ampcert.amp.torch.scaler.DynamicLossScaler`: the scale after
every update, whether the update saw an overflow and whether a step was skipped,
recorded on the device without syncing.

Each :meth:`~Trajectory.record` writes one row (scale, found_inf, skipped) in float32
into a preallocated device buffer of :data:`CHUNK` rows: 12 bytes per update on the
device, and no host read.  :meth:`~Trajectory.collect` moves everything recorded since
its last call to the host in one transfer (one sync), where it is kept in compact
arrays (4 + 1 + 1 = 6 bytes per update: a million steps cost ~6 MB).

Under ``torch.compile`` a row cannot be placed by a Python counter: the tracer
reads the counter as a constant, so a counter that changes every step would
recompile the step every step. Traced updates instead write into a separate
device buffer of :data:`TRACED_ROWS` rows at a position kept in a device tensor
(:meth:`~Trajectory.record` picks the path by ``torch.compiler.is_compiling()``);
:meth:`~Trajectory.collect` appends those rows after the eagerly recorded ones.
``collect()`` must run at least once per :data:`TRACED_ROWS` traced updates
(ampcert's training loop collects at every evaluation); rows past that are
not kept, and ``collect()`` raises saying how many were lost.

Imports torch and the standard library only.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

import torch

__all__ = ["CHUNK", "TRACED_ROWS", "Trajectory"]

#: Rows of telemetry per device buffer.
CHUNK = 1024
#: Rows the traced (torch.compile) path keeps between two collect() calls.
TRACED_ROWS = 8192

_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)


class Trajectory:
    """Rows recorded on the device in chunks, moved to host arrays on demand."""

    # The traced path's buffer and its next row, both on the device (see the module doc),
    # and whether a traced update wrote to it (set in the trace, never read there:
    # collect() reads it eagerly, and asks the device nothing when it is unset).
    # Class defaults, so a trajectory pickled before the traced path existed loads.
    _traced: tuple[torch.Tensor, torch.Tensor] | None = None
    _traced_used: bool = False

    def __init__(self, scale: Iterable[float] = (), found: Iterable[int] = (), skipped: Iterable[int] = ()) -> None:
        self._chunks: list[torch.Tensor] = []
        self._fill = 0
        self._scale = array("f", scale)
        self._found = array("b", found)
        self._skipped = array("b", skipped)

    def record(
        self, scale: torch.Tensor, found: torch.Tensor | None, skipped: torch.Tensor | None, sync_free: bool
    ) -> None:
        """One row: ``scale`` after the update, whether any flag in ``found`` was set,
        whether a step was skipped (``None``: no flag, recorded as 0)."""
        if _compiling():
            self._record_traced(scale, found, skipped)
            return
        if self._traced is None:  # made eagerly, so a later trace finds it and need not make it
            self._traced = self._traced_buffer(scale.device)
        if scale.device.type == "cpu" and not sync_free:
            # The syncing path already reads the device each step, and on a CPU a
            # read is free: three host appends are ~10x cheaper than the three
            # small tensor ops of the device path. (sync_free keeps the device
            # path, so its no-read guarantee holds and stays testable on a CPU.)
            self.collect()  # keep order if the device path was used before
            self._scale.append(scale.item())
            self._found.append(0 if found is None else int(found.item() != 0))
            self._skipped.append(0 if skipped is None else int(skipped.item() != 0))
            return
        if not self._chunks or self._fill == CHUNK:
            self._chunks.append(torch.empty((CHUNK, 3), dtype=torch.float32, device=scale.device))
            self._fill = 0
        zero = scale.new_zeros(())
        row = self._chunks[-1][self._fill]
        torch.stack(
            (
                scale,
                zero if found is None else found.ne(0).to(torch.float32),
                zero if skipped is None else skipped.ne(0).to(torch.float32),
            ),
            out=row,
        )
        self._fill += 1

    @staticmethod
    def _traced_buffer(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.zeros((TRACED_ROWS, 3), dtype=torch.float32, device=device),
                torch.zeros((1,), dtype=torch.int64, device=device))

    def _record_traced(self, scale: torch.Tensor, found: torch.Tensor | None, skipped: torch.Tensor | None) -> None:
        if self._traced is None:
            self._traced = self._traced_buffer(scale.device)
        rows, next_row = self._traced
        zero = scale.new_zeros(())
        row = torch.stack((
            scale.to(torch.float32),
            zero if found is None else found.ne(0).to(torch.float32),
            zero if skipped is None else skipped.ne(0).to(torch.float32),
        ))
        # Past the end, the last row is overwritten and next_row keeps counting: collect() sees the loss.
        rows.index_copy_(0, next_row.clamp(max=TRACED_ROWS - 1), row.unsqueeze(0))
        next_row.add_(1)
        self._traced_used = True

    def _collect_traced(self) -> None:
        if self._traced is None or not self._traced_used:
            return  # (eager-only training: no sync for a buffer nothing wrote to)
        rows, next_row = self._traced
        n = int(next_row.item())  # the one sync
        self._traced_used = False
        if n == 0:
            return
        kept = rows[: min(n, TRACED_ROWS)].cpu().tolist()
        next_row.zero_()
        if n > TRACED_ROWS:
            kept = kept[:-1]  # the last row was overwritten by each update past the end
        for scale, found, skipped in kept:
            self._scale.append(scale)
            self._found.append(int(found))
            self._skipped.append(int(skipped))
        if n > TRACED_ROWS:
            raise RuntimeError(f"loss-scale trajectory: {n - len(kept)} of {n} traced updates were not recorded; "
                               f"call collect() (or trajectory()) at least every {TRACED_ROWS} compiled steps")

    def collect(self) -> None:
        """Move the rows still on the device to the host arrays (one sync per buffer
        in use): the eagerly recorded ones first, then the traced ones."""
        self._collect_eager()
        self._collect_traced()

    def _collect_eager(self) -> None:
        if not self._chunks:
            return
        used = list(self._chunks[:-1]) + [self._chunks[-1][: self._fill]]
        rows = torch.cat(used).cpu()  # the one sync
        self._chunks = []
        self._fill = 0
        self._scale.extend(rows[:, 0].tolist())
        self._found.extend(int(v) for v in rows[:, 1].tolist())
        self._skipped.extend(int(v) for v in rows[:, 2].tolist())

    def as_dict(self) -> dict[str, list]:
        """``{"scale": [...], "found_inf": [...], "skipped_steps": [...]}`` (collects first)."""
        self.collect()
        return {
            "scale": list(self._scale),
            "found_inf": [bool(v) for v in self._found],
            "skipped_steps": [i for i, v in enumerate(self._skipped) if v],
        }
