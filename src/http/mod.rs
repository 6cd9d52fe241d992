//! The HTTP API (JSON everywhere; errors as `{"error":{"code","message"}}`), described by
//! the OpenAPI document it serves at `/openapi.json`.

pub(crate) mod access;
mod admin;
mod auth;
mod body;
mod browser;
mod bulk;
mod conn;
mod console;
mod delivery;
mod error;
mod estimates;
mod evaluations;
mod export;
mod export_feed;
mod extract;
mod front;
mod guesses;
pub(crate) mod handlers;
pub(crate) mod limits;
mod log_limit;
pub(crate) mod metrics;
mod money;
mod openapi;
#[cfg(test)]
mod openapi_tests;
mod refusal;
mod revisions;
mod routes;
mod schemas;
mod stall;
mod tenant_series;
mod tenants;
mod time;
mod views;
mod whole;
mod workers;

use std::sync::Arc;

use axum::Extension;
use axum::routing::any;

pub(crate) use body::BodyLimits;
pub(crate) use browser::HostNames;
pub(crate) use conn::serve;
pub(crate) use error::ApiError;
pub(crate) use front::Front;
pub(crate) use guesses::DEFAULT_ALLOWANCE as DEFAULT_WRONG_TOKEN_ALLOWANCE;

use crate::http::access::Access;
use crate::service::Service;

pub(crate) fn router(service: Service, body: BodyLimits, access: Arc<Access>, hosts: HostNames) -> Front {
    let (routes, doc) = routes::documented(&access);
    let schema_names: Vec<String> = service.registry().names().map(str::to_string).collect();
    let document = openapi::Served(openapi::finish(doc, &schema_names).to_string().into());
    // An unknown path is no route of any group: it answers 404 only to a caller with a
    // token, as the routes under it would.
    let unknown = any(|| async { ApiError::not_found_route() })
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&access), auth::any_caller));
    // The console does its own authentication (a session cookie after one token check).
    let console = console::router(&service, Arc::clone(&access));
    let routed = routes
        .merge(console)
        .fallback_service(unknown)
        .layer(Extension(document))
        .layer(Extension(body))
        .with_state(service);
    // What applies to every request wraps the finished router once (`front.rs`):
    // `Router::layer` would wrap each route and clone its whole stack per request.
    Front::new(routed, hosts, body.deadline)
}

/// Every route the router serves, as (method, path template): the API's from its own
/// OpenAPI document (built by the same `routes!` calls as the router), the console's from
/// the table its router is built from. For tests that must reach every route.
#[cfg(feature = "fuzzing")]
pub(crate) fn route_table() -> Vec<(String, String)> {
    let (_, doc) = routes::documented(&Arc::new(Access::new(access::AccessPolicy::default())));
    let mut table = Vec::new();
    for (path, item) in &doc.paths.paths {
        let item = serde_json::to_value(item).unwrap_or_default();
        for method in item.as_object().into_iter().flat_map(|ops| ops.keys()) {
            table.push((method.to_uppercase(), path.clone()));
        }
    }
    table.extend(console::table().into_iter().map(|(method, path)| (method.to_string(), path.to_string())));
    table
}
