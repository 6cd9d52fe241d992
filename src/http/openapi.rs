//! The OpenAPI 3.1 document, served at `GET /openapi.json`. It is assembled from the
//! handlers' own `#[utoipa::path]` annotations by the same `routes!` calls that build the
//! router (see `mod.rs`), so a route cannot exist without its description.

use axum::Extension;
use axum::body::Bytes;
use axum::http::header;
use axum::response::IntoResponse;
use serde_json::{Value, json};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi as Document, Ref, RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi};

/// Reusable error responses, each `{"error": {"code", "message", "details"?}}`.
macro_rules! error_responses {
    ($($name:ident => $description:literal,)*) => {
        $(
            #[derive(Debug)]
            pub(super) struct $name;

            impl<'r> utoipa::ToResponse<'r> for $name {
                fn response() -> (&'r str, RefOr<utoipa::openapi::Response>) {
                    (stringify!($name), error_response($description))
                }
            }
        )*
    };
}

error_responses! {
    BadRequest => "`malformed_json`, `unreadable_body` or `malformed_encoding` (the body is not JSON, or not \
        gzip as its `Content-Encoding` says), `invalid_id` or `invalid_path` \
        (a path parameter is malformed), or `invalid_query` (a query parameter has the wrong type or value)",
    Unauthenticated => "`unauthenticated`: no valid `Authorization: Bearer` token (only when access tokens are \
        configured); carries `WWW-Authenticate: Bearer`",
    Forbidden => "`forbidden`: the call needs the admin token, or the token may not reach this tenant; \
        `cross_site`: a state-changing request from another site (`Origin`, `Sec-Fetch-Site`); \
        `token_required`: backup, tenant erasure or a provider pause from a web browser while the server has \
        no tokens",
    PayloadTooLarge => "`payload_too_large`: the body (after gzip decoding) is over `--max-body-bytes`, or a \
        webhook endpoint's `max_body_bytes`; a larger `Content-Length` is refused before the body is read",
    BodyTimeout => "`body_timeout`: the body did not arrive in full within `server.body_read_timeout`",
    UnsupportedEncoding => "`unsupported_encoding`: a `Content-Encoding` other than `gzip` or `identity`; \
        `unsupported_media_type`: a JSON body sent without `Content-Type: application/json`",
    MisdirectedHost => "`unknown_host`: the `Host` header is not a name of this server (loopback, the listen \
        address, `[server] allowed_hosts`); refused before any route runs, reads included",
    TooManyRequests => "`rate_limited`: too many wrong tokens or failed console logins from this address; \
        `Retry-After` says when to try again",
    InvalidInput => "`invalid_input`: a value is out of range (`details.field` names it)",
    ServerError => "`store_corrupt`, `schema_unavailable` or `internal`: see the server log",
    StoreUnavailable => "`store_unavailable`: the writer stopped after a storage error; restart the service",
}

fn error_response(description: &str) -> RefOr<utoipa::openapi::Response> {
    let content = ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build();
    ResponseBuilder::new().description(description).content("application/json", content).build().into()
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "commitpoint",
        description = "Exactly-once LLM structured extraction. Every error is \
            `{\"error\": {\"code\", \"message\", \"details\"?}}`; see docs/API.md.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    components(
        schemas(super::error::ErrorBody),
        responses(
            BadRequest,
            Unauthenticated,
            Forbidden,
            PayloadTooLarge,
            BodyTimeout,
            UnsupportedEncoding,
            InvalidInput,
            ServerError,
            StoreUnavailable,
            MisdirectedHost,
            TooManyRequests
        ),
    ),
    modifiers(&BearerScheme),
    tags(
        (name = "extractions", description = "Taking sources in and reading extractions"),
        (name = "workers", description = "External workers: claims, lease extensions and results (the admin token or a worker token)"),
        (name = "costs", description = "The cost ledger"),
        (name = "webhooks", description = "Signed inbound webhooks (no bearer token)"),
        (name = "outbox", description = "Deliveries to downstream sinks (admin)"),
        (name = "admin", description = "Backups and providers (admin)"),
        (name = "evaluations", description = "Provider bake-offs over a frozen set: trials, reports, promotion (admin)"),
        (name = "operations", description = "Health, metrics, statistics and this document"),
    ),
)]
pub(super) struct ApiDoc;

