"""report.json/report.html: schema, reproducibility, escaping; DSSE signing and offline verification."""

from __future__ import annotations

import json
import os
import random
import shutil
import stat
import subprocess
import textwrap

import pytest
from conftest import REPO, chromium, run_cli
from factories import warm_cli

from ampcert.report.model import SCHEMA_FILE, json_schema
from ampcert.report.sign import (
    VerificationError,
    keygen,
    load_public_key,
    pae,
    sign_results,
    verify_envelope,
)

jsonschema = pytest.importorskip("jsonschema")

XSS = "<script>alert('x')</script>"


@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    """A real run (two precisions, two seeds, a rule pack) with a hostile description, signed."""
    folder = tmp_path_factory.mktemp("report")
    suite = folder / "suite.yaml"
    suite.write_text(textwrap.dedent(f"""
        name: report-test
        description: "{XSS} & friends"
        amp: ampcert
        device: cpu
        precisions: [fp32, fp16]
        seeds: [0, 1]
        unaccelerated: run
        certify: default
        train: {{steps: 20, eval_every: 10}}
        workloads:
          - workload: underflow
    """))
    key, pub = keygen(folder / "signing.key")
    out = folder / "out"
    proc = run_cli("run", suite, "--out", out, "--sign-key", key, timeout=600)
    assert (out / "report.dsse.json").is_file(), proc.stdout + proc.stderr
    return out, key, pub


def test_every_report_validates_against_the_schema_in_the_repo(signed):
    assert SCHEMA_FILE.read_text() == json_schema(), "schemas/ is stale: regenerate from ampcert.report.model"
    report = json.loads((signed[0] / "report.json").read_text())
    jsonschema.validate(report, json.loads(SCHEMA_FILE.read_text()))
    assert report["schema_version"] == 1 and report["certificate"]["rules"]["name"] == "default"
    assert {r["spec"]["precision"] for r in report["runs"]} == {"fp32", "fp16"}
    assert report["methods"]["step_time"] and report["not_measured"]
    row = next(r for r in report["table"] if r["precision"] == "fp16")
    assert row["verdict"] in ("PASS", "FAIL", "INCONCLUSIVE") and row["speedup_vs_fp32"] > 0


def test_the_policy_table_says_which_engine_decided_the_runs(signed):
    from ampcert.amp.torch.autocast import engine_of

    report = json.loads((signed[0] / "report.json").read_text())
    expected = engine_of("cpu")  # the shipped policy on this torch: the fp16 runs' engine
    rows = {p["name"]: p for p in report["policies"]}
    assert rows["torch-cpu"]["engine"] == expected["engine"] == "dispatcher"
    assert rows["torch-cpu"]["ampcert_kernels"] == expected["ampcert_kernels"] and "einsum" in expected["ampcert_kernels"]
    fp16 = [r for r in report["runs"] if r["spec"]["precision"] == "fp16"]
    assert rows["torch-cpu"]["runs"] == len(fp16) > 0 and rows["none (fp32)"]["engine"] is None
    assert {r["amp_policy"]["engine"] for r in fp16} == {"dispatcher"}
    html = (signed[0] / "report.html").read_text()
    assert "ampcert's kernels: " + ", ".join(expected["ampcert_kernels"]) in html


