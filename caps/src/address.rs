//! The classes of address a request may connect to, and the ranges a rule may name.
//!
//! A rule's wildcard host (`*`, `*.example.com`) covers public addresses only. Any other
//! address is reached only where both the tool's declaration and the caller's grant name
//! it: its host or address exactly, or its range (`{loopback}`, `{private}`,
//! `{link-local}`, `{unique-local}`, `{internal}`). Cloud metadata and special-purpose
//! addresses belong to no range: only a rule naming the address itself reaches them.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What kind of address a request would connect to.
///
/// ```
/// use capstan_caps::AddressClass;
///
/// assert_eq!(AddressClass::of("8.8.8.8".parse().unwrap()), AddressClass::Public);
/// assert_eq!(AddressClass::of("169.254.169.254".parse().unwrap()), AddressClass::CloudMetadata);
/// assert_eq!(AddressClass::of("::ffff:10.0.0.1".parse().unwrap()), AddressClass::Private);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressClass {
    /// A global unicast address.
    Public,
    /// `127.0.0.0/8`, `::1`.
    Loopback,
    /// `10/8`, `172.16/12`, `192.168/16`, and the shared `100.64/10`.
    Private,
    /// `169.254/16`, `fe80::/10`.
    LinkLocal,
    /// `fc00::/7`.
    UniqueLocal,
    /// A cloud provider's instance metadata or credentials service ([`METADATA_V4`],
    /// [`METADATA_V6`]): reached only by a rule naming the address itself.
    CloudMetadata,
    /// `0.0.0.0/8`, `::`, multicast, broadcast, documentation, benchmarking and reserved
    /// ranges: nothing a tool has reason to reach.
    Special,
}

impl AddressClass {
    /// The class of `ip`; an IPv6 address that embeds an IPv4 one (mapped, NAT64, 6to4)
    /// is classed by the IPv4 address.
    pub fn of(ip: IpAddr) -> AddressClass {
        match ip {
            IpAddr::V4(v4) => class_v4(v4),
            IpAddr::V6(v6) => match embedded_v4(v6) {
                Some(v4) => class_v4(v4),
                None => class_v6(v6),
            },
        }
    }

    /// Whether a wildcard rule may reach it.
    pub fn is_public(self) -> bool {
        self == AddressClass::Public
    }
}

/// A range of addresses that are not public, as a rule names it in place of a host:
/// `http://{loopback}:*` allows plain HTTP to any port of any loopback address.
///
/// ```
/// use capstan_caps::{AddressClass, AddressRange};
///
/// let range: AddressRange = "internal".parse().unwrap();
/// assert!(range.contains(AddressClass::Loopback));
/// assert!(range.contains(AddressClass::Private));
/// assert!(!range.contains(AddressClass::CloudMetadata));
/// assert!(!range.contains(AddressClass::Public));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AddressRange {
    /// `{loopback}`: `127.0.0.0/8`, `::1`.
    Loopback,
    /// `{private}`: `10/8`, `172.16/12`, `192.168/16`, `100.64/10`.
    Private,
    /// `{link-local}`: `169.254/16` (but the metadata address), `fe80::/10`.
    LinkLocal,
    /// `{unique-local}`: `fc00::/7`.
    UniqueLocal,
    /// `{internal}`: the four above.
    Internal,
}

impl AddressRange {
    /// Every range, in the order their names are listed.
    pub const ALL: [AddressRange; 5] = [
        AddressRange::Loopback,
        AddressRange::Private,
        AddressRange::LinkLocal,
        AddressRange::UniqueLocal,
        AddressRange::Internal,
    ];

