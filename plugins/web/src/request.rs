//! `http_request`: one HTTP request of the model's making, answered as JSON.

use std::collections::BTreeMap;

use capstan_sdk::http::{self, Request, Response};
use capstan_sdk::{Context, Json, ToolError};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::limits::body_limit;
use crate::text::decode;

/// The methods `http_request` sends. `CONNECT` and `TRACE` are left out: neither is an API
/// call.
#[derive(Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "UPPERCASE")]
pub enum RequestMethod {
    Get,
    Post,
    Put,
    Patch,
    Delete,
    Head,
    Options,
}

impl From<RequestMethod> for http::Method {
    fn from(method: RequestMethod) -> Self {
        match method {
            RequestMethod::Get => http::Method::Get,
            RequestMethod::Post => http::Method::Post,
            RequestMethod::Put => http::Method::Put,
            RequestMethod::Patch => http::Method::Patch,
            RequestMethod::Delete => http::Method::Delete,
            RequestMethod::Head => http::Method::Head,
            RequestMethod::Options => http::Method::Options,
        }
    }
}

/// Arguments of `http_request`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestArgs {
    /// The method: GET, POST, PUT, PATCH, DELETE, HEAD or OPTIONS.
    method: RequestMethod,
    /// The http:// or https:// URL.
    url: String,
    /// Request headers, name to value, e.g. {"accept": "application/json"}. No credentials:
    /// the host adds them.
    #[serde(default)]
    headers: Option<BTreeMap<String, String>>,
    /// The request body, sent as is (set a content-type header to say what it is).
    #[serde(default)]
    body: Option<String>,
    /// The most bytes of the response body to return. Default 262144 (256 KiB), at most
    /// 1048576.
    #[serde(default)]
    #[schemars(range(min = 1, max = 1048576))]
    max_bytes: Option<u64>,
}

/// What `http_request` returns.
#[derive(Serialize, Debug, PartialEq, Eq)]
pub struct Answer {
    status: u16,
    /// Lowercase names; a repeated header's values joined with ", ".
    headers: BTreeMap<String, String>,
    body: String,
    truncated: bool,
}

pub fn http_request(args: RequestArgs, _: &Context) -> Result<Json<Answer>, ToolError> {
    let limit = body_limit(args.max_bytes)?;
    let mut request = Request::new(args.method.into(), &args.url).max_response_bytes(limit);
    for (name, value) in args.headers.unwrap_or_default() {
        request = request.header(&name, value);
    }
    if let Some(body) = args.body {
        request = request.body(body);
    }
    Ok(Json(answer(request.send()?)))
}

fn answer(response: Response) -> Answer {
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in response.headers {
        headers
            .entry(name.to_ascii_lowercase())
            .and_modify(|joined| {
                joined.push_str(", ");
                joined.push_str(&value);
            })
            .or_insert(value);
    }
    Answer {
        status: response.status,
        headers,
        body: decode(&response.body, response.truncated),
        truncated: response.truncated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_headers_are_joined_and_names_lowercased() {
        let response = Response {
            status: 201,
            headers: vec![
                ("Vary".into(), "accept".into()),
                ("content-type".into(), "application/json".into()),
                ("vary".into(), "origin".into()),
            ],
            body: b"{\"id\": 7}".to_vec(),
            truncated: false,
        };
        let json = serde_json::to_value(answer(response)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "status": 201,
                "headers": {"content-type": "application/json", "vary": "accept, origin"},
                "body": "{\"id\": 7}",
                "truncated": false,
            })
        );
    }

    #[test]
    fn only_the_listed_methods_parse() {
        let args: RequestArgs =
            serde_json::from_str(r#"{"method": "PATCH", "url": "https://example.com/"}"#).unwrap();
        assert_eq!(args.method, RequestMethod::Patch);
        for bad in ["get", "TRACE", "CONNECT"] {
            let json = format!(r#"{{"method": "{bad}", "url": "https://example.com/"}}"#);
            let err = serde_json::from_str::<RequestArgs>(&json).err().unwrap();
            assert!(err.to_string().contains("unknown variant"), "{err}");
        }
    }

    #[test]
    fn a_bad_url_or_header_is_invalid_args() {
        let ctx = Context::new("test", "1", vec![]);
        let args = |json: &str| serde_json::from_str::<RequestArgs>(json).unwrap();
        let err = http_request(
            args(r#"{"method": "GET", "url": "file:///etc/passwd"}"#),
            &ctx,
        )
        .err()
        .unwrap();
        assert!(
            matches!(&err, ToolError::InvalidArgs(m) if m.contains("`file`")),
            "{err:?}"
        );
        let err = http_request(
            args(r#"{"method": "GET", "url": "https://example.com/", "headers": {"a b": "c"}}"#),
            &ctx,
        )
        .err()
        .unwrap();
        assert!(
            matches!(&err, ToolError::InvalidArgs(m) if m.contains("`a b`")),
            "{err:?}"
        );
        let err = http_request(
            args(r#"{"method": "GET", "url": "https://example.com/", "max_bytes": 0}"#),
            &ctx,
        )
        .err()
        .unwrap();
        assert!(matches!(&err, ToolError::InvalidArgs(_)), "{err:?}");
    }
}
