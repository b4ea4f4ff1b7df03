"""What a model's settings say about HTTP (part of :mod:`dsh.llm.http`).

:class:`HTTPSettings` — timeouts, the retry policy and extra headers, validated once — and the
helpers for what travels in a request line or a header: a header value that cannot be sent
(:func:`header_value_problem`), a base URL's ``user:password@`` turned into Basic auth
(:func:`split_userinfo`), the URL as messages may show it (:func:`shown_url`), a path joined
before the query (:func:`join_path`) and whether a URL is the loopback (:func:`is_loopback`).
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote
from urllib.parse import urlsplit
from urllib.parse import urlunsplit

import attrs
import httpx

from dsh.core import redact
from dsh.core.errors import ConfigError


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
                if bad or not math.isfinite(v) or v < 0 or (positive and v == 0):
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
