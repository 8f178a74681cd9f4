"""Reports as a verifier on another machine and a reviewer on a phone read them (issue 24):
no install paths in report.json/html or the summary (shipped files by package-relative
name and digest), the environment as readable facts with the raw fingerprint behind a
disclosure, and both pages within a 390 px wide screen and a 1280 px window (the browser test)."""

from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, chromium
from factories import CPU_CAPS, completed, failed, plan, write_results

from ampcert.capacity_planning import PRICING_FILE, PRICING_NAME, capacity_plan, load_pricing
from ampcert.certify.checks import evaluate
from ampcert.certify.rules import load_rules
from ampcert.envinfo import fingerprint
from ampcert.report import render
from ampcert.report.model import SCHEMA_FILE, environment_facts, json_schema, portable
from ampcert.resources import config_path
from ampcert.results import ResultsDir, atomic_write_json, load
from ampcert.workloads.images import digits_file

SUITE = {"name": "hardening", "description": "phone check: " + "unbroken-" * 20 + "end",
         "amp": "ampcert", "device": "cpu", "precisions": ["fp32", "fp16"], "seeds": [0, 1],
         "unaccelerated": "run", "certify": "default",
         "workloads": [{"workload": "digits", "id": "digits-with-a-long-entry-name-for-phones"}]}
PACKAGE = config_path().parent  # where this ampcert is installed (the checkout, in an editable install)
USER_DATA = "/home/someone/data/cifar-10-batches-py"  # a path a user gave: kept as written
FINGERPRINT = fingerprint()  # this machine's, so the facts are read from the shape envinfo writes


def _results(root: Path, install: dict[str, str]) -> Path:
    """A results folder as ``ampcert run`` leaves it on a machine whose installed files lie at
    ``install`` (policy, rules, digits): a plan.json with the fingerprint, verdicts, summary."""
    runs = []
    for spec in plan(SUITE):
        info = {"amp_policy": {"name": "torch-cpu", "sha256": "a" * 64, "effective_sha256": "b" * 64,
                               "source": install["policy"]},
                "data_info": {"source": "digits", "path": install["digits"], "sha256": "c" * 64}}
        if spec.precision == "fp16" and spec.seed == 1:
            runs.append(failed(spec, f"cannot read {USER_DATA}/data_batch_1: no such file", **info))
        else:
            runs.append(completed(spec, final_metric=0.95, **info))
    write_results(root, runs, suite=SUITE["name"])
    rd = ResultsDir(root)
    plan_json = json.loads(rd.plan_file.read_text())
    atomic_write_json(rd.plan_file, plan_json | {"device": "cpu", "created_at": "2026-01-01T00:00:00+00:00",
                                                 "capabilities": CPU_CAPS, "environment": FINGERPRINT})
    cert = evaluate(runs, load_rules("default"))
    atomic_write_json(rd.verdicts_file, cert.model_copy(update={"rules": cert.rules | {"source": install["rules"]}}))
    from ampcert.report import summary

    rs = load(root)
    summary.write(rs)
    render.write(rs)
    return root


HERE = {"policy": str(config_path("policies", "torch-cpu.yaml")), "rules": str(config_path("rules", "default.yaml")),
        "digits": str(digits_file())}
