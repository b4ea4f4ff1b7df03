"""Failures of a provider request, their wording and their retrying (part of
:mod:`dsh.llm.http`).

:class:`ProviderHTTPError` carries a server's ``Retry-After``; :class:`ProviderErrors`, a base
of :class:`~dsh.llm.http.model.HTTPModel`, turns an HTTP error reply, a body or stream event
that is not JSON, or a stream cut short into a :class:`~dsh.core.errors.ProviderError` message a
user can act on, never quoting a secret (:func:`_scrub`). Retrying: which statuses are worth it
(:data:`RETRY_STATUSES`), how long to wait (:func:`parse_retry_after`, :func:`backoff` with full
jitter) and the pause a 429 puts on an endpoint for the whole process (:data:`RATE_GATE`).
A retry about to wait is told to the run's observers as an ``llm/retry`` live event
(:class:`RetryNotice`; docs/events.md): transient, never in the ledger.
"""

from __future__ import annotations

import email.utils
import json
import random
import re
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any
from typing import ClassVar

from dsh.core import redact
from dsh.core.errors import ProviderError

if TYPE_CHECKING:
    from dsh.llm.sse import SSEEvent

#: Statuses worth retrying (529 is Anthropic's "overloaded").
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504, 529})
#: The longest error detail a message quotes (see :func:`truncate`).
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


class RetryNotice:
    """The ``llm/retry`` live event: a failed model request will be sent again after
    ``data["wait"]`` seconds. Shaped as :class:`dsh.run.recorder.LiveEvent` (``type``,
    ``data``, ``session``), which this layer may not import; ``dsh run`` shows it on a
    terminal (``retrying after HTTP 500 (1/4) in 0.4 s``)."""

    __slots__ = ("data", "session")
    type = "llm/retry"

    def __init__(self, data: dict[str, Any], session: str = "") -> None:
        self.data = data
        self.session = session

    def __repr__(self) -> str:
        return f"RetryNotice({self.data!r})"


def notify_retry(ctx: Any, err: ProviderError, provider: str, attempt: int, retries: int,
                 wait: float) -> None:
    """Tell an observed run (``ctx.emit`` set) that ``err`` is retried after ``wait``
    seconds, as attempt ``attempt`` of ``retries``; an unobserved run builds nothing (D7).
    ``err`` is already scrubbed of secrets."""
    if ctx is None or ctx.emit is None:
        return
    ctx.emit(RetryNotice({"provider": provider, "status": err.status, "attempt": attempt,
                          "retries": retries, "wait": round(wait, 3), "error": str(err)},
                         ctx.session_id))


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


class ProviderErrors:
    """How an HTTP adapter words what went wrong: the base of
    :class:`~dsh.llm.http.model.HTTPModel` that holds its error methods (an adapter overrides
    ``error_details`` or ``status_error`` for what its provider says)."""

    if TYPE_CHECKING:  # set by HTTPModel
        provider: ClassVar[str]
        not_found_hint: ClassVar[str]
        model_name: str
        url: str
        shown_url: str
        shown_base_url: str
        attachments_refused: bool

        @property
        def key_source(self) -> str: ...

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
