"""``[plugins.web]`` settings, validated once per agent at assembly.

A bad value is a :class:`dsh.core.errors.ConfigError` naming the key, so ``dsh`` reports it before
any run starts instead of a fetch failing halfway through one. The settings are validated even
while the plugin is off: ``enabeld = true`` is a typo to report, not a silent "off".
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import attrs

from dsh.core.errors import ConfigError

#: The values of ``approve``: ``ask`` (a fetch leaves the sandbox: asked in every mode,
#: refused without a terminal unless ``--yes``), ``read`` (a fetch is a read: it runs at once
#: in every mode, ``read-only`` and ``plan`` included).
APPROVE = ("ask", "read")


@attrs.frozen
class WebSettings:
    """The settings of one agent's ``web_fetch`` (``[plugins.web]`` overlaid with
    ``[agents.NAME.plugin_settings.web]``)."""

    #: Whether ``web_fetch`` is registered at all. Off by default: installing dsh-web
    #: changes nothing until the person turns it on.
    enabled: bool = False
    #: Whether any address may be fetched: loopback, private, link-local (cloud metadata
    #: services), CGNAT, multicast, unspecified and the IPv6 forms of those included.
    allow_private: bool = False
    #: Host names, addresses and networks (CIDR) that may be fetched even when they are not
    #: public: a name allows whatever it resolves to, an address or a network allows the
    #: addresses in it, whatever name led there. Normalised: names lowercased, without a
    #: trailing dot, non-ASCII names in their IDNA form; addresses as :mod:`ipaddress`
    #: writes them.
    allow_hosts: tuple[str, ...] = ()
    #: Bytes of the body read, after decompression; the rest is not read.
    max_bytes: int = 2 * 1024 * 1024
    #: Seconds the whole fetch may take: resolution, connections, redirects and the body.
    timeout: float = 20.0
    #: Redirects followed; one more is an error.
    max_redirects: int = 5
    #: Characters of the page's text (Markdown) returned to the model.
    max_output: int = 40_000
    #: ``ask`` or ``read`` (:data:`APPROVE`).
    approve: str = "ask"
    #: Where approval is asked (default ``/dev/tty``). Only tests and unusual setups change it.
    tty: str | None = None


_FIELDS = tuple(f.name for f in attrs.fields(WebSettings))
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")


def parse_settings(raw: Mapping[str, Any], where: str = "plugins.web") -> WebSettings:
    """Validate ``raw`` into :class:`WebSettings`; raise ConfigError naming the key."""
    for key in raw:
        if key not in _FIELDS:
            import difflib  # only on an error: it costs a millisecond at start-up

            near = difflib.get_close_matches(key, _FIELDS, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else f"; valid keys: {', '.join(_FIELDS)}"
            raise ConfigError(f"[{where}]: unknown key {key!r}{hint}")
    values: dict[str, Any] = {}
    for key in ("enabled", "allow_private"):
        if key in raw:
            if not isinstance(raw[key], bool):
                raise ConfigError(f"[{where}] {key}: expected true or false, got {raw[key]!r}")
            values[key] = raw[key]
    if "allow_hosts" in raw:
        hosts = raw["allow_hosts"]
        if isinstance(hosts, str) or not isinstance(hosts, list | tuple):
            raise ConfigError(f"[{where}] allow_hosts: expected a list of host names, "
                              f"addresses or networks such as [\"localhost\", \"10.0.0.0/8\"], "
                              f"got {hosts!r}")
        values["allow_hosts"] = tuple(_host(h, where) for h in hosts)
    if "timeout" in raw:
        values["timeout"] = _number(raw["timeout"], where, "timeout", integer=False)
    for key in ("max_bytes", "max_output"):
        if key in raw:
            values[key] = int(_number(raw[key], where, key, integer=True))
    if "max_redirects" in raw:
        values["max_redirects"] = int(_number(raw["max_redirects"], where, "max_redirects",
                                              integer=True, zero=True))
    if "approve" in raw:
        if raw["approve"] not in APPROVE:
            raise ConfigError(f"[{where}] approve: expected \"ask\" or \"read\", "
                              f"got {raw['approve']!r}")
        values["approve"] = raw["approve"]
    if "tty" in raw:
        if not isinstance(raw["tty"], str) or not raw["tty"]:
            raise ConfigError(f"[{where}] tty: expected a non-empty string, got {raw['tty']!r}")
        values["tty"] = raw["tty"]
    return WebSettings(**values)


def _host(value: Any, where: str) -> str:
    """One ``allow_hosts`` entry, normalised: an address or network as :mod:`ipaddress`
    writes it, a host name lowercased in its IDNA (ASCII) form."""
    bad = ConfigError(f"[{where}] allow_hosts: {value!r} is not a host name, an address or a "
                      f"network (such as \"localhost\", \"127.0.0.1\", \"::1\", \"10.0.0.0/8\")")
    if not isinstance(value, str) or not value.strip():
        raise bad
    text = value.strip()
    if text.startswith("[") and text.endswith("]"):  # [::1], as in a URL
        text = text[1:-1]
    if ":" in text or "/" in text or re.fullmatch(r"[0-9.]+", text):
        import ipaddress  # only for an address: a name needs no parsing

        try:
            if "/" in text:
                return str(ipaddress.ip_network(text, strict=False))
            return str(ipaddress.ip_address(text))
        except ValueError:
            raise bad from None
    name = text.lower().rstrip(".")
    if not name.isascii():
        try:
            name = name.encode("idna").decode("ascii")
        except UnicodeError:
            raise bad from None
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in name.split(".")):
        raise bad
    return name


def _number(value: Any, where: str, key: str, *, integer: bool, zero: bool = False) -> float:
    # bool is an int subclass; `timeout = true` is a typo, not one second.
    number = isinstance(value, int if integer else int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        kind = ("a whole number, 0 or more" if zero else "a positive integer") if integer \
            else "a positive number"
        raise ConfigError(f"[{where}] {key}: expected {kind}, got {value!r}")
    return float(value)
