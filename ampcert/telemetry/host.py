"""Host telemetry: RAPL package energy, process memory, CPU utilisation.

RAPL (Running Average Power Limit) energy counters are exposed by the Linux
powercap framework as ``/sys/class/powercap/intel-rapl:N/energy_uj`` (AMD
Zen CPUs use the same ``intel-rapl`` zones on recent kernels). Only the
top-level *package* zones are summed: their ``intel-rapl:N:M`` sub-zones
(core, uncore, dram) are parts of, or beside, the package and would double
count, ``psys`` is the whole platform, and ``intel-rapl-mmio`` zones mirror
the package zones. The counter wraps at ``max_energy_range_uj``; a reading
lower than the previous one is taken as one wrap. At 10 Hz a second wrap
between two readings would need several kW, so one wrap per interval is
safe. Since Linux 5.10 ``energy_uj`` is readable by root only
(CVE-2020-8694); an unreadable counter makes host energy ``None`` with that
reason, never zero.

The sysfs root is a parameter so the reader can be tested on a folder that a
test builds.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POWERCAP_ROOT = Path("/sys/class/powercap")


def _read_int(path: Path) -> int:
    return int(path.read_text(encoding="ascii").strip())


def _why(exc: OSError | ValueError, path: Path) -> str:
    if isinstance(exc, PermissionError):
        return (f"{path} is not readable by this user (root-only since Linux 5.10, CVE-2020-8694; "
                "run as root or make energy_uj readable to enable RAPL)")
    if isinstance(exc, ValueError):
        return f"{path} does not hold an integer ({exc})"
    return f"{path}: {exc.strerror or exc}"


@dataclass
class RaplDomain:
    zone: str          # e.g. intel-rapl:0
    name: str          # e.g. package-0
    path: Path
    max_range_uj: int | None
    last_uj: int | None = None
    total_uj: int = 0  # unwrapped energy since the first reading
    wraps: int = 0


class RaplReader:
    """Unwrapped energy of the RAPL package domains under ``root``.

    ``available`` is False with ``reason`` set when there is nothing readable;
    :meth:`read` then returns None. Readings are cumulative joules since the
    reader's first reading, summed over packages.
    """

    def __init__(self, root: str | Path = POWERCAP_ROOT):
        self.root = Path(root)
        self.domains: list[RaplDomain] = []
        self.reason: str | None = None
        self._discover()
        if self.domains:
            first = self.read()
            if first is None and self.reason is None:  # pragma: no cover - read() sets a reason
                self.reason = "RAPL counters could not be read"

    @property
    def available(self) -> bool:
        return bool(self.domains) and self.reason is None

    @property
    def method(self) -> str:
        names = ", ".join(f"{d.zone} ({d.name})" for d in self.domains)
        return (f"RAPL package energy counters under {self.root} ({names}): deltas of energy_uj, "
                "wraparound corrected with max_energy_range_uj; whole CPU package(s), all processes")

    def _discover(self) -> None:
        if not self.root.is_dir():
            self.reason = f"{self.root} not present (no powercap/RAPL support on this kernel or platform)"
            return
        zones = sorted(p for p in self.root.iterdir()
                       if p.name.startswith("intel-rapl:") and p.name.count(":") == 1)
        for zone in zones:
            try:
                name = (zone / "name").read_text(encoding="ascii").strip()
            except OSError:
                continue
            if not name.startswith("package"):
                continue  # psys (platform) or an unknown top-level domain
            try:
                max_range = _read_int(zone / "max_energy_range_uj")
            except (OSError, ValueError):
                max_range = None
            self.domains.append(RaplDomain(zone.name, name, zone / "energy_uj", max_range))
        if not self.domains:
            self.reason = f"no RAPL package domains (intel-rapl:N with name package-N) under {self.root}"

    def read(self) -> float | None:
        """Cumulative joules since the first reading, or None (with ``reason``)."""
        if not self.domains:
            return None
        for d in self.domains:
            try:
                uj = _read_int(d.path)
            except (OSError, ValueError) as exc:
                self.reason = _why(exc, d.path)
                return None
            if d.last_uj is not None:
                delta = uj - d.last_uj
                if delta < 0:
                    if d.max_range_uj is None:
                        self.reason = (f"{d.path} wrapped and {d.path.parent / 'max_energy_range_uj'} "
                                       "is unreadable, so the wrap cannot be corrected")
                        return None
                    delta += d.max_range_uj
                    d.wraps += 1
                d.total_uj += delta
            d.last_uj = uj
        self.reason = None
        return sum(d.total_uj for d in self.domains) / 1e6


class ProcStats:
    """The process's RSS and CPU time and the system's CPU use, read cheaply:
    ``/proc/<pid>/statm`` and the first line of ``/proc/stat`` through file
    descriptors kept open (one ``pread`` each), CPU time from ``time.process_time``.
    About 15 us a sample, against ~130 us through psutil; on a 2-core
    machine every microsecond the sampler holds the GIL or a core is taken
    from the training loop. Where /proc is missing, psutil does the same."""

    def __init__(self) -> None:
        pid = os.getpid()
        self._statm = os.open(f"/proc/{pid}/statm", os.O_RDONLY)
        try:
            self._stat = os.open("/proc/stat", os.O_RDONLY)
        except OSError:
            os.close(self._statm)
            raise
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._last_cpu = self._cpu_times()
        self._last_sys = self._sys_times()

    @staticmethod
    def _cpu_times() -> tuple[float, float]:
        # CLOCK_PROCESS_CPUTIME_ID: every thread, ns resolution (os.times ticks at 10 ms).
        return (time.perf_counter(), time.process_time())

    def _sys_times(self) -> tuple[int, int]:
        fields = os.pread(self._stat, 512, 0).split(b"\n", 1)[0].split()[1:9]
        values = [int(v) for v in fields]  # user nice system idle iowait irq softirq steal
        total = sum(values)
        return (total - values[3] - values[4], total)

    def rss(self) -> int:
        return int(os.pread(self._statm, 128, 0).split()[1]) * self._page

    def cpu_process_pct(self) -> float | None:
        """CPU time of all the process's threads over wall time since the last call (100 = one core)."""
        now = self._cpu_times()
        (t0, c0), (t1, c1) = self._last_cpu, now
        self._last_cpu = now
        return 100.0 * (c1 - c0) / (t1 - t0) if t1 > t0 else None

    def cpu_system_pct(self) -> float | None:
        """Busy share of all CPUs since the last call, from /proc/stat (0-100)."""
        now = self._sys_times()
        (b0, n0), (b1, n1) = self._last_sys, now
        self._last_sys = now
        return 100.0 * (b1 - b0) / (n1 - n0) if n1 > n0 else None

    def close(self) -> None:
        for fd in (self._statm, self._stat):
            try:
                os.close(fd)
            except OSError:
                pass


