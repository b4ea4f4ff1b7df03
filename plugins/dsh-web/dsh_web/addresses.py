"""Which addresses ``web_fetch`` connects to: public ones, and those the person allowed
(``allow_private``, ``allow_hosts``). See :mod:`dsh_web.fetch` for where the check is made.
"""

from __future__ import annotations

import ipaddress

from dsh_web.settings import WebSettings


def address_problem(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why ``ip`` is not a public address (``a loopback address``…), or None if it is. IPv6
    forms that carry an IPv4 address (IPv4-mapped, IPv4-compatible, NAT64, 6to4, Teredo)
    are judged by that address too."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            inner = address_problem(ip.ipv4_mapped)
            return f"an IPv4-mapped form of {ip.ipv4_mapped}, {inner}" if inner else None
        if ip in _V4_COMPATIBLE and not (ip.is_loopback or ip.is_unspecified):
            return "an IPv4-compatible address (deprecated; it may reach IPv4 hosts)"
        if ip in _NAT64_LOCAL:
            return "a local-use NAT64 address"
        if ip in _NAT64:  # DNS64 networks give every IPv4-only site such an address
            inner = address_problem(_last32(ip))
            return f"a NAT64 form of {_last32(ip)}, {inner}" if inner else None
        if ip.sixtofour is not None and (inner := address_problem(ip.sixtofour)):
            return f"a 6to4 form of {ip.sixtofour}, {inner}"
        if ip.teredo is not None:
            return "a Teredo address"
        if ip.is_site_local:
            return "a site-local address"
    if ip.is_unspecified:
        return "an unspecified address (it reaches this machine)"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address (where cloud metadata services answer)"
    if ip.is_multicast:
        return "a multicast address"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _CGNAT:
        return "a shared (CGNAT) address"
    if ip.is_private:
        return "a private address"
    if ip.is_reserved or not ip.is_global:
        return "a reserved address"
    return None


_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_V4_COMPATIBLE = ipaddress.ip_network("::/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")


def _last32(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)


class Guard:
    """Which addresses one fetch may connect to (``allow_private``, ``allow_hosts``)."""

    def __init__(self, settings: WebSettings) -> None:
        self.allow_private = settings.allow_private
        self.names: set[str] = set()
        self.networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for entry in settings.allow_hosts:
            try:
                self.networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                self.names.add(entry)

    def problem(self, host: str, addresses: list[str]) -> str | None:
        """Why ``host`` may not be connected to, or None: every one of ``addresses`` (what
        it resolved to) must be allowed, as the connection could go to any of them."""
        if self.allow_private or host.lower().rstrip(".") in self.names:
            return None
        try:
            literal = ipaddress.ip_address(host) is not None
        except ValueError:
            literal = False
        for text in addresses:
            ip = ipaddress.ip_address(text)
            problem = address_problem(ip)
            if problem is None or any(ip in net for net in self.networks):
                continue
            said = host if literal else f"{host} resolves to {text}, which"
            return (f"{said} is {problem}; it is fetched only if [plugins.web] allow_hosts "
                    f"names it, or allow_private = true")
        return None
