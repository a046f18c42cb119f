//! What a request brings back.

/// A response: its status, headers and body (read up to the request's limit).
///
/// ```
/// use capstan_sdk::http::Response;
///
/// let response = Response {
///     status: 200,
///     headers: vec![("content-type".into(), "text/plain; charset=utf-8".into())],
///     body: b"hello".to_vec(),
///     truncated: false,
/// };
/// assert!(response.is_success());
/// assert_eq!(response.header("Content-Type"), Some("text/plain; charset=utf-8"));
/// assert_eq!(response.text(), "hello");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code, e.g. 200 or 404.
    pub status: u16,
    /// The headers in the order received, names lowercase, values decoded as UTF-8
    /// (lossily: an invalid byte becomes U+FFFD). A repeated header appears once per value.
    pub headers: Vec<(String, String)>,
    /// The body, at most the request's
    /// [`max_response_bytes`](super::Request::max_response_bytes).
    pub body: Vec<u8>,
    /// Whether the body went on past the limit: `body` then holds only its beginning.
    pub truncated: bool,
}

impl Response {
    /// The first value of header `name` (any case), if present.
    ///
    /// ```
    /// # use capstan_sdk::http::Response;
    /// let response = Response {
    ///     status: 302,
    ///     headers: vec![("location".into(), "/next".into())],
    ///     body: Vec::new(),
    ///     truncated: false,
    /// };
    /// assert_eq!(response.header("Location"), Some("/next"));
    /// assert_eq!(response.header("etag"), None);
    /// ```
    pub fn header(&self, name: &str) -> Option<&str> {
        self.header_values(name).next()
    }

    /// Every value of header `name` (any case), in the order received.
    ///
    /// ```
    /// # use capstan_sdk::http::Response;
    /// let response = Response {
    ///     status: 200,
    ///     headers: vec![("vary".into(), "accept".into()), ("vary".into(), "origin".into())],
    ///     body: Vec::new(),
    ///     truncated: false,
    /// };
    /// assert_eq!(response.header_values("Vary").collect::<Vec<_>>(), ["accept", "origin"]);
    /// ```
    pub fn header_values<'a, 'n>(
        &'a self,
        name: &'n str,
    ) -> impl Iterator<Item = &'a str> + use<'a, 'n> {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as text, decoded as UTF-8 lossily (an invalid byte, or a character cut at
    /// the limit, becomes U+FFFD).
    ///
    /// ```
    /// # use capstan_sdk::http::Response;
    /// let response = Response { status: 200, headers: vec![], body: vec![b'a', 0xff], truncated: false };
    /// assert_eq!(response.text(), "a\u{fffd}");
    /// ```
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Whether the status is 2xx.
    ///
    /// ```
    /// # use capstan_sdk::http::Response;
    /// let response = Response { status: 204, headers: vec![], body: vec![], truncated: false };
    /// assert!(response.is_success());
    /// ```
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// Whether the status is a redirect (3xx); see [`Response::header`] for its `location`.
    ///
    /// ```
    /// # use capstan_sdk::http::Response;
    /// let response = Response { status: 301, headers: vec![], body: vec![], truncated: false };
    /// assert!(response.is_redirect());
    /// ```
    pub fn is_redirect(&self) -> bool {
        (300..400).contains(&self.status)
    }
}
