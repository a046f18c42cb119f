//! The `wasi:http` calls behind [`Request::send`](super::Request::send), made blocking.
//!
//! The order matters: the request is handed to the host before its body is written (the
//! host's body pipe is bounded, so writing a large body first would wait forever), and each
//! child resource (a stream, a pollable, a header list) is dropped before its parent, which
//! the component model requires.

use std::time::Duration;

use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    self as wasi, FutureIncomingResponse, HeaderError, IncomingResponse, OutgoingBody,
    OutgoingRequest, RequestOptions,
};
use wasip2::io::streams::StreamError;

use super::{HttpError, Method, Response, Scheme, Url};

/// `blocking-write-and-flush` takes at most 4096 bytes per call.
const WRITE_CHUNK: usize = 4096;

/// How much one read asks for.
const READ_CHUNK: usize = 64 * 1024;

/// A request checked by [`Request::send`](super::Request::send), ready to go.
pub(super) struct Outgoing<'a> {
    pub method: &'a Method,
    pub url: &'a Url,
    pub headers: &'a [(String, Vec<u8>)],
    pub body: &'a [u8],
    pub max_response_bytes: usize,
    pub timeout: Option<Duration>,
}

/// Sends `request` and reads the response.
pub(super) fn send(request: Outgoing<'_>) -> Result<Response, HttpError> {
    // Natively the bindings have no host behind them: say so instead of reaching their
    // `unreachable!()`. This keeps a plugin's native unit tests from panicking.
    if !cfg!(target_arch = "wasm32") {
        return Err(HttpError::Failed(format!(
            "{} {}: outbound HTTP needs the Capstan host; this code is not running as a \
             wasm32-wasip2 component",
            request.method, request.url
        )));
    }
    let what = format!("{} {}", request.method, request.url);
    let outgoing = build(&request)?;
    let body = outgoing
        .body()
        .map_err(|()| HttpError::Failed(format!("{what}: the request body was already taken")))?;
    let options = request.timeout.map(options);
    let future =
        outgoing_handler::handle(outgoing, options).map_err(|c| HttpError::from_code(&c, &what))?;
    let sent = write_body(&body, request.body, &what).and_then(|()| {
        OutgoingBody::finish(body, None).map_err(|c| HttpError::from_code(&c, &what))
    });
    // The response explains a failed upload best (the host's refusal, or a server that
    // answered early and closed), so it is awaited even then.
    let response = wait(&future, &what);
    drop(future);
    let response = match (response, sent) {
        (Ok(response), _) => response,
        (Err(err), Ok(())) => return Err(err),
        (Err(response_err), Err(sent_err)) => {
            return Err(match response_err {
                HttpError::Refused(_) => response_err,
                _ => sent_err,
            });
        }
    };
    read_response(response, request.max_response_bytes, &what)
}

/// The request resource with its method, URL and headers.
fn build(request: &Outgoing<'_>) -> Result<OutgoingRequest, HttpError> {
    let fields = wasi::Fields::new();
    for (name, value) in request.headers {
        fields
            .append(name, value)
            .map_err(|e| header_error(name, e))?;
    }
    let outgoing = OutgoingRequest::new(fields);
    let refused = |part: &str| {
        HttpError::InvalidRequest(format!(
            "the host does not accept the {part} of {} {}",
            request.method, request.url
        ))
    };
    outgoing
        .set_method(&wasi_method(request.method))
        .map_err(|()| refused("method"))?;
    let scheme = match request.url.scheme() {
        Scheme::Http => wasi::Scheme::Http,
        Scheme::Https => wasi::Scheme::Https,
    };
    outgoing
        .set_scheme(Some(&scheme))
        .map_err(|()| refused("scheme"))?;
    outgoing
        .set_authority(Some(&request.url.authority()))
        .map_err(|()| refused("host and port"))?;
    outgoing
        .set_path_with_query(Some(request.url.path_and_query()))
        .map_err(|()| refused("path"))?;
    Ok(outgoing)
}

fn header_error(name: &str, err: HeaderError) -> HttpError {
    HttpError::InvalidRequest(match err {
        HeaderError::InvalidSyntax => {
            format!("the host finds header `{name}` or its value invalid")
        }
        HeaderError::Forbidden => format!(
            "header `{name}` may not be set by a tool: the host sets it itself or does not \
             send it; leave it out"
        ),
        HeaderError::Immutable => format!("header `{name}` can no longer be changed"),
    })
}

