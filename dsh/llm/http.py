"""Shared HTTP plumbing of the model adapters (MISSION A2, D9).

* one ``httpx.Client`` per run, kept in ``ctx.resources["httpx"]`` and closed by the run's
  cleanups (:func:`get_client`);
* per-request timeouts, bounded retries with exponential backoff and full jitter, honouring
  ``Retry-After``; waits wake early when the run is cancelled;
* cancellation that ends a blocked read at once: the client records every socket it opens
  (through httpcore's ``trace`` extension) and an abort *shuts them down* — closing a socket
  from another thread does not wake a ``recv`` blocked on it, ``shutdown`` does;
* :class:`HTTPModel`, the base of the OpenAI and Anthropic adapters: key lookup, the retry loop,
  and HTTP failures turned into :class:`~dsh.core.errors.ProviderError` messages a user can act on.

httpx is imported here and in the adapters only; ``import dsh`` never pays for it.
"""

from __future__ import annotations

import contextvars
import email.utils
import ipaddress
import json
import logging
import os
import random
import re
import socket
import threading
import time
import weakref
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from typing import Any
from typing import ClassVar
from urllib.parse import unquote
from urllib.parse import urlsplit
from urllib.parse import urlunsplit

import attrs
import httpx

from dsh._version import __version__
from dsh.core import redact
from dsh.core.errors import ConfigError
from dsh.core.errors import ProviderError
from dsh.core.messages import ModelRequest
from dsh.core.messages import ModelResponse
from dsh.core.messages import ToolCall
from dsh.core.messages import Usage
from dsh.host.runcontext import RunContext
from dsh.host.runcontext import current_or_none
from dsh.llm.base import INVALID_JSON_KEY  # noqa: F401 - re-exported for adapters and tests
from dsh.llm.base import Model
from dsh.llm.base import TextCallback
from dsh.llm.base import parse_tool_arguments  # noqa: F401 - re-exported
from dsh.llm.sse import SSEEvent
from dsh.llm.sse import SSEParser

log = logging.getLogger(__name__)
# httpx logs every request's URL (a query may hold a key); ours log provider errors.
for _name in (__name__, "httpx"):
    redact.install_log_filter(_name)

#: Statuses worth retrying (529 is Anthropic's "overloaded").
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504, 529})
#: Key under which unparseable tool-call arguments are kept (see :func:`parse_tool_arguments`).
_MAX_DETAIL = 300
_CONTEXT_RE = re.compile(
    r"context.(length|window|size)|maximum context|prompt is too long|too many tokens"
    r"|reduce the length of the messages",
    re.IGNORECASE,
)
#: A 4xx saying the model takes no images / files (issue 17): the attachments were refused.
_ATTACHMENT_RE = re.compile(
    r"(?=.*\b(image|vision|pdf|document|file_data|input_image|input_file|image_url|multimodal|"
    r"attachment)s?\b)(?=.*(not support|unsupported|does not|doesn't|cannot|can't|not allowed|"
    r"invalid content type|only supported|not enabled))",
    re.IGNORECASE | re.DOTALL,
)


class RateGate:
    """A pause shared by every request of this process to one endpoint: a 429 pauses the
    endpoint for the wait the retry takes (its ``Retry-After`` when given), and any request
    about to go there first waits until the pause ends — so concurrent runs (``dsh batch``'s
    workers, parallel sub-agents) slow down together instead of each spending its own 429."""

    def __init__(self) -> None:
        self._until: dict[str, float] = {}
        self._lock = threading.Lock()

    def pause(self, endpoint: str, seconds: float) -> None:
        until = time.monotonic() + seconds
        with self._lock:
            if until > self._until.get(endpoint, 0.0):
                self._until[endpoint] = until

    def remaining(self, endpoint: str) -> float:
        """Seconds until requests to ``endpoint`` may go (0 when they may now)."""
        until = self._until.get(endpoint)
        return max(0.0, until - time.monotonic()) if until is not None else 0.0


