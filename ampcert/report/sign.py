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
reason.
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

from ampcert.errors import UserError
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
    private.parent.mkdir(parents=True, exist_ok=True)
    if force:
        private.unlink(missing_ok=True)
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    os.chmod(private, 0o600)  # whatever the umask said
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def load_private_key(path: str | Path) -> tuple[Ed25519PrivateKey, list[str]]:
    """The key and warnings (a key file readable by others)."""
    p = Path(path)
    warnings = []
    try:
        mode = p.stat().st_mode
        data = p.read_bytes()
    except OSError as exc:
        raise UserError(f"{p}: cannot read the private key ({type(exc).__name__})") from None
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
        raise UserError(f"{p}: cannot read the public key ({type(exc).__name__})") from None
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
    from ampcert.results import atomic_write_text

    root = Path(root)
    key, warnings = load_private_key(key_path)
    payload = json.dumps(statement(root), sort_keys=True, separators=(",", ":")).encode("utf-8")
    sig = key.sign(pae(PAYLOAD_TYPE, payload))
    envelope = {"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(payload).decode("ascii"),
                "signatures": [{"keyid": keyid(key.public_key()), "sig": base64.b64encode(sig).decode("ascii")}]}
    out = root / ENVELOPE
    atomic_write_text(out, json.dumps(envelope, indent=1) + "\n")
    return out, warnings


# --------------------------------------------------------------------------- verifying


@dataclass
class Verified:
    keyid: str
    payload_type: str
    subjects: list[tuple[str, str]] = field(default_factory=list)
    predicate: dict[str, Any] = field(default_factory=dict)


def _b64(text: Any, what: str) -> bytes:
    if not isinstance(text, str):
        raise VerificationError(f"{what}: expected a base64 string")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise VerificationError(f"{what}: not valid base64") from None
    if base64.b64encode(raw).decode("ascii") != text:
        raise VerificationError(f"{what}: not canonical base64")
    return raw


def verify_envelope(envelope_path: str | Path, public_key: Ed25519PublicKey) -> Verified:
    path = Path(envelope_path)
    try:
        env = json.loads(path.read_bytes())
    except OSError as exc:
        raise VerificationError(f"{path}: cannot read ({type(exc).__name__})") from None
    except (UnicodeDecodeError, ValueError):
        raise VerificationError(f"{path}: not a JSON DSSE envelope") from None
    if not isinstance(env, dict) or set(env) != {"payload", "payloadType", "signatures"}:
        raise VerificationError("envelope: expected exactly the fields payload, payloadType, signatures")
    if env["payloadType"] != PAYLOAD_TYPE:
        raise VerificationError(f"payloadType: expected {PAYLOAD_TYPE!r}, got {env['payloadType']!r}")
    payload = _b64(env["payload"], "payload")
    sigs = env["signatures"]
    if not isinstance(sigs, list) or not sigs:
        raise VerificationError("signatures: expected a non-empty list")
    want = keyid(public_key)
    message = pae(env["payloadType"], payload)
    ok = False
    for i, s in enumerate(sigs):
        if not isinstance(s, dict) or set(s) != {"keyid", "sig"}:
            raise VerificationError(f"signatures[{i}]: expected exactly the fields keyid, sig")
        if s["keyid"] != want:
            continue
        try:
            public_key.verify(_b64(s["sig"], f"signatures[{i}].sig"), message)
            ok = True
            break
        except InvalidSignature:
            raise VerificationError(f"signatures[{i}]: signature does not verify with key {want[:16]}…") from None
    if not ok:
        raise VerificationError(f"no signature by key {want[:16]}… (keyids in the envelope: "
                                f"{', '.join(str(s.get('keyid'))[:16] for s in sigs if isinstance(s, dict))})")
    try:
        st = json.loads(payload)
    except ValueError:
        raise VerificationError("payload: signed, but not a JSON in-toto Statement") from None
    if not isinstance(st, dict) or st.get("_type") != STATEMENT_TYPE:
        raise VerificationError(f"payload: expected an in-toto Statement ({STATEMENT_TYPE})")
    subjects = st.get("subject")
    if not isinstance(subjects, list) or not subjects:
        raise VerificationError("statement: no subjects")
    result = Verified(keyid=want, payload_type=env["payloadType"], predicate=st.get("predicate") or {})
    for s in subjects:
        name = s.get("name") if isinstance(s, dict) else None
        digest = (s.get("digest") or {}).get("sha256") if isinstance(s, dict) else None
        if not isinstance(name, str) or not isinstance(digest, str) or Path(name).name != name:
            raise VerificationError(f"statement: malformed subject {s!r}")
        file = path.parent / name
        if not file.is_file():
            raise VerificationError(f"{file}: subject file missing")
        actual = sha256_file(file)
        if actual != digest:
            raise VerificationError(f"{file}: sha256 {actual[:16]}… does not match the signed {digest[:16]}…")
        result.subjects.append((name, digest))
    return result
