//! A mail server as `[channels.NAME.email]` names it: `imaps://imap.example.org`,
//! `smtp+starttls://smtp.example.org:587`.

use std::fmt;
use std::str::FromStr;

/// How the connection to a mail server is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Security {
    /// TLS from the first byte (`imaps`, `smtps`).
    Tls,
    /// Plain text, then STARTTLS before anything else is said (`smtp+starttls`).
    StartTls,
    /// Plain text throughout (`imap`, `smtp`): only to a loopback address, where nothing
    /// crosses a network.
    Plain,
}

/// Which protocol a server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// IMAP, to read the mailbox.
    Imap,
    /// SMTP submission, to send.
    Smtp,
}

/// A mail server: protocol, protection, host and port.
///
/// ```
/// use capstan_host::net::mail::{MailServer, Protocol, Security};
///
/// let imap: MailServer = "imaps://imap.example.org".parse().unwrap();
/// assert_eq!((imap.protocol, imap.security, imap.port), (Protocol::Imap, Security::Tls, 993));
/// let smtp: MailServer = "smtp+starttls://smtp.example.org".parse().unwrap();
/// assert_eq!(smtp.port, 587);
/// // Passwords in plain text go to loopback only.
/// assert!("imap://imap.example.org".parse::<MailServer>().is_err());
/// assert!("imap://127.0.0.1:11143".parse::<MailServer>().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MailServer {
    /// IMAP or SMTP.
    pub protocol: Protocol,
    /// TLS, STARTTLS or plain.
    pub security: Security,
    /// The host name or address.
    pub host: String,
    /// The port.
    pub port: u16,
}

impl FromStr for MailServer {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (scheme, rest) = text.split_once("://").ok_or_else(|| {
            format!(
                "`{text}` is not a server URL such as imaps://imap.example.org or \
                 smtps://smtp.example.org"
            )
        })?;
        let (protocol, security, default_port) = match scheme {
            "imaps" => (Protocol::Imap, Security::Tls, 993),
            "imap" => (Protocol::Imap, Security::Plain, 143),
            "smtps" => (Protocol::Smtp, Security::Tls, 465),
            "smtp+starttls" => (Protocol::Smtp, Security::StartTls, 587),
            "smtp" => (Protocol::Smtp, Security::Plain, 25),
            other => {
                return Err(format!(
                    "`{other}://` is not one of imaps://, imap://, smtps://, smtp+starttls:// \
                     or smtp://"
                ));
            }
        };
        let authority = rest.trim_end_matches('/');
        if authority.is_empty() || authority.contains(['/', '@', '?', '#']) {
            return Err(format!(
                "`{text}`: give only the host and port (the user and password go in \
                 `user` and `password`)"
            ));
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) if !host.ends_with(':') => (
                host,
                port.parse::<u16>()
                    .map_err(|_| format!("`{text}`: `{port}` is not a port"))?,
            ),
            _ => (authority, default_port),
        };
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        if security == Security::Plain && !is_loopback(&host) {
            return Err(format!(
                "`{text}` would send the password in plain text across a network; use \
                 {}:// (or smtp+starttls://), or a loopback address",
                match protocol {
                    Protocol::Imap => "imaps",
                    Protocol::Smtp => "smtps",
                }
            ));
        }
        Ok(MailServer {
            protocol,
            security,
            host,
            port,
        })
    }
}

impl fmt::Display for MailServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match (self.protocol, self.security) {
            (Protocol::Imap, Security::Tls) => "imaps",
            (Protocol::Imap, _) => "imap",
            (Protocol::Smtp, Security::Tls) => "smtps",
            (Protocol::Smtp, Security::StartTls) => "smtp+starttls",
            (Protocol::Smtp, Security::Plain) => "smtp",
        };
        if self.host.contains(':') {
            write!(f, "{scheme}://[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{scheme}://{}:{}", self.host, self.port)
        }
    }
}

/// Whether `host` is a loopback address or `localhost`.
fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_are_read_with_their_default_ports_and_refused_when_unsafe() {
        let s: MailServer = "smtp://[::1]:2525".parse().unwrap();
        assert_eq!((s.host.as_str(), s.port), ("::1", 2525));
        assert_eq!(s.to_string(), "smtp://[::1]:2525");
        for bad in [
            "imap.example.org",
            "pop3://x",
            "imaps://user:pw@imap.example.org",
            "smtps://smtp.example.org:99999",
            "smtp://mail.example.org",
        ] {
            assert!(bad.parse::<MailServer>().is_err(), "{bad}");
        }
    }
}
