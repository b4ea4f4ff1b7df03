"""The network half of ``web_fetch``: which URLs and addresses are fetched, and how, within
bounds (README.md, "Security model").

* **Addresses.** A host is resolved by dsh (:func:`socket.getaddrinfo`), every address it
  resolves to is checked (:func:`address_problem`, ``allow_private``, ``allow_hosts``), and the
  connection is made to one of those very addresses, as an IP literal: no second lookup, so
  a name that answers a public address to the check and ``127.0.0.1`` to the connect (DNS
  rebinding) cannot get past it. This happens in :class:`_Backend`, the network backend of
  httpcore's connection pool, so it holds for every connection the pool opens — the first
  and each redirect's — and nothing connects without it. The request keeps its ``Host``
  header and TLS its server name (SNI) and certificate check: both come from the URL, not
  from the address.
* **Redirects** are followed here, one request at a time: each ``Location`` is checked as
  the first URL was (scheme, credentials), its address at its connection; at most
  ``max_redirects``.
* **Bounds.** Every read, write, TLS handshake, connection and lookup waits at most until
  the fetch's deadline (``timeout`` after it started), checked again every quarter second
  for the run's abort; the body is decompressed here with zlib's ``max_length``, so a
  compression bomb inflates to ``max_bytes`` and no further.
* **No environment.** No proxy (``HTTP_PROXY``…: the checked address would be the proxy's),
  no ``.netrc``, no cookies, no credentials in URLs.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

import attrs
import httpcore
import httpx

from dsh_web.addresses import Guard
from dsh_web.settings import WebSettings

#: The statuses whose ``Location`` is followed.
REDIRECTS = frozenset({301, 302, 303, 307, 308})
#: Content types returned as Markdown converted from HTML.
HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
#: Content types returned as they are (``application/*+json`` too).
TEXT_TYPES = frozenset({"text/plain", "text/markdown", "text/x-markdown", "application/json",
                        "text/json"})
#: How often a wait looks at the run's abort.
SLICE = 0.25
#: Bytes of compressed body read beyond ``max_bytes`` before the read stops anyway (a body
#: that inflates to nothing, such as empty deflate blocks, must end too).
RAW_SLACK = 64 * 1024
ACCEPT = ("text/html, application/xhtml+xml, text/markdown, text/plain;q=0.9, "
          "application/json;q=0.9, */*;q=0.1")


class FetchError(Exception):
    """A fetch that did not happen or did not finish; the message says why (the URL is
    added by the caller, from ``chain``: the URLs asked for, the last one failed)."""

    chain: tuple[str, ...] = ()


class Refused(FetchError):
    """A URL, address or answer web_fetch refuses by rule (scheme, address, type)."""


class Cancelled(FetchError):
    """The run was aborted while the fetch waited."""


@attrs.frozen
class Page:
    """A fetched body and what is known of it."""

    url: str
    status: int
    #: The media type, lowercased, without parameters (``text/html``).
    media_type: str
    #: ``html`` or ``text``.
    kind: str
    charset: str | None
    body: bytes
    #: Why the body is incomplete (``max_bytes``, ``timeout``), or None.
    cut: str | None
    #: The URLs asked for before this one (redirects), oldest first.
    redirected_from: tuple[str, ...] = ()
    #: The addresses connected to, in order.
    addresses: tuple[str, ...] = ()


# -- URLs ---------------------------------------------------------------------------------------


def check_url(text: str) -> httpx.URL:
    """``text`` as a URL web_fetch may ask for (http or https, a host, no credentials);
    raises :class:`Refused` saying why not. Nothing is resolved or connected."""
    if not isinstance(text, str) or not text.strip():
        raise Refused("expected a URL such as https://example.com/page")
    try:
        url = httpx.URL(text.strip())
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        raise Refused(f"not a valid URL ({exc})") from None
    return _checked(url)


def _checked(url: httpx.URL) -> httpx.URL:
    if url.scheme not in ("http", "https"):
        shown = f"{url.scheme}:" if url.scheme else "no scheme"
        raise Refused(f"only http and https URLs are fetched, not {shown}")
    if not url.host:
        raise Refused("the URL has no host")
    if url.userinfo:
        raise Refused("URLs with a user name or password are not fetched")
    return url


# -- time ---------------------------------------------------------------------------------------


class Deadline:
    """The end of one fetch, and the run's abort."""

    def __init__(self, seconds: float, cancelled: Callable[[], bool]) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds
        self._cancelled = cancelled

    def left(self) -> float:
        return self.end - time.monotonic()

    def expired(self) -> bool:
        return self.left() <= 0

    def check_cancel(self) -> None:
        if self._cancelled():
            raise Cancelled("the run was aborted")

    def bound(self, timeout: float | None, error: type[Exception]) -> float:
        """``timeout`` cut to what is left; raises ``error`` when nothing is."""
        self.check_cancel()
        left = self.left()
        if left <= 0:
            raise error(f"the time limit of {self.seconds:g}s was reached")
        return left if timeout is None else min(timeout, left)


