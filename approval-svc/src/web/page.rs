//! The templates' view models and the pages every handler may answer with (sign-in, an
//! error). Templates escape everything they print; nothing here marks text as safe.

use askama::Template;
use axum::{
    http::StatusCode,
    response::{Html, IntoResponse, Response},
};

use super::statics;

/// What every page's frame shows: the title, the assets and who is signed in.
pub struct Chrome {
    pub title: String,
    pub css: String,
    pub js: String,
    /// Empty when nobody is signed in.
    pub who: String,
    pub csrf: String,
}

impl Chrome {
    pub fn new(title: impl Into<String>, who: Option<&super::session::Person>) -> Self {
        Self {
            title: title.into(),
            css: statics::css_url(),
            js: statics::js_url(),
            who: who.map(|p| p.name().to_string()).unwrap_or_default(),
            csrf: who.map(|p| p.csrf.clone()).unwrap_or_default(),
        }
    }
}

/// Renders `t` with `status`; a template that fails to render is a 500 saying so.
pub fn render(status: StatusCode, t: &impl Template) -> Response {
    match t.render() {
        Ok(html) => (status, Html(html)).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "a web template failed to render");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the page could not be rendered",
            )
                .into_response()
        }
    }
}

#[derive(Template)]
#[template(path = "message.html")]
struct Message {
    chrome: Chrome,
    heading: String,
    message: String,
    back: String,
}

/// A page saying what went wrong, with `status`.
pub fn error(status: StatusCode, message: &str) -> Response {
    render(
        status,
        &Message {
            chrome: Chrome::new("Not done", None),
            heading: match status {
                StatusCode::FORBIDDEN => "Refused".into(),
                StatusCode::NOT_FOUND => "Not found".into(),
                _ => "Something went wrong".into(),
            },
            message: message.to_string(),
            back: "/queue".into(),
        },
    )
}

pub async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "There is no such page.")
}

#[derive(Template)]
#[template(path = "sign_in.html")]
struct SignIn {
    chrome: Chrome,
    message: String,
    proxied: bool,
}

pub fn sign_in(status: StatusCode, proxied: bool, message: &str) -> Response {
    render(
        status,
        &SignIn {
            chrome: Chrome::new("Sign in", None),
            message: message.to_string(),
            proxied,
        },
    )
}

/// One name and value of a table (arguments, context, blackboard).
pub struct Pair {
    pub key: String,
    pub value: String,
}

/// The top-level entries of a JSON value as pairs; a non-object is one pair named `value`.
pub fn pairs(v: &serde_json::Value) -> Vec<Pair> {
    match v {
        serde_json::Value::Object(m) => m
            .iter()
            .map(|(k, v)| Pair {
                key: k.clone(),
                value: show(v),
            })
            .collect(),
        serde_json::Value::Null => Vec::new(),
        other => vec![Pair {
            key: "value".into(),
            value: show(other),
        }],
    }
}

/// A JSON value as a person reads it: strings without quotes, the rest as JSON.
pub fn show(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A row of a diff between two argument objects.
pub struct DiffRow {
    pub key: String,
    pub old: String,
    pub new: String,
}

/// The top-level entries that differ between `old` and `new`.
pub fn diff(old: &serde_json::Value, new: &serde_json::Value) -> Vec<DiffRow> {
    let empty = serde_json::Map::new();
    let (o, n) = (
        old.as_object().unwrap_or(&empty),
        new.as_object().unwrap_or(&empty),
    );
    if old.as_object().is_none() || new.as_object().is_none() {
        if old == new {
            return Vec::new();
        }
        return vec![DiffRow {
            key: "value".into(),
            old: show(old),
            new: show(new),
        }];
    }
    let mut keys: Vec<&String> = o.keys().chain(n.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| o.get(*k) != n.get(*k))
        .map(|k| DiffRow {
            key: k.clone(),
            old: o.get(k).map(show).unwrap_or_else(|| "(absent)".into()),
            new: n.get(k).map(show).unwrap_or_else(|| "(absent)".into()),
        })
        .collect()
}

/// RFC 3339 of a time in ms since the epoch (empty for 0).
pub fn iso(ms: u64) -> String {
    if ms == 0 {
        return String::new();
    }
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
        .to_string()
}

/// How long until `ms` (or since), as a person reads it; the script keeps it counting.
/// Whole minutes beyond the first one, so a page refetched every second changes only when
/// something did (the script counts the seconds).
pub fn until(ms: u64, now_ms: u64) -> String {
    let secs = |d: u64| {
        let s = match d / 1000 {
            s if s >= 60 => s - s % 60,
            s => s,
        };
        humantime::format_duration(std::time::Duration::from_secs(s))
    };
    match ms > now_ms {
        true => format!("in {}", secs(ms - now_ms)),
        false => format!("{} ago", secs(now_ms - ms)),
    }
}
