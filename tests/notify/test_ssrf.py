"""The SSRF guard with literal IPs, localhost and a scripted resolver (no network)."""

from __future__ import annotations

import asyncio

import pytest

from app.notify import SSRFBlockedError, SSRFGuard
from app.notify.ssrf import AllowList, PinnedTarget


def pin(url: str, allow: tuple[str, ...] = (), answers: list[str] | None = None) -> PinnedTarget:
    async def resolver(host: str, port: int) -> list[str]:
        assert answers is not None, "this test expects no DNS lookup"
        return list(answers)

    return asyncio.run(SSRFGuard(allow, resolver if answers is not None else None).pin(url))


@pytest.mark.parametrize(
    "ip",
    ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "0.0.0.0", "100.64.0.1",
     "224.0.0.1", "240.0.0.1", "[::1]", "[fe80::1]", "[fc00::1]", "[::ffff:127.0.0.1]"],
)  # fmt: skip
def test_non_public_literal_addresses_are_refused(ip: str) -> None:
    with pytest.raises(SSRFBlockedError, match="APP_WEBHOOK_ALLOW_PRIVATE") as info:
        pin(f"http://{ip}:8080/hook")
    assert not info.value.retryable


def test_loopback_is_allowed_by_ip_cidr_or_host_name() -> None:
    assert str(pin("http://127.0.0.1:9/x", ("127.0.0.1",)).ip) == "127.0.0.1"
    assert str(pin("http://127.0.0.2:9/x", ("127.0.0.0/8",)).ip) == "127.0.0.2"
    with pytest.raises(SSRFBlockedError):
        pin("http://127.0.0.2:9/x", ("127.0.0.1",))


def test_localhost_resolves_and_is_refused_unless_allow_listed() -> None:
    with pytest.raises(SSRFBlockedError, match="non-public"):
        pin("http://localhost:9/x")
    target = pin("http://localhost:9/x", ("localhost",))
    assert target.ip.is_loopback
    assert target.host_header == "localhost:9"


def test_public_literal_is_pinned_without_dns() -> None:
    target = pin("https://93.184.216.34/hook?t=1")
    assert str(target.url) == "https://93.184.216.34/hook?t=1"
    assert target.sni_hostname is None


def test_name_is_pinned_to_the_checked_ip_with_host_and_sni() -> None:
    target = pin("https://hooks.example.com:8443/a", answers=["93.184.216.34"])
    assert target.url.host == "93.184.216.34"
    assert (target.host_header, target.sni_hostname) == ("hooks.example.com:8443", "hooks.example.com")
    assert target.extensions() == {"sni_hostname": "hooks.example.com"}
    assert pin("http://hooks.example.com/a", answers=["93.184.216.34"]).sni_hostname is None


def test_a_name_with_any_private_answer_is_refused() -> None:
    with pytest.raises(SSRFBlockedError, match=r"10\.0\.0\.5"):
        pin("https://rebind.example.com/a", answers=["93.184.216.34", "10.0.0.5"])


def test_only_http_and_https_are_accepted() -> None:
    for url in ("ftp://93.184.216.34/x", "file:///etc/passwd", "not a url"):
        with pytest.raises(SSRFBlockedError):
            pin(url)


@pytest.mark.parametrize(
    "ip",
    [
        "2002:7f00:1::",  # 6to4 of 127.0.0.1
        "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254 (cloud metadata)
        "2002:c0a8:101::",  # 6to4 of 192.168.1.1
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
        "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
        "64:ff9b:1::808:808",  # local-use NAT64: refused whole
        "::7f00:1",  # IPv4-compatible 127.0.0.1
        "::ffff:a9fe:a9fe",  # IPv4-mapped 169.254.169.254
    ],
)
def test_ipv6_forms_that_embed_a_private_ipv4_are_refused(ip: str) -> None:
    with pytest.raises(SSRFBlockedError, match="non-public"):
        pin(f"http://[{ip}]:8080/hook")
    with pytest.raises(SSRFBlockedError, match="non-public"):
        pin("http://sneaky.example.com/hook", answers=[ip])


def test_6to4_of_a_public_ipv4_is_public() -> None:
    assert str(pin("http://[2002:808:808::1]/hook").ip) == "2002:808:808::1"


def test_an_allow_list_entry_with_a_port_allows_that_port_only() -> None:
    assert pin("http://127.0.0.1:8080/x", ("127.0.0.1:8080",)).ip.is_loopback
    assert pin("http://localhost:8080/x", ("localhost:8080",)).ip.is_loopback
    assert pin("http://[::1]:8080/x", ("[::1]:8080",)).ip.is_loopback
    assert pin("http://127.0.0.1:6379/x", ("127.0.0.1",)).ip.is_loopback  # a bare host: every port
    for url in ("http://127.0.0.1:6379/x", "http://127.0.0.1/x"):
        with pytest.raises(SSRFBlockedError, match=r"127\.0\.0\.1:(6379|80)\)"):
            pin(url, ("127.0.0.1:8080",))
    with pytest.raises(SSRFBlockedError):
        pin("http://localhost:6379/x", ("localhost:8080",))
    with pytest.raises(ValueError, match="not a port"):
        AllowList.parse(["127.0.0.1:http"])
