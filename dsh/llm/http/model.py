"""The base of the HTTP adapters (part of :mod:`dsh.llm.http`).

:class:`HTTPModel`, the base of the OpenAI, Anthropic and Responses adapters: base URL and
headers from the settings, key lookup (setting, environment, ``dsh keys``), the request — its
body built by the class's own ``build_body`` from the sealed request only — with its retry loop
(the process-wide rate gate, backoff, waits that wake when the run is cancelled), one attempt
with httpx failures worded for a user, and the reasoning sink. :func:`make_response` builds the
adapters' result. Its error methods live in :class:`~dsh.llm.http.errors.ProviderErrors`.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import time
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from typing import Any
from typing import ClassVar

import attrs
import httpx

from dsh.core import redact
from dsh.core.errors import BudgetExceeded
from dsh.core.errors import ConfigError
from dsh.core.errors import ProviderError
from dsh.core.messages import ModelRequest
from dsh.core.messages import ModelResponse
from dsh.core.messages import ToolCall
from dsh.core.messages import Usage
from dsh.host.runcontext import RunContext
from dsh.host.runcontext import current_or_none
from dsh.llm.base import Model
from dsh.llm.base import TextCallback
from dsh.llm.http.client import _expected
from dsh.llm.http.client import _remember_socket
from dsh.llm.http.client import abort_client
from dsh.llm.http.client import check_client
from dsh.llm.http.client import expect_body
from dsh.llm.http.client import get_client
from dsh.llm.http.client import iter_sse
from dsh.llm.http.client import read_capped
from dsh.llm.http.errors import RATE_GATE
from dsh.llm.http.errors import ProviderErrors
from dsh.llm.http.errors import ProviderHTTPError
from dsh.llm.http.errors import _scrub
from dsh.llm.http.errors import backoff
from dsh.llm.http.errors import notify_retry
from dsh.llm.http.settings import _HEADER_NAME
from dsh.llm.http.settings import HTTPSettings
from dsh.llm.http.settings import header_value_problem
from dsh.llm.http.settings import is_loopback
from dsh.llm.http.settings import join_path
from dsh.llm.http.settings import shown_url
from dsh.llm.http.settings import split_userinfo
from dsh.llm.record import _binding
from dsh.llm.sse import SSEEvent

# The logger keeps the name it had when this was one module (dsh.llm.http).
log = logging.getLogger("dsh.llm.http")
# httpx logs every request's URL (a query may hold a key); ours log provider errors.
for _name in ("dsh.llm.http", "httpx"):
    redact.install_log_filter(_name)


class _CallbackFailed(BaseException):
    """Carries an exception raised by ``on_text`` past the adapter's own error handling."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


#: Where :meth:`HTTPModel.emit_reasoning` delivers, for the request being parsed (set by
#: :meth:`HTTPModel.complete`; a context variable, so concurrent requests never mix).
_reasoning_sink: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar(
    "dsh_reasoning_sink", default=None)


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


class HTTPModel(ProviderErrors, Model):
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
        sent = False  # the first request was reserved by dsh.llm.transport.send
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
            if sent and ctx is not None:  # a retry is a request that leaves: counted (D8)
                refused = ctx.budget.reserve(requests=1)
                if refused:
                    log.info("not retried: %s", refused)
                    raise BudgetExceeded(refused)
            sent = True
            try:
                return self._once(client, content, headers, stream, emit)
            except _CallbackFailed as failed:
                raise failed.error from None
            except ProviderError as caught:
                if ctx is not None:
                    ctx.cancel.check()  # a read ended by an abort is a cancellation
                err = _scrub(caught, key)
                err.streamed = delivered  # shown in part: no layer may send it again
                if not err.retryable:
                    raise err from None
                if delivered:  # the user has seen part of this answer: never send it twice
                    partial = ProviderError(
                        f"{err} (not retried: part of the answer was already streamed)",
                        status=err.status,
                    )
                    partial.streamed = True
                    raise partial from None
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
                notify_retry(ctx, err, self.provider, attempt, self.http.retries, wait)
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
        binding = _binding.get()
        # the connection is dsh's: refused before anything is written when a plugin changed it
        check_client(client, binding.pm if binding is not None else None)
        expected = expect_body(content)  # checked by dsh's transport right before the write
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
        finally:
            _expected.reset(expected)
