//! Absolute http(s) URLs, split into the parts a `wasi:http` request takes.
//!
//! Only what an outgoing request needs: a scheme (http or https), a host, an optional port,
//! and the path with its query. The fragment is dropped (it never leaves the client).
//! Characters a request line cannot carry (spaces, non-ASCII, quotes...) are
//! percent-encoded; existing `%XX` escapes are kept as they are.

use std::fmt;
use std::str::FromStr;

use super::HttpError;

/// The scheme of a [`Url`]: the only two an outgoing request may use.
///
/// ```
/// use capstan_sdk::http::{Scheme, Url};
///
/// let url = Url::parse("HTTPS://example.com").unwrap();
/// assert_eq!(url.scheme(), Scheme::Https);
/// assert_eq!(Scheme::Https.default_port(), 443);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// `http://`, port 80 by default.
    Http,
    /// `https://`, port 443 by default.
    Https,
}

impl Scheme {
    /// `"http"` or `"https"`.
    ///
    /// ```
    /// assert_eq!(capstan_sdk::http::Scheme::Http.as_str(), "http");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }

    /// The port a URL of this scheme uses when it names none.
    ///
    /// ```
    /// assert_eq!(capstan_sdk::http::Scheme::Http.default_port(), 80);
    /// ```
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An absolute `http://` or `https://` URL.
///
/// ```
/// use capstan_sdk::http::Url;
///
/// let url = Url::parse("https://API.example.com:8443/v1/items?q=a b#top").unwrap();
/// assert_eq!(url.host(), "api.example.com");
/// assert_eq!(url.port(), Some(8443));
/// assert_eq!(url.authority(), "api.example.com:8443");
/// assert_eq!(url.path_and_query(), "/v1/items?q=a%20b");
/// assert_eq!(url.to_string(), "https://api.example.com:8443/v1/items?q=a%20b");
///
/// let err = Url::parse("ftp://example.com/file").unwrap_err();
/// assert!(err.to_string().contains("only http and https"), "{err}");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Url {
    scheme: Scheme,
    /// Lowercase; an IPv6 address keeps its brackets.
    host: String,
    port: Option<u16>,
    /// Starts with `/`; percent-encoded where needed.
    path_and_query: String,
}

impl Url {
    /// Parses an absolute http(s) URL. The error says what is wrong and how to write it.
    ///
    /// ```
    /// use capstan_sdk::http::Url;
    ///
    /// assert_eq!(Url::parse("http://example.com").unwrap().path_and_query(), "/");
    /// let err = Url::parse("example.com/page").unwrap_err();
    /// assert!(err.to_string().contains("https://example.com/page"), "{err}");
    /// ```
    pub fn parse(text: &str) -> Result<Url, HttpError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(invalid(
                "the URL is empty: give an absolute http:// or https:// URL",
            ));
        }
        let Some((scheme, rest)) = text.split_once("://") else {
            return Err(no_scheme(text));
        };
        let scheme = parse_scheme(scheme, text)?;
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(end);
        let (host, port) = parse_authority(authority, text)?;
        Ok(Url {
            scheme,
            host,
            port,
            path_and_query: path_and_query(path),
        })
    }

    /// The scheme.
    ///
    /// ```
    /// use capstan_sdk::http::{Scheme, Url};
    /// assert_eq!(Url::parse("http://a.example").unwrap().scheme(), Scheme::Http);
    /// ```
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The host, lowercase; an IPv6 address in brackets (`[::1]`).
    ///
    /// ```
    /// use capstan_sdk::http::Url;
    /// assert_eq!(Url::parse("http://[::1]:8080/").unwrap().host(), "[::1]");
    /// ```
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port the URL names, if any.
    ///
    /// ```
    /// use capstan_sdk::http::Url;
    /// assert_eq!(Url::parse("https://example.com/").unwrap().port(), None);
    /// ```
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// The port a request goes to: the one named, else the scheme's default.
    ///
    /// ```
    /// use capstan_sdk::http::Url;
    /// assert_eq!(Url::parse("https://example.com/").unwrap().port_or_default(), 443);
    /// ```
    pub fn port_or_default(&self) -> u16 {
        self.port.unwrap_or(self.scheme.default_port())
    }

    /// `host` or `host:port`, as the request's authority.
    ///
    /// ```
    /// use capstan_sdk::http::Url;
    /// assert_eq!(Url::parse("http://example.com:81/x").unwrap().authority(), "example.com:81");
    /// ```
    pub fn authority(&self) -> String {
        match self.port {
            Some(port) => format!("{}:{port}", self.host),
            None => self.host.clone(),
        }
    }

    /// The path and query, starting with `/`, percent-encoded where needed.
    ///
    /// ```
    /// use capstan_sdk::http::Url;
    /// assert_eq!(Url::parse("http://example.com?q=1").unwrap().path_and_query(), "/?q=1");
    /// ```
    pub fn path_and_query(&self) -> &str {
        &self.path_and_query
    }

    /// Resolves `reference` against this URL, as a browser resolves a link or a
    /// `location` header: absolute (`https://other.example/`), scheme-relative
    /// (`//other.example/`), absolute-path (`/docs`), query-only (`?page=2`) or relative
    /// (`../up`).
    ///
    /// ```
    /// use capstan_sdk::http::Url;
    ///
    /// let base = Url::parse("https://example.com/a/b/page?x=1").unwrap();
    /// assert_eq!(base.join("other").unwrap().to_string(), "https://example.com/a/b/other");
    /// assert_eq!(base.join("../up").unwrap().to_string(), "https://example.com/a/up");
    /// assert_eq!(base.join("/root").unwrap().to_string(), "https://example.com/root");
    /// assert_eq!(base.join("?x=2").unwrap().to_string(), "https://example.com/a/b/page?x=2");
    /// assert_eq!(base.join("//cdn.example/f").unwrap().to_string(), "https://cdn.example/f");
    /// ```
    pub fn join(&self, reference: &str) -> Result<Url, HttpError> {
        let reference = reference.trim();
        if reference.starts_with("//") {
            return Url::parse(&format!("{}:{reference}", self.scheme));
        }
        if has_scheme(reference) {
            return Url::parse(reference);
        }
        let reference = reference.split('#').next().unwrap_or_default();
        let (ref_path, ref_query) = split_query(reference);
        let (base_path, base_query) = split_query(&self.path_and_query);
        let path = if ref_path.is_empty() {
            base_path.to_owned()
        } else if ref_path.starts_with('/') {
            remove_dot_segments(ref_path)
        } else {
            let dir = &base_path[..base_path.rfind('/').map_or(0, |i| i + 1)];
            remove_dot_segments(&format!("{dir}{ref_path}"))
        };
        let query = if ref_path.is_empty() && ref_query.is_none() {
            base_query
        } else {
            ref_query
        };
        let joined = match query {
            Some(query) => format!("{path}?{query}"),
            None => path,
        };
        Ok(Url {
            path_and_query: path_and_query(&joined),
            ..self.clone()
        })
    }
}

