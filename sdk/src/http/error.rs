//! Why a request failed, in words a model (or a person) can act on.

use std::fmt;

use wasip2::http::types::ErrorCode;

use crate::ToolError;

/// How every message of a request the host refused begins. The rest says which grant or limit
/// refused it and which configuration line would allow it.
pub const REFUSAL_PREFIX: &str = "capstan refused this request:";

/// Why [`Request::send`](super::Request::send) failed. The message says what failed; a
/// refusal's message is the host's, as is.
///
/// `?` in a tool handler turns it into a [`ToolError`]: a bad URL or request into
/// [`ToolError::InvalidArgs`], a refusal into [`ToolError::Denied`], anything else into
/// [`ToolError::Failed`].
///
/// ```
/// use capstan_sdk::http::{HttpError, Request};
/// use capstan_sdk::ToolError;
///
/// let err = Request::get("gopher://example.com/").send().unwrap_err();
/// assert!(matches!(err, HttpError::InvalidUrl(_)));
/// assert!(matches!(ToolError::from(err), ToolError::InvalidArgs(_)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpError {
    /// The URL cannot be requested: not http(s), no host, a bad port...
    InvalidUrl(String),
    /// The method, a header or the body cannot be sent as given.
    InvalidRequest(String),
    /// The host refused the request: no `net:` grant covers it, or a limit of the host's.
    /// The message starts with [`REFUSAL_PREFIX`].
    Refused(String),
    /// The request was sent, or tried, and failed: DNS, connection, TLS, timeout, protocol.
    Failed(String),
}

impl HttpError {
    /// The message, without the kind.
    ///
    /// ```
    /// use capstan_sdk::http::HttpError;
    /// assert_eq!(HttpError::Failed("connection refused".into()).message(), "connection refused");
    /// ```
    pub fn message(&self) -> &str {
        match self {
            HttpError::InvalidUrl(m)
            | HttpError::InvalidRequest(m)
            | HttpError::Refused(m)
            | HttpError::Failed(m) => m,
        }
    }

    /// The error for a `wasi:http` error code met while doing `what` (e.g.
    /// `GET https://example.com/`). The host's own message (`internal-error(some(..))`) is
    /// kept as is; any other code is named in words.
    pub(crate) fn from_code(code: &ErrorCode, what: &str) -> HttpError {
        match code {
            ErrorCode::InternalError(Some(message)) if message.starts_with(REFUSAL_PREFIX) => {
                HttpError::Refused(message.clone())
            }
            ErrorCode::InternalError(Some(message)) => HttpError::Failed(message.clone()),
            other => HttpError::Failed(format!("{what} failed: {}", describe(other))),
        }
    }
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for HttpError {}

impl From<HttpError> for ToolError {
    fn from(err: HttpError) -> Self {
        match err {
            HttpError::InvalidUrl(m) | HttpError::InvalidRequest(m) => ToolError::InvalidArgs(m),
            HttpError::Refused(m) => ToolError::Denied(m),
            HttpError::Failed(m) => ToolError::Failed(m),
        }
    }
}

/// A `wasi:http` error code in words.
pub(crate) fn describe(code: &ErrorCode) -> String {
    let bytes = |limit: &Option<u64>| match limit {
        Some(n) => format!(" ({n} bytes)"),
        None => String::new(),
    };
    let section = |limit: &Option<u32>| match limit {
        Some(n) => format!(" ({n} bytes)"),
        None => String::new(),
    };
    let field = |name: &Option<String>| match name {
        Some(name) => format!(" `{name}`"),
        None => String::new(),
    };
    let coding = |name: &Option<String>| match name {
        Some(name) => format!(" `{name}`"),
        None => String::new(),
    };
    match code {
        ErrorCode::DnsTimeout => "the DNS lookup timed out".into(),
        ErrorCode::DnsError(p) => {
            let mut text = String::from("the DNS lookup failed");
            if let Some(rcode) = &p.rcode {
                text.push_str(&format!(" ({rcode})"));
            }
            text
        }
        ErrorCode::DestinationNotFound => "no such host: the name does not resolve".into(),
        ErrorCode::DestinationUnavailable => "the destination is unavailable".into(),
        ErrorCode::DestinationIpProhibited => "the destination IP address is prohibited".into(),
        ErrorCode::DestinationIpUnroutable => "the destination IP address is unroutable".into(),
        ErrorCode::ConnectionRefused => "connection refused".into(),
        ErrorCode::ConnectionTerminated => "the connection was closed unexpectedly".into(),
        ErrorCode::ConnectionTimeout => "connecting timed out".into(),
        ErrorCode::ConnectionReadTimeout => "reading from the connection timed out".into(),
        ErrorCode::ConnectionWriteTimeout => "writing to the connection timed out".into(),
        ErrorCode::ConnectionLimitReached => "too many connections are open".into(),
        ErrorCode::TlsProtocolError => "TLS protocol error".into(),
        ErrorCode::TlsCertificateError => "the server's TLS certificate was not accepted".into(),
        ErrorCode::TlsAlertReceived(p) => {
            let mut text = String::from("the server ended TLS with an alert");
            if let Some(id) = p.alert_id {
                text.push_str(&format!(" {id}"));
            }
            if let Some(message) = &p.alert_message {
                text.push_str(&format!(": {message}"));
            }
            text
        }
        ErrorCode::HttpRequestDenied => "the request was denied".into(),
        ErrorCode::HttpRequestLengthRequired => "the server requires a content-length".into(),
        ErrorCode::HttpRequestBodySize(n) => {
            format!("the request body is over the limit{}", bytes(n))
        }
        ErrorCode::HttpRequestMethodInvalid => "the method is not valid".into(),
        ErrorCode::HttpRequestUriInvalid => "the URL is not valid".into(),
        ErrorCode::HttpRequestUriTooLong => "the URL is too long".into(),
        ErrorCode::HttpRequestHeaderSectionSize(n) => {
            format!("the request headers are over the limit{}", section(n))
        }
        ErrorCode::HttpRequestHeaderSize(p) => format!(
            "request header{} is over the limit",
            field(&p.as_ref().and_then(|p| p.field_name.clone()))
        ),
        ErrorCode::HttpRequestTrailerSectionSize(n) => {
            format!("the request trailers are over the limit{}", section(n))
        }
        ErrorCode::HttpRequestTrailerSize(p) => {
            format!("request trailer{} is over the limit", field(&p.field_name))
        }
        ErrorCode::HttpResponseIncomplete => "the response ended before it was complete".into(),
        ErrorCode::HttpResponseHeaderSectionSize(n) => {
            format!("the response headers are over the limit{}", section(n))
        }
        ErrorCode::HttpResponseHeaderSize(p) => {
            format!("response header{} is over the limit", field(&p.field_name))
        }
        ErrorCode::HttpResponseBodySize(n) => {
            format!("the response body is over the limit{}", bytes(n))
        }
        ErrorCode::HttpResponseTrailerSectionSize(n) => {
            format!("the response trailers are over the limit{}", section(n))
        }
        ErrorCode::HttpResponseTrailerSize(p) => {
            format!("response trailer{} is over the limit", field(&p.field_name))
        }
        ErrorCode::HttpResponseTransferCoding(c) => {
            format!(
                "the response's transfer coding{} is not supported",
                coding(c)
            )
        }
        ErrorCode::HttpResponseContentCoding(c) => {
            format!(
                "the response's content coding{} is not supported",
                coding(c)
            )
        }
        ErrorCode::HttpResponseTimeout => "the server did not answer in time".into(),
        ErrorCode::HttpUpgradeFailed => "the protocol upgrade failed".into(),
        ErrorCode::HttpProtocolError => "HTTP protocol error".into(),
        ErrorCode::LoopDetected => "a request loop was detected".into(),
        ErrorCode::ConfigurationError => "the host's HTTP client is misconfigured".into(),
        ErrorCode::InternalError(Some(message)) => message.clone(),
        ErrorCode::InternalError(None) => "internal error in the host's HTTP client".into(),
    }
}

#[cfg(test)]
mod tests {
    use wasip2::http::types::{DnsErrorPayload, FieldSizePayload, TlsAlertReceivedPayload};