fn wasi_method(method: &Method) -> wasi::Method {
    match method {
        Method::Get => wasi::Method::Get,
        Method::Head => wasi::Method::Head,
        Method::Post => wasi::Method::Post,
        Method::Put => wasi::Method::Put,
        Method::Delete => wasi::Method::Delete,
        Method::Connect => wasi::Method::Connect,
        Method::Options => wasi::Method::Options,
        Method::Trace => wasi::Method::Trace,
        Method::Patch => wasi::Method::Patch,
        Method::Other(token) => wasi::Method::Other(token.clone()),
    }
}

fn options(timeout: Duration) -> RequestOptions {
    let options = RequestOptions::new();
    let nanos = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
    // A host that does not support an option refuses it; the call's deadline still bounds
    // the request then, so the refusal is not worth failing the request over.
    let _ = options.set_connect_timeout(Some(nanos));
    let _ = options.set_first_byte_timeout(Some(nanos));
    let _ = options.set_between_bytes_timeout(Some(nanos));
    options
}

fn write_body(body: &OutgoingBody, bytes: &[u8], what: &str) -> Result<(), HttpError> {
    if bytes.is_empty() {
        return Ok(());
    }
    let stream = body
        .write()
        .map_err(|()| HttpError::Failed(format!("{what}: the request body was already taken")))?;
    for chunk in bytes.chunks(WRITE_CHUNK) {
        stream
            .blocking_write_and_flush(chunk)
            .map_err(|e| stream_error(e, what, "sending the request body"))?;
    }
    Ok(())
}

fn wait(future: &FutureIncomingResponse, what: &str) -> Result<IncomingResponse, HttpError> {
    loop {
        match future.get() {
            Some(Ok(Ok(response))) => return Ok(response),
            Some(Ok(Err(code))) => return Err(HttpError::from_code(&code, what)),
            Some(Err(())) => {
                return Err(HttpError::Failed(format!(
                    "{what}: the response was already taken"
                )));
            }
            None => future.subscribe().block(),
        }
    }
}

fn read_response(
    response: IncomingResponse,
    limit: usize,
    what: &str,
) -> Result<Response, HttpError> {
    let status = response.status();
    let headers = {
        let fields = response.headers();
        fields
            .entries()
            .into_iter()
            .map(|(name, value)| {
                (
                    name.to_ascii_lowercase(),
                    String::from_utf8_lossy(&value).into_owned(),
                )
            })
            .collect()
    };
    let body = response
        .consume()
        .map_err(|()| HttpError::Failed(format!("{what}: the response body was already taken")))?;
    let (body_bytes, truncated) = {
        let stream = body.stream().map_err(|()| {
            HttpError::Failed(format!("{what}: the response body was already taken"))
        })?;
        read_limited(&stream, limit, what)?
    };
    drop(body);
    drop(response);
    Ok(Response {
        status,
        headers,
        body: body_bytes,
        truncated,
    })
}

/// Reads up to `limit` bytes; `true` when the body goes on past them. One byte beyond the
/// limit is asked for, so a body of exactly `limit` bytes is not called truncated.
fn read_limited(
    stream: &wasi::InputStream,
    limit: usize,
    what: &str,
) -> Result<(Vec<u8>, bool), HttpError> {
    let mut bytes = Vec::new();
    loop {
        let room = limit.saturating_add(1) - bytes.len();
        let want = room.min(READ_CHUNK) as u64;
        match stream.blocking_read(want) {
            Ok(chunk) => {
                bytes.extend_from_slice(&chunk);
                if bytes.len() > limit {
                    bytes.truncate(limit);
                    return Ok((bytes, true));
                }
            }
            Err(StreamError::Closed) => return Ok((bytes, false)),
            Err(e) => return Err(stream_error(e, what, "reading the response body")),
        }
    }
}

fn stream_error(err: StreamError, what: &str, doing: &str) -> HttpError {
    match err {
        StreamError::LastOperationFailed(io) => match wasi::http_error_code(&io) {
            Some(code) => HttpError::from_code(&code, &format!("{what} ({doing})")),
            None => HttpError::Failed(format!("{what} failed {doing}: {}", io.to_debug_string())),
        },
        StreamError::Closed => HttpError::Failed(format!(
            "{what} failed {doing}: the connection closed early"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_maps_to_its_wasi_case() {
        let cases = [
            (Method::Get, "Method::Get"),
            (Method::Patch, "Method::Patch"),
            (Method::Other("PURGE".into()), "Method::Other(\"PURGE\")"),
        ];
        for (method, debug) in cases {
            assert_eq!(format!("{:?}", wasi_method(&method)), debug);
        }
    }

    #[test]
    fn header_errors_name_the_header() {
        let err = header_error("host", HeaderError::Forbidden);
        assert!(
            matches!(&err, HttpError::InvalidRequest(m) if m.contains("`host`") && m.contains("leave it out")),
            "{err:?}"
        );
    }
}
