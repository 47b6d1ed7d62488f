//! The webhooks file (TOML, `approval-svc serve --webhooks PATH`): the endpoints, each with its
//! URL, secret and the events it wants, and the inbox URL the deep links start with. Every
//! mistake is reported at start-up with the file, the endpoint and the values accepted; a
//! secret is never shown.

use std::{path::Path, sync::Arc, time::Duration};

use http::Uri;
use serde::Deserialize;

use super::{EventKind, Routes, sign::Secret};

/// One endpoint, checked.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// Names it in the outbox, the metrics and the log.
    pub name: String,
    pub url: Uri,
    pub secret: Secret,
    pub events: Vec<EventKind>,
}

/// How deliveries are retried and how long one may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    /// First wait after a failure; each failure in a row doubles it, up to `max`.
    pub min: Duration,
    pub max: Duration,
    /// One delivery that has not answered by then failed.
    pub timeout: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            min: Duration::from_secs(1),
            max: Duration::from_secs(300),
            timeout: Duration::from_secs(10),
        }
    }
}

/// The webhooks configuration; the default has no endpoint.
#[derive(Debug, Clone, Default)]
pub struct WebhookConfig {
    /// The inbox URL prefix: a message's link is `{link_base}/approvals/{request_id}`.
    pub link_base: String,
    pub endpoints: Vec<Arc<Endpoint>>,
    pub retry: Retry,
}

#[derive(Debug, thiserror::Error)]
pub enum WebhookConfigError {
    #[error("cannot read webhooks file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("webhooks file {path} is invalid: {message}")]
    Invalid { path: String, message: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    link_base: Option<String>,
    #[serde(default, rename = "endpoint")]
    endpoints: Vec<EndpointEntry>,
    retry_min_ms: Option<u64>,
    retry_max_ms: Option<u64>,
    timeout_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EndpointEntry {
    name: String,
    url: String,
    secret: String,
    events: Vec<String>,
}

/// The longest endpoint name (it labels metrics and keys the outbox).
const MAX_NAME: usize = 64;

impl WebhookConfig {
    pub fn from_file(path: &Path) -> Result<Self, WebhookConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| WebhookConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text).map_err(|message| WebhookConfigError::Invalid {
            path: path.display().to_string(),
            message,
        })
    }

    /// The configuration in `text`, or what is wrong with it.
    pub fn parse(text: &str) -> Result<Self, String> {
        // TOML's own message quotes the offending line, which may hold a secret.
        let file: File = toml::from_str(text).map_err(|e| match e.span() {
            Some(span) => format!(
                "{} (at byte {}); expected top-level link_base, retry_min_ms, retry_max_ms, \
                 timeout_ms and [[endpoint]] tables of name, url, secret, events",
                e.message(),
                span.start
            ),
            None => e.message().to_string(),
        })?;
        let mut endpoints: Vec<Arc<Endpoint>> = Vec::new();
        for (i, entry) in file.endpoints.into_iter().enumerate() {
            let endpoint = entry.check().map_err(|m| {
                match m.strip_prefix("name=").and_then(|r| r.split_once(';')) {
                    Some((name, rest)) => format!("endpoint {name:?}:{rest}"),
                    None => format!("endpoint #{}: {m}", i + 1),
                }
            })?;
            if endpoints.iter().any(|e| e.name == endpoint.name) {
                return Err(format!(
                    "endpoint {:?}: the name is used by an earlier endpoint; names must differ",
                    endpoint.name
                ));
            }
            endpoints.push(Arc::new(endpoint));
        }
        let link_base = match (file.link_base, endpoints.is_empty()) {
            (Some(base), _) => check_link_base(&base)?,
            (None, true) => String::new(),
            (None, false) => {
                return Err(
                    "link_base is missing: the inbox URL the approvals' links start \
                            with, e.g. link_base = \"https://inbox.example.com\""
                        .into(),
                );
            }
        };
        let default = Retry::default();
        let ms = |v: Option<u64>, d: Duration| v.map_or(d, Duration::from_millis);
        let retry = Retry {
            min: ms(file.retry_min_ms, default.min),
            max: ms(file.retry_max_ms, default.max),
            timeout: ms(file.timeout_ms, default.timeout),
        };
        if retry.min.is_zero() || retry.timeout.is_zero() || retry.max < retry.min {
            return Err(format!(
                "retry_min_ms ({}) and timeout_ms ({}) must be above 0 and retry_max_ms ({}) \
                 at least retry_min_ms",
                retry.min.as_millis(),
                retry.timeout.as_millis(),
                retry.max.as_millis()
            ));
        }
        Ok(Self {
            link_base,
            endpoints,
            retry,
        })
    }

    /// What the store needs to queue messages.
    pub fn routes(&self) -> Routes {
        Routes {
            link_base: self.link_base.clone(),
            endpoints: self
                .endpoints
                .iter()
                .map(|e| (e.name.clone(), e.events.clone()))
                .collect(),
        }
    }
}

