"""Attachments: images and PDFs sent with a user message (issue 17).

The path of an attachment, end to end (docs/attachments.md):

1. **In.** :func:`load` reads one source — a file path, ``-`` (stdin), an ``http(s)`` URL
   (downloaded once, here), raw bytes, or :class:`Input` (bytes with a media type) — into an
   :class:`Input`: its bytes, the media type *sniffed from the bytes* (a name or a server's
   ``Content-Type`` is never trusted) and a display name. Sizes are capped
   (:data:`MAX_BYTES`) before anything is read past the cap.
2. **Stored.** :func:`store` puts the bytes in the session's blob store — the session store's
   ``put_attachment`` (``<sessions dir>/attachments/<sha256>`` for the built-in JSON Lines
   store), or memory for a ``--no-save`` session — and returns the reference the ledger
   records on ``user/message``: :class:`~dsh.core.messages.Attachment` (hash, type, size, name).
3. **Sent.** An adapter turns a message's references into its provider's content parts with
   :func:`payload` / :func:`data_url`: the bytes come from the blob store the transport
   handed over with the sealed request (:func:`dsh.llm.transport.blobs`), and are checked
   against the recorded hash before they are used. So what leaves is the record plus the
   bytes whose hash the record holds (C3); a missing or altered file is an
   :class:`AttachmentMissing` naming it, raised before anything is sent.
"""

from __future__ import annotations

import base64
import hashlib
import os
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from typing import BinaryIO

import attrs

from dsh.core.errors import DshError
from dsh.core.errors import UsageError
from dsh.core.files import NotRegular
from dsh.core.files import TooLarge
from dsh.core.files import reason as _reason
from dsh.core.messages import Attachment
from dsh.ledger.blobs import MAX_BYTES as MAX_BYTES
from dsh.ledger.blobs import READ_CAP as READ_CAP
from dsh.ledger.blobs import AttachmentMissing as AttachmentMissing
from dsh.ledger.blobs import MemoryBlobs as MemoryBlobs

#: Image types every adapter that takes attachments accepts.
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
PDF = "application/pdf"
#: Every media type dsh attaches.
MEDIA_TYPES = IMAGE_TYPES | {PDF}
#: ``MAX_BYTES``, the largest attachment of each kind (20 MiB for an image: OpenAI's limit per
#: image, Anthropic's is lower and its API says so; 32 MiB for a PDF: Anthropic's request
#: limit), and ``READ_CAP``, the most any source is read before its type is known, live in
#: :mod:`dsh.ledger.blobs`. Nothing past the cap is read, downloaded or stored.
#: Downloads: seconds for the whole download, redirects followed at most.
URL_TIMEOUT = 30.0
MAX_REDIRECTS = 5


class AttachmentError(UsageError):
    """A source cannot be attached (not found, not an image or PDF, too big, a download that
    failed); the message names it. Nothing was stored or sent. Exit code 2."""


class NotAccepted(DshError):
    """The model cannot take attachments (or not this type); names the model. Nothing was
    sent. Exit code 2."""

    exit_code = 2


@attrs.frozen
class Input:
    """Bytes to attach, with their media type and a display name.

    :param data: the content.
    :param media_type: what the caller says it is; checked against the bytes (a mismatch is
        an :class:`AttachmentError`). ``None``: sniffed.
    :param name: shown by ``sessions show`` (never used as a path).
    """

    data: bytes
    media_type: str | None = None
    name: str | None = None


#: What :func:`load` accepts: a path or URL (``str`` / ``os.PathLike``), ``-`` for stdin,
#: raw ``bytes``, ``(bytes, media_type)``, or an :class:`Input`.
Source = Any


def sniff(data: bytes) -> str | None:
    """The media type the bytes' own signature says, or None for anything dsh does not
    attach (the file name and any ``Content-Type`` play no part)."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data.startswith(b"%PDF-"):
        return PDF
    return None


def limit_of(media_type: str) -> int:
    """The size cap of ``media_type`` in bytes (:data:`MAX_BYTES`)."""
    return MAX_BYTES["pdf"] if media_type == PDF else MAX_BYTES["image"]


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):g} MiB"


def check_input(item: Input, where: str) -> Input:
    """``item`` with its media type sniffed and checked, its size capped; else an
    :class:`AttachmentError` naming ``where``."""
    found = sniff(item.data)
    if found is None:
        raise AttachmentError(
            f"cannot attach {where}: not a PNG, JPEG, GIF, WebP image or a PDF (judged by its "
            "content, not its name)")
    if item.media_type is not None and item.media_type.lower() != found:
        raise AttachmentError(f"cannot attach {where}: said to be {item.media_type} but its "
                              f"content is {found}")
    cap = limit_of(found)
    if len(item.data) > cap:
        raise AttachmentError(f"cannot attach {where}: {len(item.data)} bytes, over the "
                              f"{_mib(cap)} limit for {found}")
    return Input(item.data, found, item.name)


def is_url(text: str) -> bool:
    low = text[:8].lower()
    return low.startswith(("http://", "https://"))


def shown_url(url: str) -> str:
    """A URL as messages and the ledger show it: no credentials, no query or fragment (a
    signed URL's token stays out of the ledger)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(an invalid URL)"
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}{port}{parts.path}"