impl fmt::Display for Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}://{}{}",
            self.scheme,
            self.authority(),
            self.path_and_query
        )
    }
}

impl FromStr for Url {
    type Err = HttpError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Url::parse(text)
    }
}

fn invalid(message: impl Into<String>) -> HttpError {
    HttpError::InvalidUrl(message.into())
}

/// The error for a URL without `://`: another scheme (`mailto:`), or none at all.
fn no_scheme(text: &str) -> HttpError {
    if let Some((scheme, rest)) = text.split_once(':') {
        // `localhost:8080/x` is a host and a port, not the scheme `localhost`.
        let port_follows = rest.starts_with(|c: char| c.is_ascii_digit());
        if is_scheme_token(scheme) && !port_follows {
            return invalid(format!(
                "`{text}` uses the scheme `{}`: only http and https URLs can be requested",
                scheme.to_ascii_lowercase()
            ));
        }
    }
    invalid(format!(
        "`{text}` is not an absolute URL: write the scheme and host, e.g. `https://{}`",
        text.trim_start_matches([':', '/'])
    ))
}

fn is_scheme_token(text: &str) -> bool {
    let mut chars = text.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// Whether a reference starts with `scheme:` (before any `/`, `?` or `#`).
fn has_scheme(reference: &str) -> bool {
    let end = reference.find(['/', '?', '#']).unwrap_or(reference.len());
    reference[..end]
        .split_once(':')
        .is_some_and(|(scheme, _)| is_scheme_token(scheme))
}

fn parse_scheme(scheme: &str, text: &str) -> Result<Scheme, HttpError> {
    match scheme.to_ascii_lowercase().as_str() {
        "http" => Ok(Scheme::Http),
        "https" => Ok(Scheme::Https),
        "" => Err(no_scheme(text)),
        other => Err(invalid(format!(
            "`{text}` uses the scheme `{other}`: only http and https URLs can be requested"
        ))),
    }
}

fn parse_authority(authority: &str, text: &str) -> Result<(String, Option<u16>), HttpError> {
    if authority.contains('@') {
        return Err(invalid(format!(
            "`{text}` has credentials before the host (`user@`): leave them out; the host \
             adds the credentials a request needs itself"
        )));
    }
    let (host, port) = if let Some(inner) = authority.strip_prefix('[') {
        let (address, after) = inner.split_once(']').ok_or_else(|| {
            invalid(format!(
                "`{text}` opens an IPv6 address with `[` but never closes it"
            ))
        })?;
        let valid = !address.is_empty()
            && address
                .chars()
                .all(|c| c.is_ascii_hexdigit() || matches!(c, ':' | '.'));
        if !valid {
            return Err(invalid(format!(
                "`[{address}]` in `{text}` is not an IPv6 address"
            )));
        }
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':').ok_or_else(|| {
                invalid(format!(
                    "`{text}` has `{after}` after the IPv6 address; only `:PORT` may follow it"
                ))
            })?),
        };
        (format!("[{}]", address.to_ascii_lowercase()), port)
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host.to_ascii_lowercase(), Some(port)),
            None => (authority.to_ascii_lowercase(), None),
        }
    };
    if host.is_empty() {
        return Err(invalid(format!("`{text}` has no host")));
    }
    check_host(&host, text)?;
    let port = match port {
        // `http://example.com:/` names no port (RFC 3986 allows the empty port).
        None | Some("") => None,
        Some(digits) => Some(parse_port(digits, text)?),
    };
    Ok((host, port))
}

