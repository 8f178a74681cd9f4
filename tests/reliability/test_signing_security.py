"""The signing path: the private key never lands in results, logs or reports;
a key others can read is warned about; a signed envelope does not vouch for
another (valid) report swapped in beside it."""

from __future__ import annotations

import base64
import os
import shutil
import stat

import pytest
from cryptography.hazmat.primitives import serialization
from factories import warm_cli
from rel_lab import lab

from ampcert.report.model import load_report
from ampcert.report.sign import (
    VerificationError,
    load_private_key,
    load_public_key,
    verify_envelope,
)


@pytest.fixture(scope="module")
def the_lab(tmp_path_factory):
    return lab(tmp_path_factory).wait()


def _key_forms(key_path) -> dict[str, bytes]:
    """Every form in which the private key's bytes could leak."""
    pem = key_path.read_bytes()
    key, _ = load_private_key(key_path)
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                            serialization.NoEncryption())
    der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    body = b"".join(line for line in pem.splitlines() if not line.startswith(b"-----"))
    forms = {"pem file": pem, "pem body": body, "raw key": raw, "pkcs8 der": der,
             "raw hex": raw.hex().encode(), "raw HEX": raw.hex().upper().encode(),
             "raw base64": base64.b64encode(raw), "raw urlsafe base64": base64.urlsafe_b64encode(raw).rstrip(b"=")}
    forms |= {f"pem line {i}": line for i, line in enumerate(pem.splitlines()) if not line.startswith(b"-----")}
    return forms


@pytest.mark.slow
def test_private_key_bytes_are_in_no_produced_file_or_output(the_lab):
    a = the_lab.procs["a"]
    assert a.returncode == 0, a.stdout + a.stderr
    assert (the_lab.root / "a" / "report.dsse.json").is_file()
    forms = _key_forms(the_lab.key)
    files = [p for p in the_lab.root.rglob("*") if p.is_file() and p.parent != the_lab.key.parent]
    assert len([p for p in files if p.is_relative_to(the_lab.root / "a")]) >= 15
    leaks = []
    for path in files:
        data = path.read_bytes()
        leaks += [f"{path}: {name}" for name, form in forms.items() if form in data]
    for stream in (a.stdout, a.stderr):
        leaks += [f"output: {name}" for name, form in forms.items() if form.decode("latin-1") in stream]
    assert leaks == []


@pytest.mark.slow
def test_loose_key_permissions_warn_and_strict_ones_do_not(the_lab, tmp_path):
    folder = tmp_path / "other"
    shutil.copytree(the_lab.chains[0].out, folder)
    loose = tmp_path / "loose.key"
    shutil.copyfile(the_lab.key, loose)
    os.chmod(loose, 0o644)
    proc = warm_cli("sign", folder, "--key", loose)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ampcert: warning: {loose}: private key is accessible to other users (mode 644); chmod 600" in proc.stderr
    assert verify_envelope(folder / "report.dsse.json", load_public_key(the_lab.pub))
    assert stat.S_IMODE(os.stat(the_lab.key).st_mode) == 0o600
    strict = warm_cli("sign", folder, "--key", the_lab.key)
    assert strict.returncode == 0 and "warning" not in strict.stderr, strict.stderr


@pytest.mark.slow
def test_an_envelope_rejects_another_valid_report_swapped_in(the_lab, tmp_path):
    signed, other = the_lab.root / "a", the_lab.chains[0].out
    key = load_public_key(the_lab.pub)
    verify_envelope(signed / "report.dsse.json", key)
    load_report(other / "report.json")  # the other report is a valid one (same suite, another run, unsigned)
    assert (other / "report.json").read_bytes() != (signed / "report.json").read_bytes()

    def swapped(name: str, files: tuple[str, ...], source=other, envelope_from=signed):
        work = tmp_path / name
        shutil.copytree(envelope_from, work)
        for f in files:
            shutil.copyfile(source / f, work / f)
        return work / "report.dsse.json"

    for name, files in (("json", ("report.json",)), ("html", ("report.html",)),
                        ("both", ("report.json", "report.html"))):
        with pytest.raises(VerificationError, match="does not match the signed"):
            verify_envelope(swapped(name, files), key)
    # The other report signed too, by the same key: each envelope still vouches only for its own files.
    resigned = tmp_path / "other-signed"
    shutil.copytree(other, resigned)
    assert warm_cli("sign", resigned, "--key", the_lab.key).returncode == 0
    verify_envelope(resigned / "report.dsse.json", key)
    with pytest.raises(VerificationError, match="does not match the signed"):
        verify_envelope(swapped("signed-other", ("report.json", "report.html"), source=resigned), key)
    with pytest.raises(VerificationError, match="does not match the signed"):
        verify_envelope(swapped("envelope-swap", ("report.dsse.json",), source=resigned), key)
    proc = warm_cli("verify", tmp_path / "both" / "report.dsse.json", "--pubkey", the_lab.pub)
    assert proc.returncode == 1 and "NOT VERIFIED" in proc.stderr and "report.json: sha256" in proc.stderr


