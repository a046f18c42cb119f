//! Capstan's web tools: `web_fetch` (a page's text) and `http_request` (any HTTP call).
//!
//! Both go through the host's `wasi:http`, which checks each request against the caller's
//! `net:` grants and adds the credentials a deployment binds to a host. The tools declare
//! any public host and any internal address (`net:*://*:*`, `net:*://{internal}:*`) and
//! any secret (`secret:*`): what a call may reach, and the keys its requests carry, are
//! what the caller grants.
//! Neither follows redirects, so every hop is a request the model asked for and the host
//! checked.

use capstan_sdk::{Capability, Tool, Toolbox};

mod content_type;
mod fetch;
mod limits;
mod request;
mod text;

/// `net:*://*:*` and `net:*://{internal}:*`: any public host, and any internal address a
/// caller's grant names, by either scheme and on any port. The caller's grants narrow it;
/// the tool itself goes wherever it is let. Built from their text, the contract, which
/// cannot fail to parse.
fn public_hosts() -> Capability {
    "net:*://*:*".parse().expect("`net:*://*:*` is a capability")
}

/// See [`public_hosts`].
fn internal_hosts() -> Capability {
    "net:*://{internal}:*".parse().expect("`net:*://{internal}:*` is a capability")
}

/// [`public_hosts`] for `GET` alone: what `web_fetch` does. A tool that only reads is a
/// read to the host's data-flow rules, so a worker that read an untrusted page may still
/// fetch the next one.
fn public_gets() -> Capability {
    "net:GET *://*:*".parse().expect("`net:GET *://*:*` is a capability")
}

/// [`internal_hosts`] for `GET` alone; see [`public_gets`].
fn internal_gets() -> Capability {
    "net:GET *://{internal}:*"
        .parse()
        .expect("`net:GET *://{internal}:*` is a capability")
}

/// `secret:*`: any secret the caller grants, none required. The host injects them; the
/// tool never reads them.
fn any_secret() -> Capability {
    "secret:*".parse().expect("`secret:*` is a capability")
}

fn tools() -> Toolbox {
    Toolbox::new()
        .tool(
            Tool::new(
                "web_fetch",
                "Fetches a web page or text document with GET and returns its text: HTML as \
                 is, plain text, JSON or XML. Binary content (images, PDF, archives) is \
                 refused, naming its type. Returns at most `max_bytes` (default 262144, at \
                 most 1048576); a longer document is cut and says so. Redirects are not \
                 followed: a redirect is reported with the URL it points to, which you can \
                 fetch next. The host decides which sites are reachable and adds any \
                 credentials a site needs itself: never put API keys or passwords in the URL.",
                fetch::web_fetch,
            )
            .needs(public_gets())
            .needs(internal_gets())
            .needs(any_secret()),
        )
        .tool(
            Tool::new(
                "http_request",
                "Sends one HTTP request (GET, POST, PUT, PATCH, DELETE, HEAD or OPTIONS) with \
                 optional headers and a text body, and returns JSON: {\"status\": number, \
                 \"headers\": {lowercase name: value}, \"body\": text, \"truncated\": bool}. \
                 Any status comes back as is, redirects included (they are not followed). The \
                 response body is cut at `max_bytes` (default 262144, at most 1048576). The \
                 host decides which hosts and methods are reachable and injects credentials \
                 (an authorization header, for instance) for the APIs it is configured for: \
                 never put API keys or tokens in the headers, the URL or the body. A refused \
                 request's error says which grant is missing.",
                request::http_request,
            )
            .needs(public_hosts())
            .needs(internal_hosts())
            .needs(any_secret()),
        )
}

capstan_sdk::export_plugin!(tools);