def test_rerendering_gives_identical_bytes(signed, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(signed[0], out)
    before = {n: (out / n).read_bytes() for n in ("report.json", "report.html")}
    proc = warm_cli("report", out, "--csv", tmp_path / "runs.csv")
    assert proc.returncode == 0, proc.stderr
    assert {n: (out / n).read_bytes() for n in before} == before
    import pandas as pd

    frame = pd.read_csv(tmp_path / "runs.csv")
    assert len(frame) == len(json.loads(before["report.json"])["runs"])
    from ampcert.report.model import runs_frame

    assert len(runs_frame(out / "report.json")) == len(frame)


def test_html_is_self_contained_and_escapes_suite_text(signed):
    html = (signed[0] / "report.html").read_text()
    assert XSS not in html and "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; friends" in html
    import re

    without_namespaces = re.sub(r'xmlns(:\w+)?="http://www\.w3\.org/[^"]*"', "", html)
    for needle in ("<script", "http://", "https://", "@import", "<link", "<img", "<iframe"):
        assert needle not in without_namespaces, needle
    assert not re.search(r"url\((?!#)", html)  # only references inside the page (SVG clip paths)
    assert html.count("<svg") >= 3 and "Content-Security-Policy" in html


def test_suite_names_cannot_carry_markup(tmp_path):
    suite = tmp_path / "s.yaml"
    suite.write_text(f'name: "{XSS}"\nworkloads:\n  - workload: digits\n')
    proc = warm_cli("run", suite, "--dry-run")
    assert proc.returncode == 2 and "name" in proc.stderr and "Traceback" not in proc.stderr


def test_verify_accepts_the_signed_report_and_prints_what_it_checked(signed):
    out, _, pub = signed
    proc = warm_cli("verify", out / "report.dsse.json", "--pubkey", pub)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verified: report.json sha256" in proc.stdout and "verified: report.html sha256" in proc.stdout
    env = json.loads((out / "report.dsse.json").read_text())
    assert env["payloadType"] == "application/vnd.in-toto+json"
    import base64

    st = json.loads(base64.b64decode(env["payload"]))
    assert st["_type"] == "https://in-toto.io/Statement/v1"
    assert [s["name"] for s in st["subject"]] == ["report.json", "report.html"]
    assert st["predicate"]["suite"]["name"] == "report-test"
    import hashlib

    from cryptography.hazmat.primitives import serialization

    raw = load_public_key(pub).public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert env["signatures"][0]["keyid"] == hashlib.sha256(raw).hexdigest()


def test_pae_matches_the_dsse_spec():
    assert pae("http://example.com/HelloWorld", b"hello world") == \
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"


def test_single_byte_flips_anywhere_are_rejected(signed, tmp_path):
    out, _, pub = signed
    key = load_public_key(pub)
    rng = random.Random(0)
    tried = 0
    for name, n in (("report.dsse.json", 200), ("report.json", 100), ("report.html", 100)):
        work = tmp_path / name.replace(".", "_")
        shutil.copytree(out, work)
        target = work / name
        original = target.read_bytes()
        positions = sorted(rng.sample(range(len(original)), min(n, len(original))))
        for pos in positions:
            flipped = bytearray(original)
            flipped[pos] ^= 1 << rng.randrange(8)
            target.write_bytes(bytes(flipped))
            with pytest.raises(VerificationError):
                verify_envelope(work / "report.dsse.json", key)
            tried += 1
        target.write_bytes(original)
        verify_envelope(work / "report.dsse.json", key)  # restored: verifies again
    assert tried >= 400


def test_wrong_key_and_swapped_subject_are_rejected(signed, tmp_path):
    out, _, _ = signed
    _, other_pub = keygen(tmp_path / "other.key")
    proc = warm_cli("verify", out / "report.dsse.json", "--pubkey", other_pub)
    assert proc.returncode == 1 and "NOT VERIFIED: no signature by key" in proc.stderr
    work = tmp_path / "swap"
    shutil.copytree(out, work)
    (work / "report.html").write_text((work / "report.html").read_text().replace("FAIL", "PASS"))
    proc = warm_cli("verify", work / "report.dsse.json", "--pubkey", signed[2])
    assert proc.returncode == 1 and "report.html: sha256" in proc.stderr


def test_keygen_modes_and_refusal(tmp_path):
    key, pub = keygen(tmp_path / "k")
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    proc = warm_cli("keygen", key)
    assert proc.returncode == 2 and "refusing to overwrite" in proc.stderr
    before = key.read_bytes()
    assert warm_cli("keygen", key, "--force").returncode == 0 and key.read_bytes() != before
    os.chmod(key, 0o644)
    results = tmp_path / "r"
    results.mkdir()
    with pytest.raises(Exception):  # noqa: B017 - no report there: a UserError, after the warning is collected
        sign_results(results, key)
    from ampcert.report.sign import load_private_key

    assert "accessible to other users" in load_private_key(key)[1][0]


@pytest.mark.browser
def test_report_renders_in_headless_chromium_without_errors_or_requests(signed, tmp_path):
    html = signed[0] / "report.html"
    shot = tmp_path / "report.png"
    proc = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
         "--host-resolver-rules=MAP * ~NOTFOUND", "--window-size=1200,3000",
         f"--screenshot={shot}", html.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert shot.is_file() and shot.stat().st_size > 10_000, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if "CONSOLE" in line or "Refused to" in line]
    assert console == [], console
    # no network: nothing in the page names a remote resource (the CSP would also refuse it, loudly)
    assert "https://" not in html.read_text().replace("https://in-toto.io", "")
    (REPO / "reports").mkdir(exist_ok=True)
    shutil.copy(shot, REPO / "reports" / "browser-report.png")