    /// Its name, as written between braces.
    pub fn as_str(self) -> &'static str {
        match self {
            AddressRange::Loopback => "loopback",
            AddressRange::Private => "private",
            AddressRange::LinkLocal => "link-local",
            AddressRange::UniqueLocal => "unique-local",
            AddressRange::Internal => "internal",
        }
    }

    /// Whether an address of `class` is in the range.
    pub fn contains(self, class: AddressClass) -> bool {
        match (self, class) {
            (AddressRange::Loopback, AddressClass::Loopback)
            | (AddressRange::Private, AddressClass::Private)
            | (AddressRange::LinkLocal, AddressClass::LinkLocal)
            | (AddressRange::UniqueLocal, AddressClass::UniqueLocal) => true,
            (AddressRange::Internal, class) => matches!(
                class,
                AddressClass::Loopback
                    | AddressClass::Private
                    | AddressClass::LinkLocal
                    | AddressClass::UniqueLocal
            ),
            _ => false,
        }
    }

    /// The addresses both ranges hold, as a range; `None` if they share none.
    pub fn intersect(self, other: AddressRange) -> Option<AddressRange> {
        match (self, other) {
            (AddressRange::Internal, x) | (x, AddressRange::Internal) => Some(x),
            (a, b) => (a == b).then_some(a),
        }
    }
}

impl fmt::Display for AddressRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{{}}}", self.as_str())
    }
}

impl std::str::FromStr for AddressRange {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        AddressRange::ALL
            .into_iter()
            .find(|range| range.as_str() == name)
            .ok_or_else(|| {
                format!(
                    "`{{{name}}}` is no address range; the ranges are {{loopback}}, {{private}}, \
                     {{link-local}}, {{unique-local}} and {{internal}} (all four)"
                )
            })
    }
}

impl fmt::Display for AddressClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AddressClass::Public => "a public address",
            AddressClass::Loopback => "a loopback address",
            AddressClass::Private => "a private address",
            AddressClass::LinkLocal => "a link-local address",
            AddressClass::UniqueLocal => "a unique-local address",
            AddressClass::CloudMetadata => "a cloud metadata address",
            AddressClass::Special => "a special-purpose address",
        })
    }
}

/// The IPv4 addresses of cloud metadata and credentials services: AWS, GCP, Azure,
/// OpenStack and others (169.254.169.254), AWS ECS task credentials (169.254.170.2), EKS
/// Pod Identity (169.254.170.23), Tencent (169.254.0.23), Alibaba (100.100.100.200) and
/// Azure's WireServer (168.63.129.16, which is not in a private range).
pub const METADATA_V4: [Ipv4Addr; 6] = [
    Ipv4Addr::new(169, 254, 169, 254),
    Ipv4Addr::new(169, 254, 170, 2),
    Ipv4Addr::new(169, 254, 170, 23),
    Ipv4Addr::new(169, 254, 0, 23),
    Ipv4Addr::new(100, 100, 100, 200),
    Ipv4Addr::new(168, 63, 129, 16),
];

/// The IPv6 addresses of cloud metadata and credentials services: AWS (`fd00:ec2::254`),
/// EKS Pod Identity (`fd00:ec2::23`), GCP (`fd20:ce::254`).
pub const METADATA_V6: [Ipv6Addr; 3] = [
    Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254),
    Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x23),
    Ipv6Addr::new(0xfd20, 0xce, 0, 0, 0, 0, 0, 0x254),
];

fn class_v4(ip: Ipv4Addr) -> AddressClass {
    let [a, b, c, _] = ip.octets();
    if METADATA_V4.contains(&ip) {
        return AddressClass::CloudMetadata;
    }
    if ip.is_loopback() {
        AddressClass::Loopback
    } else if ip.is_private() || (a == 100 && (64..128).contains(&b)) {
        AddressClass::Private
    } else if ip.is_link_local() {
        AddressClass::LinkLocal
    } else if a == 0
        || a >= 224
        || ip.is_broadcast()
        || ip.is_documentation()
        || (a == 192 && b == 0 && c == 0)
        || (a == 198 && (b == 18 || b == 19))
    {
        AddressClass::Special
    } else {
        AddressClass::Public
    }
}