ELSEWHERE = {"policy": "/opt/tool/lib/python3.12/site-packages/ampcert/configs/policies/torch-cpu.yaml",
             "rules": "C:\\Py\\Lib\\site-packages\\ampcert\\configs\\rules\\default.yaml",
             "digits": "/opt/tool/lib/python3.12/site-packages/sklearn/datasets/data/digits.csv.gz"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return _results(tmp_path_factory.mktemp("hardening") / "out", HERE)


def _report(folder: Path) -> dict:
    return json.loads((folder / "report.json").read_text())


# --------------------------------------------------------------------------- install paths


def test_no_install_or_checkout_path_in_what_is_signed_or_summarised(folder):
    assert "-packages" in HERE["digits"] and HERE["policy"].startswith(str(PACKAGE))  # the fixture has them
    for name in ("report.json", "report.html", "summary.json", "summary.html"):
        text = (folder / name).read_text()
        for needle in (str(REPO), str(PACKAGE), sys.prefix, "site-packages", "dist-packages"):
            assert needle not in text, f"{name} holds {needle!r}"
    assert USER_DATA in (folder / "report.json").read_text() and USER_DATA in (folder / "summary.html").read_text()


def test_shipped_files_are_named_by_package_and_digest(folder):
    report = _report(folder)
    digest = hashlib.sha256(PRICING_FILE.read_bytes()).hexdigest()
    assert report["capacity"]["pricing"].startswith(PRICING_NAME) and PRICING_NAME == "ampcert:configs/pricing.yaml"
    assert report["capacity"]["pricing_sha256"] == digest
    assert digest in (folder / "report.html").read_text()
    assert [p["source"] for p in report["policies"] if p["name"] == "torch-cpu"] == [
        "ampcert:configs/policies/torch-cpu.yaml"]
    assert report["rules"]["source"] == report["certificate"]["rules"]["source"] == "ampcert:configs/rules/default.yaml"
    assert report["rules"]["sha256"] == hashlib.sha256(config_path("rules", "default.yaml").read_bytes()).hexdigest()
    assert {r["data_info"]["path"] for r in report["runs"]} == {"sklearn:datasets/data/digits.csv.gz"}
    assert {r["amp_policy"]["source"] for r in report["runs"]} == {"ampcert:configs/policies/torch-cpu.yaml"}


def test_the_report_does_not_depend_on_where_ampcert_was_installed(folder, tmp_path):
    other = _results(tmp_path / "out", ELSEWHERE)
    for name in ("report.json", "report.html"):
        assert (other / name).read_bytes() == (folder / name).read_bytes(), name


def test_a_shipped_policy_run_from_two_installs_is_one_policy(folder, tmp_path):
    merged = tmp_path / "merged"
    shutil.copytree(folder, merged)
    rs = load(merged)
    for r in rs.runs[::2]:  # shards run by another installation, merged into this folder
        policy = r.amp_policy | {"source": ELSEWHERE["policy"]}
        atomic_write_json(ResultsDir(merged).result_file(r.run_id), r.model_copy(update={"amp_policy": policy}))
    render.write(merged)
    assert [(p["source"], p["runs"]) for p in _report(merged)["policies"]] == [
        ("ampcert:configs/policies/torch-cpu.yaml", len(rs.runs))]


def test_report_validates_against_the_regenerated_schema(folder):
    jsonschema = pytest.importorskip("jsonschema")
    assert SCHEMA_FILE.read_text() == json_schema(), "schemas/ is stale: regenerate from ampcert.report.model"
    jsonschema.validate(_report(folder), json.loads(SCHEMA_FILE.read_text()))


@pytest.mark.parametrize(("text", "expected"), [
    ("/srv/venv/lib/python3.11/site-packages/ampcert/configs/pricing.yaml", "ampcert:configs/pricing.yaml"),
    ("no price for 'X' in /work/co/ampcert/configs/pricing.yaml: pass --price-per-gpu-hour",
     "no price for 'X' in ampcert:configs/pricing.yaml: pass --price-per-gpu-hour"),
    ("(/usr/lib/python3/dist-packages/torch/nn/x.py)", "(torch:nn/x.py)"),
    ("/usr/local/lib/python3.11/textwrap.py", "stdlib:textwrap.py"),
    ("C:\\Py\\Lib\\site-packages\\ampcert\\schemas\\report.v1.schema.json", "ampcert:schemas/report.v1.schema.json"),
    # what a user gave, and what is not a path, stays as written
    ("/home/me/rules/strict.yaml", "/home/me/rules/strict.yaml"),
    ("rules/strict.yaml", "rules/strict.yaml"),
    ("/home/me/ampcert/results/run.json", "/home/me/ampcert/results/run.json"),
    ("samples/s", "samples/s"),
    ("https://in-toto.io/Statement/v1", "https://in-toto.io/Statement/v1"),
])
def test_portable_names_installed_files_only(text, expected):
    assert portable(text) == expected


def test_pricing_table_names_shipped_by_package_and_user_given_as_given(tmp_path):
    shipped = load_pricing()
    assert (shipped.source, shipped.sha256) == (PRICING_NAME, hashlib.sha256(PRICING_FILE.read_bytes()).hexdigest())
    mine = tmp_path / "prices.yaml"
    mine.write_text("currency: EUR\ndevices:\n  - {name: box, match: [cpu], price_per_gpu_hour: 1.5}\n")
    runs = [completed(s, final_metric=0.9) for s in plan(SUITE | {"certify": None, "seeds": [0]})]
    cp = capacity_plan(runs, 1000, pricing=mine)
    assert cp.pricing.startswith(str(mine)) and cp.pricing_sha256 == hashlib.sha256(mine.read_bytes()).hexdigest()
    fixed = capacity_plan(runs, 1000, price_per_gpu_hour=2.0)
    assert fixed.pricing == "--price-per-gpu-hour" and fixed.pricing_sha256 is None


# --------------------------------------------------------------------------- environment

GPU_BOX = {
    "python": "3.12.3", "platform": "Linux-6.8.0-45-generic-x86_64-with-glibc2.39", "hostname": "node7",
    "cpu": {"model": "Intel(R) Xeon(R) Platinum 8480+", "logical_cores": 224, "physical_cores": 112,
            "usable_cores": 224, "memory_bytes": 2 * 2**40,
            "flags": {"avx2": True, "avx512f": True, "avx512_bf16": True, "avx512_fp16": True, "avx512_vnni": True,
                      "amx_tile": True, "amx_bf16": True, "amx_fp16": False, "f16c": True, "fma": True}},
    "gpu": {"cuda_visible_devices": "0", "torch_cuda": "12.4", "cuda_available": True, "cudnn": 90100,
            "devices": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "capability": "9.0",
                         "memory_bytes": 85_520_809_984}],
            "driver": "550.90.07", "nvml_device_count": 1},
    "packages": {"torch": "2.5.1+cu124", "jax": "0.4.35", "jaxlib": "0.4.35", "numpy": "2.1.3", "optax": None},
}


