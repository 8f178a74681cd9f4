"""The report's plots as inline SVG, byte-for-byte reproducible.

matplotlib's SVG backend is deterministic once three things are pinned: the
hash salt behind element ids (set per figure, so ids never collide between
the figures of one page), the ``Date`` metadata (dropped), and text kept as
text (``svg.fonttype: none``) so no font outlines depend on the fonts
installed. Colours are fixed per precision. Every function returns an SVG
string without the XML prolog, ready to inline, or None when the data for
that plot does not exist (the page then says what is missing).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("svg")

import matplotlib.pyplot as plt  # noqa: E402

from ampcert.aggregate import is_repeat  # noqa: E402
from ampcert.memory import MemoryFit  # noqa: E402
from ampcert.results import RunResult  # noqa: E402

COLOURS = {"fp32": "#1f4e79", "bf16": "#2e8b57", "fp16": "#c0504d"}
_STYLE = {"svg.fonttype": "none", "font.size": 9, "axes.titlesize": 10, "figure.dpi": 72,
          "axes.spines.top": False, "axes.spines.right": False, "font.family": "sans-serif"}


def _svg(fig, salt: str) -> str:
    buf = io.StringIO()
    with plt.rc_context({"svg.hashsalt": f"ampcert-{salt}"}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None}, bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    # The RDF metadata block only names namespaces and the creator; drop it.
    start, end = text.find("<metadata>"), text.find("</metadata>")
    if start != -1 and end != -1:
        text = text[:start] + text[end + len("</metadata>"):]
    return text


def _figure(title: str, xlabel: str, ylabel: str):
    with plt.rc_context(_STYLE):
        fig, ax = plt.subplots(figsize=(5.6, 3.0))
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    return fig, ax


def _by_precision(runs: Sequence[RunResult]) -> list[tuple[str, list[RunResult]]]:
    order = ["fp32", "bf16", "fp16"]
    groups: dict[str, list[RunResult]] = {}
    for r in sorted(runs, key=lambda r: (r.spec.seed, r.spec.repeat)):
        if not is_repeat(r) and r.status == "completed":
            groups.setdefault(r.spec.precision, []).append(r)
    return [(p, groups[p]) for p in order if p in groups]


def loss_curves(label: str, runs: Sequence[RunResult]) -> str | None:
    groups = _by_precision(runs)
    if not groups:
        return None
    with plt.rc_context(_STYLE):
        fig, ax = _figure(f"{label}: training loss", "step", "loss")
        for precision, rs in groups:
            for i, r in enumerate(rs):
                steps = [s + 1 for s, v in enumerate(r.loss) if v is not None]
                ax.plot(steps, [v for v in r.loss if v is not None], color=COLOURS[precision], lw=0.8,
                        alpha=0.9 if i == 0 else 0.35, label=precision if i == 0 else None)
        ax.legend(frameon=False)
        return _svg(fig, f"loss-{label}")


def eval_curves(label: str, runs: Sequence[RunResult]) -> str | None:
    groups = _by_precision(runs)
    if not groups or not any(r.evals for _, rs in groups for r in rs):
        return None
    with plt.rc_context(_STYLE):
        fig, ax = _figure(f"{label}: {groups[0][1][0].metric} over training time", "training time (s)",
                          groups[0][1][0].metric or "metric")
        for precision, rs in groups:
            for i, r in enumerate(rs):
                ax.plot([e.train_time_s for e in r.evals], [e.value for e in r.evals], marker="o", ms=2.5,
                        color=COLOURS[precision], lw=0.9, alpha=0.9 if i == 0 else 0.35,
                        label=precision if i == 0 else None)
        target = groups[0][1][0].spec.target
        if target is not None:
            ax.axhline(target, color="#888888", lw=0.8, ls="--", label="target")
        ax.legend(frameon=False)
        return _svg(fig, f"eval-{label}")


def loss_scale(label: str, runs: Sequence[RunResult]) -> str | None:
    scaled = [(p, [r for r in rs if r.loss_scale]) for p, rs in _by_precision(runs)]
    scaled = [(p, rs) for p, rs in scaled if rs]
    if not scaled:
        return None
    with plt.rc_context(_STYLE):
        fig, ax = _figure(f"{label}: loss scale (x = skipped step)", "step", "scale")
        ax.set_yscale("log", base=2)
        for precision, rs in scaled:
            for i, r in enumerate(rs):
                steps = list(range(1, len(r.loss_scale) + 1))
                ax.step(steps, r.loss_scale, where="post", color=COLOURS[precision], lw=0.9,
                        alpha=0.9 if i == 0 else 0.35, label=f"{precision} seed {r.spec.seed}" if i < 3 else None)
                skipped = [s for s in (r.skipped_steps or []) if 1 <= s <= len(r.loss_scale)]
                ax.plot(skipped, [r.loss_scale[s - 1] for s in skipped], "x", color="#000000", ms=4)
        ax.legend(frameon=False)
        return _svg(fig, f"scale-{label}")


def _power_series(path: Path) -> tuple[list[float], dict[str, list[float | None]]]:
    with path.open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    cols = [c for c in (rows[0].keys() if rows else []) if c.endswith("power_w") or c.endswith("package_w")]
    t = [float(r["t_s"]) for r in rows]
    series = {c: [float(r[c]) if r.get(c) not in (None, "") else None for r in rows] for c in cols}
    return t, {c: v for c, v in series.items() if any(x is not None for x in v)}


def power(label: str, runs: Sequence[RunResult], root: Path) -> str | None:
    """Power over time of the first completed run of each precision, from its telemetry.csv."""
    traces = []
    for precision, rs in _by_precision(runs):
        path = root / "runs" / rs[0].run_id / "telemetry.csv"
        if path.is_file():
            t, series = _power_series(path)
            for col, values in series.items():
                traces.append((precision, col, t, values))
    if not traces:
        return None
    with plt.rc_context(_STYLE):
        fig, ax = _figure(f"{label}: power (seed {min(r.spec.seed for r in runs)})", "time in run (s)", "W")
        for precision, col, t, values in traces:
            pts = [(a, b) for a, b in zip(t, values, strict=True) if b is not None]
            ax.plot([a for a, _ in pts], [b for _, b in pts], color=COLOURS[precision], lw=0.8,
                    label=f"{precision} {col}")
        ax.legend(frameon=False, fontsize=7)
        return _svg(fig, f"power-{label}")


def memory_fit(label: str, fits: Sequence[MemoryFit], salt: str) -> str | None:
    """Peak memory against batch size: each precision's measured peaks (dots) and its fitted
    line from batch 0 (where it meets the fixed bytes) to its largest batch measured; a batch
    that did not fit in the device's memory as a dotted line at that batch."""
    measured = [f for f in fits if f.points]
    if not measured:
        return None
    mib = 2**20
    with plt.rc_context(_STYLE):
        fig, ax = _figure(f"{label}: peak memory against batch size", "batch size (dots: measured, lines: fitted)",
                          "peak (MiB)")
        for f in measured:
            precision = f.subject.precision
            colour = COLOURS.get(precision, "#777777")
            ax.plot([p.batch for p in f.points], [p.peak_bytes / mib for p in f.points], "o", color=colour, ms=4,
                    label=precision)
            right = max(p.batch for p in f.points)
            low, high = f.predict(0), f.predict(right)
            if low is not None and high is not None:
                ax.plot([0, right], [low / mib, high / mib], color=colour, lw=1.0)
            for d in f.does_not_fit:
                ax.axvline(d.batch, color=colour, lw=0.8, ls=":", label=f"{precision}: batch {d.batch} did not fit")
        ax.set_xlim(left=0)
        ax.legend(frameon=False, fontsize=7)
        return _svg(fig, salt)