#: The process-wide gate :meth:`HTTPModel.complete` honours (issue 16).
RATE_GATE = RateGate()


class _CallbackFailed(BaseException):
    """Carries an exception raised by ``on_text`` past the adapter's own error handling."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


#: Where :meth:`HTTPModel.emit_reasoning` delivers, for the request being parsed (set by
#: :meth:`HTTPModel.complete`; a context variable, so concurrent requests never mix).
_reasoning_sink: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar(
    "dsh_reasoning_sink", default=None)


class ProviderHTTPError(ProviderError):
    """A :class:`ProviderError` that also carries the server's ``Retry-After`` (seconds)."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, status=status, retryable=retryable)
        self.retry_after = retry_after


# -- the per-run client ----------------------------------------------------------------------

_sockets: weakref.WeakKeyDictionary[httpx.Client, weakref.WeakSet[socket.socket]] = (
    weakref.WeakKeyDictionary()
)
_lock = threading.Lock()


def new_client() -> httpx.Client:
    """A client that remembers the sockets it opens, so :func:`abort_client` can end reads."""
    socks: weakref.WeakSet[socket.socket] = weakref.WeakSet()

    def on_request(request: httpx.Request) -> None:
        previous = request.extensions.get("trace")

        def trace(event: str, info: dict[str, Any]) -> None:
            if event.endswith((".connect_tcp.complete", ".start_tls.complete")):
                stream = info.get("return_value")
                sock = stream.get_extra_info("socket") if stream is not None else None
                if isinstance(sock, socket.socket):
                    with _lock:
                        socks.add(sock)
            if previous is not None:
                previous(event, info)

        request.extensions["trace"] = trace

    client = httpx.Client(
        timeout=httpx.Timeout(600.0, connect=10.0),
        headers={"user-agent": f"dsh/{__version__}"},
        event_hooks={"request": [on_request]},
    )
    with _lock:
        _sockets[client] = socks
    return client


def get_client(settings: Mapping[str, Any] | None = None) -> httpx.Client:
    """The run's shared client (created on first use, closed by the run's cleanups); outside a
    run a new client that the caller must close. ``settings`` is accepted for per-model client
    options; today timeouts and headers are applied per request, so all models share one."""
    ctx = current_or_none()
    if ctx is None:
        return new_client()
    with _lock:
        client = ctx.resources.get("httpx")
    if isinstance(client, httpx.Client):
        return client
    fresh = new_client()
    with _lock:
        client = ctx.resources.setdefault("httpx", fresh)
    if client is fresh:
        ctx.add_cleanup(fresh.close)
    else:  # another thread of the run won the race
        fresh.close()
    return client


def shutdown_socket(sock: socket.socket) -> None:
    try:
        # The plain-socket method on purpose: ssl.SSLSocket.shutdown would also drop its SSL
        # object under the reading thread's feet.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # already closed


def _remember_socket(client: httpx.Client, resp: httpx.Response) -> None:
    """Also record the response's own socket: covers a client not made by :func:`new_client`."""
    stream = resp.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if isinstance(sock, socket.socket):
        with _lock:
            _sockets.setdefault(client, weakref.WeakSet()).add(sock)


def _scrub(err: ProviderError, key: str | None) -> ProviderError:
    """A provider echoing a secret in its error text (the key whole, escaped, encoded or cut
    short at a truncation, URL credentials) must not leak it to the user, the ledger or logs:
    the message goes through :func:`dsh.core.redact.redact`. A dummy key (``x``, ``none``…) is no
    secret and leaves the message as it is."""
    redact.register(key)
    text = str(err)
    clean = redact.redact(text)
    if clean == text:
        return err
    after = err.retry_after if isinstance(err, ProviderHTTPError) else None
    return ProviderHTTPError(
        clean,
        status=err.status,
        retryable=err.retryable,
        retry_after=after,
    )


