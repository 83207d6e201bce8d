"""SSRF guard for outgoing webhooks: resolve, check, then connect to the checked IP.

Contract of :meth:`SSRFGuard.pin`:

- only ``http`` and ``https`` URLs with a host are accepted;
- the host is resolved once; every address it resolves to must be public
  (not private, loopback, link-local, multicast, reserved, unspecified or
  shared address space), and so must every IPv4 address an IPv6 address
  embeds (IPv4-mapped and -compatible, 6to4 ``2002::/16``, Teredo ``2001::/32``,
  NAT64 ``64:ff9b::/96``; the local-use NAT64 ``64:ff9b:1::/48`` is refused
  whole), unless the host name or the address (exact IP or inside a CIDR) is
  on the allow list, with the URL's port when the entry names one
  (``127.0.0.1:8080``: that port only; ``127.0.0.1``: any port);
- the result is a :class:`PinnedTarget` whose URL names the checked IP, with
  the original ``Host`` header and, for https, the TLS server name (SNI and
  certificate check) set to the original host. The HTTP client therefore never
  resolves the name again, so DNS rebinding between check and connect cannot
  reach an address that was not checked.

Refusals raise :class:`SSRFBlockedError` (not retryable); resolution failures
raise :class:`NotifierError` with ``retryable=True`` (DNS outages pass).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import httpx

from app.errors import NotifierError
from app.notify.redact import redact_url

logger = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
#: ``(host, port) -> addresses``; injectable so tests need no DNS.
Resolver = Callable[[str, int], Awaitable[list[str]]]

_DEFAULT_PORTS = {"http": 80, "https": 443}
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")  # RFC 8215: where the IPv4 sits varies


class SSRFBlockedError(NotifierError):
    """The webhook host resolves to an address we refuse to connect to."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


async def system_resolver(host: str, port: int) -> list[str]:
    """All TCP addresses of ``host`` from the system resolver, in its order."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    out: list[str] = []
    for info in infos:
        addr = str(info[4][0])
        if addr not in out:
            out.append(addr)
    return out


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries, which a gateway may connect to:
    IPv4-mapped (``::ffff:a.b.c.d``) and -compatible (``::a.b.c.d``), 6to4
    (``2002:AABB:CCDD::``), Teredo (server and client) and NAT64 (``64:ff9b::a.b.c.d``)."""
    out: list[ipaddress.IPv4Address] = []
    if ip.ipv4_mapped is not None:
        out.append(ip.ipv4_mapped)
    if ip.sixtofour is not None:
        out.append(ip.sixtofour)
    if ip.teredo is not None:
        out.extend(ip.teredo)
    value = int(ip)
    if ip in _NAT64 or ip in _NAT64_LOCAL or (value >> 32 == 0 and value > 1):
        out.append(ipaddress.IPv4Address(value & 0xFFFF_FFFF))
    return out


def _forbidden_alone(ip: IPAddress) -> bool:
    return (
        not ip.is_global
        or ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
    )


def is_forbidden(ip: IPAddress) -> bool:
    """True for any address a public webhook must not point at (see the module docstring)."""
    if isinstance(ip, ipaddress.IPv4Address):
        return _forbidden_alone(ip)
    if ip.ipv4_mapped is not None:
        return _forbidden_alone(ip.ipv4_mapped)
    return _forbidden_alone(ip) or ip in _NAT64_LOCAL or any(map(_forbidden_alone, embedded_ipv4(ip)))