def bars(title: str, labels: list[str], values: list[float | None], unit: str, salt: str,
         reference: float | None = None) -> str | None:
    """A bar per precision; bars without a value are left out and named in the caption."""
    pts = [(lab, v) for lab, v in zip(labels, values, strict=True) if v is not None]
    if not pts:
        return None
    with plt.rc_context(_STYLE):
        fig, ax = plt.subplots(figsize=(3.6, 2.6))
        ax.set_title(title)
        ax.bar([p for p, _ in pts], [v for _, v in pts],
               color=[COLOURS.get(p.split()[0], "#777777") for p, _ in pts])
        for i, (_, v) in enumerate(pts):
            ax.annotate(f"{v:.3g}", (i, v), ha="center", va="bottom", fontsize=8)
        if reference is not None:
            ax.axhline(reference, color="#888888", lw=0.8, ls="--")
        ax.set_ylabel(unit)
        missing = [lab for lab, v in zip(labels, values, strict=True) if v is None]
        if missing:
            ax.set_xlabel(f"not measured: {', '.join(missing)}", fontsize=7)
        return _svg(fig, salt)


def history_series(title: str, nights: Sequence[str], series: Mapping[str, Sequence[float]],
                   change_points: Mapping[str, Sequence[int]], unit: str, salt: str) -> str | None:
    """Nightly series (one line per name, night by night) with each series' change
    points marked by a dashed line at the night a new level starts, labelled with
    that night's date."""
    if not nights or not series:
        return None
    with plt.rc_context(_STYLE):
        fig, ax = plt.subplots(figsize=(6.4, 3.0))
        ax.set_title(title)
        x = list(range(len(nights)))
        for i, (name, values) in enumerate(sorted(series.items())):
            colour = COLOURS.get(name.rsplit("/", 1)[-1], f"C{i % 10}")
            ax.plot(x[-len(values):], values, marker="o", ms=2.5, lw=1.0, color=colour, label=name)
            for c in change_points.get(name, ()):
                at = len(nights) - len(values) + c
                ax.axvline(at, color=colour, lw=0.9, ls="--")
                ax.annotate(nights[at][:10], (at, ax.get_ylim()[1]), fontsize=7, rotation=90, va="top",
                            ha="right", color=colour)
        step = max(len(nights) // 8, 1)
        ax.set_xticks(x[::step], [n[:10] for n in nights][::step], rotation=30, ha="right", fontsize=7)
        ax.set_ylabel(unit)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, frameon=False)
        return _svg(fig, salt)


