//! Request methods.

use std::fmt;
use std::str::FromStr;

use super::HttpError;

/// An HTTP request method.
///
/// Parsing accepts the standard methods in any case and returns them canonical; any other
/// valid token is kept as [`Method::Other`], as written.
///
/// ```
/// use capstan_sdk::http::Method;
///
/// assert_eq!("post".parse::<Method>().unwrap(), Method::Post);
/// assert_eq!(Method::Patch.as_str(), "PATCH");
/// assert_eq!("PROPFIND".parse::<Method>().unwrap(), Method::Other("PROPFIND".into()));
/// assert!("GET /".parse::<Method>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Method {
    /// `GET`
    Get,
    /// `HEAD`
    Head,
    /// `POST`
    Post,
    /// `PUT`
    Put,
    /// `DELETE`
    Delete,
    /// `CONNECT`
    Connect,
    /// `OPTIONS`
    Options,
    /// `TRACE`
    Trace,
    /// `PATCH`
    Patch,
    /// Any other method token, e.g. `PROPFIND`.
    Other(String),
}

impl Method {
    const STANDARD: [Method; 9] = [
        Method::Get,
        Method::Head,
        Method::Post,
        Method::Put,
        Method::Delete,
        Method::Connect,
        Method::Options,
        Method::Trace,
        Method::Patch,
    ];

    /// The method as sent on the wire.
    ///
    /// ```
    /// assert_eq!(capstan_sdk::http::Method::Get.as_str(), "GET");
    /// ```
    pub fn as_str(&self) -> &str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Delete => "DELETE",
            Method::Connect => "CONNECT",
            Method::Options => "OPTIONS",
            Method::Trace => "TRACE",
            Method::Patch => "PATCH",
            Method::Other(token) => token,
        }
    }

    /// Whether a request with this method usually carries a body, so that an empty one is
    /// still announced with `content-length: 0` (servers answer 411 otherwise).
    pub(crate) fn expects_body(&self) -> bool {
        matches!(self, Method::Post | Method::Put | Method::Patch)
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Method {
    type Err = HttpError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if let Some(standard) = Method::STANDARD
            .iter()
            .find(|m| m.as_str().eq_ignore_ascii_case(text))
        {
            return Ok(standard.clone());
        }
        if is_token(text) {
            Ok(Method::Other(text.to_owned()))
        } else {
            Err(HttpError::InvalidRequest(format!(
                "`{text}` is not an HTTP method: use GET, HEAD, POST, PUT, PATCH, DELETE or \
                 OPTIONS"
            )))
        }
    }
}

/// An RFC 9110 token: what a method or a header name is made of.
pub(crate) fn is_token(text: &str) -> bool {
    !text.is_empty()
        && text.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'!' | b'#'
                        | b'$'
                        | b'%'
                        | b'&'
                        | b'\''
                        | b'*'
                        | b'+'
                        | b'-'
                        | b'.'
                        | b'^'
                        | b'_'
                        | b'`'
                        | b'|'
                        | b'~'
                )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_methods_parse_in_any_case_and_others_stay_as_written() {
        for m in Method::STANDARD {
            assert_eq!(m.as_str().parse::<Method>().unwrap(), m);
            assert_eq!(m.as_str().to_lowercase().parse::<Method>().unwrap(), m);
        }
        assert_eq!(
            "MkCol".parse::<Method>().unwrap(),
            Method::Other("MkCol".into())
        );
        for bad in ["", "GET /", "GE\nT", "ü"] {
            let err = bad.parse::<Method>().unwrap_err();
            assert!(
                matches!(&err, HttpError::InvalidRequest(m) if m.contains("not an HTTP method")),
                "{err:?}"
            );
        }
    }
}
