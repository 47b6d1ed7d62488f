//! The docs stay honest: every relative link in the project's Markdown leads to a file (and an
//! `#anchor` to a heading of it), every `arbor_…` metric the docs name is emitted by the real
//! binaries on sled or PostgreSQL and every metric they emit is documented, and the README stays
//! at a user's size.
//!
//! `docs/notes/` is left out: it is history, whose links and metric names are those of the
//! releases it describes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use arbor_shared::proto::{approval::v1 as apb, runner::v1 as rpb};
use arbor_testkit::{PgCluster, webhooks::WebhookReceiver};
use arbor_tests::{
    Cluster, Profile, WAIT, eventually, flow, gate_tree, process::workspace_root, scrape::scrape,
};

/// The README says what Arbor is and where to read on; the rest lives in `docs/`.
const README_MAX_LINES: usize = 250;

/// History, kept as it was written (see the module comment).
const HISTORY: &str = "docs/notes";

/// `arbor_…` names the docs use that are not metrics, each with the file that defines it: the
/// file must exist and name it (or be named by it), so the docs cannot keep one that is gone.
const NOT_METRICS: &[(&str, &str)] = &[
    // PostgreSQL notification channels.
    (
        "arbor_runner_events",
        "runner-svc/src/store/postgres/wake.rs",
    ),
    ("arbor_runner_work", "runner-svc/src/store/postgres/wake.rs"),
    ("arbor_approvals", "approval-svc/src/store/postgres/mod.rs"),
    // The table of schema versions.
    ("arbor_schema", "shared/src/postgres/mod.rs"),
    // The Python client package's module name.
    ("arbor_client", "clients/python/pyproject.toml"),
];

/// The suffixes the samples of a family of each type add to its name (OpenMetrics).
fn sample_suffixes(kind: &str) -> &'static [&'static str] {
    match kind {
        "counter" => &["_total", "_created"],
        "histogram" => &["_bucket", "_sum", "_count", "_created"],
        "summary" => &["_sum", "_count", "_created"],
        _ => &[],
    }
}

#[test]
fn the_readme_stays_at_a_user_s_size() {
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move details into docs/"
    );
    // CI runs the test command the README gives; both commands stay in it.
    for command in ["bash deploy/demo.sh", "cargo test --workspace"] {
        assert!(readme.contains(command), "README.md lost `{command}`");
    }
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = workspace_root();
    let mut broken = Vec::new();
    let mut headings = BTreeMap::<PathBuf, BTreeSet<String>>::new();
    for file in markdown_files(&root) {
        let text = std::fs::read_to_string(&file).unwrap();
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match link.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (link.as_str(), None),
            };
            let target = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            let shown = format!("{}: ({link})", rel(&root, &file));
            if !target.exists() {
                broken.push(format!("{shown}: no such file"));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if target.extension().is_none_or(|e| e != "md") {
                continue;
            }
            let known = headings
                .entry(target.clone())
                .or_insert_with(|| slugs(&std::fs::read_to_string(&target).unwrap_or_default()));
            if !known.contains(anchor) {
                broken.push(format!("{shown}: no heading #{anchor}"));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// Both services on sled and on PostgreSQL, each pair taken once round the approval loop (so
/// that every family has samples, a subscriber's lag among them), then scraped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_docs_name_is_emitted_and_every_emitted_one_is_documented() {
    let root = workspace_root();
    let mut named = BTreeMap::<String, String>::new();
    for file in markdown_files(&root) {
        let text = std::fs::read_to_string(&file).unwrap();
        for name in arbor_names(&text) {
            named.entry(name).or_insert_with(|| rel(&root, &file));
        }
    }
    for (name, file) in NOT_METRICS {
        let path = root.join(file);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{file}, which defines `{name}`: {e}"));
        let stem = path.file_stem().unwrap().to_string_lossy();
        assert!(
            stem == *name || text.contains(name),
            "{file} no longer defines `{name}`, which the docs name"
        );
        named.remove(*name);
    }

    let mut emitted = BTreeMap::new();
    // An endpoint, so that the webhook metrics are emitted too.
    let receiver = WebhookReceiver::start(HOOK_SECRET).await;
    let hooks = tempfile::tempdir().unwrap();
    let webhooks = webhooks_args(hooks.path(), &receiver);
    let sled = Cluster::start_with(Profile::Debug, Vec::new(), webhooks.clone()).await;
    emitted.extend(families_after_one_approval(&sled).await);
    drop(sled);
    let url = tokio::task::spawn_blocking(|| PgCluster::shared().fresh_database("docs_metrics"))
        .await
        .unwrap();
    let store = vec!["--store".to_string(), url];
    let postgres =
        Cluster::start_with(Profile::Debug, store.clone(), [store, webhooks].concat()).await;
    emitted.extend(families_after_one_approval(&postgres).await);

    let family_of = |name: &str| -> Option<String> {
        emitted
            .iter()
            .find(|(family, kind)| {
                name == family.as_str()
                    || sample_suffixes(kind)
                        .iter()
                        .any(|s| name.strip_suffix(s) == Some(family.as_str()))
            })
            .map(|(family, _)| family.clone())
    };
    let unknown: Vec<String> = named
        .iter()
        .filter(|(name, _)| family_of(name).is_none())
        .map(|(name, file)| format!("{file}: {name}"))
        .collect();
    assert!(
        unknown.is_empty(),
        "metrics the docs name that neither binary emits (on sled or PostgreSQL):\n{}\nemitted: {emitted:?}",
        unknown.join("\n")
    );
    let documented: BTreeSet<String> = named.keys().filter_map(|n| family_of(n)).collect();
    let undocumented: Vec<&String> = emitted
        .keys()
        .filter(|f| !documented.contains(*f))
        .collect();
    assert!(
        undocumented.is_empty(),
        "metrics emitted but named in no doc: {undocumented:?}"
    );
}

const HOOK_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// `--webhooks` with a file in `dir` naming `receiver` as the one endpoint.
fn webhooks_args(dir: &Path, receiver: &WebhookReceiver) -> Vec<String> {
    let file = dir.join("webhooks.toml");
    let toml = format!(
        "link_base = \"https://inbox.example\"\n[[endpoint]]\nname = \"docs\"\n\
         url = \"{}\"\nsecret = \"{HOOK_SECRET}\"\nevents = [\"decided\"]\n",
        receiver.url()
    );
    std::fs::write(&file, toml).unwrap();
    vec!["--webhooks".into(), file.display().to_string()]
}

/// One gated run approved and finished, approval-svc's cursor acked, then the metric families
/// both services expose (their `# TYPE` lines; every sample is of one of them).
async fn families_after_one_approval(cluster: &Cluster) -> BTreeMap<String, String> {
    let run = flow::submit(cluster, gate_tree("docs-metrics", "failure"), None).await;
    let pending = flow::approval_of(cluster, &run.run_id, apb::ApprovalState::Pending).await;
    flow::approve(cluster, &pending.request_id).await;
    flow::wait_run(cluster, &run.run_id, rpb::RunStatus::Succeeded).await;
    let runner = eventually("approval-svc's cursor to be acked", WAIT, || async {
        let s = scrape(&cluster.runner.metrics_url()).await;
        s.get(
            "arbor_runner_subscriber_lag_events",
            &[("subscriber", "approval-svc")],
        )
        .is_some()
        .then_some(s)
    })
    .await;
    let approval = scrape(&cluster.approval.metrics_url()).await;
    let mut families = BTreeMap::new();
    for text in [&runner.text, &approval.text] {
        for line in text.lines() {
            if let Some((family, kind)) = line
                .strip_prefix("# TYPE ")
                .and_then(|rest| rest.split_once(' '))
            {
                families.insert(family.to_string(), kind.to_string());
            }
        }
    }
    assert!(
        families.keys().any(|f| f.starts_with("arbor_runner_"))
            && families.keys().any(|f| f.starts_with("arbor_approval_")),
        "both scrapes hold arbor metrics: {families:?}"
    );
    families.retain(|f, _| f.starts_with("arbor_"));
    families
}

/// Every Markdown file of the project: not build output, installed packages, hidden
/// directories or history.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if path.is_dir() {
                let skipped = name.starts_with('.')
                    || name == "target"
                    || name == "node_modules"
                    || path == root.join(HISTORY);
                if !skipped {
                    dirs.push(path);
                }
            } else if name.ends_with(".md") {
                found.push(path);
            }
        }
    }
    found.sort();
    assert!(found.len() > 5, "Markdown files found: {found:?}");
    found
}