impl EndpointEntry {
    /// The checked endpoint; an error message starts with `name=NAME;` when the name is good.
    fn check(self) -> Result<Endpoint, String> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= MAX_NAME
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !name_ok {
            return Err(format!(
                "name {:?} must be 1 to {MAX_NAME} characters of A-Z, a-z, 0-9, '-', '_' and '.'",
                self.name
            ));
        }
        let at = |m: String| format!("name={};{m}", self.name);
        let url = check_url(&self.url).map_err(at)?;
        let secret = Secret::parse(&self.secret).map_err(|m| at(format!(" secret {m}")))?;
        if self.events.is_empty() {
            return Err(at(format!(" events is empty; accepted: {}", kinds())));
        }
        let mut events = Vec::new();
        for e in &self.events {
            let kind = EventKind::from_name(e)
                .ok_or_else(|| at(format!(" unknown event kind {e:?}; accepted: {}", kinds())))?;
            if !events.contains(&kind) {
                events.push(kind);
            }
        }
        Ok(Endpoint {
            name: self.name,
            url,
            secret,
            events,
        })
    }
}

fn kinds() -> String {
    EventKind::ALL.map(EventKind::name).join(", ")
}

fn check_url(url: &str) -> Result<Uri, String> {
    let uri: Uri = url
        .parse()
        .map_err(|e| format!(" url {url:?} is not a URL: {e}"))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(h)) if !h.is_empty() => Ok(uri),
        _ => Err(format!(
            " url {url:?} must be http://host[:port]/path or https://host[:port]/path"
        )),
    }
}

fn check_link_base(base: &str) -> Result<String, String> {
    check_url(base).map_err(|m| format!("link_base:{m}"))?;
    Ok(base.trim_end_matches('/').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn endpoint(name: &str, url: &str, secret: &str, events: &str) -> String {
        format!(
            "link_base = \"https://inbox.example\"\n[[endpoint]]\nname = \"{name}\"\n\
             url = \"{url}\"\nsecret = \"{secret}\"\nevents = {events}\n"
        )
    }

    #[test]
    fn a_good_file_gives_its_endpoints_and_routes() {
        let cfg = WebhookConfig::parse(&endpoint(
            "chat",
            "https://hooks.example/arbor",
            SECRET,
            r#"["requested", "decided", "decided"]"#,
        ))
        .unwrap();
        assert_eq!(cfg.endpoints.len(), 1);
        assert_eq!(cfg.retry, Retry::default());
        let routes = cfg.routes();
        assert_eq!(routes.link_base, "https://inbox.example");
        assert_eq!(
            routes.endpoints,
            vec![(
                "chat".to_string(),
                vec![EventKind::Requested, EventKind::Decided]
            )]
        );
        assert_eq!(WebhookConfig::parse("").unwrap().endpoints.len(), 0);
    }

    #[test]
    fn every_mistake_names_the_endpoint_and_what_is_accepted() {
        let url = "https://hooks.example/x";
        for (file, wanted) in [
            (
                endpoint("chat", url, SECRET, r#"["requested", "approved"]"#),
                vec![
                    "endpoint \"chat\"",
                    "unknown event kind \"approved\"",
                    "requested, voted, stage_opened, escalated, reminded, decided, expired",
                ],
            ),
            (
                endpoint("chat", url, SECRET, "[]"),
                vec![
                    "endpoint \"chat\"",
                    "events is empty",
                    "accepted: requested",
                ],
            ),
            (
                endpoint("chat", "ftp://x/y", SECRET, r#"["decided"]"#),
                vec!["endpoint \"chat\"", "must be http://"],
            ),
            (
                endpoint("chat", url, "whsec_???", r#"["decided"]"#),
                vec![
                    "endpoint \"chat\"",
                    "secret is not \"whsec_\" followed by base64",
                ],
            ),
            (
                endpoint("bad name", url, SECRET, r#"["decided"]"#),
                vec!["endpoint #1", "name \"bad name\" must be"],
            ),
            (
                format!("{}{}", endpoint("a", url, SECRET, r#"["decided"]"#), {
                    let second = endpoint("a", url, SECRET, r#"["expired"]"#);
                    second.split_once('\n').unwrap().1.to_string()
                }),
                vec!["endpoint \"a\"", "names must differ"],
            ),
            (
                endpoint("chat", url, SECRET, r#"["decided"]"#).replace("link_base", "#"),
                vec!["link_base is missing"],
            ),
            (
                endpoint("chat", url, SECRET, r#"["decided"]"#) + "colour = 1\n",
                vec!["unknown field", "name, url, secret, events"],
            ),
            ("retry_min_ms = 0\n".to_string(), vec!["retry_min_ms (0)"]),
        ] {
            let err = WebhookConfig::parse(&file).unwrap_err();
            for w in wanted {
                assert!(err.contains(w), "{err:?} lacks {w:?}");
            }
            assert!(!err.contains("MfKQ9r8"), "a secret is never shown: {err}");
        }
    }

    #[test]
    fn a_file_that_cannot_be_read_names_itself() {
        let err = WebhookConfig::from_file(Path::new("/nonexistent/hooks.toml")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/hooks.toml"), "{err}");
    }
}