@dataclass(frozen=True)
class AllowList:
    """Hosts (exact, case-insensitive) and networks that may be private, each for one port
    or (None) every port."""

    hosts: frozenset[tuple[str, int | None]] = frozenset()
    networks: tuple[tuple[IPNetwork, int | None], ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> AllowList:
        """Entries are host names, IPs or CIDRs, an IP or host name with ``:port`` for that
        port only (``localhost``, ``127.0.0.1:8080``, ``[::1]:8080``, ``10.0.0.0/8``).
        Raises ValueError naming an entry whose port is not a port number."""
        hosts: set[tuple[str, int | None]] = set()
        nets: list[tuple[IPNetwork, int | None]] = []
        for raw in entries:
            entry, port = _split_port(raw.strip().lower().rstrip("."))
            if not entry:
                continue
            try:
                nets.append((ipaddress.ip_network(entry, strict=False), port))
            except ValueError:
                hosts.add((entry, port))
        return cls(frozenset(hosts), tuple(nets))

    def allows(self, host: str, ip: IPAddress, port: int) -> bool:
        name = host.lower().rstrip(".")
        if (name, None) in self.hosts or (name, port) in self.hosts:
            return True
        return any(
            ip.version == net.version and ip in net and (only is None or only == port)
            for net, only in self.networks
        )


def _split_port(entry: str) -> tuple[str, int | None]:
    """``host:port`` or ``[v6]:port`` -> (host, port); a bare host, IP, IPv6 or CIDR -> (it, None)."""
    if entry.startswith("["):
        addr, _, rest = entry[1:].partition("]")
        if not rest:
            return addr, None
        if not rest.startswith(":"):
            msg = f"allow-list entry {entry!r}: expected [IPv6]:port"
            raise ValueError(msg)
        return addr, _port(entry, rest[1:])
    if entry.count(":") != 1:  # a bare IPv6 address or CIDR has several
        return entry, None
    host, _, port = entry.partition(":")
    return host, _port(entry, port)


def _port(entry: str, text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        msg = f"allow-list entry {entry!r}: {text!r} is not a port (1-65535)"
        raise ValueError(msg)
    return int(text)


@dataclass(frozen=True)
class PinnedTarget:
    """Where to connect: ``url`` names the checked ``ip``; send ``host_header``
    as ``Host`` and pass ``sni_hostname`` (https only) as the httpx extension."""

    url: httpx.URL
    ip: IPAddress
    host_header: str
    sni_hostname: str | None

    def extensions(self) -> dict[str, str]:
        return {"sni_hostname": self.sni_hostname} if self.sni_hostname else {}


class SSRFGuard:
    """Checks and pins webhook URLs. Stateless apart from its configuration;
    safe to share between tasks."""

    def __init__(self, allow_private: Iterable[str] = (), resolver: Resolver | None = None) -> None:
        self._allow = AllowList.parse(allow_private)
        self._resolve = resolver or system_resolver

    async def pin(self, url: str) -> PinnedTarget:
        """Resolve and check ``url``'s host; see the module docstring for the contract."""
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL:
            msg = f"webhook URL {redact_url(url)} is not a valid URL"
            raise SSRFBlockedError(msg) from None
        if parsed.scheme not in _DEFAULT_PORTS or not parsed.host:
            msg = f"webhook URL {redact_url(url)} must be http:// or https:// with a host"
            raise SSRFBlockedError(msg)
        host = parsed.host
        port = parsed.port or _DEFAULT_PORTS[parsed.scheme]
        ips = await self._addresses(host, port, url)
        refused = [ip for ip in ips if is_forbidden(ip) and not self._allow.allows(host, ip, port)]
        if refused:
            msg = (
                f"webhook URL {redact_url(url)} resolves to non-public address "
                f"{', '.join(map(str, refused))}; add the host or address with its port "
                f"({_with_port(host, port)}) to APP_WEBHOOK_ALLOW_PRIVATE to allow it"
            )
            raise SSRFBlockedError(msg)
        ip = ips[0]
        literal = literal_ip(host) is not None
        host_header = host if parsed.port is None else f"{host}:{parsed.port}"
        if ":" in host and literal:
            host_header = f"[{host}]" if parsed.port is None else f"[{host}]:{parsed.port}"
        sni = host if parsed.scheme == "https" and not literal else None
        return PinnedTarget(parsed.copy_with(host=str(ip)), ip, host_header, sni)

    async def _addresses(self, host: str, port: int, url: str) -> list[IPAddress]:
        literal = literal_ip(host)
        if literal is not None:
            return [literal]
        try:
            raw = await self._resolve(host, port)
        except OSError as exc:
            msg = f"cannot resolve webhook host of {redact_url(url)}: {exc.strerror or exc}"
            raise NotifierError(msg, retryable=True) from None
        ips = [ip for ip in map(literal_ip, raw) if ip is not None]
        if not ips:
            msg = f"webhook host of {redact_url(url)} resolved to no usable address"
            raise NotifierError(msg, retryable=True)
        return ips


def _with_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def literal_ip(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