fn check_host(host: &str, text: &str) -> Result<(), HttpError> {
    if host.starts_with('[') {
        return Ok(());
    }
    if !host.is_ascii() {
        return Err(invalid(format!(
            "the host `{host}` in `{text}` is not ASCII: write it in its ASCII (punycode) form, \
             e.g. `xn--bcher-kva.example` for `bücher.example`"
        )));
    }
    let valid = host
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
    if !valid {
        return Err(invalid(format!(
            "the host `{host}` in `{text}` has characters a host name cannot have (only \
             letters, digits, `-`, `.` and `_`)"
        )));
    }
    Ok(())
}

fn parse_port(digits: &str, text: &str) -> Result<u16, HttpError> {
    match digits.parse::<u16>() {
        Ok(port) if port > 0 && digits.bytes().all(|b| b.is_ascii_digit()) => Ok(port),
        _ => Err(invalid(format!(
            "the port `{digits}` in `{text}` is not a number from 1 to 65535"
        ))),
    }
}

/// `(path, query)` of `path?query`, without the `?`.
fn split_query(text: &str) -> (&str, Option<&str>) {
    match text.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (text, None),
    }
}

/// The path and query of a request from what follows the authority: the fragment dropped,
/// a `/` first, and what a request line cannot carry percent-encoded.
fn path_and_query(text: &str) -> String {
    let text = text.split('#').next().unwrap_or_default();
    let mut out = String::with_capacity(text.len() + 1);
    if !text.starts_with('/') {
        out.push('/');
    }
    for byte in text.bytes() {
        if needs_encoding(byte) {
            out.push_str(&format!("%{byte:02X}"));
        } else {
            out.push(byte as char);
        }
    }
    out
}

/// Bytes outside the characters RFC 3986 allows in a path or query (`%` stays: it
/// starts an escape the caller already wrote).
fn needs_encoding(byte: u8) -> bool {
    !byte.is_ascii_graphic()
        || matches!(
            byte,
            b'"' | b'<' | b'>' | b'\\' | b'^' | b'`' | b'{' | b'|' | b'}'
        )
}

