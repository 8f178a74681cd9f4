"""Signed reports: a key pair, a DSSE envelope over report.json and report.html, offline verification."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ampcert.errors import NotVerified
from ampcert.runner.signals import interruptible
from ampcert.session.folders import existing_folder, folder_lock

if TYPE_CHECKING:
    from ampcert.report.sign import Verified


def keygen(key: str | Path, *, force: bool = False) -> tuple[Path, Path, str]:
    """Write an Ed25519 key pair (private key mode 0600); returns the paths and the keyid."""
    from ampcert.report.sign import keygen as make_keys
    from ampcert.report.sign import keyid, load_public_key

    with interruptible():
        private, public = make_keys(key, force=force)
        return private, public, keyid(load_public_key(public))


def sign(folder: str | Path, key: str | Path) -> tuple[Path, list[str]]:
    """Sign report.json and report.html: writes report.dsse.json; returns it and any warnings."""
    from ampcert.report.sign import sign_results

    with interruptible():
        root = existing_folder(folder)
        with folder_lock(root):
            return sign_results(root, key)


def verify(envelope: str | Path, pubkey: str | Path) -> Verified:
    """Verify a signed report offline: signature, payload type, every subject's digest.

    Raises :class:`~ampcert.errors.NotVerified` on any mismatch, UserError on unreadable input."""
    from ampcert.report.sign import VerificationError, load_public_key, verify_envelope

    with interruptible():
        key = load_public_key(pubkey)
        try:
            return verify_envelope(envelope, key)
        except VerificationError as exc:
            raise NotVerified(str(exc)) from None