def load(source: Source, *, stdin: BinaryIO | None = None) -> Input:
    """Read one source into a checked :class:`Input` (see the module docstring)."""
    if isinstance(source, Input):
        return check_input(source, repr(source.name or "bytes"))
    if isinstance(source, bytes | bytearray | memoryview):
        return check_input(Input(bytes(source)), "bytes")
    if isinstance(source, tuple) and len(source) == 2 and isinstance(source[0], bytes):
        return check_input(Input(source[0], str(source[1])), f"bytes ({source[1]})")
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str):
        raise AttachmentError(f"cannot attach a {type(source).__name__}: give a path, a URL, "
                              "'-', bytes or dsh.llm.attachments.Input")
    if source == "-":
        if stdin is None and (sys.stdin is None or sys.stdin.isatty()):
            raise AttachmentError("cannot attach stdin: it is a terminal (pipe the file in: "
                                  "dsh run --attach - PROMPT < FILE)")
        stream = stdin if stdin is not None else sys.stdin.buffer
        data = stream.read(READ_CAP + 1)
        if len(data) > READ_CAP:
            raise AttachmentError(f"cannot attach stdin: more than {_mib(READ_CAP)}")
        return check_input(Input(data, None, "stdin"), "stdin")
    if is_url(source):
        return fetch(source)
    return read_file(Path(source))


def read_file(path: Path) -> Input:
    """A regular file's bytes, read once by descriptor (:mod:`dsh.core.beneath`): the file
    itself may not be a symbolic link (one a command planted in the workspace would send what
    it points to), and dsh's protected paths (the key store, ``~/.ssh``…) are refused
    wherever the path leads. Its size is checked on the open descriptor before reading, and
    reading stops past the cap (files under ``/proc`` report size 0)."""
    from dsh.core import beneath

    where = repr(str(path))
    folder, name = os.path.split(os.path.abspath(path))
    try:
        data = beneath.read(folder, name, READ_CAP)
    except beneath.Refused as exc:
        if "symbolic link" in exc.why:
            raise AttachmentError(f"cannot attach {where}: it is a symbolic link; attach the "
                                  "file it points to by its own path") from None
        raise AttachmentError(f"cannot attach {where}: {exc.why}") from None
    except FileNotFoundError:
        raise AttachmentError(f"cannot attach {where}: no such file") from None
    except NotRegular as exc:
        kind = exc.kind if exc.kind == "a directory" else "not a regular file"
        raise AttachmentError(f"cannot attach {where}: {kind}") from None
    except TooLarge as exc:
        size = f"{exc.size} bytes, " if exc.exact else ""
        raise AttachmentError(f"cannot attach {where}: {size}over the {_mib(READ_CAP)} limit "
                              f"(images {_mib(MAX_BYTES['image'])}, PDFs "
                              f"{_mib(MAX_BYTES['pdf'])})") from None
    except OSError as exc:
        raise AttachmentError(f"cannot attach {where}: {_reason(exc)}") from None
    return check_input(Input(data, None, path.name or str(path)), where)