/// RFC 3986's remove_dot_segments for an absolute path: `/a/b/../c/./d` is `/a/c/d`.
fn remove_dot_segments(path: &str) -> String {
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let last = segments.len().saturating_sub(1);
    let mut out: Vec<&str> = Vec::with_capacity(segments.len());
    for (i, segment) in segments.iter().enumerate() {
        match *segment {
            "." | ".." => {
                if *segment == ".." {
                    out.pop();
                }
                // A path ending in `.` or `..` names a directory: keep its trailing `/`.
                if i == last {
                    out.push("");
                }
            }
            other => out.push(other),
        }
    }
    format!("/{}", out.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> Url {
        Url::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn err(text: &str) -> String {
        match Url::parse(text) {
            Ok(u) => panic!("{text} parsed as {u:?}"),
            Err(HttpError::InvalidUrl(m)) => m,
            Err(other) => panic!("{text}: {other:?}"),
        }
    }

    #[test]
    fn a_url_splits_into_scheme_host_port_and_path() {
        let u = url("  https://Example.COM:8443/a/b?c=d&e#frag ");
        assert_eq!(u.scheme(), Scheme::Https);
        assert_eq!(u.host(), "example.com");
        assert_eq!(u.port(), Some(8443));
        assert_eq!(u.port_or_default(), 8443);
        assert_eq!(u.path_and_query(), "/a/b?c=d&e");
        assert_eq!(u.to_string(), "https://example.com:8443/a/b?c=d&e");

        let u = url("http://example.com");
        assert_eq!(
            (u.port(), u.port_or_default(), u.path_and_query()),
            (None, 80, "/")
        );
        assert_eq!(url("http://example.com?x").path_and_query(), "/?x");
        assert_eq!(url("http://example.com#top").path_and_query(), "/");
        assert_eq!(url("http://example.com:/").port(), None);
        assert_eq!(url("HTTP://h_1.example/").scheme(), Scheme::Http);
        assert_eq!(
            "http://a.example/".parse::<Url>().unwrap().host(),
            "a.example"
        );
    }

    #[test]
    fn ipv6_hosts_keep_their_brackets() {
        let u = url("http://[::1]:8080/x");
        assert_eq!((u.host(), u.port()), ("[::1]", Some(8080)));
        assert_eq!(u.authority(), "[::1]:8080");
        assert_eq!(url("https://[2001:DB8::1]").host(), "[2001:db8::1]");
        assert!(err("http://[::1/x").contains("never closes"));
        assert!(err("http://[::1]x/").contains("only `:PORT`"));
        assert!(err("http://[zz]/").contains("not an IPv6 address"));
    }

    #[test]
    fn characters_a_request_line_cannot_carry_are_percent_encoded() {
        assert_eq!(
            url("http://e.example/a b/ü?q=\"x\"|{y}").path_and_query(),
            "/a%20b/%C3%BC?q=%22x%22%7C%7By%7D"
        );
        // An escape already written stays as it is.
        assert_eq!(url("http://e.example/a%20b").path_and_query(), "/a%20b");
    }

    #[test]
    fn other_schemes_and_missing_schemes_are_refused_with_the_fix() {
        let m = err("ftp://example.com/file");
        assert!(
            m.contains("`ftp`") && m.contains("only http and https"),
            "{m}"
        );
        let m = err("mailto:someone@example.com");
        assert!(m.contains("`mailto`"), "{m}");
        let m = err("example.com/page");
        assert!(m.contains("https://example.com/page"), "{m}");
        let m = err("localhost:8080/x");
        assert!(m.contains("https://localhost:8080/x"), "{m}");
        let m = err("://example.com");
        assert!(m.contains("e.g. `https://example.com`"), "{m}");
        assert!(err("").contains("empty"));
        assert!(err("   ").contains("empty"));
    }

    #[test]
    fn bad_hosts_and_ports_are_named() {
        assert!(err("https:///path").contains("no host"));
        assert!(err("https://:80/").contains("no host"));
        let m = err("https://user:pw@example.com/");
        assert!(m.contains("credentials"), "{m}");
        let m = err("https://bücher.example/");
        assert!(m.contains("punycode"), "{m}");
        let m = err("https://a b.example/");
        assert!(m.contains("cannot have"), "{m}");
        for port in ["0", "65536", "-1", "+80", "http"] {
            let m = err(&format!("https://example.com:{port}/"));
            assert!(
                m.contains(&format!("`{port}`")) && m.contains("1 to 65535"),
                "{m}"
            );
        }
    }

    #[test]
    fn references_resolve_as_a_browser_resolves_links() {
        let base = url("http://a.example/b/c/d;p?q");
        let cases = [
            ("g", "http://a.example/b/c/g"),
            ("./g", "http://a.example/b/c/g"),
            ("g/", "http://a.example/b/c/g/"),
            ("/g", "http://a.example/g"),
            ("//g.example", "http://g.example/"),
            ("?y", "http://a.example/b/c/d;p?y"),
            ("g?y", "http://a.example/b/c/g?y"),
            ("#s", "http://a.example/b/c/d;p?q"),
            ("", "http://a.example/b/c/d;p?q"),
            (".", "http://a.example/b/c/"),
            ("..", "http://a.example/b/"),
            ("../g", "http://a.example/b/g"),
            ("../..", "http://a.example/"),
            ("../../../g", "http://a.example/g"),
            ("/./g", "http://a.example/g"),
            ("g/../h", "http://a.example/b/c/h"),
            ("https://other.example:444/x", "https://other.example:444/x"),
            ("next page", "http://a.example/b/c/next%20page"),
        ];
        for (reference, expected) in cases {
            assert_eq!(
                base.join(reference).unwrap().to_string(),
                expected,
                "{reference}"
            );
        }
        let m = base.join("ftp://files.example/").unwrap_err().to_string();
        assert!(m.contains("only http and https"), "{m}");
        // A port on the base carries over to a relative reference.
        let base = url("http://a.example:8080/x/y");
        assert_eq!(
            base.join("z").unwrap().to_string(),
            "http://a.example:8080/x/z"
        );
    }

    #[test]
    fn dot_segments_are_removed() {
        assert_eq!(remove_dot_segments("/a/b/c/./../../g"), "/a/g");
        assert_eq!(remove_dot_segments("/.."), "/");
        assert_eq!(remove_dot_segments("/a/.."), "/");
        assert_eq!(remove_dot_segments("/a/b/"), "/a/b/");
        assert_eq!(remove_dot_segments("/"), "/");
    }
}
