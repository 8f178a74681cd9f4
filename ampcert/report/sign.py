"""Sign and verify reports: DSSE envelopes over in-toto Statements, Ed25519.

``sign_results(dir, key)`` writes ``report.dsse.json`` next to report.json
and report.html::

    {"payloadType": "application/vnd.in-toto+json",
     "payload": base64(Statement),
     "signatures": [{"keyid": hex sha256 of the raw public key, "sig": base64(Ed25519(PAE))}]}

The Statement (in-toto v1) names report.json and report.html as subjects by
sha256 and carries a predicate with the certificate's verdict summary, the
suite digest and the tool version. The signature covers DSSE's
pre-authentication encoding, ``PAE = "DSSEv1" SP len(type) SP type SP
len(body) SP body`` (lengths in bytes, ASCII decimal), so the payload type
is signed too.

``verify_envelope`` recomputes the PAE from the bytes it received (it never
re-serialises the JSON it parsed), checks the payload type, the signature
for the given public key, that base64 fields are canonical (so no two
encodings of one payload both verify), then re-hashes every subject file
beside the envelope. Any mismatch raises :class:`VerificationError` with the
reason, and so does any envelope however made (a file above
``MAX_ENVELOPE_BYTES``, JSON nested deeper than ``MAX_DEPTH``, a field of the
wrong type in the envelope or the statement): one line, never a traceback. An
envelope or subject file that cannot be read at all (not found, a folder, no
permission) is a UserError: bad input, not a failed verification.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ampcert.errors import UserError, WriteFailed, one_line
from ampcert.version import __version__

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://github.com/ampcert/ampcert/certification/v1"
ENVELOPE = "report.dsse.json"
SUBJECTS = ("report.json", "report.html")


class VerificationError(Exception):
    """The envelope, its signature or a subject file does not check out (the message says which)."""


def pae(payload_type: str, payload: bytes) -> bytes:
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def keyid(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------- keys


def keygen(path: str | Path, force: bool = False) -> tuple[Path, Path]:
    """Write an Ed25519 key pair: ``path`` (PKCS#8 PEM, mode 0600) and
    ``path.pub`` (SubjectPublicKeyInfo PEM). Refuses to overwrite either
    without ``force``."""
    private = Path(path)
    public = private.with_name(private.name + ".pub")
    for p in (private, public):
        if p.exists() and not force:
            raise UserError(f"{p}: exists; refusing to overwrite a key (use --force)")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    from ampcert.results import atomic_write_text

    try:
        private.parent.mkdir(parents=True, exist_ok=True)
        if force:
            private.unlink(missing_ok=True)
        fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(pem)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(private, 0o600)  # whatever the umask said
        except BaseException:
            private.unlink(missing_ok=True)  # a cut-short key would only block the next keygen
            raise
    except OSError as exc:
        raise WriteFailed(private, exc) from exc
    pub_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
    try:
        atomic_write_text(public, pub_pem.decode("ascii"))
    except WriteFailed:
        private.unlink(missing_ok=True)  # no half pair: keygen can simply be run again
        raise
    return private, public


def cannot_read(path: Path, what: str, exc: OSError) -> UserError:
    """The one line (exit 2) for a file that could not be read, in plain words: not
    found, a folder, no permission, or the system's reason."""
    shown = one_line(str(path))
    if isinstance(exc, FileNotFoundError):
        return UserError(f"{shown}: {what} not found")
    if isinstance(exc, IsADirectoryError):
        return UserError(f"{shown}: expected the {what} (a file), found a folder")
    if isinstance(exc, PermissionError):
        return UserError(f"{shown}: cannot read the {what}: permission denied")
    return UserError(f"{shown}: cannot read the {what}: {one_line(exc.strerror or str(exc))}")


def load_private_key(path: str | Path) -> tuple[Ed25519PrivateKey, list[str]]:
    """The key and warnings (a key file readable by others)."""
    p = Path(path)
    warnings = []
    try:
        mode = p.stat().st_mode
        data = p.read_bytes()
    except OSError as exc:
        raise cannot_read(p, "private key", exc) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        warnings.append(f"{p}: private key is accessible to other users (mode {stat.S_IMODE(mode):o}); "
                        f"chmod 600 {p}")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise UserError(f"{p}: not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise UserError(f"{p}: expected an Ed25519 private key, got {type(key).__name__}")
    return key, warnings


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    p = Path(path)
    try:
        key = serialization.load_pem_public_key(p.read_bytes())
    except OSError as exc:
        raise cannot_read(p, "public key", exc) from None
    except (ValueError, TypeError) as exc:
        raise UserError(f"{p}: not a PEM public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise UserError(f"{p}: expected an Ed25519 public key, got {type(key).__name__}")
    return key


# --------------------------------------------------------------------------- signing


def statement(root: Path) -> dict[str, Any]:
    """The in-toto Statement for the report files in ``root``."""
    subjects = []
    for name in SUBJECTS:
        path = root / name
        if not path.is_file():
            raise UserError(f"{path}: missing; render the report first (`ampcert report {root}`)")
        subjects.append({"name": name, "digest": {"sha256": sha256_file(path)}})
    try:
        report = json.loads((root / "report.json").read_text(encoding="utf-8"))
        cert = report.get("certificate") or {}
        predicate = {
            "tool": {"name": "ampcert", "version": __version__},
            "suite": {"name": report["suite"]["name"], "sha256": report["suite"]["sha256"]},
            "rules": report.get("rules"),
            "verdict": cert.get("status", "NOT CERTIFIED"),
            "subjects": [{**s["subject"], "status": s["status"]} for s in cert.get("subjects", [])],
            "runs": {"total": len(report["runs"]),
                     "completed": sum(r["status"] == "completed" for r in report["runs"]),
                     "failed": sum(r["status"] == "failed" for r in report["runs"])},
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise UserError(f"{root / 'report.json'}: not an ampcert report ({type(exc).__name__}: {exc}); "
                        f"re-render it with `ampcert report {root}`") from None
    return {"_type": STATEMENT_TYPE, "subject": subjects, "predicateType": PREDICATE_TYPE, "predicate": predicate}


def sign_results(root: str | Path, key_path: str | Path) -> tuple[Path, list[str]]:
    """Sign report.json and report.html in ``root``; returns the envelope path and warnings."""
    root = Path(root)
    return sign_statement(statement(root), root / ENVELOPE, key_path)


def files_statement(root: Path, names: tuple[str, ...], predicate: dict[str, Any]) -> dict[str, Any]:
    """An in-toto Statement over the files ``names`` in ``root`` (another report than a results
    folder's: the systems comparison). ``predicate`` needs what `ampcert verify` prints: ``suite``
    (``name``, ``sha256``: what was compared) and ``verdict``; the tool is added."""
    subjects = [{"name": name, "digest": {"sha256": sha256_file(root / name)}} for name in names]
    return {"_type": STATEMENT_TYPE, "subject": subjects, "predicateType": PREDICATE_TYPE,
            "predicate": {"tool": {"name": "ampcert", "version": __version__}, **predicate}}


def sign_statement(st: dict[str, Any], out: Path, key_path: str | Path) -> tuple[Path, list[str]]:
    """Write the DSSE envelope of ``st`` to ``out``, signed with the key at ``key_path``;
    returns the envelope path and warnings."""
    from ampcert.results import atomic_write_text

    key, warnings = load_private_key(key_path)
    payload = json.dumps(st, sort_keys=True, separators=(",", ":")).encode("utf-8")
    sig = key.sign(pae(PAYLOAD_TYPE, payload))
    envelope = {"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(payload).decode("ascii"),
                "signatures": [{"keyid": keyid(key.public_key()), "sig": base64.b64encode(sig).decode("ascii")}]}
    atomic_write_text(out, json.dumps(envelope, indent=1) + "\n")
    return out, warnings


# --------------------------------------------------------------------------- verifying


@dataclass
class Verified:
    keyid: str
    payload_type: str
    subjects: list[tuple[str, str]] = field(default_factory=list)
    predicate: dict[str, Any] = field(default_factory=dict)


# Bounds on what `verify` reads, so that no envelope, however made, ends in
# anything but a one-line VerificationError. A real envelope is a few KiB,
# nests four deep and names two subject files; these leave room for any real
# predicate (a certificate of a thousand subjects fits in well under a MiB) and
# none for an envelope that would take the verifier's memory, time or stack.
MAX_ENVELOPE_BYTES = 16 << 20
MAX_DEPTH = 32          # JSON nesting, envelope and statement alike
MAX_SUBJECTS = 64       # each one is a file hashed
MAX_SIGNATURES = 64
_SHA256_HEX = frozenset("0123456789abcdef")


def _show(value: Any, limit: int = 60) -> str:
    """A value from the envelope for a message: its repr, one line, cut short."""
    try:
        text = repr(value)
    except RecursionError:  # (depth is bounded before anything is shown; this is belt and braces)
        text = f"<a deeply nested {type(value).__name__}>"
    text = one_line(text)
    return text if len(text) <= limit else text[:limit] + "…"


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Two values for one key: JSON parsers disagree on which wins, so another
    # verifier could read another statement from the same signed bytes.
    seen: dict[str, Any] = {}
    for k, v in pairs:
        if k in seen:
            raise VerificationError(f"duplicate key {_show(k)}")
        seen[k] = v
    return seen


def _no_constant(name: str) -> Any:
    raise VerificationError(f"{name} is not JSON")


def _depth(obj: Any) -> int:
    """How deep ``obj`` nests, without recursing (a list of lists a million deep is data too)."""
    deepest, todo = 0, [(obj, 1)]
    while todo:
        item, d = todo.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, d)
            if deepest > MAX_DEPTH:
                break
            todo.extend((v, d + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def _json(raw: bytes, what: str) -> Any:
    """Strict JSON from bytes: UTF-8, no duplicate keys, no NaN, at most MAX_DEPTH deep.

    Python's json recurses once per level and stops with RecursionError near
    a thousand: that, like any other refusal here, is a VerificationError."""
    try:
        obj = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise VerificationError(f"{what}: not UTF-8 text") from None
    except RecursionError:
        raise VerificationError(f"{what}: JSON nested deeper than {MAX_DEPTH} levels") from None
    except VerificationError as exc:
        raise VerificationError(f"{what}: {exc}") from None
    except ValueError as exc:  # JSONDecodeError; an integer too long to convert
        raise VerificationError(f"{what}: not JSON ({one_line(str(exc))[:100]})") from None
    if _depth(obj) > MAX_DEPTH:
        raise VerificationError(f"{what}: JSON nested deeper than {MAX_DEPTH} levels")
    return obj


def _b64(text: Any, what: str) -> bytes:
    if not isinstance(text, str):
        raise VerificationError(f"{what}: expected a base64 string, got {type(text).__name__}")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise VerificationError(f"{what}: not valid base64") from None
    if base64.b64encode(raw).decode("ascii") != text:
        raise VerificationError(f"{what}: not canonical base64")
    return raw


def _read_envelope(path: Path) -> bytes:
    """The envelope's bytes, refused above MAX_ENVELOPE_BYTES before any is parsed
    (read with a bound, not by its stat size: a device or a growing file lies).

    An envelope that cannot be read at all (not found, a folder, no permission)
    is bad input, a UserError (exit 2), not a verification failure."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_ENVELOPE_BYTES + 1)
    except IsADirectoryError as exc:
        inside = path / ENVELOPE
        if inside.is_file():
            raise UserError(f"{one_line(str(path))}: is a folder; give its envelope, {one_line(str(inside))}") \
                from None
        raise cannot_read(path, "envelope", exc) from None
    except OSError as exc:
        raise cannot_read(path, "envelope", exc) from None
    if len(raw) > MAX_ENVELOPE_BYTES:
        raise VerificationError(f"{one_line(str(path))}: larger than {MAX_ENVELOPE_BYTES >> 20} MiB; "
                                "not an ampcert envelope")
    return raw


def _signatures(env: dict[str, Any]) -> list[tuple[str, Any]]:
    """(keyid, sig) of every signature, each item's shape checked."""
    sigs = env["signatures"]
    if not isinstance(sigs, list) or not sigs:
        raise VerificationError("signatures: expected a non-empty list")
    if len(sigs) > MAX_SIGNATURES:
        raise VerificationError(f"signatures: {len(sigs)} of them, more than {MAX_SIGNATURES}")
    out = []
    for i, s in enumerate(sigs):
        if not isinstance(s, dict) or set(s) != {"keyid", "sig"}:
            raise VerificationError(f"signatures[{i}]: expected exactly the fields keyid, sig")
        if not isinstance(s["keyid"], str):
            raise VerificationError(f"signatures[{i}].keyid: expected a string, got {type(s['keyid']).__name__}")
        out.append((s["keyid"], s["sig"]))
    return out


def _subject(i: int, s: Any) -> tuple[str, str]:
    """(name, sha256) of one statement subject, every field's type checked."""
    if not isinstance(s, dict):
        raise VerificationError(f"statement: subject[{i}]: expected an object, got {type(s).__name__}")
    name, digest = s.get("name"), s.get("digest")
    # A plain file name beside the envelope: no folder, nothing that is not a name.
    if (not isinstance(name, str) or not name or name in (".", "..") or len(name) > 255
            or not name.isprintable() or any(c in name for c in "/\\")):
        raise VerificationError(f"statement: subject[{i}].name: expected a file name, got {_show(name)}")
    if not isinstance(digest, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                               for k, v in digest.items()):
        raise VerificationError(f"statement: subject[{i}].digest: expected an object of strings, "
                                f"got {_show(digest)}")
    sha = digest.get("sha256")
    if sha is None or len(sha) != 64 or not set(sha) <= _SHA256_HEX:
        raise VerificationError(f"statement: subject[{i}].digest.sha256: expected 64 lowercase hex digits, "
                                f"got {_show(sha)}")
    return name, sha


def _predicate(st: dict[str, Any]) -> dict[str, Any]:
    """The predicate, its type and the fields `ampcert verify` prints checked."""
    if st.get("predicateType") != PREDICATE_TYPE:
        raise VerificationError(f"statement: predicateType: expected {PREDICATE_TYPE!r}, "
                                f"got {_show(st.get('predicateType'))}")
    pred = st.get("predicate")
    if not isinstance(pred, dict):
        raise VerificationError(f"statement: predicate: expected an object, got {type(pred).__name__}")
    for key, fields in (("suite", ("name", "sha256")), ("tool", ("name", "version")), ("", ("verdict",))):
        part = pred.get(key, {}) if key else pred
        if not isinstance(part, dict):
            raise VerificationError(f"statement: predicate.{key}: expected an object, got {type(part).__name__}")
        for f in fields:
            value = part.get(f, "")
            if not isinstance(value, str) or not value.isprintable():
                where = f"{key}.{f}" if key else f
                raise VerificationError(f"statement: predicate.{where}: expected a printable string, "
                                        f"got {_show(value)}")
    return pred


def verify_envelope(envelope_path: str | Path, public_key: Ed25519PublicKey) -> Verified:
    """Verify the envelope at ``envelope_path`` with ``public_key``; any failure,
    however the envelope was made, is a one-line :class:`VerificationError`. A file
    that cannot be read at all (the envelope or a subject file: not found, a folder,
    no permission) is a one-line UserError instead: nothing was checked."""
    path = Path(envelope_path)
    env = _json(_read_envelope(path), f"{one_line(str(path))}: not a JSON DSSE envelope")
    if not isinstance(env, dict) or set(env) != {"payload", "payloadType", "signatures"}:
        raise VerificationError("envelope: expected exactly the fields payload, payloadType, signatures")
    if env["payloadType"] != PAYLOAD_TYPE:
        raise VerificationError(f"payloadType: expected {PAYLOAD_TYPE!r}, got {_show(env['payloadType'])}")
    payload = _b64(env["payload"], "payload")
    sigs = _signatures(env)
    want = keyid(public_key)
    message = pae(PAYLOAD_TYPE, payload)
    ok = False
    for i, (kid, sig) in enumerate(sigs):
        if kid != want:
            continue
        try:
            public_key.verify(_b64(sig, f"signatures[{i}].sig"), message)
            ok = True
            break
        except InvalidSignature:
            raise VerificationError(f"signatures[{i}]: signature does not verify with key {want[:16]}…") from None
    if not ok:
        shown = ", ".join(_show(k, 16).strip("'") for k, _ in sigs[:4]) + (", …" if len(sigs) > 4 else "")
        raise VerificationError(f"no signature by key {want[:16]}… (keyids in the envelope: {shown})")
    # Signed from here on, but by whoever holds the key: still checked as untrusted input.
    st = _json(payload, "payload: signed, but not a JSON in-toto Statement")
    if not isinstance(st, dict) or st.get("_type") != STATEMENT_TYPE:
        raise VerificationError(f"payload: expected an in-toto Statement ({STATEMENT_TYPE})")
    subjects = st.get("subject")
    if not isinstance(subjects, list) or not subjects:
        raise VerificationError(f"statement: no subjects (subject: expected a non-empty list, got {_show(subjects)})")
    if len(subjects) > MAX_SUBJECTS:
        raise VerificationError(f"statement: {len(subjects)} subjects, more than {MAX_SUBJECTS}")
    named = [_subject(i, s) for i, s in enumerate(subjects)]
    if len({name for name, _ in named}) != len(named):
        raise VerificationError("statement: a subject is named twice")
    result = Verified(keyid=want, payload_type=PAYLOAD_TYPE, predicate=_predicate(st))
    for name, digest in named:
        file = path.parent / name
        if not file.is_file():
            raise VerificationError(f"{one_line(str(file))}: subject file missing")
        try:
            actual = sha256_file(file)
        except OSError as exc:  # it is there, but cannot be read: bad input, not a mismatch
            raise cannot_read(file, "signed report file", exc) from None
        if actual != digest:
            raise VerificationError(f"{one_line(str(file))}: sha256 {actual[:16]}… does not match "
                                    f"the signed {digest[:16]}…")
        result.subjects.append((name, digest))
    return result