def abort_client(client: httpx.Client) -> None:
    """Shut down every socket ``client`` opened: blocked reads return at once with an error."""
    with _lock:
        socks = list(_sockets.get(client, ()))
    for sock in socks:
        shutdown_socket(sock)


# -- settings --------------------------------------------------------------------------------


@attrs.frozen
class HTTPSettings:
    """The transport part of a model's settings, validated once."""

    timeout: float = 600.0  # read timeout: the longest silence accepted from the server
    connect_timeout: float = 10.0
    retries: int = 4
    retry_base: float = 0.5  # first backoff ceiling; doubles per retry
    retry_cap: float = 30.0  # largest backoff ceiling without a Retry-After
    max_retry_wait: float = 60.0  # cap on a server's Retry-After
    headers: Mapping[str, str] = attrs.field(factory=dict)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], where: str) -> HTTPSettings:
        values: dict[str, Any] = {}
        for key in ("timeout", "connect_timeout", "retry_base", "retry_cap", "max_retry_wait"):
            if key in settings:
                v = settings[key]
                positive = key in ("timeout", "connect_timeout")
                bad = isinstance(v, bool) or not isinstance(v, int | float)
                if bad or v < 0 or (positive and v == 0):
                    raise ConfigError(f"{where}: `{key}` must be a number of seconds, got {v!r}")
                values[key] = float(v)
        if "retries" in settings:
            v = settings["retries"]
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"{where}: `retries` must be an integer >= 0, got {v!r}")
            values["retries"] = v
        headers = settings.get("headers") or {}
        if not isinstance(headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise ConfigError(f"{where}: `headers` must be a table of strings")
        values["headers"] = dict(headers)
        return cls(**values)

    @property
    def httpx_timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.timeout, connect=self.connect_timeout, pool=self.connect_timeout)


# -- small helpers ---------------------------------------------------------------------------


#: RFC 9110 ``token``: what a header name may be made of.
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def header_value_problem(value: str) -> str | None:
    """Why ``value`` cannot be sent as an HTTP header value (``"contains a line break"``…),
    or ``None``. The answer never quotes the value: it is usually a secret."""
    if not value.isascii():
        return "contains non-ASCII characters (a copy-paste accident?)"
    if "\n" in value or "\r" in value:
        return "contains a line break"
    if any(c < " " and c != "\t" or c == "\x7f" for c in value):
        return "contains a control character"
    if value != value.strip():
        return "starts or ends with whitespace"
    return None


def split_userinfo(url: str) -> tuple[str, str | None]:
    """``(url without userinfo, "Basic …" header or None)`` for an http(s) ``url``: the base
    URL's ``user:password@`` is sent as HTTP Basic auth, as curl and httpx do, and never left
    in a URL that could be shown. The path loses its trailing ``/``; a fragment is dropped.
    A URL that is not ``http(s)://HOST…`` gives ``("", None)``, for the caller to reject."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return "", None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "", None
    userinfo, at, hostport = parts.netloc.rpartition("@")
    clean = urlunsplit((parts.scheme, hostport, parts.path.rstrip("/"), parts.query, ""))
    if not at:
        return clean, None
    import base64

    user, _, password = userinfo.partition(":")
    pair = f"{unquote(user)}:{unquote(password)}".encode()
    return clean, "Basic " + base64.b64encode(pair).decode("ascii")


def shown_url(url: str, credentials: bool = False) -> str:
    """``url`` as messages show it: credential-like query values redacted, and with
    ``credentials`` a ``[redacted]@`` where the base URL's userinfo was."""
    shown = redact.redact_url(url)
    if credentials:
        scheme, sep, rest = shown.partition("://")
        shown = f"{scheme}{sep}{redact.REDACTED}@{rest}"
    return shown


def join_path(url: str, path: str) -> str:
    """``url`` with ``path`` appended to its path; its query string stays after it."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + path))


def is_loopback(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds — fractions accepted
    as an extension — or an HTTP date); ``None`` when absent or unreadable."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = (headers.get("retry-after") or "").strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def backoff(attempt: int, base: float, cap: float) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2**attempt)]."""
    return random.uniform(0.0, min(cap, base * 2**attempt))


