//! Which addresses are special-use: everything a sandbox must not reach by default because it
//! is the host itself, a private network, or not a real unicast destination. Public addresses
//! are everything else. IPv4 embedded in IPv6 (IPv4-mapped `::ffff:a.b.c.d`, NAT64
//! `64:ff9b::a.b.c.d`) is judged by the IPv4 address it carries, so `::ffff:127.0.0.1` is
//! loopback. IPv6 outside global unicast `2000::/3` is refused wholesale, as are the
//! IETF-assignment, 6to4 and documentation blocks inside it.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an address is not public.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SpecialUse {
    /// `0.0.0.0/8`, `::`.
    Unspecified,
    /// `127.0.0.0/8`, `::1`.
    Loopback,
    /// RFC 1918: `10/8`, `172.16/12`, `192.168/16`.
    Private,
    /// RFC 6598 carrier-grade NAT: `100.64.0.0/10`.
    SharedAddressSpace,
    /// `169.254.0.0/16`, `fe80::/10`.
    LinkLocal,
    /// `fec0::/10`, deprecated but still routed by some hosts.
    SiteLocal,
    /// `fc00::/7`.
    UniqueLocal,
    /// `224.0.0.0/4`, `ff00::/8`.
    Multicast,
    /// `255.255.255.255`.
    Broadcast,
    /// `192.0.2/24`, `198.51.100/24`, `203.0.113/24`, `2001:db8::/32`, `3fff::/20`.
    Documentation,
    /// `198.18.0.0/15`.
    Benchmarking,
    /// `192.0.0.0/24`, `2001::/23` (Teredo, ORCHID, …).
    ProtocolAssignment,
    /// `2002::/16`: 6to4 carries an IPv4 address the tunnel would reach.
    SixToFour,
    /// `64:ff9b:1::/48`: NAT64 for local use.
    LocalNat64,
    /// `240.0.0.0/4`, `192.88.99.0/24`, `100::/64`, and IPv6 outside `2000::/3`.
    Reserved,
}

impl fmt::Display for SpecialUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SpecialUse::Unspecified => "an unspecified address",
            SpecialUse::Loopback => "a loopback address",
            SpecialUse::Private => "a private address",
            SpecialUse::SharedAddressSpace => "a carrier-grade NAT address",
            SpecialUse::LinkLocal => "a link-local address",
            SpecialUse::SiteLocal => "a site-local address",
            SpecialUse::UniqueLocal => "a unique local address",
            SpecialUse::Multicast => "a multicast address",
            SpecialUse::Broadcast => "the broadcast address",
            SpecialUse::Documentation => "a documentation address",
            SpecialUse::Benchmarking => "a benchmarking address",
            SpecialUse::ProtocolAssignment => "an IETF protocol-assignment address",
            SpecialUse::SixToFour => "a 6to4 address",
            SpecialUse::LocalNat64 => "a local-use NAT64 address",
            SpecialUse::Reserved => "a reserved address",
        })
    }
}

/// What special use `ip` has; `None` for a public address.
pub(crate) fn special_use(ip: IpAddr) -> Option<SpecialUse> {
    match ip {
        IpAddr::V4(v4) => special_use_v4(v4),
        IpAddr::V6(v6) => special_use_v6(v6),
    }
}

fn in_v4(ip: Ipv4Addr, network: [u8; 4], prefix: u32) -> bool {
    let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(network)) & mask
}

fn in_v6(ip: Ipv6Addr, network: [u16; 8], prefix: u32) -> bool {
    let mask = u128::MAX.checked_shl(128 - prefix).unwrap_or(0);
    u128::from(ip) & mask == u128::from(Ipv6Addr::from(network)) & mask
}

fn special_use_v4(ip: Ipv4Addr) -> Option<SpecialUse> {
    const RANGES: &[([u8; 4], u32, SpecialUse)] = &[
        ([0, 0, 0, 0], 8, SpecialUse::Unspecified),
        ([10, 0, 0, 0], 8, SpecialUse::Private),
        ([100, 64, 0, 0], 10, SpecialUse::SharedAddressSpace),
        ([127, 0, 0, 0], 8, SpecialUse::Loopback),
        ([169, 254, 0, 0], 16, SpecialUse::LinkLocal),
        ([172, 16, 0, 0], 12, SpecialUse::Private),
        ([192, 0, 0, 0], 24, SpecialUse::ProtocolAssignment),
        ([192, 0, 2, 0], 24, SpecialUse::Documentation),
        ([192, 88, 99, 0], 24, SpecialUse::Reserved),
        ([192, 168, 0, 0], 16, SpecialUse::Private),
        ([198, 18, 0, 0], 15, SpecialUse::Benchmarking),
        ([198, 51, 100, 0], 24, SpecialUse::Documentation),
        ([203, 0, 113, 0], 24, SpecialUse::Documentation),
        ([224, 0, 0, 0], 4, SpecialUse::Multicast),
        ([255, 255, 255, 255], 32, SpecialUse::Broadcast),
        ([240, 0, 0, 0], 4, SpecialUse::Reserved),
    ];
    RANGES
        .iter()
        .find(|(network, prefix, _)| in_v4(ip, *network, *prefix))
        .map(|(_, _, kind)| *kind)
}