def resolve(host: str, port: int, deadline: Deadline) -> list[str]:
    """The addresses of ``host`` (an IP literal is its own), in the resolver's order,
    without repeats. The lookup runs in a thread, so the deadline and an abort bound it."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    found: dict[str, Any] = {}

    def lookup() -> None:
        try:
            found["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                proto=socket.IPPROTO_TCP)
        except (OSError, UnicodeError) as exc:
            found["error"] = exc

    worker = threading.Thread(target=lookup, name="dsh-web-resolve", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(min(SLICE, deadline.bound(None, httpcore.ConnectTimeout)))
    if "error" in found:
        raise FetchError(f"{host} could not be resolved ({found['error']})")
    addresses = list(dict.fromkeys(str(info[4][0]) for info in found["infos"]
                                   if info[0] in (socket.AF_INET, socket.AF_INET6)))
    if not addresses:
        raise FetchError(f"{host} resolved to no address")
    return addresses


# -- the connection ---------------------------------------------------------------------------


class _Stream(httpcore.NetworkStream):
    """A connection whose every wait ends by the deadline (reads in slices, for the abort)."""

    def __init__(self, inner: httpcore.NetworkStream, deadline: Deadline) -> None:
        self._inner = inner
        self._deadline = deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        until = self._deadline.end if timeout is None else min(
            self._deadline.end, time.monotonic() + timeout)
        while True:
            self._deadline.check_cancel()
            left = until - time.monotonic()
            if left <= 0:
                raise httpcore.ReadTimeout(f"the time limit of {self._deadline.seconds:g}s "
                                           f"was reached")
            try:
                return self._inner.read(max_bytes, min(left, SLICE))
            except httpcore.ReadTimeout:  # no data consumed: read again until `until`
                continue

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, self._deadline.bound(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        # server_hostname is the URL's host (httpcore passes the origin's): SNI and the
        # certificate check are for the name, the connection is to the checked address.
        bounded = self._deadline.bound(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, bounded),
                       self._deadline)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    """httpcore's network backend for one fetch: resolve, check every address, connect to a
    checked one by its IP literal (so the system resolver is not asked again)."""

    def __init__(self, guard: Guard, deadline: Deadline) -> None:
        self._inner = httpcore.SyncBackend()
        self._guard = guard
        self._deadline = deadline
        self.connected: list[str] = []

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: Any = None) -> httpcore.NetworkStream:
        addresses = resolve(host, port, self._deadline)
        problem = self._guard.problem(host, addresses)
        if problem is not None:
            raise Refused(problem)
        error: Exception | None = None
        for address in addresses:
            try:
                stream = self._inner.connect_tcp(
                    address, port, timeout=self._deadline.bound(timeout, httpcore.ConnectTimeout),
                    local_address=local_address, socket_options=socket_options)
            except httpcore.ConnectError as exc:
                error = exc
                continue
            self.connected.append(address)
            return _Stream(stream, self._deadline)
        raise FetchError(f"could not connect to {host} port {port} ({error})")

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Any = None) -> httpcore.NetworkStream:
        raise Refused("Unix sockets are not fetched")

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, min(seconds, self._deadline.left())))


_ssl: ssl.SSLContext | None = None


def _ssl_context() -> ssl.SSLContext:
    """The TLS settings httpx uses (certifi's roots, hostname checks), made once."""
    global _ssl
    if _ssl is None:
        _ssl = httpx.create_ssl_context()
    return _ssl


# -- the fetch ----------------------------------------------------------------------------------


def fetch(text: str, settings: WebSettings, cancelled: Callable[[], bool] = lambda: False,
          ) -> Page:
    """GET ``text`` within ``settings``' bounds, following redirects; the page, or
    :class:`FetchError` (or :class:`HTTPStatus` for an error status)."""
    url = check_url(text)
    deadline = Deadline(settings.timeout, cancelled)
    backend = _Backend(Guard(settings), deadline)
    chain: list[httpx.URL] = [url]
    pool = httpcore.ConnectionPool(ssl_context=_ssl_context(), network_backend=backend,
                                   http1=True, http2=False, retries=0, max_connections=2)
    try:
        with pool:
            while True:
                left = deadline.bound(None, httpcore.ConnectTimeout)
                with pool.stream("GET", _core_url(url), headers=_headers(url), extensions={
                        "timeout": {"connect": left, "read": left, "write": left,
                                    "pool": left}}) as response:
                    location = _header(response, b"location")
                    if response.status in REDIRECTS and location:
                        if len(chain) > settings.max_redirects:
                            raise FetchError(f"more than {settings.max_redirects} redirects "
                                             f"([plugins.web] max_redirects); the last one "
                                             f"pointed to {_shown(location)}")
                        try:
                            url = _checked(url.join(location).copy_with(fragment=None))
                        except (httpx.InvalidURL, ValueError, TypeError) as exc:
                            raise FetchError(f"it redirects to an invalid URL "
                                             f"{_shown(location)} ({_reason(exc)})") from None
                        except Refused as exc:
                            raise Refused(f"it redirects to {_shown(location)}: {exc}") from None
                        chain.append(url)
                        continue
                    if not 200 <= response.status < 300:
                        raise HTTPStatus(response.status)
                    return _page(response, url, chain, settings, deadline, backend)
    except FetchError as exc:
        exc.chain = tuple(str(u) for u in chain)
        raise
    except httpcore.TimeoutException:
        error = FetchError(f"no complete answer within the time limit of "
                           f"{settings.timeout:g}s ([plugins.web] timeout)")
    except (httpcore.NetworkError, httpcore.ProtocolError, OSError) as exc:
        error = FetchError(f"the connection failed ({type(exc).__name__}: {_reason(exc)})")
    error.chain = tuple(str(u) for u in chain)
    raise error


class HTTPStatus(FetchError):
    """An answer with an error status (4xx, 5xx, or a 3xx without ``Location``)."""

    def __init__(self, status: int) -> None:
        import http

        try:
            phrase = http.HTTPStatus(status).phrase  # never the server's own words
        except ValueError:
            phrase = ""
        super().__init__(f"the server answered HTTP {status}" + (f" {phrase}" if phrase else ""))
        self.status = status


def _page(response: httpcore.Response, url: httpx.URL, chain: list[httpx.URL],
          settings: WebSettings, deadline: Deadline, backend: _Backend) -> Page:
    media_type, charset = _content_type(_header(response, b"content-type"))
    if media_type in HTML_TYPES:
        kind = "html"
    elif media_type in TEXT_TYPES or (media_type.startswith("application/")
                                      and media_type.endswith("+json")):
        kind = "text"
    else:
        shown = media_type if _TOKENS.fullmatch(media_type) else "not a valid media type"
        raise Refused(f"its content type is {shown if media_type else '(none)'}; web_fetch "
                      f"returns only HTML, plain text, Markdown and JSON")
    coding = _encoding(_header(response, b"content-encoding"))
    body, cut = _read_body(response, settings.max_bytes, coding, deadline)
    return Page(url=str(url), status=response.status, media_type=media_type, kind=kind,
                charset=charset, body=body, cut=cut,
                redirected_from=tuple(str(u) for u in chain[:-1]),
                addresses=tuple(backend.connected))


def _read_body(response: httpcore.Response, max_bytes: int, coding: str | None,
               deadline: Deadline) -> tuple[bytes, str | None]:
    """At most ``max_bytes`` of the decoded body, and why it was cut (or None). Compressed
    input is inflated with a ``max_length``, never past the bound."""
    out = bytearray()
    raw = 0
    inflater = _Inflater(coding) if coding else None
    try:
        for chunk in response.iter_stream():
            raw += len(chunk)
            if inflater is None:
                out += chunk[:max_bytes + 1 - len(out)]
            else:
                data = chunk
                while data and not inflater.eof:
                    out += inflater.decompress(data, max_bytes + 1 - len(out))
                    if len(out) > max_bytes:
                        break
                    data = inflater.unconsumed_tail
            if len(out) > max_bytes or raw > max_bytes + RAW_SLACK:
                return bytes(out[:max_bytes]), "max_bytes"
            if inflater is not None and inflater.eof:
                break
    except httpcore.TimeoutException:
        if deadline.expired():
            return bytes(out), "timeout"
        raise
    except zlib.error as exc:
        raise FetchError(f"the body is not valid {coding} ({exc})") from None
    return bytes(out), None


class _Inflater:
    """A ``gzip`` or ``deflate`` body, inflated piece by piece (``deflate`` as zlib data, or
    raw deflate data as some servers send it)."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        self._raw_tried = False
        wbits = 16 + zlib.MAX_WBITS if coding == "gzip" else zlib.MAX_WBITS
        self._obj = zlib.decompressobj(wbits)
        self._started = False

    def decompress(self, data: bytes, limit: int) -> bytes:
        try:
            out = self._obj.decompress(data, limit)
        except zlib.error:
            if self.coding != "deflate" or self._started:
                raise
            self._obj = zlib.decompressobj(-zlib.MAX_WBITS)
            out = self._obj.decompress(data, limit)
        self._started = True
        return out

    @property
    def unconsumed_tail(self) -> bytes:
        return self._obj.unconsumed_tail

    @property
    def eof(self) -> bool:
        return self._obj.eof


def _encoding(value: str | None) -> str | None:
    codings = [c.strip().lower() for c in (value or "").split(",")]
    codings = [c for c in codings if c not in ("", "identity")]
    if not codings:
        return None
    if len(codings) == 1 and codings[0] in ("gzip", "x-gzip", "deflate"):
        return "deflate" if codings[0] == "deflate" else "gzip"
    named = ", ".join(codings)[:60]
    shown = repr(named) if all(_TOKENS.fullmatch(c) for c in codings) else "something"
    raise Refused(f"its body is encoded as {shown}, which web_fetch does not decode (it asks "
                  f"for gzip or deflate)")


def _content_type(value: str | None) -> tuple[str, str | None]:
    if not value:
        return "", None
    media, _, params = value.partition(";")
    charset = None
    for param in params.split(";"):
        key, _, val = param.partition("=")
        if key.strip().lower() == "charset" and val.strip().strip('"\''):
            charset = val.strip().strip('"\'')[:40]
    return media.strip().lower()[:100], charset


def _header(response: httpcore.Response, name: bytes) -> str | None:
    for key, value in response.headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _headers(url: httpx.URL) -> list[tuple[bytes, bytes]]:
    from dsh_web import __version__

    # netloc keeps IPv6 brackets and a port that is not the scheme's default.
    return [(b"Host", url.netloc), (b"User-Agent", f"dsh-web/{__version__}".encode()),
            (b"Accept", ACCEPT.encode()), (b"Accept-Encoding", b"gzip, deflate")]


def _core_url(url: httpx.URL) -> httpcore.URL:
    return httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port,
                        target=url.raw_path)


#: An HTTP token (a content coding), or a media type: what a server's words may be shown as
#: in an error, which is outside the wrapper (words with spaces could be read as orders).
_TOKENS = re.compile(r"[a-z0-9!#$%&'*+.^_`|~-]{1,40}(/[a-z0-9!#$%&'*+.^_`|~-]{1,60})?")


def _reason(exc: Exception) -> str:
    """An error's words without the server's own that h11 and httpx quote in them (an
    illegal status line, a port, a host), capped."""
    text = re.split(r"""[\s:,]*(?:['"]|bytearray\(|\bb['"])""", str(exc), maxsplit=1)[0]
    return text[:160] or type(exc).__name__


def _shown(text: str, limit: int = 300) -> str:
    """A server's URL in a message: percent-encoded where it is not plain, capped."""
    from urllib.parse import quote

    safe = quote(text, safe=":/?#[]@!$&'()*+,;=%~-._")
    return safe if len(safe) <= limit else safe[:limit] + "…"
