//! A request's target, canonical: what rules compare against.

use std::net::IpAddr;

use capstan_caps::{NetTarget, Scheme, TargetHost, canonical_ip};

/// The target of a request to `uri` with `method`, its host canonicalized the way a
/// browser reads it: internationalized names in their `xn--` form, IPv4 written in
/// decimal, octal, hex or fewer parts (`2130706433`, `0x7f.1`) as the address it means,
/// a trailing dot dropped. A URL with user info (`user@host`) is refused: it is a common
/// way to disguise a host.
///
/// ```
/// use capstan_caps::TargetHost;
/// use capstan_host::net::target_of;
///
/// let target = target_of(&http::Method::GET, &"http://0x7f.1:8080/x".parse().unwrap()).unwrap();
/// assert_eq!(target.host, TargetHost::Ip("127.0.0.1".parse().unwrap()));
/// assert_eq!(target.port, 8080);
/// ```
pub fn target_of(method: &http::Method, uri: &http::Uri) -> Result<NetTarget, String> {
    let scheme = match uri.scheme_str() {
        Some("https") => Scheme::Https,
        Some("http") => Scheme::Http,
        Some(other) => return Err(format!("the scheme `{other}` is not http or https")),
        None => return Err("the URL has no scheme".into()),
    };
    let authority = uri.authority().ok_or("the URL has no host")?;
    if authority.as_str().contains('@') {
        return Err("the URL holds user info (`user@host`); send credentials in a header".into());
    }
    let port = match authority.port() {
        None => scheme.default_port(),
        Some(port) => match port.as_u16() {
            0 => return Err("port 0 cannot be reached".into()),
            port => port,
        },
    };
    Ok(NetTarget {
        method: method.as_str().to_ascii_uppercase(),
        scheme,
        host: canonical_host(authority.host())?,
        port,
    })
}

