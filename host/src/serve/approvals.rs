//! The approvals API: the calls parked for a person, and deciding them. Reading needs the
//! `read` scope, as the audit log does; deciding needs `admin`, and the record names the
//! token that decided.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::app::App;
use super::auth::Caller;
use super::error::{ApiError, ApiJson, ApiPath, ApiQuery, ErrorBody};
use crate::config::TokenScope;
use crate::services::{Approval, ApprovalId, Lease, ServiceError, Verdict};

/// Which approvals to list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ApprovalsQuery {
    /// Every approval, decided ones too (default: only those waiting).
    #[serde(default)]
    all: bool,
    /// At most this many, newest first (default 100, at most 1000).
    limit: Option<u32>,
}

/// Approvals, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ApprovalList {
    /// Each with its process, tool, canonical (redacted) arguments, their digest, the
    /// labels that required it, and its state.
    approvals: Vec<Approval>,
}

/// `GET /v1/approvals`: the calls waiting for a person (`all=true`: every approval).
#[utoipa::path(get, path = "/v1/approvals", tag = "approvals", params(ApprovalsQuery),
    responses((status = 200, body = ApprovalList, description = "The approvals, newest first")))]
pub(crate) async fn list(
    State(app): State<Arc<App>>,
    ApiQuery(query): ApiQuery<ApprovalsQuery>,
) -> Result<Json<ApprovalList>, ApiError> {
    let limit = query.limit.unwrap_or(100);
    let approvals = app
        .runtime
        .services()
        .approvals
        .list(!query.all, limit)
        .await?;
    Ok(Json(ApprovalList { approvals }))
}

/// `GET /v1/approvals/{id}`: one approval.
#[utoipa::path(get, path = "/v1/approvals/{id}", tag = "approvals",
    params(("id" = u64, Path, description = "The approval's number")),
    responses((status = 200, body = Approval, description = "The approval"),
        (status = 404, body = ErrorBody, description = "No such approval")))]
pub(crate) async fn get(
    State(app): State<Arc<App>>,
    ApiPath(id): ApiPath<u64>,
) -> Result<Json<Approval>, ApiError> {
    let approval = app
        .runtime
        .services()
        .approvals
        .get(ApprovalId::new(id))
        .await?;
    Ok(Json(approval))
}

/// An approval's lease.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ApproveBody {
    /// How many calls with these exact arguments it covers (default 1, at most 1000).
    uses: Option<u32>,
    /// How long it holds, in seconds (default 600, at most a week).
    ttl_secs: Option<u64>,
    /// Also vouch for the handles' values the call carries (`handles`): every later use
    /// of them by the process is trusted (default false).
    endorse: Option<bool>,
}

/// `POST /v1/approvals/{id}/approve`: approves a parked call; the waiting process runs
/// it. The approval covers only that process, that tool and arguments of that digest;
/// with `endorse`, the handles' values the call carries are trusted in every later use.
#[utoipa::path(post, path = "/v1/approvals/{id}/approve", tag = "approvals",
    params(("id" = u64, Path, description = "The approval's number")),
    request_body = ApproveBody,
    responses((status = 200, body = Approval, description = "Approved"),
        (status = 400, body = ErrorBody, description = "A lease out of range"),
        (status = 403, body = ErrorBody, description = "The token's scope is not `admin`"),
        (status = 404, body = ErrorBody, description = "No such approval"),
        (status = 409, body = ErrorBody, description = "Already decided or withdrawn, or `endorse` for a call that carries no handle")))]
pub(crate) async fn approve(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiPath(id): ApiPath<u64>,
    ApiJson(body): ApiJson<ApproveBody>,
) -> Result<Json<Approval>, ApiError> {
    caller.require(TokenScope::Admin)?;
    let once = Lease::once();
    let lease = Lease {
        ttl_seconds: body.ttl_secs.unwrap_or(once.ttl_seconds),
        uses: body.uses.unwrap_or(once.uses),
    }
    .checked()?;
    let verdict = if body.endorse.unwrap_or(false) {
        Verdict::Endorse(lease)
    } else {
        Verdict::Approve(lease)
    };
    decide(&app, &caller, id, verdict).await
}

/// A denial's body: `{}`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DenyBody {}

/// `POST /v1/approvals/{id}/deny`: denies a parked call; the waiting process is told a
/// person refused it.
#[utoipa::path(post, path = "/v1/approvals/{id}/deny", tag = "approvals",
    params(("id" = u64, Path, description = "The approval's number")),
    request_body = DenyBody,
    responses((status = 200, body = Approval, description = "Denied"),
        (status = 403, body = ErrorBody, description = "The token's scope is not `admin`"),
        (status = 404, body = ErrorBody, description = "No such approval"),
        (status = 409, body = ErrorBody, description = "Already decided or withdrawn")))]
pub(crate) async fn deny(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiPath(id): ApiPath<u64>,
    // A JSON body (`{}`), as approving takes: a form a web page posts across sites is not
    // one, so no other page in the person's browser can deny for them.
    ApiJson(DenyBody {}): ApiJson<DenyBody>,
) -> Result<Json<Approval>, ApiError> {
    caller.require(TokenScope::Admin)?;
    decide(&app, &caller, id, Verdict::Deny).await
}

async fn decide(
    app: &App,
    caller: &Caller,
    id: u64,
    verdict: Verdict,
) -> Result<Json<Approval>, ApiError> {
    let by = format!("token:{}", caller.name);
    let decided = app
        .runtime
        .services()
        .approvals
        .decide(ApprovalId::new(id), verdict, &by)
        .await;
    match decided {
        Ok(approval) => Ok(Json(approval)),
        // The lease was checked above: what is left is a decision already made.
        Err(ServiceError::Invalid(message)) => {
            Err(ApiError::new(StatusCode::CONFLICT, "conflict", message))
        }
        Err(err) => Err(err.into()),
    }
}
