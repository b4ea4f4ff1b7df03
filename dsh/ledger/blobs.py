"""Attachment blobs (issue 17): their size caps, the error for a missing one, and their stores.

The attachment *store* — bytes by content hash, shared by a store's sessions — belongs to the
ledger: :class:`BlobFiles` keeps them as files beside the session ledgers
(``<dir>/attachments/<sha256>``, ``0600``, written atomically; :class:`~dsh.ledger.store.JsonlStore`
is one), :class:`MemoryBlobs` in memory for a ``--no-save`` session. What an attachment is,
how it is read, checked and encoded for a provider lives in :mod:`dsh.llm.attachments`, which
re-exports these names.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from dsh.core.errors import LedgerError
from dsh.core.files import fsync_dir
from dsh.core.files import reason as _reason
from dsh.ledger.scan import _check_regular

#: The largest attachment of each kind, in bytes (why these: :mod:`dsh.llm.attachments`).
MAX_BYTES = {"image": 20 * 1024 * 1024, "pdf": 32 * 1024 * 1024}
#: The most any blob read takes: the largest attachment (one byte more says "too large").
READ_CAP = max(MAX_BYTES.values())
_SHA256 = re.compile(r"[0-9a-f]{64}")


class AttachmentMissing(LedgerError):
    """A recorded attachment's bytes are missing from the store or no longer match their hash;
    the message names the attachment and where it was looked for. Nothing was sent."""


class MemoryBlobs:
    """The attachment store of an in-memory (``--no-save``) session: bytes by hash (issue
    17). Here rather than in :mod:`dsh.attachments` so that a run without attachments never
    imports that module."""

    def __init__(self) -> None:
        self._blobs: dict[str, bytes] = {}

    def put_attachment(self, data: bytes) -> str:
        import hashlib

        sha = hashlib.sha256(data).hexdigest()
        self._blobs.setdefault(sha, bytes(data))
        return sha

    def get_attachment(self, sha256: str) -> bytes:
        try:
            return self._blobs[sha256]
        except KeyError:
            raise AttachmentMissing(f"attachment {sha256[:12]} is not in memory") from None

    def attachment_path(self, sha256: str) -> str:
        return "(memory)"



class BlobFiles:
    """The attachment files of a session store, beside its ledgers (a base of
    :class:`~dsh.ledger.store.JsonlStore`): bytes by content hash, shared by the store's
    sessions, under ``<directory>/attachments/``."""

    directory: Path

    def attachment_path(self, sha256: str) -> Path:
        """``<dir>/attachments/<sha256>``; anything but 64 lower-case hex digits is refused
        (a hash read from a ledger names no other file)."""
        if not _SHA256.fullmatch(sha256):
            raise LedgerError(f"invalid attachment hash {sha256[:80]!r}")
        return self.directory / "attachments" / sha256

    def put_attachment(self, data: bytes) -> str:
        """Store ``data`` under its SHA-256 (once: a file already there with the right bytes
        is kept) and return the hash. Written atomically — a ``0600`` temporary file in the
        same folder, fsynced, renamed — so a crash never leaves a partial blob under a hash;
        a file there whose bytes do not match (altered) is replaced."""
        import hashlib

        sha = hashlib.sha256(data).hexdigest()
        path = self.attachment_path(sha)
        folder = path.parent
        with contextlib.suppress(LedgerError, OSError):
            if hashlib.sha256(self._read_blob(path)).hexdigest() == sha:
                return sha
        tmp = folder / f".tmp-{os.getpid()}-{os.urandom(6).hex()}"
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            fsync_dir(folder)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise LedgerError(f"cannot store attachment in {folder}: {_reason(exc)}") from None
        return sha

    def get_attachment(self, sha256: str) -> bytes:
        """The bytes stored under ``sha256`` (the caller checks them against the hash:
        :func:`dsh.llm.attachments.verified`). Missing:
        :class:`dsh.ledger.blobs.AttachmentMissing`.
        """
        path = self.attachment_path(sha256)
        try:
            return self._read_blob(path)
        except FileNotFoundError:
            raise AttachmentMissing(f"no attachment file {path}") from None

    @staticmethod
    def _read_blob(path: Path) -> bytes:
        """A blob file's bytes: a regular file (a symlink planted there is not followed),
        read up to the largest attachment plus one byte."""
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            _check_regular(fd, path)
            chunks = []
            total = 0
            while total <= READ_CAP:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)