def fetch(url: str, *, timeout: float = URL_TIMEOUT, client: Any = None) -> Input:
    """Download ``url`` once: ``http``/``https`` only, at most :data:`MAX_REDIRECTS`
    redirects (each checked again), at most :data:`READ_CAP` bytes (streamed, stopped past
    it), within ``timeout`` seconds overall. Messages show the URL without credentials or
    query (:func:`shown_url`); the server's ``Content-Type`` is ignored (the bytes are
    sniffed)."""
    import httpx

    from dsh.llm.deadline import deadline_transport

    shown = shown_url(url)
    where = repr(shown)
    deadline = time.monotonic() + timeout
    own = client is None
    if own:
        client = httpx.Client(follow_redirects=False, trust_env=False,
                              timeout=httpx.Timeout(min(timeout, 10.0)),
                              transport=deadline_transport(deadline))
    try:
        request = client.build_request("GET", url)
        for _ in range(MAX_REDIRECTS + 1):
            if request.url.scheme not in ("http", "https"):
                raise AttachmentError(f"cannot attach {where}: redirected to a "
                                      f"{request.url.scheme!r} URL (only http and https)")
            response = client.send(request, stream=True)
            try:
                if response.is_redirect and response.next_request is not None:
                    request = response.next_request
                    continue
                if response.status_code != 200:
                    raise AttachmentError(f"cannot attach {where}: the server answered "
                                          f"{response.status_code}")
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > READ_CAP:
                    raise AttachmentError(f"cannot attach {where}: {declared} bytes, over the "
                                          f"{_mib(READ_CAP)} limit")
                chunks = []
                total = 0
                for chunk in response.iter_raw():
                    chunks.append(chunk)
                    total += len(chunk)
                    if total > READ_CAP:
                        raise AttachmentError(f"cannot attach {where}: more than "
                                              f"{_mib(READ_CAP)}, download stopped")
                    if time.monotonic() > deadline:
                        raise AttachmentError(f"cannot attach {where}: not downloaded within "
                                              f"{timeout:g}s")
                # recorded as its name: the URL without credentials or query
                return check_input(Input(b"".join(chunks), None, shown), where)
            finally:
                response.close()
        raise AttachmentError(f"cannot attach {where}: more than {MAX_REDIRECTS} redirects")
    except httpx.HTTPError as exc:
        if isinstance(exc, httpx.TimeoutException) and time.monotonic() >= deadline:
            raise AttachmentError(f"cannot attach {where}: not downloaded within "
                                  f"{timeout:g}s") from None
        raise AttachmentError(f"cannot attach {where}: {type(exc).__name__}"
                              + _first_line(exc)) from None
    finally:
        if own:
            client.close()



def _first_line(exc: BaseException) -> str:
    from dsh.core.redact import redact

    text = str(exc).strip().splitlines()
    # httpx's messages may quote the URL: never its credentials or query
    return f" ({redact(text[0])[:200]})" if text and "://" not in text[0] else ""


# -- the blob store -----------------------------------------------------------------------------


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def store(blobs: Any, items: Iterable[Input]) -> tuple[Attachment, ...]:
    """Put each input in ``blobs`` (a session's blob store); the references to record."""
    if blobs is None or not hasattr(blobs, "put_attachment"):
        raise AttachmentError("this session's store keeps no attachments (a session_store "
                              "plugin without put_attachment/get_attachment)")
    out = []
    for item in items:
        sha = blobs.put_attachment(item.data)
        if sha != digest(item.data):
            raise AttachmentMissing(f"the session store filed {item.name!r} under a wrong hash")
        assert item.media_type is not None
        out.append(Attachment(sha256=sha, media_type=item.media_type, size=len(item.data),
                              name=item.name))
    return tuple(out)


def describe(att: Attachment) -> str:
    """``name (image/png, 12.3 KiB, sha256 1a2b3c4d5e6f)`` for messages and views."""
    return f"{att.name or '(unnamed)'} ({att.media_type}, {human_size(att.size)}, " \
           f"sha256 {att.sha256[:12]})"


def file_name(att: Attachment) -> str:
    """A file name for providers that want one (OpenAI's ``file`` parts): the last part of
    the recorded name (a path or URL), else ``<short hash>.<ext>``."""
    base = (att.name or "").replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    if base and base not in (".", ".."):
        return base
    return f"{att.sha256[:12]}.{att.media_type.rsplit('/', 1)[-1]}"


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def status(blobs: Any, att: Attachment) -> str | None:
    """Why ``att`` could not be sent from ``blobs`` (missing, altered), or None when it can."""
    try:
        verified(blobs, att)
    except AttachmentMissing as exc:
        return str(exc)
    return None


def verified(blobs: Any, att: Attachment) -> bytes:
    """The bytes of ``att`` from ``blobs``, checked against the recorded hash and size."""
    where = getattr(blobs, "attachment_path", None)
    place = f" ({where(att.sha256)})" if callable(where) else ""
    if blobs is None or not hasattr(blobs, "get_attachment"):
        raise AttachmentMissing(f"attachment {describe(att)}: this session's store keeps no "
                                "attachments")
    try:
        data = blobs.get_attachment(att.sha256)
    except AttachmentMissing:
        raise AttachmentMissing(f"attachment {describe(att)} is missing from the session "
                                f"store{place}") from None
    except OSError as exc:
        raise AttachmentMissing(f"attachment {describe(att)} cannot be read{place}: "
                                f"{_reason(exc)}") from None
    if type(data) is not bytes or len(data) != att.size or digest(data) != att.sha256:
        raise AttachmentMissing(f"attachment {describe(att)} was altered: its stored bytes no "
                                f"longer match the recorded hash{place}")
    return data


