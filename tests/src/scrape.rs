//! Scraping a service's `/metrics` the way Prometheus does (plain HTTP/1.1 GET) and reading
//! samples out of the OpenMetrics text.

use std::collections::BTreeMap;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One scrape: `name{labels}` → value, labels sorted by name as the exposition prints them.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    pub samples: BTreeMap<String, f64>,
    pub text: String,
}

impl Scrape {
    /// The value of `name` with exactly `labels` (in any order), or `None`.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples.get(&key(name, labels)).copied()
    }

    /// Like `get`, but 0 when the sample is absent (a family that has not seen that label yet).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels).unwrap_or(0.0)
    }
}

fn key(name: &str, labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return name.to_string();
    }
    let mut labels = labels.to_vec();
    labels.sort();
    let inner: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    format!("{name}{{{}}}", inner.join(","))
}

/// Parses the text exposition (comments skipped, labels normalised to sorted order).
pub fn parse(text: &str) -> Scrape {
    let mut samples = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let normalised = match series.split_once('{') {
            Some((name, rest)) => {
                let inner = rest.trim_end_matches('}');
                let labels: Vec<(&str, &str)> = inner
                    .split(',')
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k, v.trim_matches('"')))
                    .collect();
                key(name, &labels)
            }
            None => series.to_string(),
        };
        samples.insert(normalised, value);
    }
    Scrape {
        samples,
        text: text.to_string(),
    }
}

/// GETs `http://host:port/metrics`; panics on anything but 200.
pub async fn scrape(url: &str) -> Scrape {
    let rest = url.strip_prefix("http://").expect("an http:// url");
    let (authority, path) = match rest.split_once('/') {
        Some((a, p)) => (a, format!("/{p}")),
        None => (rest, "/".to_string()),
    };
    let mut stream = tokio::net::TcpStream::connect(authority)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"));
    let request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "scrape of {url} failed:\n{head}"
    );
    parse(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_samples_with_and_without_labels() {
        let s =
            parse("# HELP a_total x\n# TYPE a counter\na_total 3\nb{z=\"1\",a=\"2\"} 4.5\n# EOF\n");
        assert_eq!(s.get("a_total", &[]), Some(3.0));
        assert_eq!(s.get("b", &[("a", "2"), ("z", "1")]), Some(4.5));
        assert_eq!(s.value("missing", &[]), 0.0);
    }
}
