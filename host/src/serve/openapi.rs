//! The OpenAPI document of the service, derived from its handlers and types.

use axum::Json;
use utoipa::OpenApi;

use super::{api, error, openai, stream};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Capstan",
        description = "The agent over HTTP: conversations, live events, state, and an \
                       OpenAI-compatible chat endpoint. Every route under /v1 needs \
                       `Authorization: Bearer TOKEN` when the server has tokens.",
    ),
    paths(
        api::channels, api::history, api::post_message, api::workers, api::branches,
        api::tasks, api::policy, api::audit, api::requests, api::plugins, api::tools,
        stream::events, openai::models, openai::chat_completions,
    ),
    components(schemas(error::ErrorBody)),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The service's OpenAPI document, as JSON (what `GET /v1/openapi.json` serves and
/// `capstan serve --openapi` prints).
pub fn openapi_json() -> String {
    ApiDoc::openapi()
        .to_pretty_json()
        .expect("the OpenAPI document serializes")
}

/// `GET /v1/openapi.json`.
pub(crate) async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