# -- for adapters -------------------------------------------------------------------------------


def payload(att: Attachment) -> bytes:
    """The bytes of a recorded attachment, for an adapter building its request: from the
    blob store the transport handed over with the sealed request, checked against the
    recorded hash (:class:`AttachmentMissing` otherwise, before anything is sent)."""
    from dsh.llm import transport

    return verified(transport.blobs(), att)


#: Base64 of attachments already read and verified in this process: a session's history is
#: resent with every request, so later steps skip the read, the hash check and the encoding.
#: Keyed by the hash and the stored file's identity (inode, size, mtime: one ``stat`` per
#: step), so a blob deleted or rewritten since is read and checked again. Bounded (oldest
#: dropped first).
_ENCODED: dict[tuple[Any, ...], str] = {}
_ENCODED_LIMIT = 128 * 1024 * 1024  # characters
_encoded_lock = threading.Lock()


def _identity(att: Attachment) -> tuple[Any, ...] | None:
    from dsh.llm import transport

    blobs = transport.blobs()
    where = getattr(blobs, "attachment_path", None)
    if not callable(where):
        return (att.sha256, id(blobs))  # in memory: the bytes cannot change under us
    try:
        st = os.stat(where(att.sha256), follow_symlinks=False)
    except (OSError, ValueError):
        return None  # missing: payload() says so
    return (att.sha256, st.st_ino, st.st_size, st.st_mtime_ns)


def base64_of(att: Attachment) -> str:
    """The base64 of a recorded attachment's verified bytes (see :data:`_ENCODED`)."""
    key = _identity(att)
    text = _ENCODED.get(key) if key is not None else None
    if text is not None:
        return text
    text = base64.b64encode(payload(att)).decode("ascii")
    if key is not None:
        with _encoded_lock:
            _ENCODED[key] = text
            total = sum(len(v) for v in _ENCODED.values())
            while total > _ENCODED_LIMIT and len(_ENCODED) > 1:
                total -= len(_ENCODED.pop(next(iter(_ENCODED))))
    return text


def data_url(att: Attachment) -> str:
    """``data:MEDIA_TYPE;base64,…`` of a recorded attachment."""
    return f"data:{att.media_type};base64,{base64_of(att)}"


def check_model(model: Any, model_id: str, attachments: Iterable[Any]) -> None:
    """A :class:`NotAccepted` naming the model when it cannot take one of ``attachments``
    (its adapter declares no such type, or its settings say ``attachments = false``)."""
    accepts = getattr(model, "accepts_attachment", None)
    for att in attachments:
        if accepts is None or not accepts(att.media_type):
            raise NotAccepted(f"model {model_id} does not take {att.media_type} attachments "
                              f"({_label(att)}); nothing was sent. Use a model "
                              "that does (openai:…, anthropic:…), or leave the attachment out")


def _label(att: Any) -> str:
    name = getattr(att, "name", None)
    return str(name) if name else str(getattr(att, "sha256", "") or "bytes")[:12]


# -- for views ----------------------------------------------------------------------------------


def problems(blobs: Any, events: Iterable[Any]) -> Any:
    """A callable giving why each recorded attachment of ``events`` cannot be sent (None when
    it can), each checked once; None when the events record no attachment."""
    if not any(getattr(e, "attachments", ()) for e in events):
        return None
    seen: dict[str, str | None] = {}

    def problem(a: Attachment) -> str | None:
        key = f"{a.sha256}:{a.size}"
        if key not in seen:
            seen[key] = status(blobs, a)
        return seen[key]

    return problem


def listing(blobs: Any, events: Iterable[Any]) -> list[dict[str, Any]]:
    """Every attachment ``events`` record, in order, as JSON objects (``sessions show
    --json``): ``sha256``, ``media_type``, ``size``, ``name``, ``seq`` of its ``user/message``
    and ``problem`` (null when its bytes are there and match)."""
    events = list(events)
    problem = problems(blobs, events)
    return [{"sha256": a.sha256, "media_type": a.media_type, "size": a.size, "name": a.name,
             "seq": e.seq, "problem": problem(a)}
            for e in events for a in getattr(e, "attachments", ())]