fn class_v6(ip: Ipv6Addr) -> AddressClass {
    let seg = ip.segments();
    if METADATA_V6.contains(&ip) {
        AddressClass::CloudMetadata
    } else if ip.is_loopback() {
        AddressClass::Loopback
    } else if seg[0] & 0xffc0 == 0xfe80 {
        AddressClass::LinkLocal
    } else if seg[0] & 0xfe00 == 0xfc00 {
        AddressClass::UniqueLocal
    } else if ip.is_unspecified()
        || ip.is_multicast()
        || seg[0] == 0x2001 && seg[1] == 0x0db8
        || seg[0] & 0xe000 != 0x2000
    {
        // Global unicast is 2000::/3; everything else is special or reserved.
        AddressClass::Special
    } else {
        AddressClass::Public
    }
}

/// The IPv4 address inside a mapped (`::ffff:a.b.c.d`), compatible (`::a.b.c.d`), NAT64
/// (`64:ff9b::/96`) or 6to4 (`2002:AABB:CCDD::/48`) address.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    let seg = ip.segments();
    let tail = Ipv4Addr::new(
        (seg[6] >> 8) as u8,
        seg[6] as u8,
        (seg[7] >> 8) as u8,
        seg[7] as u8,
    );
    if seg[..6] == [0, 0, 0, 0, 0, 0] && !ip.is_loopback() && !ip.is_unspecified() {
        return Some(tail);
    }
    if seg[0] == 0x64 && seg[1] == 0xff9b && seg[2..6] == [0, 0, 0, 0] {
        return Some(tail);
    }
    if seg[0] == 0x2002 {
        return Some(Ipv4Addr::new(
            (seg[1] >> 8) as u8,
            seg[1] as u8,
            (seg[2] >> 8) as u8,
            seg[2] as u8,
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_non_public_range_is_classed() {
        for (ip, class) in [
            ("127.0.0.1", AddressClass::Loopback),
            ("127.255.1.2", AddressClass::Loopback),
            ("10.1.2.3", AddressClass::Private),
            ("172.16.0.1", AddressClass::Private),
            ("172.31.255.255", AddressClass::Private),
            ("192.168.1.1", AddressClass::Private),
            ("100.64.0.1", AddressClass::Private),
            ("169.254.1.1", AddressClass::LinkLocal),
            ("169.254.169.254", AddressClass::CloudMetadata),
            ("100.100.100.200", AddressClass::CloudMetadata),
            ("0.0.0.0", AddressClass::Special),
            ("0.1.2.3", AddressClass::Special),
            ("255.255.255.255", AddressClass::Special),
            ("224.0.0.1", AddressClass::Special),
            ("240.0.0.1", AddressClass::Special),
            ("192.0.2.1", AddressClass::Special),
            ("198.18.0.1", AddressClass::Special),
            ("::1", AddressClass::Loopback),
            ("::", AddressClass::Special),
            ("fe80::1", AddressClass::LinkLocal),
            ("fc00::1", AddressClass::UniqueLocal),
            ("fd12:3456::1", AddressClass::UniqueLocal),
            ("fd00:ec2::254", AddressClass::CloudMetadata),
            ("fd00:ec2::23", AddressClass::CloudMetadata),
            ("fd20:ce::254", AddressClass::CloudMetadata),
            ("169.254.170.2", AddressClass::CloudMetadata),
            ("169.254.170.23", AddressClass::CloudMetadata),
            ("169.254.0.23", AddressClass::CloudMetadata),
            ("168.63.129.16", AddressClass::CloudMetadata),
            ("::ffff:168.63.129.16", AddressClass::CloudMetadata),
            ("ff02::1", AddressClass::Special),
            ("2001:db8::1", AddressClass::Special),
            ("::ffff:127.0.0.1", AddressClass::Loopback),
            ("::127.0.0.1", AddressClass::Loopback),
            ("64:ff9b::a9fe:a9fe", AddressClass::CloudMetadata),
            ("2002:0a00:0001::1", AddressClass::Private),
            ("8.8.8.8", AddressClass::Public),
            ("172.32.0.1", AddressClass::Public),
            ("2606:4700::1111", AddressClass::Public),
        ] {
            let parsed: IpAddr = ip.parse().unwrap();
            assert_eq!(AddressClass::of(parsed), class, "{ip}");
        }
    }
}