fn rel(root: &Path, file: &Path) -> String {
    file.strip_prefix(root)
        .unwrap_or(file)
        .display()
        .to_string()
}

/// Lines outside fenced code blocks, with inline code spans taken out (a span may sit inside a
/// link's text, never in its destination).
fn prose(markdown: &str) -> Vec<String> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let without_code: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, part)| part)
            .collect();
        lines.push(without_code);
    }
    lines
}

/// The destinations of inline links `[text](destination "title")`.
fn links(markdown: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in prose(markdown) {
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find([')', ' ']).unwrap_or(after.len());
            found.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    found
}

/// GitHub's anchors for the headings of a document: the heading's text in lower case, without
/// punctuation, spaces as hyphens; a repeated one gets `-1`, `-2`….
fn slugs(markdown: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut seen = BTreeMap::<String, usize>::new();
    let mut anchors = BTreeSet::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let text = line.trim_start_matches('#').trim();
        let slug: String = text
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        anchors.insert(if *n == 0 { slug } else { format!("{slug}-{n}") });
        *n += 1;
    }
    anchors
}

/// Every `arbor_…` name in the text, code included (that is where metric names are written),
/// but not Rust paths (`arbor_shared::…`).
fn arbor_names(markdown: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = markdown;
    while let Some(at) = rest.find("arbor_") {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let word_start = before.is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == '-'));
        if word_start && !tail[end..].starts_with("::") {
            names.insert(tail[..end].trim_end_matches('_').to_string());
        }
        rest = &tail[end..];
    }
    names
}

#[test]
fn the_doc_readers_read_what_github_shows() {
    let doc = "# Arbor\n## Durability, exactly\n```\n# not a heading [x](nowhere)\n```\n\
               ## Full cycle, sled and PostgreSQL\n## Full cycle, sled and PostgreSQL\n\
               See [`proto/`](proto/) and [there](docs/a.md#b \"title\"), `[no](link)`.\n\
               `arbor_runner_runs{status}`, arbor_shared::json, `arbor_approval_…`.\n";
    assert_eq!(
        slugs(doc),
        [
            "arbor",
            "durability-exactly",
            "full-cycle-sled-and-postgresql",
            "full-cycle-sled-and-postgresql-1"
        ]
        .map(String::from)
        .into()
    );
    assert_eq!(links(doc), ["proto/", "docs/a.md#b"]);
    assert_eq!(
        arbor_names(doc),
        ["arbor_approval", "arbor_runner_runs"]
            .map(String::from)
            .into()
    );
}