def truncate(text: str, limit: int = _MAX_DETAIL) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def make_response(
    text: str, calls: list[ToolCall], usage: Usage, stop_reason: str | None, model: str
) -> ModelResponse:
    """The adapters' result; ``tool_call_source`` is ``"native"`` exactly when there are calls.

    A surrogate pair that streaming split across two deltas (each decoded on its own) is
    joined back into its character here; a surrogate still alone is replaced, and counted,
    when the ledger records the answer (:func:`dsh.ledger.store.sanitized`)."""
    from dsh.core.sanitize import join_pairs

    return ModelResponse(
        text=join_pairs(text),
        tool_calls=calls,
        usage=usage,
        stop_reason=stop_reason,
        tool_call_source="native" if calls else None,
        model=model,
    )


#: The most bytes of one provider response dsh reads (a stream, a body, an error body): a
#: runaway or hostile server — one endless line, an endless stream of text — cannot fill
#: memory. Far above any real response (a Responses API ``response.completed`` repeats every
#: output item, encrypted reasoning included: a few MiB).
MAX_RESPONSE_BYTES = 256 * 1024 * 1024


class ResponseTooLarge(ProviderError):
    """A provider response over :data:`MAX_RESPONSE_BYTES`: not retried, nothing recorded."""


def _capped(response: httpx.Response, where: str) -> Iterator[bytes]:
    limit = MAX_RESPONSE_BYTES
    total = 0
    for chunk in response.iter_bytes():
        total += len(chunk)
        if total > limit:
            raise ResponseTooLarge(f"{where}: the response is larger than {limit} bytes (a "
                                   "runaway or hostile server); nothing was recorded")
        yield chunk


def read_capped(response: httpx.Response, where: str) -> bytes:
    """The whole body of ``response``, at most :data:`MAX_RESPONSE_BYTES`."""
    return b"".join(_capped(response, where))


def iter_sse(response: httpx.Response, where: str = "provider") -> Iterator[SSEEvent]:
    """Parse a streaming response's body into SSE events as bytes arrive (at most
    :data:`MAX_RESPONSE_BYTES`; ``where`` names the server in the error)."""
    parser = SSEParser()
    for chunk in _capped(response, where):
        yield from parser.feed(chunk)
    yield from parser.flush()


# -- the adapter base ------------------------------------------------------------------------


