"""``ledgers = "ship"``: ledgers, and the attachments they reference, carried between the
workers and the driver's store (imported only by :mod:`dsh_ray.executor`; imports ray).

* A worker writes its run's ledger into a directory of its own (:func:`local_store`) and a
  :class:`Shipper` streams what is appended to the batch's :class:`LedgerSink` actor — whole
  lines only while the run lasts, every byte once it has ended. Before the lines that
  reference an attachment, the attachment's bytes (read from the worker's store and checked
  against their hash) are sent: one caller's actor calls are served in order, so whatever
  part of a ledger reaches the sink has its attachments there too, even if the worker dies.
* The driver takes a finished unit's ledger and attachments (:func:`land`), checks every
  attachment's bytes against its hash again, stores them with the store's own atomic write
  (:class:`dsh.ledger.blobs.BlobFiles`), writes the ledger (whole or absent) and reports any
  attachment the ledger references that did not arrive whole.
* A continued session goes the other way: its ledger and the attachments it references,
  read from the driver's store and checked (:func:`outgoing`), are written into the
  worker's store before its run (:func:`receive`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import ray

from dsh.core.errors import DshError
from dsh.ledger.blobs import AttachmentMissing
from dsh.ledger.blobs import BlobFiles


class Blobs(BlobFiles):
    """The attachment files of the session directory ``directory``
    (``directory/attachments/<sha256>``), as the built-in store keeps them."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)


def references(data: bytes) -> list[tuple[str, int | None]]:
    """``(sha256, size)`` of every attachment the ledger lines in ``data`` reference, in
    order (a line that is not a JSON object — a torn last line — references none)."""
    if b'"attachments"' not in data:
        return []
    out: list[tuple[str, int | None]] = []
    for line in data.split(b"\n"):
        if b'"attachments"' not in line:
            continue
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):
            continue
        refs = event.get("attachments") if isinstance(event, dict) else None
        for ref in refs if isinstance(refs, list) else ():
            if isinstance(ref, dict) and isinstance(ref.get("sha256"), str):
                size = ref.get("size")
                out.append((ref["sha256"], size if type(size) is int else None))
    return out


def checked(blobs: Blobs, sha256: str, size: int | None = None) -> bytes:
    """The bytes stored under ``sha256`` in ``blobs``, checked against the hash (and the
    recorded size); :class:`AttachmentMissing` naming the file when they are absent or
    altered (an invalid hash: :class:`~dsh.core.errors.LedgerError`)."""
    data = blobs.get_attachment(sha256)
    if hashlib.sha256(data).hexdigest() != sha256 or (size is not None and len(data) != size):
        raise AttachmentMissing(f"attachment file {blobs.attachment_path(sha256)} does not "
                                "match its hash")
    return data


class LedgerSink:
    """The batch's actor holding the ledgers of running units, and the attachments they
    reference, as their workers stream them."""

    def __init__(self) -> None:
        self.ledgers: dict[str, bytearray] = {}
        self.blobs: dict[str, dict[str, bytes]] = {}

    def append(self, session: str, offset: int, data: bytes) -> None:
        buf = self.ledgers.setdefault(session, bytearray())
        if offset <= len(buf) < offset + len(data):
            buf += data[len(buf) - offset:]

    def put_blob(self, session: str, sha256: str, data: bytes) -> None:
        self.blobs.setdefault(session, {})[sha256] = data

    def take(self, session: str) -> tuple[bytes, dict[str, bytes]]:
        return bytes(self.ledgers.pop(session, b"")), self.blobs.pop(session, {})