def test_environment_facts_read_like_a_datasheet():
    facts = dict(environment_facts(GPU_BOX))
    assert facts["CPU"] == ("Intel(R) Xeon(R) Platinum 8480+ · 224 usable of 224 logical cores · 112 physical · "
                            "2048.0 GiB memory")
    assert facts["CPU features (mixed precision)"] == (
        "has avx512_bf16, amx_bf16, amx_tile, avx512_fp16, avx512_vnni, avx512f, avx2, f16c, fma; lacks amx_fp16")
    assert facts["GPU 0"] == "NVIDIA H100 80GB HBM3 · compute capability 9.0 · 79.6 GiB"
    assert facts["NVIDIA driver"] == "550.90.07" and facts["CUDA"] == "torch built for CUDA 12.4 · cuDNN 90100"
    assert facts["PyTorch"] == "2.5.1+cu124" and facts["JAX"] == "0.4.35 (jaxlib 0.4.35)"
    assert facts["Python"] == "3.12.3" and facts["OS"].startswith("Linux-6.8.0") and facts["Host"] == "node7"
    assert facts["Other packages"] == "numpy 2.1.3"  # optax not installed: not listed


def test_environment_facts_of_a_cpu_box_and_of_old_or_missing_fingerprints():
    cpu_box = GPU_BOX | {"gpu": {"cuda_visible_devices": None, "torch_cuda": None, "cuda_available": False,
                                 "nvml": "unavailable: NVMLError_LibraryNotFound: NVML Shared Library Not Found"},
                         "packages": {"torch": "2.13.0+cpu", "jax": None}}
    facts = dict(environment_facts(cpu_box))
    assert facts["GPU"] == "none (CUDA not available to torch)" and facts["CUDA"] == "torch built without CUDA"
    assert facts["NVIDIA driver"].startswith("unavailable: NVMLError_LibraryNotFound") and facts["JAX"] == "not installed"
    assert "CUDA_VISIBLE_DEVICES" not in facts
    assert environment_facts({}) == []
    odd = dict(environment_facts({"cpu": {"model": "riscv", "flags": "unknown"}, "python": "3.10.0"}))
    assert odd == {"CPU": "riscv", "CPU features (mixed precision)": "unknown: the CPU's flags could not be read",
                   "Python": "3.10.0"}


def test_report_html_shows_facts_and_keeps_the_raw_fingerprint_behind_a_disclosure(folder):
    html = (folder / "report.html").read_text()
    section = html[html.index("<h2>Environment</h2>"):html.index("<h2>Suite file</h2>")]
    facts, raw = section.split("<details>")
    from markupsafe import escape

    for name, value in environment_facts(FINGERPRINT):
        assert f'<tr><th class="l">{escape(name)}</th><td class="l">{escape(value)}</td></tr>' in facts
    assert "CPU features (mixed precision)" in facts and "Python" in facts and "{" not in facts
    assert raw.startswith("<summary>Raw fingerprint") and "<pre>" in raw
    assert json.dumps(FINGERPRINT["python"]) in raw and '"packages": {' in raw


# --------------------------------------------------------------------------- a phone, in Chromium

PHONE_WIDTH = 390
DESKTOP_WIDTH = 1280

# What _measure reads of a page: its root element's widths, then the widest overflow of any
# table past its container (a .scroll wrapper, or the page): 0 where every table fits.
MEASURE = """(() => {
  const root = document.documentElement;
  const over = [...document.querySelectorAll("table")].map(
    t => Math.ceil(t.getBoundingClientRect().width) - t.parentElement.clientWidth);
  return [root.scrollWidth, root.clientWidth, Math.max(0, ...over)];
})()"""