/// The `bearer` scheme that operations refer to.
#[derive(Debug)]
struct BearerScheme;

impl Modify for BearerScheme {
    fn modify(&self, doc: &mut Document) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme("bearer", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
    }
}

/// The document as served: the schema names a server knows are facts of that server,
/// so the request fields that name a schema list them.
pub(super) fn finish(mut doc: Document, schema_names: &[String]) -> Value {
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    let mut value = serde_json::to_value(&doc).unwrap_or(Value::Null);
    respell_unsigned_formats(&mut value);
    add_guard_responses(&mut value);
    if let Some(schemas) = value.pointer_mut("/components/schemas") {
        for pointer in ["/IntakeBody/properties/schema", "/ClaimBody/properties/schema"] {
            if let Some(field) = schemas.pointer_mut(pointer) {
                field["enum"] = json!(schema_names);
            }
        }
        // `ClaimBody.schema` is optional and may be null.
        if let Some(field) = schemas.pointer_mut("/ClaimBody/properties/schema/enum")
            && let Some(names) = field.as_array_mut()
        {
            names.push(Value::Null);
        }
    }
    value
}

/// The answers of the layers every route sits behind (`browser.rs`, `auth.rs`), added
/// here rather than in each annotation: any operation may get 421 for a foreign `Host`,
/// any that takes a token 429 once its address has guessed too often, and any
/// state-changing one 403 for a cross-site request.
fn add_guard_responses(doc: &mut Value) {
    let reference = |name: &str| json!({"$ref": format!("#/components/responses/{name}")});
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else { return };
    for (method, operation) in paths.values_mut().filter_map(Value::as_object_mut).flat_map(|item| item.iter_mut()) {
        let has_security = operation.get("security").is_some();
        let operation_has_body = operation.get("requestBody").is_some();
        let Some(responses) = operation.get_mut("responses").and_then(Value::as_object_mut) else { continue };
        responses.entry("421").or_insert_with(|| reference("MisdirectedHost"));
        if operation_has_body {
            responses.entry("415").or_insert_with(|| reference("UnsupportedEncoding"));
        }
        if has_security {
            responses.entry("429").or_insert_with(|| reference("TooManyRequests"));
        }
        if !matches!(method.as_str(), "get" | "head" | "options" | "trace") {
            responses.entry("403").or_insert_with(|| reference("Forbidden"));
        }
    }
}

/// utoipa 6 spells the unsigned formats `u-int64` and so on (juhaku/utoipa#1527, open);
/// tools know them as `uint64`. Without these formats a `u64` would be `int64`, whose
/// range schemathesis enforces: a valid cursor past 2^63 would count as invalid.
fn respell_unsigned_formats(node: &mut Value) {
    match node {
        Value::Object(map) => {
            if let Some(Value::String(format)) = map.get_mut("format")
                && let Some(bits) = format.strip_prefix("u-int")
            {
                *format = format!("uint{bits}");
            }
            map.values_mut().for_each(respell_unsigned_formats);
        }
        Value::Array(items) => items.iter_mut().for_each(respell_unsigned_formats),
        _ => {}
    }
}

/// The serialized document, shared by every request.
#[derive(Debug, Clone)]
pub(super) struct Served(pub Bytes);

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations",
    responses((status = 200, description = "The OpenAPI 3.1 description of this API", body = Object)))]
pub(super) async fn document(Extension(Served(json)): Extension<Served>) -> axum::response::Response {
    ([(header::CONTENT_TYPE, "application/json")], json).into_response()
}
