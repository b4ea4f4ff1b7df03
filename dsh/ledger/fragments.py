"""Fragment blocks (``dsh run -f``): their text kept once by hash, the model's text rebuilt.

A ``user/message`` with ``fragments`` records each as a
:class:`~dsh.core.messages.FragmentRef` (hash, size, name); the text's UTF-8 bytes are in the
session's blob store, where attachments are (``<sessions dir>/attachments/<sha256>``, or
memory for ``--no-save``), so the same file used in many turns or sessions is stored once.
The model reads the message as it always did — each block, a blank line, the message's text::

    <fragment name="a.py">
    …the file's text…
    </fragment>

    review these

:func:`expand` builds that text from the references (the projection's user message, C3), reading
each text from the store once per process (:data:`_TEXTS`, by hash: the same bytes whoever
asks), checked against the recorded hash and size. A missing or altered blob is a
:class:`FragmentMissing` naming the fragment and where it was looked for.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dsh.core.errors import LedgerError
from dsh.core.messages import FragmentRef
from dsh.ledger.blobs import BlobFiles

#: Fragment texts read or stored in this process, by the SHA-256 of their bytes; kept up to
#: :data:`_CACHE_BYTES` (a fragment is at most 1 MiB).
_TEXTS: dict[str, str] = {}
_CACHE_BYTES = 64 * 1024 * 1024
_cached = [0]


class FragmentMissing(LedgerError):
    """A recorded fragment's text is missing from the session's store or no longer matches its
    hash; the message names the fragment and where it was looked for. Nothing was sent."""


class DirectoryBlobs(BlobFiles):
    """The blob files of a sessions folder, for reading a ledger file outside a store."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)


def block(name: str, text: str) -> str:
    """The fragment as the prompt carries it: ``<fragment name="NAME">`` … ``</fragment>``
    (the name's ``& " < >`` and newlines escaped; one final newline of the text dropped)."""
    shown = (name.replace("&", "&amp;").replace('"', "&quot;")
             .replace("<", "&lt;").replace(">", "&gt;").replace("\n", "&#10;"))
    body = text[:-1] if text.endswith("\n") else text
    return f'<fragment name="{shown}">\n{body}\n</fragment>'


def prepend(fragments: Iterable[tuple[str, str]], text: str) -> str:
    """``text`` after the blocks of ``fragments`` (``(name, text)`` pairs), each followed by a
    blank line."""
    blocks = [block(name, body) for name, body in fragments]
    return "\n\n".join([*blocks, text]) if blocks else text


def split(text: str, fragments: Sequence[Any]) -> str | None:
    """What follows the blocks of ``fragments`` (objects with ``name`` and ``text``) at the
    start of ``text`` — so that ``prepend(those, result) == text`` exactly — or None when
    ``text`` does not start with them (a ``pre_step`` rewrote it) or one cannot be stored as
    UTF-8 (then the message is recorded whole, as it is)."""
    pairs = [(f.name, f.text) for f in fragments]
    head = prepend(pairs, "")
    if not pairs or not text.startswith(head):
        return None
    try:
        for name, body in pairs:
            name.encode()
            body.encode()
    except UnicodeEncodeError:
        return None
    return text[len(head):]


def store(blobs: Any, fragments: Sequence[Any]) -> tuple[FragmentRef, ...] | None:
    """Put each fragment's text in ``blobs`` (a session's blob store, ``put_attachment``); the
    references to record, or None for a store that keeps no blobs (the text is then recorded
    whole)."""
    if blobs is None or not hasattr(blobs, "put_attachment"):
        return None
    refs = []
    for f in fragments:
        data = f.text.encode()
        sha = blobs.put_attachment(data)
        if sha != hashlib.sha256(data).hexdigest():
            raise FragmentMissing(f"the session store filed fragment {f.name!r} under a "
                                  "wrong hash")
        _remember(sha, f.text)
        refs.append(FragmentRef(sha256=sha, size=len(data), name=f.name))
    return tuple(refs)


def expand(blobs: Any, refs: Sequence[FragmentRef], text: str) -> str:
    """The text the model reads for a user message with ``refs``: their blocks, then
    ``text``."""
    return prepend([(r.name, text_of(blobs, r)) for r in refs], text)


def text_of(blobs: Any, ref: FragmentRef) -> str:
    """The text of ``ref``: from this process's cache, else from ``blobs``, checked."""
    cached = _TEXTS.get(ref.sha256)
    if cached is not None:
        return cached
    what = f"fragment {ref.name!r} (sha256 {ref.sha256[:12]})"
    where = getattr(blobs, "attachment_path", None)
    try:
        place = f" ({where(ref.sha256)})" if callable(where) else ""
    except LedgerError:
        raise FragmentMissing(f"{what}: invalid hash in the ledger") from None
    if blobs is None or not hasattr(blobs, "get_attachment"):
        raise FragmentMissing(f"{what}: no blob store to read it from (this session's "
                              "store keeps no blobs)")
    try:
        data = blobs.get_attachment(ref.sha256)
    except LedgerError:
        raise FragmentMissing(f"{what} is missing from the session store{place}") from None
    except OSError as exc:
        raise FragmentMissing(f"{what} cannot be read{place}: {exc.strerror or exc}") from None
    if (type(data) is not bytes or len(data) != ref.size
            or hashlib.sha256(data).hexdigest() != ref.sha256):
        raise FragmentMissing(f"{what} was altered: its stored bytes no longer match the "
                              f"recorded hash{place}")
    try:
        text = data.decode()
    except UnicodeDecodeError:  # pragma: no cover - the hash matched what was stored
        raise FragmentMissing(f"{what} is not UTF-8 text{place}") from None
    _remember(ref.sha256, text)
    return text


def _remember(sha: str, text: str) -> None:
    if sha in _TEXTS:
        return
    if _cached[0] + len(text) > _CACHE_BYTES:
        _TEXTS.clear()
        _cached[0] = 0
    _TEXTS[sha] = text
    _cached[0] += len(text)
