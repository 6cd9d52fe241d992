//! Why `browser.rs` refused a request, apart from the layer itself so that the one error
//! mapping (`error.rs`) can name it without the two modules using each other.

/// Why a request was refused as one a browser page may have sent against the operator's
/// wishes.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    #[error(
        "Host {0:?} is not a name of this server: a page whose DNS name points here is refused; \
         if it is one of this server's names, add it to [server] allowed_hosts"
    )]
    UnknownHost(String),
    #[error("a cross-site request ({0}) may not change anything here; use the console or a client outside the browser")]
    CrossSite(String),
    #[error(
        "this call is refused from a web browser while the server has no tokens; configure \
         access.admin_token_* to make it from the console or a page, or use the CLI"
    )]
    TokenRequired,
}