class _PsutilStats:
    """The same three readings through psutil (platforms without /proc)."""

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self._proc = psutil.Process(os.getpid())
        self._proc.cpu_percent(None)  # the first call only primes the counters
        psutil.cpu_percent(None)

    def rss(self) -> int:
        return int(self._proc.memory_info().rss)

    def cpu_process_pct(self) -> float | None:
        return float(self._proc.cpu_percent(None))

    def cpu_system_pct(self) -> float | None:
        return float(self._psutil.cpu_percent(None))

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class ProcInfo:
    """One process as /proc/<pid>/stat shows it (times in clock ticks, RSS in pages)."""

    pid: int
    ppid: int
    session: int
    state: str
    cpu_ticks: int  # utime + stime + cutime + cstime: its own and its waited-for children's
    rss_pages: int
    start_ticks: int


def read_proc(pid: int) -> ProcInfo | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    f = text[text.rfind(")") + 2:].split()
    if len(f) < 22:
        return None
    return ProcInfo(pid=pid, ppid=int(f[1]), session=int(f[3]), state=f[0],
                    cpu_ticks=int(f[11]) + int(f[12]) + int(f[13]) + int(f[14]),
                    rss_pages=int(f[21]), start_ticks=int(f[19]))


def process_tree(root: int) -> list[ProcInfo]:
    """The living processes of ``root``'s tree: those in the session it leads (a job
    started with ``start_new_session``) and every descendant of ``root``, whichever
    session it moved to. Zombies (ended, not yet reaped) are left out."""
    procs = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if name.isdigit():
            info = read_proc(int(name))
            if info is not None and info.state not in ("Z", "X"):
                procs[info.pid] = info
    children: dict[int, list[int]] = {}
    for info in procs.values():
        children.setdefault(info.ppid, []).append(info.pid)
    members = {pid for pid, info in procs.items() if info.session == root}
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in procs:
            members.add(pid)
        todo.extend(c for c in children.get(pid, ()) if c not in members)
    return [procs[pid] for pid in sorted(members)]


class TreeStats:
    """:class:`ProcStats`' three readings for a job ampcert does not run itself: the
    summed RSS and CPU time of the job's whole process tree (:func:`process_tree`,
    one pass over /proc a sample), and the system's CPU use."""

    def __init__(self, root: int, *, count_root: bool = True) -> None:
        self.root = root
        # False: ``root`` is the job's keeper (own_job/keeper.py), not the job's own
        # memory or CPU time, and is left out of the sums (its tree is still the job's).
        self.count_root = count_root
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._tick = os.sysconf("SC_CLK_TCK")
        self._sys = ProcStats()
        self._tree: list[ProcInfo] = []
        self._ticks: dict[tuple[int, int], int] = {}  # (pid, start) -> cpu ticks at the last sample
        self._last_t = time.perf_counter()
        self.peak_rss = 0
        self.peak_processes = 0

    def rss(self) -> int:
        self._tree = [p for p in process_tree(self.root) if self.count_root or p.pid != self.root]
        total = sum(p.rss_pages for p in self._tree) * self._page
        self.peak_rss = max(self.peak_rss, total)
        self.peak_processes = max(self.peak_processes, len(self._tree))
        return total

    def cpu_process_pct(self) -> float | None:
        """CPU time of the tree's processes since the last sample over wall time (100 = one core)."""
        now = time.perf_counter()
        ticks = {(p.pid, p.start_ticks): p.cpu_ticks for p in self._tree}
        used = sum(t - self._ticks.get(key, 0) for key, t in ticks.items())
        wall, self._last_t, self._ticks = now - self._last_t, now, ticks
        return 100.0 * used / self._tick / wall if wall > 0 else None

    def cpu_system_pct(self) -> float | None:
        return self._sys.cpu_system_pct()

    def close(self) -> None:
        self._sys.close()


