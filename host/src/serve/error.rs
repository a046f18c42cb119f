//! [`ApiError`]: every refusal the service gives, in the OpenAI error shape, and the
//! extractors whose rejections are refusals of that shape too: [`ApiJson`] for bodies,
//! [`ApiQuery`] for query strings, [`ApiPath`] for path segments.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A refusal: its status, the OpenAI `type` and `code`, and a message saying what is wrong
/// and what to do. Its body is `{"error": {"message", "type", "code", "param"}}`, the shape
/// OpenAI clients read.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) code: &'static str,
    pub(crate) message: String,
    pub(crate) param: Option<&'static str>,
    /// Seconds until a rate-limited client may try again.
    pub(crate) retry_after: Option<u64>,
}

/// The body of an error response.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ErrorBody {
    error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ErrorDetail {
    /// What is wrong and what to do.
    message: String,
    /// The OpenAI error type, e.g. `invalid_request_error`.
    #[serde(rename = "type")]
    kind: &'static str,
    /// A stable code, e.g. `not_found`, `missing_token`.
    code: &'static str,
    /// The request field at fault, if one is.
    param: Option<&'static str>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            param: None,
            retry_after: None,
        }
    }

    /// 400: the request is malformed.
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    /// 404: no such thing.
    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 503: the host cannot take it now (shutting down, a service failing).
    pub(crate) fn unavailable(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }

    /// 500: the host failed; the message says where.
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// Names the request field at fault.
    pub(crate) fn param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    /// The OpenAI `type` of this status.
    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The body, for a response or an SSE `error` message.
    pub(crate) fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                message: self.message.clone(),
                kind: self.kind(),
                code: self.code,
                param: self.param,
            },
        }
    }
}

impl ApiError {
    /// The refusal as a JSON-RPC error, for an MCP client: the same status and headers,
    /// with the message where an MCP client shows it (an MCP client reads no OpenAI
    /// error). The code is in JSON-RPC's range for servers; `data.type` is the API code.
    pub(crate) fn into_jsonrpc_response(self) -> Response {
        let body = serde_json::json!({
            "jsonrpc": "2.0",
            "id": null,
            "error": {
                "code": -32001,
                "message": self.message,
                "data": { "type": self.code },
            },
        });
        self.with_headers((self.status, axum::Json(body)).into_response())
    }

    /// `response` with the headers this refusal needs (how to authenticate, when to retry).
    fn with_headers(&self, mut response: Response) -> Response {
        let headers = response.headers_mut();
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"capstan\""),
            );
        }
        if let Some(secs) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let response = (self.status, axum::Json(self.body())).into_response();
        self.with_headers(response)
    }
}

impl From<crate::services::ServiceError> for ApiError {
    fn from(err: crate::services::ServiceError) -> Self {
        use crate::services::ServiceError;
        match err {
            ServiceError::NotFound(message) => ApiError::not_found(message),
            ServiceError::Invalid(message) => ApiError::invalid(message),
            other => ApiError::unavailable(format!("the store failed: {other}")),
        }
    }
}

/// A JSON request body. Unlike axum's `Json`, a bad body is refused as an [`ApiError`]:
/// the wrong content type (415), a body over the size cap (413), JSON that does not parse
/// or does not fit the request's shape (400, naming the field).
pub(crate) struct ApiJson<T>(pub(crate) T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let cap = req.extensions().get::<BodyCap>().copied();
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(rejected(rejection, cap)),
        }
    }
}

/// The request body cap in force, in bytes, for the message of a refusal.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyCap(pub(crate) usize);

fn rejected(rejection: JsonRejection, cap: Option<BodyCap>) -> ApiError {
    match rejection {
        JsonRejection::MissingJsonContentType(_) => ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send the body as JSON, with `Content-Type: application/json`",
        ),
        JsonRejection::JsonSyntaxError(err) => {
            ApiError::invalid(format!("the body is not valid JSON: {}", err.body_text()))
        }
        JsonRejection::JsonDataError(err) => {
            ApiError::invalid(format!("the body does not fit: {}", err.body_text()))
        }
        JsonRejection::BytesRejection(err) if err.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            let limit = cap.map_or_else(String::new, |BodyCap(bytes)| {
                format!(" ({} KiB)", bytes >> 10)
            });
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!(
                    "the body is larger than serve.max_request_body_kib{limit} allows; send \
                     less, or raise it in capstan.toml"
                ),
            )
        }
        other => ApiError::invalid(other.body_text()),
    }
}

/// A query string. Unlike axum's `Query`, a bad one is refused as an [`ApiError`] naming
/// the parameter and what is wrong with it.
pub(crate) struct ApiQuery<T>(pub(crate) T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(ApiQuery(value)),
            Err(rejection) => {
                let text = rejection.body_text();
                let why = text
                    .strip_prefix("Failed to deserialize query string: ")
                    .unwrap_or(&text);
                Err(ApiError::invalid(format!(
                    "the query string does not fit: {why}"
                )))
            }
        }
    }
}

/// Path segments. Unlike axum's `Path`, a bad one (not UTF-8 once decoded) is refused as
/// an [`ApiError`].
pub(crate) struct ApiPath<T>(pub(crate) T);

impl<S, T> FromRequestParts<S> for ApiPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(ApiPath(value)),
            Err(rejection) => {
                let text = rejection.body_text();
                let why = text.strip_prefix("Invalid URL: ").unwrap_or(&text);
                Err(ApiError::invalid(format!("the path does not fit: {why}")))
            }
        }
    }
}
