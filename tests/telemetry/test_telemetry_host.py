"""RAPL on a sysfs-shaped folder built by the test: discovery, wraparound,
unreadable counters; and RAPL energy per phase through the live sampler."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from ampcert.telemetry import RaplReader, Telemetry
from ampcert.telemetry import host as host_mod

MAX_UJ = 1_000_000  # a tiny range, so the test can wrap it


def zone(root: Path, name: str, label: str, energy_uj: int | None = 0, max_uj: int | None = MAX_UJ) -> Path:
    z = root / name
    z.mkdir(parents=True)
    (z / "name").write_text(label + "\n")
    if energy_uj is not None:
        (z / "energy_uj").write_text(f"{energy_uj}\n")
    if max_uj is not None:
        (z / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return z


def set_uj(z: Path, value: int) -> None:
    """Replace energy_uj atomically, as the kernel's reads are (no torn reads)."""
    tmp = z / ".energy_uj.tmp"
    tmp.write_text(f"{value}\n")
    os.replace(tmp, z / "energy_uj")


@pytest.fixture
def powercap(tmp_path):
    """Two packages, plus the zones that must not be counted: a core
    sub-zone, psys, and an MMIO mirror of package 0."""
    root = tmp_path / "powercap"
    p0 = zone(root, "intel-rapl:0", "package-0", 900_000)
    zone(root, "intel-rapl:0:0", "core", 400_000)
    zone(root, "intel-rapl:1", "psys", 5_000_000, 10 * MAX_UJ)
    p1 = zone(root, "intel-rapl:2", "package-1", 10_000)
    zone(root, "intel-rapl-mmio:0", "package-0", 900_000)
    return root, p0, p1


def test_package_domains_only_and_wraparound(powercap):
    root, p0, p1 = powercap
    r = RaplReader(root)
    assert r.available and r.reason is None
    assert [d.zone for d in r.domains] == ["intel-rapl:0", "intel-rapl:2"]
    assert r.read() == 0.0
    set_uj(p0, 950_000)
    set_uj(p1, 30_000)
    assert r.read() == pytest.approx(0.05 + 0.02)
    # package-0 wraps: 950000 -> max -> 100000 is 50000 + 100000 uJ.
    set_uj(p0, 100_000)
    set_uj(p1, 40_000)
    assert r.read() == pytest.approx(0.07 + 0.15 + 0.01)
    assert r.domains[0].wraps == 1 and r.domains[1].wraps == 0
    assert "wraparound corrected" in r.method and "intel-rapl:2 (package-1)" in r.method


def test_no_powercap_no_packages_and_unreadable_counters(tmp_path, monkeypatch):
    missing = RaplReader(tmp_path / "absent")
    assert not missing.available and missing.read() is None
    assert "not present" in missing.reason

    only_psys = tmp_path / "psys-only"
    zone(only_psys, "intel-rapl:0", "psys")
    assert "no RAPL package domains" in RaplReader(only_psys).reason

    # energy_uj is root-only since Linux 5.10: a PermissionError is reported
    # as such (tests run as root here, so the error is injected).
    root = tmp_path / "locked"
    zone(root, "intel-rapl:0", "package-0", 5)
    real_read = host_mod._read_int

    def deny(path: Path) -> int:
        if path.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(path))
        return real_read(path)

    monkeypatch.setattr(host_mod, "_read_int", deny)
    locked = RaplReader(root)
    assert not locked.available and locked.read() is None
    assert "not readable by this user" in locked.reason and "CVE-2020-8694" in locked.reason


def test_a_wrap_without_max_range_is_refused_not_guessed(tmp_path):
    root = tmp_path / "pc"
    p0 = zone(root, "intel-rapl:0", "package-0", 500, max_uj=None)
    r = RaplReader(root)
    set_uj(p0, 700)
    assert r.read() == pytest.approx(200e-6)
    set_uj(p0, 100)
    assert r.read() is None and "cannot be corrected" in r.reason


def test_rapl_energy_per_phase_through_the_sampler(powercap):
    """Counter values set between phases give exact joules per phase, a wrap included."""
    root, p0, p1 = powercap
    tel = Telemetry.start("cpu", rate_hz=20.0, powercap_root=root)
    time.sleep(0.1)
    set_uj(p0, 100_000)                 # wraps: +200000 uJ
    tel.phase("train")
    time.sleep(0.1)
    set_uj(p0, 600_000)                 # +500000 uJ
    set_uj(p1, 110_000)                 # +100000 uJ
    tel.phase("eval")
    time.sleep(0.1)
    set_uj(p0, 700_000)                 # +100000 uJ
    s = tel.stop(train_samples=60)
    host = s["sources"]["host"]
    assert host["energy_method"].startswith("counter: RAPL package energy counters")
    assert host["energy_j"]["init"] == pytest.approx(0.2)
    assert host["energy_j"]["train"] == pytest.approx(0.6)
    assert host["energy_j"]["eval"] == pytest.approx(0.1)
    assert host["energy_j"]["total"] == pytest.approx(0.9)
    assert host["rapl_wraps"] == 1
    assert host["train_j_per_sample"] == pytest.approx(0.01)
    assert s["energy"]["scope"] == "host" and s["energy"]["train_j_per_sample"] == pytest.approx(0.01)
    assert s["host_energy"] == {"available": True, "reason": None}
    json.dumps(s, allow_nan=False)
    # package_w in the series is the counter's delta over the sample interval.
    assert host["peak_w"]["total"] > 0 and "package_w" not in host["unavailable"]


@pytest.mark.serial  # compares CPU-time readings: another test on the other core disturbs them
def test_process_memory_and_cpu_readings_agree_with_psutil(tmp_path, monkeypatch):
    import psutil

    src = host_mod.HostSource(powercap_root=tmp_path / "none")
    assert "/proc/<pid>/statm" in src.describe()["memory_method"]
    end = time.perf_counter() + 0.3
    while time.perf_counter() < end:  # one busy core
        pass
    watts, rss, cpu_proc, cpu_sys = src.sample(1.0)
    assert watts is None and "RAPL unavailable" in src.reasons["package_w"]
    assert rss == pytest.approx(psutil.Process().memory_info().rss, rel=0.05)
    assert 50 <= cpu_proc <= 250 and 0 <= cpu_sys <= 100
    src.close()
    # Without /proc, psutil gives the same readings.
    monkeypatch.setattr(host_mod, "ProcStats", _NoProc)
    fallback = host_mod.HostSource(powercap_root=tmp_path / "none")
    assert "(psutil)" in fallback.describe()["memory_method"]
    assert fallback.sample(2.0)[1] == pytest.approx(psutil.Process().memory_info().rss, rel=0.05)


class _NoProc:
    def __init__(self):
        raise FileNotFoundError(2, "No such file or directory", "/proc/self/statm")
