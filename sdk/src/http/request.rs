//! Building a request and sending it.

use std::time::Duration;

use super::method::is_token;
use super::{HttpError, Method, REFUSAL_PREFIX, Response, Url, transport};

/// The response body a [`Request`] reads unless told otherwise: 1 MiB, as much as the host
/// passes on from a tool anyway.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 1024 * 1024;

/// An HTTP request, built step by step and sent with [`Request::send`].
///
/// Nothing is checked until `send`: a bad URL, method or header comes back from it as
/// [`HttpError::InvalidUrl`] or [`HttpError::InvalidRequest`], so a chain of builder
/// calls needs no `?` in the middle.
///
/// ```no_run
/// use capstan_sdk::http::{Method, Request};
/// use std::time::Duration;
///
/// # fn run() -> Result<(), capstan_sdk::http::HttpError> {
/// let response = Request::new(Method::Post, "https://api.example.com/v1/notes")
///     .header("content-type", "application/json")
///     .body(r#"{"text": "hello"}"#)
///     .max_response_bytes(64 * 1024)
///     .timeout(Duration::from_secs(5))
///     .send()?;
/// println!("{} {}", response.status, response.text());
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Request {
    method: Method,
    url: Result<Url, HttpError>,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    max_response_bytes: usize,
    timeout: Option<Duration>,
}

impl Request {
    /// A `method` request to `url` (an absolute http or https URL), with no headers and no
    /// body.
    ///
    /// ```
    /// use capstan_sdk::http::{Method, Request};
    ///
    /// let request = Request::new(Method::Delete, "https://api.example.com/items/7");
    /// assert_eq!(request.method(), &Method::Delete);
    /// assert_eq!(request.url().unwrap().host(), "api.example.com");
    /// ```
    pub fn new(method: Method, url: &str) -> Request {
        Request::to(method, Url::parse(url))
    }

    /// A `method` request to a [`Url`] parsed (or [joined](Url::join)) already.
    ///
    /// ```
    /// use capstan_sdk::http::{Method, Request, Url};
    ///
    /// let base = Url::parse("https://example.com/docs/").unwrap();
    /// let request = Request::with_url(Method::Get, base.join("intro").unwrap());
    /// assert_eq!(request.url().unwrap().path_and_query(), "/docs/intro");
    /// ```
    pub fn with_url(method: Method, url: Url) -> Request {
        Request::to(method, Ok(url))
    }

    fn to(method: Method, url: Result<Url, HttpError>) -> Request {
        Request {
            method,
            url,
            headers: Vec::new(),
            body: Vec::new(),
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            timeout: None,
        }
    }

    /// A `GET` request to `url`.
    ///
    /// ```
    /// use capstan_sdk::http::{Method, Request};
    /// assert_eq!(Request::get("https://example.com/").method(), &Method::Get);
    /// ```
    pub fn get(url: &str) -> Request {
        Request::new(Method::Get, url)
    }

    /// A `POST` request to `url`.
    ///
    /// ```
    /// use capstan_sdk::http::{Method, Request};
    /// assert_eq!(Request::post("https://example.com/").method(), &Method::Post);
    /// ```
    pub fn post(url: &str) -> Request {
        Request::new(Method::Post, url)
    }

    /// Adds header `name: value`. Repeating a name sends the header several times.
    ///
    /// The host may forbid some names (`host`, `connection`, `transfer-encoding`, and any
    /// header it sets itself, such as the credentials it injects); `send` then names it.
    ///
    /// ```
    /// use capstan_sdk::http::Request;
    /// let request = Request::get("https://example.com/").header("accept", "text/html");
    /// # let _ = request;
    /// ```
    pub fn header(mut self, name: &str, value: impl AsRef<[u8]>) -> Request {
        self.headers
            .push((name.to_owned(), value.as_ref().to_vec()));
        self
    }

    /// Sets the body, sent as is with a `content-length`.
    ///
    /// ```
    /// use capstan_sdk::http::Request;
    /// let request = Request::post("https://example.com/hook").body("payload");
    /// # let _ = request;
    /// ```
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Request {
        self.body = body.into();
        self
    }

    /// Reads at most `limit` bytes of the response body (default
    /// [`DEFAULT_MAX_RESPONSE_BYTES`]). A longer body is cut there, the rest is not read,
    /// and [`Response::truncated`] says so.
    ///
    /// ```
    /// use capstan_sdk::http::Request;
    /// let request = Request::get("https://example.com/big").max_response_bytes(4096);
    /// # let _ = request;
    /// ```
    pub fn max_response_bytes(mut self, limit: usize) -> Request {
        self.max_response_bytes = limit;
        self
    }