def _measure(pages: list[Path], width: int, profile: Path, timeout: float = 60,
             mobile: bool = True) -> dict[str, list[int]]:
    """[scrollWidth, clientWidth, table overflow] (:data:`MEASURE`) of each page in headless
    Chromium with its viewport set to ``width`` CSS pixels, as a phone has it (``mobile``:
    honouring the page's viewport meta) or a desktop window. Through the DevTools protocol over
    --remote-debugging-pipe, because --window-size cannot go below Chromium's 500 px minimum
    window; the pages load as shipped (their CSP holds: DevTools evaluation is not a page script)."""
    chrome_in, to_chrome = os.pipe()
    from_chrome, chrome_out = os.pipe()

    def fds_3_and_4() -> None:  # the pipe protocol: Chromium reads fd 3, writes fd 4
        os.dup2(chrome_in, 3)
        os.dup2(chrome_out, 4)

    proc = subprocess.Popen([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank"],
                            pass_fds=(3, 4), preexec_fn=fds_3_and_4,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(chrome_in)
    os.close(chrome_out)
    buffer, pending, ids = b"", [], iter(range(1, 1 << 30))
    deadline = time.monotonic() + timeout

    def receive() -> dict:
        nonlocal buffer
        while b"\0" not in buffer:
            ready, _, _ = select.select([from_chrome], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(from_chrome, 1 << 16) if ready else b""
            if not chunk:
                raise AssertionError("Chromium did not answer over the DevTools pipe")
            buffer += chunk
        message, _, buffer = buffer.partition(b"\0")
        return json.loads(message)

    def call(method: str, session: str | None = None, **params) -> dict:
        i = next(ids)
        os.write(to_chrome, json.dumps({"id": i, "method": method, "params": params}
                                       | ({"sessionId": session} if session else {})).encode() + b"\0")
        while True:
            message = receive()
            if message.get("id") == i:
                assert "error" not in message, (method, message["error"])
                return message["result"]
            pending.append(message)

    def wait_for(event: str, session: str) -> None:
        while True:
            for message in pending:
                if message.get("method") == event and message.get("sessionId") == session:
                    pending.remove(message)
                    return
            pending.append(receive())

    out = {}
    try:
        for page in pages:
            target = call("Target.createTarget", url="about:blank")["targetId"]
            session = call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            call("Emulation.setDeviceMetricsOverride", session, width=width, height=900, deviceScaleFactor=1,
                 mobile=mobile)
            call("Page.enable", session)
            call("Page.navigate", session, url=page.as_uri())
            wait_for("Page.loadEventFired", session)
            value = call("Runtime.evaluate", session, returnByValue=True, expression=MEASURE)
            out[page.name] = value["result"]["value"]
            call("Target.closeTarget", targetId=target)
        call("Browser.close")
    finally:
        os.close(to_chrome)
        os.close(from_chrome)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return out


@pytest.mark.browser
def test_report_and_summary_fit_a_390px_phone_screen_and_a_1280px_window(folder, tmp_path):
    """On a phone the pages fit the screen (a wide table scrolls inside its wrapper); in a
    1280 px window every table fits too, its last column on screen (cells wrap, none scrolls)."""
    pages = [folder / "report.html", folder / "summary.html"]
    # The controls: a page wider than the screen, and a table wider than its wrapper, must measure
    # so, or the checks could not fail.
    control = tmp_path / "too-wide.html"
    control.write_text('<!doctype html><meta name="viewport" content="width=device-width, initial-scale=1">'
                       '<div style="width: 1400px">wide</div><div style="overflow-x: auto"><table>'
                       f'<tr><td style="white-space: nowrap">{"wide " * 300}</td></tr></table></div>')
    phone = _measure([*pages, control], PHONE_WIDTH, tmp_path / "profile")
    assert phone["too-wide.html"][0] > PHONE_WIDTH, phone
    for page in pages:
        scroll, client, _ = phone[page.name]
        assert client == PHONE_WIDTH and scroll <= PHONE_WIDTH, (page.name, phone)
    window = _measure([*pages, control], DESKTOP_WIDTH, tmp_path / "profile", mobile=False)
    assert window["too-wide.html"][0] > DESKTOP_WIDTH and window["too-wide.html"][2] > 0, window
    for page in pages:
        scroll, client, table_overflow = window[page.name]  # client: less a vertical scrollbar, if any
        assert DESKTOP_WIDTH - 20 <= client <= DESKTOP_WIDTH and scroll <= client and table_overflow == 0, (
            page.name, window)

