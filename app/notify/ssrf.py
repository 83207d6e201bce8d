"""SSRF guard for outgoing webhooks: resolve, check, then connect to the checked IP.

Contract of :meth:`SSRFGuard.pin`:

- only ``http`` and ``https`` URLs with a host are accepted;
- the host is resolved once; every address it resolves to must be public
  (not private, loopback, link-local, multicast, reserved, unspecified or
  shared address space), unless the host name, or the address (exact IP or
  inside a CIDR), is on the allow list;
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


def is_forbidden(ip: IPAddress) -> bool:
    """True for any address a public webhook must not point at."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (
        not ip.is_global
        or ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
    )


@dataclass(frozen=True)
class AllowList:
    """Hosts (exact, case-insensitive) and networks that may be private."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> AllowList:
        """Entries are host names, IPs or CIDRs (``localhost``, ``127.0.0.1``, ``10.0.0.0/8``)."""
        hosts: set[str] = set()
        nets: list[IPNetwork] = []
        for raw in entries:
            entry = raw.strip().lower().rstrip(".")
            if not entry:
                continue
            try:
                nets.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            except ValueError:
                hosts.add(entry)
        return cls(frozenset(hosts), tuple(nets))

    def allows(self, host: str, ip: IPAddress) -> bool:
        if host.lower().rstrip(".") in self.hosts:
            return True
        return any(ip.version == net.version and ip in net for net in self.networks)


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
        refused = [ip for ip in ips if is_forbidden(ip) and not self._allow.allows(host, ip)]
        if refused:
            msg = (
                f"webhook URL {redact_url(url)} resolves to non-public address "
                f"{', '.join(map(str, refused))}; add the host or address to "
                "APP_WEBHOOK_ALLOW_PRIVATE to allow it"
            )
            raise SSRFBlockedError(msg)
        ip = ips[0]
        literal = _literal_ip(host) is not None
        host_header = host if parsed.port is None else f"{host}:{parsed.port}"
        if ":" in host and literal:
            host_header = f"[{host}]" if parsed.port is None else f"[{host}]:{parsed.port}"
        sni = host if parsed.scheme == "https" and not literal else None
        return PinnedTarget(parsed.copy_with(host=str(ip)), ip, host_header, sni)

    async def _addresses(self, host: str, port: int, url: str) -> list[IPAddress]:
        literal = _literal_ip(host)
        if literal is not None:
            return [literal]
        try:
            raw = await self._resolve(host, port)
        except OSError as exc:
            msg = f"cannot resolve webhook host of {redact_url(url)}: {exc.strerror or exc}"
            raise NotifierError(msg, retryable=True) from None
        ips = [ip for ip in map(_literal_ip, raw) if ip is not None]
        if not ips:
            msg = f"webhook host of {redact_url(url)} resolved to no usable address"
            raise NotifierError(msg, retryable=True)
        return ips


def _literal_ip(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