def intervals(title: str, labels: list[str], values: list[float | None], ranges: list[list[float] | None],
              unit: str, salt: str) -> str | None:
    """A horizontal bar per system with its interval as an error bar; systems without a value are named
    in the caption."""
    pts = [(lab, v, r) for lab, v, r in zip(labels, values, ranges, strict=True) if v is not None]
    if not pts:
        return None
    # Names come from folders: a "$" in one is text, not mathtext (which could fail to parse).
    with plt.rc_context({**_STYLE, "text.parse_math": False}):
        fig, ax = plt.subplots(figsize=(6.4, 0.5 + 0.42 * len(pts)))
        ax.set_title(title)
        ys = list(range(len(pts)))[::-1]
        low = [v - (r[0] if r else v) for _, v, r in pts]
        high = [(r[1] if r else v) - v for _, v, r in pts]
        ax.barh(ys, [v for _, v, _ in pts], xerr=[low, high], color="#1f4e79", alpha=0.8,
                error_kw={"ecolor": "#222222", "capsize": 3, "lw": 0.9})
        ax.set_yticks(ys, [lab for lab, _, _ in pts], fontsize=7)
        for y, (_, v, r) in zip(ys, pts, strict=True):
            ax.annotate(f" {v:.3g}", ((r[1] if r else v), y), va="center", fontsize=7)
        ax.set_xlabel(unit)
        missing = [lab for lab, v in zip(labels, values, strict=True) if v is None]
        if missing:
            ax.set_xlabel(f"{unit}; none for: {', '.join(missing)}", fontsize=7)
        return _svg(fig, salt)