    use super::*;

    const WHAT: &str = "GET https://example.com/";

    #[test]
    fn the_hosts_refusal_is_shown_as_is_and_becomes_denied() {
        let message = format!(
            "{REFUSAL_PREFIX} no grant allows GET https://example.com:443; a grant of \
             `net:example.com` in profiles.worker.capabilities would allow it"
        );
        let err = HttpError::from_code(&ErrorCode::InternalError(Some(message.clone())), WHAT);
        assert_eq!(err, HttpError::Refused(message.clone()));
        assert_eq!(err.to_string(), message);
        assert_eq!(ToolError::from(err), ToolError::Denied(message));
    }

    #[test]
    fn another_internal_error_message_is_shown_as_is_but_is_a_failure() {
        let err = HttpError::from_code(&ErrorCode::InternalError(Some("boom".into())), WHAT);
        assert_eq!(err, HttpError::Failed("boom".into()));
        let err = HttpError::from_code(&ErrorCode::InternalError(None), WHAT);
        assert_eq!(
            err.to_string(),
            "GET https://example.com/ failed: internal error in the host's HTTP client"
        );
    }

    #[test]
    fn other_codes_are_named_in_words_after_the_request() {
        let cases = [
            (ErrorCode::ConnectionRefused, "connection refused"),
            (
                ErrorCode::HttpResponseBodySize(Some(10)),
                "the response body is over the limit (10 bytes)",
            ),
            (
                ErrorCode::HttpResponseBodySize(None),
                "the response body is over the limit",
            ),
            (
                ErrorCode::DnsError(DnsErrorPayload {
                    rcode: Some("NXDOMAIN".into()),
                    info_code: None,
                }),
                "the DNS lookup failed (NXDOMAIN)",
            ),
            (
                ErrorCode::TlsAlertReceived(TlsAlertReceivedPayload {
                    alert_id: Some(40),
                    alert_message: Some("handshake failure".into()),
                }),
                "the server ended TLS with an alert 40: handshake failure",
            ),
            (
                ErrorCode::HttpRequestHeaderSize(Some(FieldSizePayload {
                    field_name: Some("cookie".into()),
                    field_size: Some(9000),
                })),
                "request header `cookie` is over the limit",
            ),
            (
                ErrorCode::HttpResponseContentCoding(Some("br".into())),
                "the response's content coding `br` is not supported",
            ),
            (
                ErrorCode::DestinationNotFound,
                "no such host: the name does not resolve",
            ),
        ];
        for (code, words) in cases {
            let err = HttpError::from_code(&code, WHAT);
            assert_eq!(err, HttpError::Failed(format!("{WHAT} failed: {words}")));
        }
    }

    #[test]
    fn each_kind_maps_to_the_tool_error_a_model_can_act_on() {
        let m = || "m".to_string();
        assert_eq!(
            ToolError::from(HttpError::InvalidUrl(m())),
            ToolError::InvalidArgs(m())
        );
        assert_eq!(
            ToolError::from(HttpError::InvalidRequest(m())),
            ToolError::InvalidArgs(m())
        );
        assert_eq!(
            ToolError::from(HttpError::Failed(m())),
            ToolError::Failed(m())
        );
    }
}
