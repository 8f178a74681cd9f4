"""`ampcert verify` on hostile envelopes (issue 24, part 5): whatever the file
holds (nesting a hundred thousand deep, 16 MiB and more, bytes that are not
UTF-8, a field of the wrong type anywhere in the envelope or in the signed
statement), the answer is exit 1 and one ``ampcert: NOT VERIFIED:`` line on
stderr, never a traceback.

Envelopes are made here, signed with a fresh key over whatever statement bytes
a case needs (so the checks after the signature are reached), beside two
small subject files; nothing is trained."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from factories import warm_cli

from ampcert.report.sign import (
    MAX_DEPTH,
    MAX_ENVELOPE_BYTES,
    PAYLOAD_TYPE,
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    VerificationError,
    keygen,
    keyid,
    load_private_key,
    pae,
    verify_envelope,
)

SUBJECTS = {"report.json": b'{"report": 1}\n', "report.html": b"<!doctype html><p>report</p>\n"}


class Signer:
    def __init__(self, folder: Path):
        self.key_path, self.pub = keygen(folder / "k")
        self.key, _ = load_private_key(self.key_path)

    def statement(self) -> dict[str, Any]:
        return {"_type": STATEMENT_TYPE, "predicateType": PREDICATE_TYPE,
                "subject": [{"name": n, "digest": {"sha256": hashlib.sha256(b).hexdigest()}}
                            for n, b in SUBJECTS.items()],
                "predicate": {"tool": {"name": "ampcert", "version": "0.0"}, "verdict": "PASS",
                              "suite": {"name": "hostile", "sha256": "ab" * 32}}}

    def envelope(self, payload: bytes) -> dict[str, Any]:
        """A DSSE envelope over ``payload`` with a good signature by this key."""
        sig = self.key.sign(pae(PAYLOAD_TYPE, payload))
        return {"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(payload).decode("ascii"),
                "signatures": [{"keyid": keyid(self.key.public_key()), "sig": base64.b64encode(sig).decode("ascii")}]}

    def signed(self, change: Callable[[dict[str, Any]], Any] | None = None) -> dict[str, Any]:
        """The envelope of the good statement after ``change(statement)`` (signed after it)."""
        st = self.statement()
        if change is not None:
            change(st)
        return self.envelope(json.dumps(st).encode("utf-8"))


@pytest.fixture(scope="module")
def signer(tmp_path_factory) -> Signer:
    return Signer(tmp_path_factory.mktemp("keys"))


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A change to the statement (or envelope): ``path`` is dot-separated, list indices as numbers."""
    def change(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for p in parents:
            doc = doc[int(p)] if isinstance(doc, list) else doc[p]
        if isinstance(doc, list):
            doc[int(last)] = value
        elif value is _DELETE:
            del doc[last]
        else:
            doc[last] = value
    return change


_DELETE = object()


def _env(path: str, value: Any) -> Callable[[Signer], Any]:
    """An envelope field replaced (after signing)."""
    def make(s: Signer) -> dict[str, Any]:
        env = s.signed()
        _set(path, value)(env)
        return env
    return make


def _stmt(path: str, value: Any) -> Callable[[Signer], Any]:
    """A statement field replaced, then signed: the checks after the signature are reached."""
    return lambda s: s.signed(_set(path, value))


def _payload(raw: bytes) -> Callable[[Signer], Any]:
    return lambda s: s.envelope(raw)


def _raw(data: bytes) -> Callable[[Signer], Any]:
    return lambda s: data


def _many_subjects(st: dict[str, Any]) -> None:
    st["subject"] = [copy.deepcopy(st["subject"][0]) for _ in range(65)]


DEEP = 100_000

# (case, how to make the file, a fragment of the one line)
CASES: list[tuple[str, Callable[[Signer], Any], str]] = [
    # -- the file
    ("nested arrays", _raw(b"[" * DEEP), f"nested deeper than {MAX_DEPTH} levels"),
    ("nested objects", _raw(b'{"a":' * DEEP), f"nested deeper than {MAX_DEPTH} levels"),
    ("nested, closed, parseable", _raw(b"[" * 500 + b"]" * 500), f"nested deeper than {MAX_DEPTH} levels"),
    ("huge file", _raw(b" " * (MAX_ENVELOPE_BYTES + 1)), "larger than 16 MiB"),
    ("not UTF-8", _raw(b'{"payload": "\xff\xfe\xfd"}'), "not UTF-8"),
    ("UTF-16", _raw('{"payload": 1}'.encode("utf-16")), "not UTF-8"),
    ("not JSON", _raw(b"payload: yes"), "not a JSON DSSE envelope"),
    ("empty", _raw(b""), "not a JSON DSSE envelope"),
    ("NaN", _raw(b'{"payload": NaN}'), "NaN is not JSON"),
    ("5000-digit number", _raw(b'{"payload": ' + b"9" * 5000 + b"}"), "not JSON"),
    ("duplicate key", _raw(b'{"payload": "", "payload": "", "payloadType": "", "signatures": []}'), "duplicate key"),
    ("a list", _raw(b"[]"), "expected exactly the fields"),
    ("extra field", _env("extra", 1), "expected exactly the fields"),
    # -- the envelope's fields
    ("payloadType a list", _env("payloadType", ["application/vnd.in-toto+json"]), "payloadType: expected"),
    ("payloadType a long list", _env("payloadType", list(range(10_000))), "payloadType: expected"),
    ("payloadType another", _env("payloadType", "text/plain"), "payloadType: expected"),
    ("payload a number", _env("payload", 12), "payload: expected a base64 string, got int"),
    ("payload an object", _env("payload", {"a": 1}), "payload: expected a base64 string, got dict"),
    ("payload not base64", _env("payload", "%%% not base64 %%%"), "payload: not valid base64"),
    ("payload not canonical", _env("payload", "YR=="), "payload: not canonical base64"),
    ("signatures an object", _env("signatures", {"keyid": "a", "sig": "b"}), "signatures: expected a non-empty list"),
    ("signatures empty", _env("signatures", []), "signatures: expected a non-empty list"),
    ("signatures too many", _env("signatures", [{"keyid": "a", "sig": "b"}] * 65), "more than 64"),
    ("signature a string", _env("signatures.0", "sig"), "signatures[0]: expected exactly the fields keyid, sig"),
    ("signature extra field", _env("signatures.0.extra", 1), "signatures[0]: expected exactly the fields"),
    ("keyid a number", _env("signatures.0.keyid", 7), "signatures[0].keyid: expected a string, got int"),
    ("keyid a list", _env("signatures.0.keyid", ["a"]), "signatures[0].keyid: expected a string, got list"),
    ("keyid another key's", _env("signatures.0.keyid", "0" * 64), "no signature by key"),
    ("sig a number", _env("signatures.0.sig", 5), "signatures[0].sig: expected a base64 string, got int"),
    ("sig not base64", _env("signatures.0.sig", "***"), "signatures[0].sig: not valid base64"),
    ("sig wrong", _env("signatures.0.sig", base64.b64encode(b"\0" * 64).decode()), "does not verify"),
    # -- the signed statement
    ("payload not JSON", _payload(b"this is not json"), "payload: signed, but not a JSON in-toto Statement"),
    ("payload not UTF-8", _payload(b'{"_type": "\xff"}'), "not UTF-8"),
    ("payload nested", _payload(b"[" * DEEP), f"nested deeper than {MAX_DEPTH} levels"),
    ("payload a list", _payload(b"[1, 2]"), "expected an in-toto Statement"),
    ("_type a number", _stmt("_type", 1), "expected an in-toto Statement"),
    ("_type another", _stmt("_type", "https://in-toto.io/Statement/v0.1"), "expected an in-toto Statement"),
    ("subject missing", _stmt("subject", _DELETE), "statement: no subjects"),
    ("subject an object", _stmt("subject", {"name": "report.json"}), "no subjects (subject: expected a non-empty list"),
    ("subject empty", _stmt("subject", []), "statement: no subjects"),
    ("subjects too many", lambda s: s.signed(_many_subjects), "more than 64"),
    ("subject a string", _stmt("subject.0", "report.json"), "subject[0]: expected an object, got str"),
    ("name a number", _stmt("subject.0.name", 3), "subject[0].name: expected a file name"),
    ("name a list", _stmt("subject.0.name", ["report.json"]), "subject[0].name: expected a file name"),
    ("name a path", _stmt("subject.0.name", "../report.json"), "subject[0].name: expected a file name"),
    ("name empty", _stmt("subject.0.name", ""), "subject[0].name: expected a file name"),
    ("name dot-dot", _stmt("subject.0.name", ".."), "subject[0].name: expected a file name"),
    ("name with a newline", _stmt("subject.0.name", "report.json\nverified: x"), "subject[0].name: expected"),
    ("digest a list", _stmt("subject.0.digest", ["sha256", "ab"]), "subject[0].digest: expected an object of strings"),
    ("digest a string", _stmt("subject.0.digest", "ab" * 32), "subject[0].digest: expected an object of strings"),
    ("digest value a list", _stmt("subject.0.digest.sha256", ["ab" * 32]), "subject[0].digest: expected an object"),
    ("digest value a number", _stmt("subject.0.digest.sha256", 12), "subject[0].digest: expected an object"),
    ("digest other value a number", _stmt("subject.0.digest.sha512", 1), "subject[0].digest: expected an object"),
    ("digest without sha256", _stmt("subject.0.digest", {"sha512": "ab"}), "subject[0].digest.sha256: expected 64"),
    ("digest not hex", _stmt("subject.0.digest.sha256", "zz" * 32), "subject[0].digest.sha256: expected 64"),
    ("digest short", _stmt("subject.0.digest.sha256", "ab"), "subject[0].digest.sha256: expected 64"),
    ("subject twice", _stmt("subject.1.name", "report.json"), "a subject is named twice"),
    ("predicateType missing", _stmt("predicateType", _DELETE), "predicateType: expected"),
    ("predicateType a list", _stmt("predicateType", [PREDICATE_TYPE]), "predicateType: expected"),
    ("predicate missing", _stmt("predicate", _DELETE), "predicate: expected an object, got NoneType"),
    ("predicate a list", _stmt("predicate", [1]), "predicate: expected an object, got list"),
    ("predicate.suite a string", _stmt("predicate.suite", "s"), "predicate.suite: expected an object, got str"),
    ("predicate.suite.name a list", _stmt("predicate.suite.name", ["s"]), "predicate.suite.name: expected"),
    ("predicate.suite.name a newline", _stmt("predicate.suite.name", "s\nverified: x"), "predicate.suite.name"),
    ("predicate.tool a list", _stmt("predicate.tool", []), "predicate.tool: expected an object, got list"),
    ("predicate.tool.version a number", _stmt("predicate.tool.version", 1), "predicate.tool.version: expected"),
    ("predicate.verdict an object", _stmt("predicate.verdict", {"a": 1}), "predicate.verdict: expected"),
    ("subject file missing", _stmt("subject.0.name", "other.json"), "subject file missing"),
    ("subject file changed", _stmt("subject.0.digest.sha256", "ab" * 32), "does not match the signed"),
]


def _write(folder: Path, signer: Signer, make: Callable[[Signer], Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in SUBJECTS.items():
        (folder / name).write_bytes(data)
    made = make(signer)
    path = folder / "report.dsse.json"
    path.write_bytes(made if isinstance(made, bytes) else json.dumps(made).encode("utf-8"))
    return path


def _verify_in_process(monkeypatch, capsys, envelope: Path, pub: Path) -> tuple[int, str]:
    """``ampcert verify`` through the entry point, in this process: (exit code, stderr)."""
    from ampcert.cli import main

    monkeypatch.setattr(sys, "argv", ["ampcert", "verify", str(envelope), "--pubkey", str(pub)])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main()
    return exit_.value.code, capsys.readouterr().err


def assert_not_verified(code: int, stderr: str, fragment: str) -> None:
    assert code == 1, stderr
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ampcert: NOT VERIFIED: "), stderr
    assert fragment in lines[0], lines[0]
    assert len(lines[0]) < 400, lines[0]  # a value from the file is shown cut short


def test_the_made_envelope_verifies(signer, tmp_path):
    """The control: without a change, the envelope made here verifies (so each case
    below fails for its change, not for a broken signature)."""
    envelope = _write(tmp_path, signer, lambda s: s.signed())
    result = verify_envelope(envelope, signer.key.public_key())
    assert [name for name, _ in result.subjects] == list(SUBJECTS)
    proc = warm_cli("verify", envelope, "--pubkey", signer.pub)
    assert proc.returncode == 0 and "verified: report.json sha256" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("make, fragment", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_hostile_envelope_is_one_line_exit_1(signer, tmp_path, monkeypatch, capsys, make, fragment):
    envelope = _write(tmp_path, signer, make)
    with pytest.raises(VerificationError):
        verify_envelope(envelope, signer.key.public_key())
    code, err = _verify_in_process(monkeypatch, capsys, envelope, signer.pub)
    assert_not_verified(code, err, fragment)


@pytest.mark.parametrize("case", ["nested arrays", "huge file", "digest a list", "payload not UTF-8"])
def test_the_reported_cases_in_a_real_process(signer, tmp_path, case):
    """What the tester found, through `ampcert verify` as a user runs it (its own process,
    stderr as they see it): the RecursionError and AttributeError tracebacks are gone."""
    make, fragment = next(c[1:] for c in CASES if c[0] == case)
    proc = warm_cli("verify", _write(tmp_path, signer, make), "--pubkey", signer.pub)
    assert_not_verified(proc.returncode, proc.stderr, fragment)
    assert proc.stdout == ""