class Shipper:
    """Streams what a worker's run appends to its local ledger, and the attachments those
    lines reference, to the :class:`LedgerSink`: every ``POLL`` seconds, before each of the
    run's budget calls (waited for), and once more, waited for, when the run ends.
    ``known``: attachments the driver already has."""

    def __init__(self, sink: Any, session: str, path: Path, known: set[str] | None = None
                 ) -> None:
        self.sink, self.session, self.path = sink, session, path
        self.blobs = Blobs(path.parent)
        self.offset = 0
        self.shipped: set[str] = set(known or ())
        self._last: Any = None  # the last append sent (waited for by the next waiting flush)
        self._lock = threading.Lock()

    def flush_now(self) -> None:
        """Ship the whole lines written so far and wait until the sink has them (before a
        budget call: :attr:`dsh_ray.executor.RayBudget.before`)."""
        self.flush(wait=True, final=False)

    def flush(self, *, wait: bool = False, final: bool | None = None) -> None:
        """Ship what was appended since the last call: whole lines only while the run lasts,
        every byte when it has ended (``final``; default: ``wait``)."""
        final = wait if final is None else final
        with self._lock:  # sent in offset order (one caller's actor calls run in order)
            try:
                with self.path.open("rb") as f:
                    f.seek(self.offset)
                    data = f.read()
            except FileNotFoundError:
                return
            if not final:  # the run goes on: whole lines only (the rest comes next time)
                data = data[:data.rfind(b"\n") + 1]
            if data:
                self._send(data)
            ref = self._last
        if wait and ref is not None:
            ray.get(ref)  # the blobs sent before it are there too (served in order)

    def _send(self, data: bytes) -> None:
        for sha, size in references(data):
            if sha in self.shipped:
                continue
            try:
                blob = checked(self.blobs, sha, size)
            except (DshError, OSError):
                continue  # not here whole: the driver names what did not arrive
            self.sink.put_blob.remote(self.session, sha, blob)
            self.shipped.add(sha)
        self._last = self.sink.append.remote(self.session, self.offset, data)
        self.offset += len(data)


_LOCAL: list[Path] = []


def local_store() -> Path:
    """This worker process's own session directory (in its ``TMPDIR``)."""
    if not _LOCAL:
        _LOCAL.append(Path(tempfile.mkdtemp(prefix="dsh-ray-ledgers-")))
    return _LOCAL[0]


def receive(path: Path, prior: bytes | None, blobs: dict[str, bytes] | None) -> None:
    """Before a continued session's run on a worker: its ledger (``prior``) and the
    attachments it references, written into the worker's store (each checked again)."""
    store = Blobs(path.parent)
    for sha, data in (blobs or {}).items():
        if store.put_attachment(data) != sha:
            raise DshError(f"dsh-ray: attachment {sha[:12]} of session {path.stem} reached "
                           "the worker altered (its bytes do not match their hash)")
    if prior is not None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(prior)


def clean(path: Path) -> None:
    """After a unit: the worker's copy of its ledger and every attachment file removed (a
    worker process runs one unit at a time)."""
    path.unlink(missing_ok=True)
    shutil.rmtree(path.parent / "attachments", ignore_errors=True)


def outgoing(path: Path) -> tuple[bytes | None, dict[str, bytes]]:
    """A continued session's ledger in the driver's store and the attachments it references,
    checked against their hashes (one missing or altered: :class:`AttachmentMissing` naming
    its file, before anything is dispatched)."""
    if not path.exists():
        return None, {}
    prior = path.read_bytes()
    store = Blobs(path.parent)
    blobs: dict[str, bytes] = {}
    for sha, size in references(prior):
        if sha not in blobs:
            try:
                blobs[sha] = checked(store, sha, size)
            except AttachmentMissing as exc:
                raise AttachmentMissing(f"session {path.stem}: {exc}") from None
    return prior, blobs


def land(path: Path, data: bytes, blobs: dict[str, bytes]) -> list[str]:
    """Write what the workers shipped of a session (:meth:`LedgerSink.take`: its ledger's
    bytes and attachments) into the driver's store as ``path``: each
    attachment whose bytes match its hash (stored atomically, as the store stores them),
    then the ledger (a temporary file renamed over it: it is whole or absent). Returns the
    problems: attachments refused, or referenced by the ledger and not there whole."""
    store = Blobs(path.parent)
    problems: list[str] = []
    refused: set[str] = set()
    for sha, blob in blobs.items():
        if hashlib.sha256(blob).hexdigest() != sha:
            refused.add(sha)
            problems.append(f"attachment {sha[:12]} arrived altered (its bytes do not match "
                            "their hash): not stored")
            continue
        try:
            store.put_attachment(blob)
        except DshError as exc:
            problems.append(str(exc))
    if not data:
        return problems
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    for sha, size in dict.fromkeys(references(data)):
        if sha in refused:
            continue  # already named
        try:
            checked(store, sha, size)
        except (DshError, OSError) as exc:
            problems.append(f"attachment {sha[:12]} referenced by the ledger did not arrive "
                            f"whole: {exc}")
    return problems
