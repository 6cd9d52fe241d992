//! A form post's body, read like every other body (`body::read`: the size limit and the
//! read deadline) rather than by axum's `Form`, which has no deadline of its own.

use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::layout::Problem;
use crate::http::extract::RawBody;

#[derive(Debug)]
pub(super) struct FormBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for FormBody<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let RawBody(bytes) = RawBody::from_request(req, state).await.map_err(Problem::from)?;
        serde_urlencoded::from_bytes(&bytes)
            .map(FormBody)
            .map_err(|e| Problem::new(StatusCode::BAD_REQUEST, format!("the form does not decode: {e}")))
    }
}
