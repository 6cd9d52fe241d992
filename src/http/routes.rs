//! Every route, declared in the group that decides who may call it: public, tenant,
//! shared (any token), worker or admin. Each group carries its own authentication layer, so a new route must pick a
//! group and cannot end up open to tenants by default. Each route is registered with its
//! OpenAPI description; one `routes!` per path, since the macro serves all the handlers it
//! is given on every path among them.

use std::sync::Arc;

use axum::Router;
use axum::middleware::from_fn_with_state;
use utoipa::OpenApi;
use utoipa::openapi::OpenApi as Document;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::ApiError;
use super::{
    admin, auth, bulk, delivery, estimates, evaluations, export, handlers, money, openapi, revisions, schemas, tenants,
    workers,
};
use crate::http::access::Access;
use crate::service::Service;

/// The whole API: the five groups, each behind its own layer, and one document that
/// describes them all.
pub(super) fn documented(access: &Arc<Access>) -> (Router<Service>, Document) {
    let mut doc = openapi::ApiDoc::openapi();
    let public = part(public(), &mut doc).layer(from_fn_with_state(Arc::clone(access), auth::recognise));
    let tenant = part(tenant(), &mut doc).layer(from_fn_with_state(Arc::clone(access), auth::tenant_or_admin));
    let shared = part(shared(), &mut doc).layer(from_fn_with_state(Arc::clone(access), auth::any_caller));
    let worker = part(worker(), &mut doc).layer(from_fn_with_state(Arc::clone(access), auth::worker_or_admin));
    let admin = part(admin(), &mut doc).layer(from_fn_with_state(Arc::clone(access), auth::admin_only));
    (public.merge(tenant).merge(shared).merge(worker).merge(admin), doc)
}

/// A group's routes, their description added to `doc`. The JSON 405 is set here, before
/// the group's layer wraps its routes (a fallback set afterwards would not reach them).
fn part(group: OpenApiRouter<Service>, doc: &mut Document) -> Router<Service> {
    let (router, described) = group.split_for_parts();
    doc.merge(described);
    router.method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
}

/// No token: liveness, metrics and the API description expose no tenant data, so probes
/// and scrapers on the host need no secret. Webhooks authenticate by their signature.
pub(super) fn public() -> OpenApiRouter<Service> {
    OpenApiRouter::new()
        .routes(routes!(openapi::document))
        .routes(routes!(handlers::healthz))
        .routes(routes!(handlers::metrics))
        .routes(routes!(delivery::receive))
}

/// Any token: the handlers scope each record to the caller's tenant.
pub(super) fn tenant() -> OpenApiRouter<Service> {
    OpenApiRouter::new()
        .routes(routes!(handlers::intake, handlers::list))
        .routes(routes!(handlers::get))
        .routes(routes!(handlers::findings))
        .routes(routes!(money::extraction_costs))
        .routes(routes!(money::tenant_costs))
        .routes(routes!(estimates::estimate))
        .routes(routes!(bulk::cancel))
        .routes(routes!(export::export))
        .routes(routes!(revisions::source))
        .routes(routes!(revisions::diff))
}

/// Any token, a worker's too: the registered schemas say nothing of any tenant, and a
/// worker needs them to answer.
pub(super) fn shared() -> OpenApiRouter<Service> {
    OpenApiRouter::new().routes(routes!(schemas::get))
}

/// The admin's or a worker's token: work distribution, lease extensions and results. A worker token's
/// scope (tenants, schemas) is checked by the handlers.
pub(super) fn worker() -> OpenApiRouter<Service> {
    OpenApiRouter::new()
        .routes(routes!(workers::claim))
        .routes(routes!(workers::post_result))
        .routes(routes!(workers::extend_lease))
}

/// The admin token only: operator actions and views of the whole store.
pub(super) fn admin() -> OpenApiRouter<Service> {
    OpenApiRouter::new()
        .routes(routes!(handlers::retry))
        .routes(routes!(handlers::stats))
        .routes(routes!(delivery::list))
        .routes(routes!(delivery::redeliver))
        .routes(routes!(delivery::enable_sink))
        .routes(routes!(admin::backup))
        .routes(routes!(admin::providers))
        .routes(routes!(admin::pause))
        .routes(routes!(admin::resume))
        .routes(routes!(admin::download, admin::remove))
        .routes(routes!(bulk::retry))
        .routes(routes!(tenants::erase))
        .routes(routes!(evaluations::create, evaluations::list))
        .routes(routes!(evaluations::get))
        .routes(routes!(evaluations::report))
        .routes(routes!(evaluations::promote))
        .routes(routes!(evaluations::cancel))
}