fn special_use_v6(ip: Ipv6Addr) -> Option<SpecialUse> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return special_use_v4(v4);
    }
    if in_v6(ip, [0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96) {
        let [.., a, b, c, d] = ip.octets();
        return special_use_v4(Ipv4Addr::new(a, b, c, d));
    }
    if ip.is_unspecified() {
        return Some(SpecialUse::Unspecified);
    }
    if ip.is_loopback() {
        return Some(SpecialUse::Loopback);
    }
    const RANGES: &[([u16; 8], u32, SpecialUse)] = &[
        ([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48, SpecialUse::LocalNat64),
        ([0x100, 0, 0, 0, 0, 0, 0, 0], 64, SpecialUse::Reserved),
        (
            [0x2001, 0xdb8, 0, 0, 0, 0, 0, 0],
            32,
            SpecialUse::Documentation,
        ),
        (
            [0x2001, 0, 0, 0, 0, 0, 0, 0],
            23,
            SpecialUse::ProtocolAssignment,
        ),
        ([0x2002, 0, 0, 0, 0, 0, 0, 0], 16, SpecialUse::SixToFour),
        ([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, SpecialUse::Documentation),
        ([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, SpecialUse::UniqueLocal),
        ([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, SpecialUse::LinkLocal),
        ([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, SpecialUse::SiteLocal),
        ([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, SpecialUse::Multicast),
    ];
    if let Some((_, _, kind)) = RANGES
        .iter()
        .find(|(network, prefix, _)| in_v6(ip, *network, *prefix))
    {
        return Some(*kind);
    }
    // Only 2000::/3 is allocated as global unicast; the rest (IPv4-compatible `::a.b.c.d`,
    // SIIT `::ffff:0:a.b.c.d`, …) is nothing a sandbox needs.
    (!in_v6(ip, [0x2000, 0, 0, 0, 0, 0, 0, 0], 3)).then_some(SpecialUse::Reserved)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(s: &str) -> Option<SpecialUse> {
        special_use(s.parse().expect("test address"))
    }

    #[test]
    fn public_addresses_are_not_special() {
        for public in [
            "1.1.1.1",
            "8.8.8.8",
            "151.101.0.223",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.169.0.1",
            "198.20.0.1",
            "223.255.255.255",
            "2606:4700:4700::1111",
            "2a04:4e42::223",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
        ] {
            assert_eq!(class(public), None, "{public} is public");
        }
    }

    #[test]
    fn special_ipv4_ranges_are_classified() {
        for (ip, kind) in [
            ("0.0.0.0", SpecialUse::Unspecified),
            ("0.1.2.3", SpecialUse::Unspecified),
            ("127.0.0.1", SpecialUse::Loopback),
            ("127.255.0.9", SpecialUse::Loopback),
            ("10.0.0.1", SpecialUse::Private),
            ("172.16.0.1", SpecialUse::Private),
            ("172.31.255.255", SpecialUse::Private),
            ("192.168.1.1", SpecialUse::Private),
            ("100.64.0.1", SpecialUse::SharedAddressSpace),
            ("100.127.255.255", SpecialUse::SharedAddressSpace),
            ("169.254.169.254", SpecialUse::LinkLocal),
            ("192.0.0.8", SpecialUse::ProtocolAssignment),
            ("192.0.2.1", SpecialUse::Documentation),
            ("198.51.100.1", SpecialUse::Documentation),
            ("203.0.113.1", SpecialUse::Documentation),
            ("198.18.0.1", SpecialUse::Benchmarking),
            ("198.19.255.255", SpecialUse::Benchmarking),
            ("224.0.0.1", SpecialUse::Multicast),
            ("239.255.255.250", SpecialUse::Multicast),
            ("240.0.0.1", SpecialUse::Reserved),
            ("255.255.255.255", SpecialUse::Broadcast),
            ("192.88.99.1", SpecialUse::Reserved),
        ] {
            assert_eq!(class(ip), Some(kind), "{ip}");
        }
    }

    #[test]
    fn special_ipv6_ranges_are_classified() {
        for (ip, kind) in [
            ("::", SpecialUse::Unspecified),
            ("::1", SpecialUse::Loopback),
            ("fc00::1", SpecialUse::UniqueLocal),
            ("fd12:3456::1", SpecialUse::UniqueLocal),
            ("fe80::1", SpecialUse::LinkLocal),
            ("febf::1", SpecialUse::LinkLocal),
            ("fec0::1", SpecialUse::SiteLocal),
            ("ff02::1", SpecialUse::Multicast),
            ("2001:db8::1", SpecialUse::Documentation),
            ("3fff::1", SpecialUse::Documentation),
            ("2001::1", SpecialUse::ProtocolAssignment),
            ("2002:7f00:1::", SpecialUse::SixToFour),
            ("64:ff9b:1::1", SpecialUse::LocalNat64),
            ("100::1", SpecialUse::Reserved),
            ("::127.0.0.1", SpecialUse::Reserved),
            ("::ffff:0:7f00:1", SpecialUse::Reserved),
            ("4000::1", SpecialUse::Reserved),
        ] {
            assert_eq!(class(ip), Some(kind), "{ip}");
        }
    }

    #[test]
    fn ipv4_embedded_in_ipv6_is_judged_by_the_ipv4_address() {
        for (ip, kind) in [
            ("::ffff:127.0.0.1", SpecialUse::Loopback),
            ("::ffff:10.1.2.3", SpecialUse::Private),
            ("::ffff:169.254.169.254", SpecialUse::LinkLocal),
            ("::ffff:0.0.0.0", SpecialUse::Unspecified),
            ("64:ff9b::7f00:1", SpecialUse::Loopback),
            ("64:ff9b::a9fe:a9fe", SpecialUse::LinkLocal),
            ("64:ff9b::c0a8:1", SpecialUse::Private),
        ] {
            assert_eq!(class(ip), Some(kind), "{ip}");
        }
        assert_eq!(
            class("::ffff:127.0.0.1").map(|k| k.to_string()).as_deref(),
            Some("a loopback address")
        );
    }
}