# --------------------------------------------------------------------------- verify's exit codes


def _signed(tmp_path):
    """A signed report folder, made in milliseconds (no run): report.json as `sign` reads it."""
    import json

    from ampcert.report.sign import keygen, sign_results

    folder = tmp_path / "signed"
    folder.mkdir()
    (folder / "report.json").write_text(json.dumps({"suite": {"name": "s", "sha256": "0" * 64}, "runs": []}))
    (folder / "report.html").write_text("<!doctype html><title>s</title>\n")
    key, pub = keygen(tmp_path / "k")
    sign_results(folder, key)
    return folder / "report.dsse.json", pub


def _in_process(monkeypatch, capsys, *args) -> tuple[int, str]:
    """``ampcert ARGS`` through the entry point, in this process: (exit code, stderr)."""
    import sys

    from ampcert.cli import main

    monkeypatch.setattr(sys, "argv", ["ampcert", *map(str, args)])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main()
    return exit_.value.code, capsys.readouterr().err


def test_verify_cannot_read_is_exit_2_and_a_mismatch_is_exit_1(tmp_path):
    """A file that is missing, a folder or unreadable is bad input: one `ampcert: error:` line
    in plain words, exit 2 (nothing was checked). A verification that fails is exit 1."""
    from conftest import assert_one_line_error

    envelope, pub = _signed(tmp_path)
    folder = envelope.parent
    ok = warm_cli("verify", envelope, "--pubkey", pub)
    assert ok.returncode == 0 and "verified: report.json" in ok.stdout, ok.stdout + ok.stderr
    for args, fragment in (
            ((tmp_path / "nope.dsse.json", "--pubkey", pub), f"{tmp_path / 'nope.dsse.json'}: envelope not found"),
            ((folder, "--pubkey", pub), f"{folder}: is a folder; give its envelope, {envelope}"),
            ((tmp_path, "--pubkey", pub), f"{tmp_path}: expected the envelope (a file), found a folder"),
            ((envelope, "--pubkey", tmp_path / "nope.pub"), f"{tmp_path / 'nope.pub'}: public key not found"),
            ((envelope, "--pubkey", folder), f"{folder}: expected the public key (a file), found a folder")):
        proc = warm_cli("verify", *args)
        assert_one_line_error(proc, fragment)
        assert "Error)" not in proc.stderr and "NOT VERIFIED" not in proc.stderr, proc.stderr  # no exception names
    # a changed byte, a missing signed file: NOT VERIFIED, exit 1
    html = (folder / "report.html").read_bytes()
    (folder / "report.html").write_bytes(html + b"<!-- one more line -->\n")
    tampered = warm_cli("verify", envelope, "--pubkey", pub)
    assert tampered.returncode == 1 and tampered.stderr.startswith("ampcert: NOT VERIFIED: "), tampered.stderr
    assert "report.html: sha256" in tampered.stderr and "does not match the signed" in tampered.stderr
    (folder / "report.html").unlink()
    missing = warm_cli("verify", envelope, "--pubkey", pub)
    assert missing.returncode == 1 and "report.html: subject file missing" in missing.stderr, missing.stderr
    (folder / "report.html").write_bytes(html)
    assert warm_cli("verify", envelope, "--pubkey", pub).returncode == 0


@pytest.mark.parametrize("name, fragment", [
    ("report.dsse.json", "report.dsse.json: cannot read the envelope: permission denied"),
    ("k.pub", "k.pub: cannot read the public key: permission denied"),
    ("report.html", "report.html: cannot read the signed report file: permission denied"),
])
def test_verify_of_an_unreadable_file_is_exit_2(tmp_path, monkeypatch, capsys, name, fragment):
    """No permission (made here by refusing the open: root reads any file whatever its mode)."""
    from pathlib import Path

    envelope, pub = _signed(tmp_path)
    real_open = Path.open

    def refused(self, *args, **kwargs):
        if self.name == name:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", refused)
    code, err = _in_process(monkeypatch, capsys, "verify", envelope, "--pubkey", pub)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("ampcert: error: "), err
    assert fragment in lines[0] and "Traceback" not in err, err
