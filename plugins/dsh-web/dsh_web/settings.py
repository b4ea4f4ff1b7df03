"""``[plugins.web]`` settings: an attrs class dsh validates (``declare_settings``).

dsh checks the table, and each agent's ``[agents.NAME.plugin_settings.web]`` overlay, when it
assembles the app — so ``dsh`` reports a bad value before any run starts instead of a fetch
failing halfway through one — with its own config's rules: an unknown key names the nearest
valid one, a wrong type names the key and what was expected. The checks types alone cannot
say (a positive number, a host name, ``ask`` or ``read``) are the validators below. The
settings are validated even while the plugin is off: ``enabeld = true`` is a typo to report,
not a silent "off".
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

import attrs

import dsh

#: The values of ``approve``: ``ask`` (a fetch leaves the sandbox: asked in every mode,
#: refused without a terminal unless ``--yes``), ``read`` (a fetch is a read: it runs at once
#: in every mode, ``read-only`` and ``plan`` included).
APPROVE = ("ask", "read")
#: The plugin's name: its entry point, its table (``[plugins.web]``).
PLUGIN = "web"
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")


def _positive(integer: bool, zero: bool = False) -> Any:
    """A validator: a finite number > 0 (``zero``: ≥ 0); a validator's message names its
    field first, so that dsh shows it as the key."""
    kind = ("a whole number, 0 or more" if zero else "a positive integer") if integer \
        else "a positive number"

    def check(_: Any, attribute: Any, value: Any) -> None:
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            raise ValueError(f"{attribute.name}: expected {kind}, got {value!r}")

    return check


def _approve(_: Any, attribute: Any, value: str) -> None:
    if value not in APPROVE:
        raise ValueError(f"{attribute.name}: expected \"ask\" or \"read\", got {value!r}")


def _tty(_: Any, attribute: Any, value: str | None) -> None:
    if value is not None and not value:
        raise ValueError(f"{attribute.name}: expected a non-empty string, got {value!r}")


def _hosts(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(_host(v) for v in values)


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
    allow_hosts: tuple[str, ...] = attrs.field(default=(), converter=_hosts)
    #: Bytes of the body read, after decompression; the rest is not read.
    max_bytes: int = attrs.field(default=2 * 1024 * 1024, validator=_positive(integer=True))
    #: Seconds the whole fetch may take: resolution, connections, redirects and the body.
    timeout: float = attrs.field(default=20.0, validator=_positive(integer=False))
    #: Redirects followed; one more is an error.
    max_redirects: int = attrs.field(default=5, validator=_positive(integer=True, zero=True))
    #: Characters of the page's text (Markdown) returned to the model.
    max_output: int = attrs.field(default=40_000, validator=_positive(integer=True))
    #: ``ask`` or ``read`` (:data:`APPROVE`).
    approve: str = attrs.field(default="ask", validator=_approve)
    #: Where approval is asked (default ``/dev/tty``). Only tests and unusual setups change it.
    tty: str | None = attrs.field(default=None, validator=_tty)


def parse_settings(raw: Mapping[str, Any], agent: str = "-") -> WebSettings:
    """:class:`WebSettings` from a table given directly (tests, library use), validated as
    dsh validates ``[plugins.web]``: a bad value is a :class:`dsh.ConfigError` naming the
    key."""
    handle = dsh.AgentHandle(name=agent, model="", all_plugin_settings={PLUGIN: dict(raw)})
    return dsh.settings(WebSettings, handle, plugin=PLUGIN)


def _host(value: Any) -> str:
    """One ``allow_hosts`` entry, normalised: an address or network as :mod:`ipaddress`
    writes it, a host name lowercased in its IDNA (ASCII) form."""
    bad = ValueError(f"allow_hosts: {value!r} is not a host name, an address or a network "
                     f"(such as \"localhost\", \"127.0.0.1\", \"::1\", \"10.0.0.0/8\")")
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