/// `host` (IPv6 in brackets) in canonical form.
pub fn canonical_host(host: &str) -> Result<TargetHost, String> {
    let parsed = url::Host::parse(host)
        .map_err(|err| format!("`{}` is not a valid host: {err}", host.escape_debug()))?;
    Ok(match parsed {
        url::Host::Domain(name) => {
            let name = name.strip_suffix('.').unwrap_or(&name).to_ascii_lowercase();
            if name.is_empty() || name.ends_with('.') {
                return Err(format!("`{}` is not a valid host", host.escape_debug()));
            }
            TargetHost::Name(name)
        }
        url::Host::Ipv4(ip) => TargetHost::Ip(IpAddr::V4(ip)),
        url::Host::Ipv6(ip) => TargetHost::Ip(canonical_ip(IpAddr::V6(ip))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(url: &str) -> Result<TargetHost, String> {
        target_of(
            &http::Method::GET,
            &url.parse().map_err(|e| format!("{e}"))?,
        )
        .map(|t| t.host)
    }

    fn ip(text: &str) -> TargetHost {
        TargetHost::Ip(text.parse().unwrap())
    }

    #[test]
    fn numeric_and_disguised_hosts_become_the_address_they_mean() {
        for (url, want) in [
            ("http://2130706433/", ip("127.0.0.1")),
            ("http://0x7f000001/", ip("127.0.0.1")),
            ("http://0177.0.0.1/", ip("127.0.0.1")),
            ("http://127.1/", ip("127.0.0.1")),
            ("http://127.0.0.1./", ip("127.0.0.1")),
            ("http://[::ffff:7f00:1]/", ip("127.0.0.1")),
            (
                "http://[0:0:0:0:0:ffff:169.254.169.254]/",
                ip("169.254.169.254"),
            ),
            (
                "http://EXAMPLE.com./",
                TargetHost::Name("example.com".into()),
            ),
            (
                "http://xn--bcher-kva.de/",
                TargetHost::Name("xn--bcher-kva.de".into()),
            ),
        ] {
            assert_eq!(host(url).unwrap(), want, "{url}");
        }
    }

    #[test]
    fn user_info_other_schemes_and_bad_hosts_are_refused() {
        for url in [
            "http://user@example.com/",
            "http://a:b@example.com/",
            "ftp://example.com/",
            "http://exa mple.com/",
            "http://[::1/",
            "http://256.0.0.1/",
            "http://example.com:0/",
        ] {
            assert!(host(url).is_err(), "{url}");
        }
    }

    mod fuzz {
        use std::net::{IpAddr, Ipv4Addr};

        use capstan_caps::NetRule;
        use proptest::prelude::*;

        use super::*;
        use crate::net::{AddressClass, GrantSource, NetScope};

        /// Addresses a wildcard grant must never reach.
        const INNER: [&str; 8] = [
            "127.0.0.1",
            "10.0.0.1",
            "169.254.169.254",
            "192.168.1.1",
            "0.0.0.0",
            "::1",
            "fd00:ec2::254",
            "fe80::1",
        ];

        /// Ways to write an IPv4 address that browsers and resolvers accept.
        fn spell_v4(ip: Ipv4Addr, how: u8, upper: bool) -> String {
            let [a, b, c, d] = ip.octets();
            let n = u32::from(ip);
            let text = match how % 8 {
                0 => format!("{a}.{b}.{c}.{d}"),
                1 => format!("{n}"),
                2 => format!("0x{n:x}"),
                3 => format!("0{a:o}.0{b:o}.0{c:o}.0{d:o}"),
                4 => format!(
                    "{a}.{}",
                    (u32::from(b) << 16) | (u32::from(c) << 8) | u32::from(d)
                ),
                5 => format!("{a}.{b}.{}", (u32::from(c) << 8) | u32::from(d)),
                6 => format!("0x{a:x}.{b}.0{c:o}.{d}"),
                _ => format!("{a}.{b}.{c}.{d}."),
            };
            if upper { text.to_uppercase() } else { text }
        }

        fn spell(ip: IpAddr, how: u8, upper: bool) -> String {
            match ip {
                IpAddr::V4(v4) => spell_v4(v4, how, upper),
                IpAddr::V6(v6) => match how % 3 {
                    0 => format!("[{v6}]"),
                    1 => format!("[{}]", v6.segments().map(|s| format!("{s:x}")).join(":")),
                    _ => format!("[{v6}]").to_uppercase(),
                },
            }
        }

        fn wildcard_scope() -> NetScope {
            let any = NetRule::any_public();
            NetScope {
                tool: "t".into(),
                effective: vec![any.clone(), "*.example.com".parse().unwrap()],
                declared: vec![any.clone()],
                granted: vec![any],
                source: GrantSource::Flag,
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

            /// However an inner address is written, it is read as that address, and a
            /// wildcard grant refuses it; with user info it is refused outright.
            #[test]
            fn spelled_addresses_never_pass_a_wildcard(
                which in 0..INNER.len(),
                how in any::<u8>(),
                upper in any::<bool>(),
                user in prop_oneof![Just(""), Just("user@"), Just("a:b@"), Just("api.example.com@")],
                port in prop_oneof![Just(String::new()), (1u16..).prop_map(|p| format!(":{p}"))],
            ) {
                let ip: IpAddr = INNER[which].parse().unwrap();
                let url = format!("http://{user}{}{port}/x", spell(ip, how, upper));
                let Ok(uri) = url.parse::<http::Uri>() else { return Ok(()) };
                match target_of(&http::Method::GET, &uri) {
                    Err(_) => {}
                    Ok(target) => {
                        prop_assert!(user.is_empty(), "user info passed: {url}");
                        prop_assert_eq!(&target.host, &TargetHost::Ip(canonical_ip(ip)), "{}", url);
                        let scope = wildcard_scope();
                        if let Ok(rule) = scope.check(&target) {
                            prop_assert!(!AddressClass::of(ip).is_public());
                            prop_assert!(scope.check_address(rule, &target, ip).is_err(), "{}", url);
                        }
                    }
                }
            }

            /// A host name passes an exact grant only when it is that name, whatever its
            /// case, trailing dot or Unicode spelling.
            #[test]
            fn names_pass_an_exact_grant_only_as_themselves(
                prefix in "[a-zA-Z0-9.-]{0,6}",
                suffix in "[a-zA-Z0-9.-]{0,6}",
                upper in any::<bool>(),
                dot in any::<bool>(),
            ) {
                let name = format!("{prefix}api.example.com{suffix}");
                let name = if upper { name.to_uppercase() } else { name };
                let host = if dot { format!("{name}.") } else { name.clone() };
                let url = format!("https://{host}/");
                let Ok(uri) = url.parse::<http::Uri>() else { return Ok(()) };
                let Ok(target) = target_of(&http::Method::GET, &uri) else { return Ok(()) };
                let rule: NetRule = "api.example.com".parse().unwrap();
                let same = TargetHost::Name("api.example.com".into()) == target.host;
                prop_assert_eq!(rule.allows(&target), same, "{}", url);
            }
        }

        #[test]
        fn unicode_spellings_are_compared_in_their_ascii_form() {
            // `http::Uri` refuses non-ASCII hosts outright: a guest cannot send one.
            assert!(
                "https://\u{ff41}pi.example.com/"
                    .parse::<http::Uri>()
                    .is_err()
            );
            assert_eq!(
                canonical_host("\u{ff41}pi.example.com").unwrap(),
                TargetHost::Name("api.example.com".into())
            );
            assert_eq!(
                canonical_host("xn--bcher-kva.example").unwrap(),
                canonical_host("b\u{fc}cher.example").unwrap()
            );
        }
    }
}