class HTTPModel(Model):
    """Base of the HTTP adapters. Subclasses set the class attributes and implement the four
    protocol methods (``build_body``, ``auth_headers``, ``parse_json``, ``parse_stream``)."""

    provider: ClassVar[str]
    default_key_env: ClassVar[str]
    base_url_env: ClassVar[str]
    default_base_url: ClassVar[str]
    path: ClassVar[str]
    #: Local servers (llama.cpp, Ollama) need no key: allow none on a loopback base URL.
    key_optional_on_loopback: ClassVar[bool] = False
    #: Added to a 404 that does not name the model: the usual base_url mistake.
    not_found_hint: ClassVar[str] = ""

    def __init__(self, name: str, settings: Mapping[str, Any] | None = None) -> None:
        super().__init__(name, settings)
        where = f"{self.provider}:{name}"
        self.model_name = str(self.settings.get("model") or name)
        base = str(self.settings.get("base_url") or os.environ.get(self.base_url_env)
                   or self.default_base_url)
        # Secrets first, so no message below can show them: URL credentials, the key, headers.
        redact.register_url(base)
        redact.register(str(self.settings.get("api_key") or "") or None)
        redact.register(os.environ.get(str(self.settings.get("api_key_env")
                                           or self.default_key_env)))
        #: The base URL requests use: without userinfo (sent as Basic auth instead), with its
        #: query. ``shown_base_url`` / ``shown_url`` are the forms messages may show.
        self.base_url, basic = split_userinfo(base)
        if not self.base_url:
            raise ConfigError(f"{where}: base_url must be an http(s) URL, "
                              f"got {redact.redact_url(base)!r}")
        self.url = self.endpoint()
        self.shown_base_url = shown_url(self.base_url, basic is not None)
        self.shown_url = shown_url(self.url, basic is not None)
        self.http = HTTPSettings.from_settings(self.settings, where)
        # Header names ignore case: lower-case them, so a configured `Authorization` replaces
        # the adapter's `authorization` instead of travelling next to it.
        headers: dict[str, str] = {}
        for name, value in self.http.headers.items():
            if name.lower() in headers:
                raise ConfigError(f"{where}: `headers` sets {name!r} twice (header names "
                                  "ignore case)")
            headers[name.lower()] = value
        if basic is not None:
            headers.setdefault("authorization", basic)
        self.http = attrs.evolve(self.http, headers=headers)
        redact.register_headers(headers)
        options = self.settings.get("options") or {}
        if not isinstance(options, Mapping):
            raise ConfigError(f"{where}: `options` must be a table")
        self.options: dict[str, Any] = dict(options)

    def __repr__(self) -> str:  # never the settings: they may hold a literal api_key
        return f"{type(self).__name__}({self.name!r}, base_url={self.shown_base_url!r})"

    def endpoint(self) -> str:
        """The URL requests go to: ``path`` appended to the base URL's path, its query kept."""
        return join_path(self.base_url, self.path)

    # -- keys ---------------------------------------------------------------------------------

    @property
    def key_source(self) -> str:
        """Where the key comes from, for messages: an env var name, the ``api_key`` setting
        or a stored key (``dsh keys``)."""
        if self.settings.get("api_key"):
            return "the api_key setting"
        env = str(self.settings.get("api_key_env") or self.default_key_env)
        if not os.environ.get(env, "").strip() and getattr(self, "_stored_key", None):
            return f"the stored key {self.key_name} (dsh keys)"
        return env

    @property
    def key_name(self) -> str:
        """The stored key's name: the ``api_key_name`` setting, else the provider's name."""
        return str(self.settings.get("api_key_name") or self.provider)

    def api_key(self) -> str | None:
        """The ``api_key`` setting, else the environment variable (``api_key_env``, else the
        adapter's), else the stored key ``api_key_name`` (else the provider's name), read
        once per model object and only when no variable holds a key (dsh/config/keys.py)."""
        literal = self.settings.get("api_key")
        if literal:
            return str(literal)
        explicit = self.settings.get("api_key_env")
        env = str(explicit or self.default_key_env)
        key = os.environ.get(env, "").strip()
        if key:
            return key
        named = self.settings.get("api_key_name")
        if (self.key_optional_on_loopback and not explicit and not named
                and is_loopback(self.base_url)):
            return None
        stored: str | None = getattr(self, "_stored_key", None)
        if stored is None:
            from dsh.config.keys import get_key

            stored = self._stored_key = get_key(self.key_name) or ""  # "": none stored
        if stored:
            return stored
        raise ProviderError(
            f"{self.provider}: no API key — set the environment variable {env}, or store one "
            f"with `dsh keys set {self.key_name}` (or set `api_key_env` / `api_key_name` / "
            "`api_key` in the model's settings)"
        )

    def check(self) -> None:
        """Before any request: a key is found, and the key and the custom headers can travel
        in an HTTP header. Errors name the variable or setting, never the value."""
        key = self.api_key()
        problem = header_value_problem(key) if key is not None else None
        if problem:
            raise ConfigError(f"{self.provider}: the API key from {self.key_source} {problem} "
                              "— copy it again (the key is not shown)")
        for name, value in self.http.headers.items():
            where = f"{self.provider}:{self.name}: `headers`"
            if not _HEADER_NAME.fullmatch(name):
                raise ConfigError(f"{where}: {name!r} is not a valid HTTP header name")
            problem = header_value_problem(value)
            if problem:
                raise ConfigError(f"{where}: the value of {name!r} {problem} (it is not shown)")

    # -- protocol methods ---------------------------------------------------------------------

    def build_body(self, request: ModelRequest, stream: bool) -> dict[str, Any]:
        raise NotImplementedError

    def auth_headers(self, key: str | None) -> dict[str, str]:
        raise NotImplementedError

    def parse_json(self, data: Any) -> ModelResponse:
        raise NotImplementedError

    def parse_stream(self, events: Iterator[SSEEvent], emit: TextCallback) -> ModelResponse:
        raise NotImplementedError

    def error_details(self, payload: Any) -> tuple[str, str]:
        """``(message, code)`` from an error body (decoded JSON, or the raw text)."""
        if isinstance(payload, dict):
            err = payload.get("error", payload)
            if isinstance(err, dict):
                code = err.get("code") or err.get("type") or ""
                msg = err.get("message") or err.get("detail") or ""
                return str(msg), str(code)
            return str(err), ""
        return str(payload), ""

    # -- the request --------------------------------------------------------------------------

    @property
    def effective_id(self) -> str:
        """``provider:MODEL`` with the model name the provider is asked for (recorded)."""
        return f"{self.provider}:{self.model_name}"

    def wire_model(self, request: ModelRequest) -> str:
        """The provider's model name, from the request's (recorded) model id."""
        prefix = self.provider + ":"
        return request.model[len(prefix):] if request.model.startswith(prefix) else request.model

    def emit_reasoning(self, delta: str) -> None:
        """Deliver a reasoning delta to the caller's ``on_reasoning`` (adapters call this from
        :meth:`parse_stream`; nothing happens when nobody asked for reasoning)."""
        sink = _reasoning_sink.get()
        if sink is not None and delta:
            try:
                sink(delta)
            except Exception as exc:  # the observer's own error: pass it through untouched
                raise _CallbackFailed(exc) from exc

    def complete(self, request: ModelRequest, on_text: TextCallback | None = None,
                 on_reasoning: TextCallback | None = None) -> ModelResponse:
        sink = _reasoning_sink.set(on_reasoning)
        try:
            return self._complete(request, on_text)
        finally:
            _reasoning_sink.reset(sink)

    def _complete(self, request: ModelRequest, on_text: TextCallback | None) -> ModelResponse:
        # Reached only through dsh.llm.transport (Model wraps complete): ``request`` is the
        # sealed one, and the body is built from it alone, by the class's own build_body (an
        # instance attribute patched by a plugin is not consulted).
        key = self.api_key()
        stream = bool(request.stream and on_text is not None)
        body = type(self).build_body(self, request, stream)
        try:
            content = json.dumps(body, ensure_ascii=False).encode()
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{self.provider}: request is not JSON-serialisable: {exc}") from None
        headers = {"content-type": "application/json", **self.auth_headers(key)}
        if stream:
            headers["accept"] = "text/event-stream"
        headers.update(self.http.headers)
        ctx = current_or_none()
        client = get_client(self.settings)
        try:
            if ctx is None:
                return self._attempts(None, client, content, headers, stream, on_text, key)
            unregister = ctx.cancel.on_cancel(lambda: abort_client(client))
            try:
                return self._attempts(ctx, client, content, headers, stream, on_text, key)
            finally:
                unregister()
        finally:
            if ctx is None:
                client.close()

    def _attempts(
        self,
        ctx: RunContext | None,
        client: httpx.Client,
        content: bytes,
        headers: dict[str, str],
        stream: bool,
        on_text: TextCallback | None,
        key: str | None,
    ) -> ModelResponse:
        delivered = False

        def emit(text: str) -> None:
            nonlocal delivered
            if text and on_text is not None:
                delivered = True
                try:
                    on_text(text)
                except Exception as exc:  # the observer's own error: pass it through untouched
                    raise _CallbackFailed(exc) from exc

        attempt = 0
        endpoint = self.endpoint()
        while True:
            if ctx is not None:
                ctx.cancel.check()
            paused = RATE_GATE.remaining(endpoint)
            if paused > 0:  # a request of this process to the endpoint got a 429: wait too
                if ctx is None:
                    time.sleep(paused)
                elif ctx.cancel.wait(paused):
                    ctx.cancel.check()
                continue
            try:
                return self._once(client, content, headers, stream, emit)
            except _CallbackFailed as failed:
                raise failed.error from None
            except ProviderError as caught:
                if ctx is not None:
                    ctx.cancel.check()  # a read ended by an abort is a cancellation
                err = _scrub(caught, key)
                if not err.retryable:
                    raise err from None
                if delivered:  # the user has seen part of this answer: never send it twice
                    raise ProviderError(
                        f"{err} (not retried: part of the answer was already streamed)",
                        status=err.status,
                    ) from None
                if attempt >= self.http.retries:
                    suffix = f" — still failing after {attempt} retries" if attempt else ""
                    raise ProviderError(f"{err}{suffix}", status=err.status) from None
                after = err.retry_after if isinstance(err, ProviderHTTPError) else None
                if after is not None:
                    wait = min(after, self.http.max_retry_wait)
                else:
                    wait = backoff(attempt, self.http.retry_base, self.http.retry_cap)
                if err.status == 429:
                    RATE_GATE.pause(endpoint, wait)
                attempt += 1
                log.info("%s; retry %d/%d in %.2fs", err, attempt, self.http.retries, wait)
            if ctx is None:
                time.sleep(wait)
            elif ctx.cancel.wait(wait):
                ctx.cancel.check()

    def _once(
        self,
        client: httpx.Client,
        content: bytes,
        headers: dict[str, str],
        stream: bool,
        emit: TextCallback,
    ) -> ModelResponse:
        p, url = self.provider, self.url
        started = False  # response headers received
        try:
            with client.stream(
                "POST", url, content=content, headers=headers, timeout=self.http.httpx_timeout
            ) as resp:
                started = True
                _remember_socket(client, resp)
                where = f"{p}: {self.shown_url}"
                if resp.status_code >= 400:
                    raise self.status_error(resp.status_code, read_capped(resp, where),
                                            resp.headers)
                try:
                    if stream and "json" not in resp.headers.get("content-type", ""):
                        return self.parse_stream(iter_sse(resp, where), emit)
                    result = self.parse_json(self.decode_json(read_capped(resp, where)))
                except (TypeError, KeyError, AttributeError, ValueError) as exc:
                    # JSON of an unexpected shape: say so instead of showing a traceback
                    raise ProviderError(
                        f"{p}: malformed response from {self.shown_url}: unexpected data ({exc!r})"
                    ) from None
                if stream:  # asked to stream, the server answered whole: deliver it at once
                    emit(result.text)
                return result
        except httpx.ConnectTimeout:
            raise ProviderError(
                f"{p}: timed out connecting to {self.shown_base_url} "
                f"(connect_timeout {self.http.connect_timeout:g}s)",
                retryable=True,
            ) from None
        except httpx.ConnectError as exc:
            raise ProviderError(
                f"{p}: cannot connect to {self.shown_base_url} ({exc}) — is the server running "
                "and the base_url right?",
                retryable=True,
            ) from None
        except httpx.TimeoutException:
            raise ProviderError(
                f"{p}: no data from {self.shown_url} for {self.http.timeout:g}s (read timeout) "
                "— the server is stuck or slow; raise `timeout` in the model's settings",
            ) from None
        except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            where = "connection lost mid-stream" if started else "connection closed before a reply"
            raise ProviderError(f"{p}: {where} from {self.shown_url}: {exc}",
                                retryable=True) from None
        except httpx.HTTPError as exc:
            raise ProviderError(f"{p}: request to {self.shown_url} failed: {exc}") from None

    def decode_json(self, raw: bytes) -> Any:
        from dsh.core.sanitize import loads_strict

        try:
            return loads_strict(raw)  # no NaN/Infinity: what is recorded must be JSON
        except RecursionError:
            raise ProviderError(f"{self.provider}: malformed response from {self.url}: "
                                "nested too deeply to read") from None
        except ValueError:
            raise ProviderError(
                f"{self.provider}: malformed response from {self.url}: not JSON: "
                f"{truncate(raw.decode('utf-8', 'replace'), 120)!r}"
            ) from None

    def event_json(self, event: SSEEvent) -> Any:
        """Decode one stream event's data; garbage is a malformed stream, never retried."""
        from dsh.core.sanitize import loads_strict

        try:
            return loads_strict(event.data)  # no NaN/Infinity: what is recorded must be JSON
        except RecursionError:
            raise ProviderError(f"{self.provider}: malformed stream from {self.url}: event "
                                "data nested too deeply to read") from None
        except ValueError:
            raise ProviderError(
                f"{self.provider}: malformed stream from {self.url}: event data is not JSON: "
                f"{truncate(event.data, 120)!r}"
            ) from None

    def truncated(self, marker: str) -> ProviderError:
        return ProviderError(
            f"{self.provider}: connection lost mid-stream from {self.url} (the stream ended "
            f"before {marker})",
            retryable=True,
        )

    def status_error(self, status: int, raw: bytes, headers: Mapping[str, str]) -> ProviderError:
        """Turn an HTTP error reply into the message the user reads."""
        text = raw.decode("utf-8", "replace")
        try:
            payload: Any = json.loads(text)
        except ValueError:
            payload = text
        message, code = self.error_details(payload)
        message = truncate(message)
        detail = f": {message}" if message else ""
        p, model = self.provider, self.model_name
        retryable = status in RETRY_STATUSES
        should = headers.get("x-should-retry")
        if should in ("true", "false"):
            retryable = should == "true"
        if code in ("context_length_exceeded", "exceed_context_size_error") or (
            400 <= status < 500 and _CONTEXT_RE.search(message)
        ):
            msg = (
                f"{p}: context too long for model {model!r} (HTTP {status}){detail} — shorten "
                "the input, lower max_tokens, or start a new session"
            )
            retryable = False
        elif 400 <= status < 500 and status not in (401, 403, 404, 429) \
                and _ATTACHMENT_RE.search(message):
            # Remembered: this process refuses the model's attachments from now on, before
            # anything is sent (Model.accepts_attachment).
            self.attachments_refused = True
            msg = (f"{p}: model {model!r} refused the attachments (HTTP {status}){detail} — "
                   "if it takes none, set `attachments = false` in its [models] settings")
            retryable = False
        elif status == 401:
            msg = f"{p}: authentication failed (HTTP 401) — check {self.key_source}{detail}"
        elif status == 403:
            msg = f"{p}: permission denied (HTTP 403) — check {self.key_source}{detail}"
        elif code == "model_not_found" or (status == 404 and "model" in message.lower()):
            msg = (f"{p}: unknown model {model!r} at {self.shown_base_url} "
                   f"(HTTP {status}){detail}")
        elif status == 404:
            hint = self.not_found_hint
            msg = f"{p}: {self.shown_url} not found (HTTP 404) — check base_url{hint}{detail}"
        elif status == 429 and code == "insufficient_quota":
            msg = f"{p}: quota exceeded (HTTP 429){detail} — check your plan and billing"
            retryable = False
        elif status == 429:
            msg = f"{p}: rate limited (HTTP 429){detail}"
        elif status == 529:
            msg = f"{p}: overloaded (HTTP 529){detail}"
        elif status >= 500:
            msg = f"{p}: server error (HTTP {status}){detail}"
        else:
            msg = f"{p}: request rejected (HTTP {status}){detail}"
        return ProviderHTTPError(
            msg, status=status, retryable=retryable, retry_after=parse_retry_after(headers)
        )
