//! `web_fetch`: a page's text, with GET.

use capstan_sdk::http::{Method, Request, Response, Url};
use capstan_sdk::{Context, ToolError};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::content_type::{essence, is_text, looks_like_text};
use crate::limits::{MAX_BYTES, body_limit};
use crate::text::{decode, status_line};

/// What `web_fetch` asks for: text, HTML first.
const ACCEPT: &str = "text/html, text/plain;q=0.9, application/json;q=0.9, application/xml;q=0.8, \
                      text/*;q=0.7, */*;q=0.1";

/// Arguments of `web_fetch`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FetchArgs {
    /// The http:// or https:// URL to fetch.
    url: String,
    /// The most bytes of the document to return. Default 262144 (256 KiB), at most 1048576.
    #[serde(default)]
    #[schemars(range(min = 1, max = 1048576))]
    max_bytes: Option<u64>,
}

pub fn web_fetch(args: FetchArgs, _: &Context) -> Result<String, ToolError> {
    let limit = body_limit(args.max_bytes)?;
    let url = Url::parse(&args.url)?;
    let response = Request::with_url(Method::Get, url.clone())
        .header("accept", ACCEPT)
        .max_response_bytes(limit)
        .send()?;
    page_text(&url, &response, limit)
}

/// The text `web_fetch` returns for `response`, or why it returns none.
fn page_text(url: &Url, response: &Response, limit: usize) -> Result<String, ToolError> {
    if response.is_redirect() {
        return Err(redirect_error(url, response));
    }
    if !response.is_success() {
        return Err(ToolError::failed(format!(
            "{url} answered {}{}",
            status_line(response.status),
            error_excerpt(response)
        )));
    }
    match response.header("content-type") {
        Some(content_type) if !is_text(content_type) => {
            return Err(ToolError::failed(format!(
                "{url} is `{}`, not text: web_fetch returns only text (text/*, JSON, XML)",
                essence(content_type)
            )));
        }
        None if !looks_like_text(&response.body) => {
            return Err(ToolError::failed(format!(
                "{url} has no content-type and its body looks binary: web_fetch returns only \
                 text"
            )));
        }
        _ => {}
    }
    let mut text = decode(&response.body, response.truncated);
    if response.truncated {
        text.push_str(&truncation_note(limit));
    }
    Ok(text)
}

fn redirect_error(url: &Url, response: &Response) -> ToolError {
    let status = status_line(response.status);
    match response.header("location") {
        Some(location) => {
            // A relative location is resolved, so the model can fetch it as given.
            let target = url
                .join(location)
                .map(|u| u.to_string())
                .unwrap_or_else(|_| location.to_owned());
            ToolError::failed(format!(
                "{url} redirects ({status}) to {target}; web_fetch does not follow redirects: \
                 fetch that URL if you want it"
            ))
        }
        None => ToolError::failed(format!(
            "{url} answered {status} without a location to go to"
        )),
    }
}

/// The start of an error page's text, which often says why.
fn error_excerpt(response: &Response) -> String {
    const EXCERPT_CHARS: usize = 300;
    let textual = response.header("content-type").is_none_or(is_text);
    if !textual || response.body.is_empty() {
        return String::new();
    }
    let text = decode(&response.body, true);
    let excerpt: String = text.trim().chars().take(EXCERPT_CHARS).collect();
    if excerpt.is_empty() {
        return String::new();
    }
    let more = if text.trim().chars().count() > EXCERPT_CHARS {
        "..."
    } else {
        ""
    };
    format!(": {excerpt}{more}")
}

fn truncation_note(limit: usize) -> String {
    if limit as u64 >= MAX_BYTES {
        format!(
            "\n\n[truncated: the document is longer than {limit} bytes, the most web_fetch \
             returns; only its beginning is shown]"
        )
    } else {
        format!(
            "\n\n[truncated: only the first {limit} bytes are shown; pass a larger `max_bytes` \
             (up to {MAX_BYTES}) to read more]"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url() -> Url {
        Url::parse("https://example.com/docs/page").unwrap()
    }

    fn response(status: u16, headers: &[(&str, &str)], body: &str, truncated: bool) -> Response {
        Response {
            status,
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            body: body.as_bytes().to_vec(),
            truncated,
        }
    }

    fn failed(result: Result<String, ToolError>) -> String {
        match result {
            Err(ToolError::Failed(m)) => m,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn text_comes_back_as_is() {
        let r = response(
            200,
            &[("content-type", "text/html; charset=utf-8")],
            "<p>hi</p>",
            false,
        );
        assert_eq!(page_text(&url(), &r, 100).unwrap(), "<p>hi</p>");
        let r = response(200, &[], "no type but text", false);
        assert_eq!(page_text(&url(), &r, 100).unwrap(), "no type but text");
    }

    #[test]
    fn a_cut_document_says_so_and_how_to_read_more() {
        let r = response(200, &[("content-type", "text/plain")], "abcd", true);
        let text = page_text(&url(), &r, 4).unwrap();
        assert!(
            text.starts_with("abcd\n\n[truncated: only the first 4 bytes"),
            "{text}"
        );
        assert!(text.contains("`max_bytes`"), "{text}");
        let text = page_text(&url(), &r, MAX_BYTES as usize).unwrap();
        assert!(text.contains("the most web_fetch returns"), "{text}");
    }

    #[test]
    fn binary_content_is_refused_naming_its_type() {
        let r = response(
            200,
            &[("content-type", "image/png; x=1")],
            "\u{0}PNG",
            false,
        );
        let m = failed(page_text(&url(), &r, 100));
        assert!(m.contains("`image/png`") && m.contains("not text"), "{m}");
        let r = response(200, &[], "\u{0}\u{1}", false);
        let m = failed(page_text(&url(), &r, 100));
        assert!(m.contains("looks binary"), "{m}");
    }

    #[test]
    fn a_redirect_names_its_target_resolved() {
        let r = response(301, &[("location", "../moved?x=1")], "", false);
        let m = failed(page_text(&url(), &r, 100));
        assert!(
            m.contains("301 Moved Permanently") && m.contains("https://example.com/moved?x=1"),
            "{m}"
        );
        let r = response(302, &[], "", false);
        let m = failed(page_text(&url(), &r, 100));
        assert!(m.contains("without a location"), "{m}");
    }

    #[test]
    fn an_error_status_is_named_with_the_start_of_its_page() {
        let r = response(
            404,
            &[("content-type", "text/plain")],
            "  no such page  ",
            false,
        );
        let m = failed(page_text(&url(), &r, 100));
        assert_eq!(
            m,
            "https://example.com/docs/page answered 404 Not Found: no such page"
        );
        let long = "x".repeat(1000);
        let r = response(500, &[], &long, false);
        let m = failed(page_text(&url(), &r, 2000));
        assert!(m.ends_with("..."), "{m}");
        let r = response(503, &[("content-type", "image/gif")], "GIF89a", false);
        let m = failed(page_text(&url(), &r, 100));
        assert_eq!(
            m,
            "https://example.com/docs/page answered 503 Service Unavailable"
        );
    }
}
