//! The inbox's own stylesheet and script, compiled in and served from `/static/` under a name
//! that holds a hash of their content, so browsers keep them for a year and a new release's
//! files are fetched at once.

use std::sync::OnceLock;

use axum::{
    extract::Path,
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use sha2::{Digest, Sha256};

const CSS: &str = include_str!("../../web/inbox.css");
const JS: &str = include_str!("../../web/inbox.js");

struct Asset {
    name: String,
    etag: String,
    body: &'static str,
    mime: &'static str,
}

fn asset(stem: &str, ext: &str, body: &'static str, mime: &'static str) -> Asset {
    let hash = hex::encode(&Sha256::digest(body.as_bytes())[..8]);
    Asset {
        name: format!("{stem}-{hash}.{ext}"),
        etag: format!("\"{hash}\""),
        body,
        mime,
    }
}

fn assets() -> &'static [Asset; 2] {
    static ASSETS: OnceLock<[Asset; 2]> = OnceLock::new();
    ASSETS.get_or_init(|| {
        [
            asset("inbox", "css", CSS, "text/css; charset=utf-8"),
            asset("inbox", "js", JS, "text/javascript; charset=utf-8"),
        ]
    })
}

/// The URL of the stylesheet.
pub fn css_url() -> String {
    format!("/static/{}", assets()[0].name)
}

/// The URL of the script.
pub fn js_url() -> String {
    format!("/static/{}", assets()[1].name)
}

pub async fn serve(Path(name): Path<String>, headers: HeaderMap) -> Response {
    let Some(a) = assets().iter().find(|a| a.name == name) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let cache = HeaderValue::from_static("public, max-age=31536000, immutable");
    let etag = HeaderValue::from_str(&a.etag).unwrap_or(HeaderValue::from_static("\"\""));
    if headers
        .get(header::IF_NONE_MATCH)
        .is_some_and(|v| v.as_bytes() == a.etag.as_bytes())
    {
        return (
            StatusCode::NOT_MODIFIED,
            [(header::ETAG, etag), (header::CACHE_CONTROL, cache)],
        )
            .into_response();
    }
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(a.mime)),
            (header::ETAG, etag),
            (header::CACHE_CONTROL, cache),
        ],
        a.body,
    )
        .into_response()
}