def peak_rss_bytes() -> int:
    """The process's lifetime peak resident set (getrusage ru_maxrss)."""
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(maxrss if sys.platform == "darwin" else maxrss * 1024)


class HostSource:
    """One telemetry source for the host: RAPL package power/energy, the
    process's RSS and CPU use, and system-wide CPU use."""

    kind = "host"
    columns = ("package_w", "rss_bytes", "cpu_process_pct", "cpu_system_pct")
    power_column = "package_w"
    # package_w is the mean over the interval since the previous reading, so
    # it is not integrated point by point; energy comes from the counter.
    power_is_interval_mean = True

    def __init__(self, name: str = "host", powercap_root: str | Path = POWERCAP_ROOT, *,
                 tree: TreeStats | None = None):
        self.name = name
        self.rapl = RaplReader(powercap_root)
        self.reasons: dict[str, str] = {}
        self._last: tuple[float, float] | None = None  # (time, joules) at the last sample
        self._stats: ProcStats | _PsutilStats | TreeStats | None = tree
        self.tree = tree
        errors = []
        for kind in (ProcStats, _PsutilStats) if tree is None else ():
            try:
                self._stats = kind()
                break
            except Exception as exc:  # noqa: BLE001 - no /proc, no psutil
                errors.append(f"{kind.__name__}: {type(exc).__name__}: {exc}")
        if self._stats is None:
            for col in ("rss_bytes", "cpu_process_pct", "cpu_system_pct"):
                self.reasons[col] = "; ".join(errors)
        if not self.rapl.available:
            self.reasons["package_w"] = f"RAPL unavailable: {self.rapl.reason}"

    # -- the Source protocol -------------------------------------------------

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "power_method": ("RAPL package energy delta / time between consecutive samples"
                             if self.rapl.available else None),
            "energy_method": self.rapl.method if self.rapl.available else None,
            "memory_method": self._memory_method(),
            "cpu_method": ("cpu_process_pct: " + ("the job's process tree's" if isinstance(self._stats, TreeStats)
                                                  else "this process's") + " CPU time (time.process_time) over wall time, 100 = one core; "
                           "cpu_system_pct: busy share of all CPUs "
                           + ("(/proc/stat)" if isinstance(self._stats, ProcStats) else "(psutil)")),
            "rapl_domains": [d.zone for d in self.rapl.domains],
        }

    def _memory_method(self) -> str:
        if isinstance(self._stats, TreeStats):
            return ("resident set size summed over the job's process tree (its session and every "
                    "descendant), sampled from /proc/<pid>/stat; memory shared between them counts once per process")
        return ("resident set size of this process, sampled "
                + ("(/proc/<pid>/statm)" if isinstance(self._stats, ProcStats) else "(psutil)")
                + ", and getrusage ru_maxrss")

    def energy_j(self, t: float) -> float | None:
        j = self.rapl.read()
        if j is None:
            self.reasons["package_w"] = f"RAPL unavailable: {self.rapl.reason}"
        return j

    def sample(self, t: float) -> tuple[Any, ...]:
        watts = None
        if self.rapl.domains:
            # Power over the interval since the previous *sample* (edge readings
            # of the counter in between do not shorten it).
            prev = self._last
            j = self.energy_j(t)
            if j is not None:
                if prev is not None and t > prev[0]:
                    watts = (j - prev[1]) / (t - prev[0])
                self._last = (t, j)
        rss = cpu_proc = cpu_sys = None
        if self._stats is not None:
            try:
                rss = self._stats.rss()
                cpu_proc = self._stats.cpu_process_pct()
                cpu_sys = self._stats.cpu_system_pct()
            except Exception as exc:  # noqa: BLE001 - keep sampling the rest
                self.reasons.setdefault("rss_bytes", f"{type(exc).__name__}: {exc}")
        return (watts, rss, cpu_proc, cpu_sys)

    def energy_unavailable_reason(self) -> str | None:
        return None if self.rapl.available else f"RAPL unavailable: {self.rapl.reason}"

    def extra_summary(self) -> dict[str, Any]:
        return {"rapl_wraps": sum(d.wraps for d in self.rapl.domains)} if self.rapl.domains else {}

    def close(self) -> None:
        if self._stats is not None:
            self._stats.close()
