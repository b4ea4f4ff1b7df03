"""Fragments: text files and URLs given as context with a prompt (``dsh run -f FILE|URL``).

A fragment is UTF-8 text with a name — the path as given, or the URL without credentials,
query or fragment (:func:`dsh.llm.attachments.shown_url`: a signed URL's token stays out of the
ledger). :func:`load` reads one: a file by descriptor through :func:`dsh.core.beneath.read`
(the reader ``--attach`` uses: no symbolic link as the file itself, dsh's protected paths
refused, only regular files, the size checked before reading), a URL with httpx (``http`` and
``https`` only, redirects checked again, a non-2xx status an error naming the URL and the
status). Each is capped at :data:`MAX_BYTES`; bytes that are not UTF-8 are an error naming the
source (images and PDFs go with ``--attach``).

:func:`prepend` puts each fragment before the prompt as a block headed by its name::

    <fragment name="a.py">
    …the file's text…
    </fragment>

    review these

That text is what the model reads. The ledger keeps each fragment once by hash, like an
attachment (:mod:`dsh.ledger.fragments`): ``dsh run`` tells the session's ledger which
fragments its message begins with (:meth:`dsh.ledger.writer.Ledger.expect_fragments`), the
``user/message`` records the text after the blocks and a reference per fragment (hash, size,
name), and the text's bytes go to the session's blob store — the same file in many turns or
sessions is stored once. The projection rebuilds the blocks from the store, so a resumed
session sends the same bytes again without reading the file or the URL again (C3).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

import attrs

from dsh.core.errors import UsageError

#: The largest fragment, in bytes (text context: a source file, a page of docs).
MAX_BYTES = 1024 * 1024
#: Downloads: seconds for the whole download; redirects followed at most.
URL_TIMEOUT = 30.0
MAX_REDIRECTS = 5


class FragmentError(UsageError):
    """A fragment cannot be read (missing, not UTF-8 text, too big, a failed download); the
    message names it. Nothing was sent or recorded. Exit code 2."""


@attrs.frozen
class Fragment:
    """A fragment's name (the path as given, or the URL as shown) and its text."""

    name: str
    text: str


def load(source: str) -> Fragment:
    """Read one ``-f`` source: an ``http(s)`` URL, else a file path."""
    from dsh.llm.attachments import is_url

    if not source:
        raise FragmentError("-f: empty file name")
    if is_url(source):
        return fetch(source)
    return read_file(source)


def read_file(path: str) -> Fragment:
    """A regular file's text, read once by descriptor (see the module docstring)."""
    from dsh.core import beneath
    from dsh.core.files import NotRegular
    from dsh.core.files import TooLarge
    from dsh.core.files import reason

    where = repr(path)
    folder, name = os.path.split(os.path.abspath(path))
    try:
        data = beneath.read(folder, name, MAX_BYTES)
    except beneath.Refused as exc:
        hint = "; give the file it points to by its own path" if "symbolic link" in exc.why \
            else ""
        raise FragmentError(f"-f {where}: {exc.why}{hint}") from None
    except FileNotFoundError:
        raise FragmentError(f"-f {where}: no such file") from None
    except NotRegular as exc:
        kind = exc.kind if exc.kind == "a directory" else "not a regular file"
        raise FragmentError(f"-f {where}: {kind}") from None
    except TooLarge as exc:
        size = f"{exc.size} bytes, " if exc.exact else ""
        raise FragmentError(f"-f {where}: {size}over the {_mib(MAX_BYTES)} limit of a "
                            "fragment") from None
    except OSError as exc:
        raise FragmentError(f"-f {where}: {reason(exc)}") from None
    return Fragment(path, decode(data, where))


def decode(data: bytes, where: str) -> str:
    """``data`` as text, or a :class:`FragmentError` naming ``where`` when it is not UTF-8
    (or holds NUL bytes: a binary file)."""
    from dsh.llm.attachments import sniff

    kind = sniff(data)
    if kind is not None:
        raise FragmentError(f"-f {where}: a {kind} file, not text; attach images and PDFs "
                            "with --attach")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FragmentError(f"-f {where}: not UTF-8 text (byte {exc.start}); attach images "
                            "and PDFs with --attach") from None
    if "\x00" in text:
        raise FragmentError(f"-f {where}: not text (it holds NUL bytes); attach images and "
                            "PDFs with --attach")
    return text.removeprefix("\ufeff")


def fetch(url: str, *, timeout: float = URL_TIMEOUT) -> Fragment:
    """Download ``url`` once (see the module docstring); the server's ``Content-Type`` is
    not trusted, the bytes must be UTF-8 text."""
    import httpx

    from dsh.llm.attachments import shown_url
    from dsh.llm.deadline import deadline_transport

    shown = shown_url(url)
    where = repr(shown)
    deadline = time.monotonic() + timeout
    client = httpx.Client(follow_redirects=False, trust_env=False,
                          timeout=httpx.Timeout(min(timeout, 10.0)),
                          transport=deadline_transport(deadline))
    try:
        request = client.build_request("GET", url)
        for _ in range(MAX_REDIRECTS + 1):
            if request.url.scheme not in ("http", "https"):
                raise FragmentError(f"-f {where}: redirected to a {request.url.scheme!r} URL "
                                    "(only http and https)")
            response = client.send(request, stream=True)
            try:
                if response.is_redirect and response.next_request is not None:
                    request = response.next_request
                    continue
                if not 200 <= response.status_code < 300:
                    raise FragmentError(f"-f {where}: the server answered "
                                        f"{response.status_code}")
                return Fragment(shown, decode(_capped(response, where, deadline, timeout),
                                              where))
            finally:
                response.close()
        raise FragmentError(f"-f {where}: more than {MAX_REDIRECTS} redirects")
    except httpx.HTTPError as exc:
        if isinstance(exc, httpx.TimeoutException) and time.monotonic() >= deadline:
            raise FragmentError(f"-f {where}: not downloaded within {timeout:g}s") from None
        raise FragmentError(f"-f {where}: {type(exc).__name__}") from None
    finally:
        client.close()


def _capped(response: Any, where: str, deadline: float, timeout: float) -> bytes:
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BYTES:
        raise FragmentError(f"-f {where}: {declared} bytes, over the {_mib(MAX_BYTES)} limit "
                            "of a fragment")
    chunks = []
    total = 0
    for chunk in response.iter_bytes():  # decoded (gzip): the cap is on the text
        chunks.append(chunk)
        total += len(chunk)
        if total > MAX_BYTES:
            raise FragmentError(f"-f {where}: more than {_mib(MAX_BYTES)}, download stopped")
        if time.monotonic() > deadline:
            raise FragmentError(f"-f {where}: not downloaded within {timeout:g}s")
    return b"".join(chunks)


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):g} MiB"


def block(fragment: Fragment) -> str:
    """The fragment as the prompt carries it: ``<fragment name="NAME">`` … ``</fragment>``
    (:func:`dsh.ledger.fragments.block`, which the projection rebuilds it with)."""
    from dsh.ledger.fragments import block as _block

    return _block(fragment.name, fragment.text)


def prepend(fragments: Iterable[Fragment], text: str) -> str:
    """``text`` after the blocks of ``fragments``, each followed by a blank line."""
    from dsh.ledger.fragments import prepend as _prepend

    return _prepend(((f.name, f.text) for f in fragments), text)
