//! The OpenAPI document of the service, derived from its handlers and types.

use axum::Json;
use utoipa::OpenApi;

use super::{api, approvals, error, openai, stream};

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
        api::tasks, api::policy, api::audit, api::requests, api::costs, api::plugins, api::tools,
        approvals::list, approvals::get, approvals::approve, approvals::deny,
        stream::events, openai::models, openai::chat_completions,
    ),
    components(schemas(error::ErrorBody)),
    modifiers(&Access),
    security(("bearer" = [])),
)]
struct ApiDoc;

/// The bearer scheme, and the refusals any route may answer before its handler runs.
struct Access;

impl utoipa::Modify for Access {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        use utoipa::openapi::{Ref, ResponseBuilder, content::ContentBuilder};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        let refusal = |description: &str| {
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("ErrorBody")))
                        .build(),
                )
                .build()
        };
        for item in openapi.paths.paths.values_mut() {
            let operations = [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.delete,
                &mut item.patch,
            ];
            for operation in operations.into_iter().flatten() {
                let responses = &mut operation.responses.responses;
                responses
                    .entry("401".to_owned())
                    .or_insert_with(|| refusal("No token, or not one the server holds").into());
                responses.entry("429".to_owned()).or_insert_with(|| {
                    refusal("Over `serve.requests_per_minute`; `Retry-After` says when to retry")
                        .into()
                });
            }
        }
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