    /// Gives up when connecting, the first byte of the answer, or any pause between two
    /// pieces of it takes longer than `timeout`. The call's own deadline bounds the whole
    /// request in any case; a host that does not support timeouts ignores this.
    ///
    /// ```
    /// use capstan_sdk::http::Request;
    /// use std::time::Duration;
    /// let request = Request::get("https://example.com/").timeout(Duration::from_secs(3));
    /// # let _ = request;
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> Request {
        self.timeout = Some(timeout);
        self
    }

    /// The method.
    ///
    /// ```
    /// use capstan_sdk::http::{Method, Request};
    /// assert_eq!(Request::get("https://example.com/").method(), &Method::Get);
    /// ```
    pub fn method(&self) -> &Method {
        &self.method
    }

    /// The URL, or why it cannot be requested.
    ///
    /// ```
    /// use capstan_sdk::http::Request;
    /// assert!(Request::get("https://example.com/").url().is_ok());
    /// assert!(Request::get("file:///etc/passwd").url().is_err());
    /// ```
    pub fn url(&self) -> Result<&Url, &HttpError> {
        self.url.as_ref()
    }

    /// Sends the request and waits for the response, reading its body up to the limit.
    ///
    /// A status of 4xx or 5xx is a [`Response`], not an error; redirects are not followed.
    /// Errors: [`HttpError::InvalidUrl`] or [`HttpError::InvalidRequest`] for what cannot be
    /// sent, [`HttpError::Refused`] when the host's grants do not allow the request, and
    /// [`HttpError::Failed`] for DNS, connection, TLS and protocol failures.
    ///
    /// ```no_run
    /// use capstan_sdk::http::Request;
    ///
    /// # fn run() -> Result<(), capstan_sdk::ToolError> {
    /// let response = Request::get("https://example.com/").send()?;
    /// if response.truncated {
    ///     // Say so to the model: it saw only the first part.
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn send(self) -> Result<Response, HttpError> {
        let url = self.url?;
        // A call without a `net:` rule has no HTTP linked: the host would stop it. Say why
        // instead, as an error the tool can return.
        if let Some((false, held)) = crate::context::current_holds_net() {
            return Err(HttpError::Refused(format!(
                "{REFUSAL_PREFIX} {} {url}: this call holds no network grant (it runs with: \
                 {held}); declare `net:HOST` with `.needs(...)` and grant it in its process's \
                 profile (`net = [\"HOST\"]`); `capstan policy --why KIND TOOL URL` shows what \
                 is missing",
                self.method
            )));
        }
        check_headers(&self.headers)?;
        let mut headers = self.headers;
        let has_length = headers
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case("content-length"));
        if !has_length && (!self.body.is_empty() || self.method.expects_body()) {
            headers.push((
                "content-length".into(),
                self.body.len().to_string().into_bytes(),
            ));
        }
        transport::send(transport::Outgoing {
            method: &self.method,
            url: &url,
            headers: &headers,
            body: &self.body,
            max_response_bytes: self.max_response_bytes,
            timeout: self.timeout,
        })
    }
}

/// Checks names and values before the host sees them, to say which header is wrong and why.
fn check_headers(headers: &[(String, Vec<u8>)]) -> Result<(), HttpError> {
    for (name, value) in headers {
        if !is_token(name) {
            return Err(HttpError::InvalidRequest(format!(
                "`{name}` is not a valid header name: use letters, digits and \
                 !#$%&'*+-.^_`|~, with no spaces or colons"
            )));
        }
        if value.iter().any(|&b| b == b'\r' || b == b'\n' || b == 0) {
            return Err(HttpError::InvalidRequest(format!(
                "the value of header `{name}` has a line break or a NUL byte, which a header \
                 cannot carry"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid_request(result: Result<Response, HttpError>) -> String {
        match result {
            Err(HttpError::InvalidRequest(m)) => m,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_bad_url_is_reported_by_send() {
        let err = Request::get("ftp://example.com/").send().unwrap_err();
        assert!(
            matches!(&err, HttpError::InvalidUrl(m) if m.contains("only http and https")),
            "{err:?}"
        );
    }

    #[test]
    fn bad_header_names_and_values_are_named() {
        let m = invalid_request(
            Request::get("https://example.com/")
                .header("bad name", "x")
                .send(),
        );
        assert!(m.contains("`bad name`"), "{m}");
        let m = invalid_request(
            Request::get("https://example.com/")
                .header("x-ok", "a\r\nx-evil: 1")
                .send(),
        );
        assert!(m.contains("`x-ok`") && m.contains("line break"), "{m}");
    }

    #[test]
    #[cfg(not(target_arch = "wasm32"))]
    fn outside_a_component_send_fails_without_panicking() {
        let err = Request::get("https://example.com/").send().unwrap_err();
        assert!(
            matches!(&err, HttpError::Failed(m) if m.contains("wasm32")),
            "{err:?}"
        );
    }
}
