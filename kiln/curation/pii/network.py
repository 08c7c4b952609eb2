"""Network addresses: IPv4 and IPv6, less loopback, multicast, netmasks, version numbers, OIDs and the
documentation ranges."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator

from kiln.curation.pii.base import _WORD

# Addresses that identify no one and appear in every networking tutorial.
DEFAULT_IPV4_KEEP: frozenset[str] = frozenset({"127.0.0.1", "0.0.0.0", "255.255.255.255"})


# --- ipv4 ---------------------------------------------------------------------------------------
# Four dotted numbers, each 0-255 without leading zeros. More parts or a letter or '.' attached mean
# a version, section or OID ("1.2.3.4.5", "v1.2.3.4", "11.2.0.4.v3", "#id.3.1.3.2"), as does a
# preceding "version"/"section"/"Identifier(" word or a version specifier (">=3.10.0.2"). Netmasks
# and hostmasks (255.255.255.0, 0.0.0.255) identify no one. Otherwise a four-part number IS
# indistinguishable from an address ("Python 3.11.7.1" included) and is redacted.
_IPV4 = re.compile("[0-9](?<!" + _WORD + r"[0-9])(?<!\.[0-9])[0-9]{0,2}(?:\.[0-9]{1,3}){3}(?!" + _WORD + r")(?!\.\w)")
_NOT_AN_ADDRESS_BEFORE = re.compile(
    r"(?i)(?:(?:versi[oó]n\w*|identifier|revision|(?<![a-z])(?:ver|rev|release|build|section|sec|chapter|rfc|oid|§))"
    r"s?\.?\W{0,4}|[<>!~=]=\s*)$"
)
# An OID's context anywhere earlier on its line: "... OBJECT IDENTIFIER ::= { id-ce 17 } -- 2.5.29.17".
_OID_LINE = re.compile(r"(?i)object identifier|\boid\b|\{ *id-")


# Ranges reserved for documentation and examples (RFC 5737, RFC 3849): they identify no one, and
# redacting them would break the code samples and docs that use them on purpose.
DOCUMENTATION_NETWORKS = tuple(ipaddress.ip_network(n) for n in (
    "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32"))


def _documentation(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return any(addr in net for net in DOCUMENTATION_NETWORKS if net.version == addr.version)


def _is_mask(n: int, bits: int) -> bool:
    """0...01...1 or 1...10...0: a netmask or hostmask, not an address."""
    inverse = n ^ ((1 << bits) - 1)
    return (n & (n + 1)) == 0 or (inverse & (inverse + 1)) == 0


def _ipv4_ok(s: str, keep_documentation: bool = True) -> bool:
    octets = s.split(".")
    if any(int(o) > 255 or (o[0] == "0" and o != "0") for o in octets):
        return False
    addr = ipaddress.IPv4Address(s)
    # Multicast groups (224.0.0.251 is mDNS) name a service, not a host.
    return not (_is_mask(int(addr), 32) or addr.is_multicast or (keep_documentation and _documentation(addr)))


def _find_ipv4(text: str, keep: frozenset[str], keep_documentation: bool) -> Iterator[tuple[int, int]]:
    for m in _IPV4.finditer(text):
        if m.group() in keep or not _ipv4_ok(m.group(), keep_documentation):
            continue
        if _NOT_AN_ADDRESS_BEFORE.search(text, max(0, m.start() - 24), m.start()):
            continue
        line_start = text.rfind("\n", max(0, m.start() - 120), m.start()) + 1
        if _OID_LINE.search(text, max(line_start, m.start() - 120), m.start()):
            continue
        yield m.span()


# --- ipv6 ---------------------------------------------------------------------------------------
# Every address has two colons at most 4 hex digits apart: find those (rare outside addresses and
# `::` scopes), step back over the first group, match a candidate of hex digits and colons (optional
# dotted-quad tail), and let `ipaddress` decide. That rejects times (12:30:45), MAC addresses and
# slices. `::` and `::1` identify no one. A compressed form with a single group, fewer than 4 hex
# digits or no decimal digit at all ("a[::1000]", "2001::/32", "a::b", "dead::beef") is far more often
# a slice, a prefix or a C++/Rust scope than an address; a full 8-group form is an address, unless every
# group is two hex digits ("00:1a:2b:3c:4d:5e:6f:70": 8 bytes, an EUI-64 or a Fibre Channel WWN, a hardware
# id; an address drops its groups' leading zeros).
_IPV6_GATE = re.compile(r":[0-9A-Fa-f]{0,4}:")
_IPV6 = re.compile(r"(?<![\w:.])[0-9A-Fa-f:]{2,45}(?:\.[0-9]{1,3}){0,3}(?!\w)(?!:[\w:])(?!\.[0-9])")
# A dotted-quad tail is always last, so a colon after it starts a port: "[client ::ffff:1.2.3.4:55120]".
_IPV6_PORT = re.compile(r"(?<![\w:.])[0-9A-Fa-f:]{2,39}[0-9]{1,3}(?:\.[0-9]{1,3}){3}(?=:[0-9]{1,5}(?![\w:.]))")
_HEX = frozenset("0123456789abcdefABCDEF")


def _ipv6_ok(s: str, keep_documentation: bool = True) -> bool:
    if "::" not in s and all(len(g) == 2 for g in s.split(":")):
        return False  # 8 bytes written as such: an EUI-64, a Fibre Channel WWN (00:1a:2b:3c:4d:5e:6f:70), no address
    if "::" in s and (
        sum(1 for g in s.split(":") if g) < 2
        or sum(c in _HEX for c in s) < 4
        or not any(c.isdigit() for c in s)
    ):
        return False
    try:
        addr = ipaddress.IPv6Address(s)
    except ValueError:
        return False
    return not (addr.is_unspecified or addr.is_loopback or addr.is_multicast or _is_mask(int(addr), 128)
                or (keep_documentation and _documentation(addr)))


def _find_ipv6(text: str, keep_documentation: bool) -> Iterator[tuple[int, int]]:
    pos = 0
    while (g := _IPV6_GATE.search(text, pos)) is not None:
        start = g.start()
        while start > 0 and g.start() - start < 4 and text[start - 1] in _HEX:
            start -= 1
        m = _IPV6.match(text, start) or _IPV6_PORT.match(text, start)
        end = -1 if m is None else m.end() - (m.group().endswith(":") and not m.group().endswith("::"))
        if m is not None and _ipv6_ok(text[start:end], keep_documentation):
            yield start, end  # without a colon that ends a phrase: "from 2a00:1450::1: icmp_seq=1"
            pos = end
        else:
            pos = g.start() + 1
