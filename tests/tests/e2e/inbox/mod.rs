//! The web inbox in a real Chromium: both real binaries (authentication on, a 2-of-3 approval
//! rule, the inbox on `--web-listen`), and the Playwright suite in `tests/browser/` run against
//! them with Debian's Chromium — one browser, a context per person (alice, bob and carol approve,
//! all three in `payments`; sam and bob submit). The specs drive the pages and do what happens
//! outside the browser (submitting runs, deciding through the gRPC API) with the services' own
//! CLIs. A failing spec fails this test with Playwright's output; screenshots and traces of
//! failures are under `target/browser/`.
//!
//! `ARBOR_BROWSER_SPECS="specs/live.spec.ts"` runs only the specs it names.
//!
//! One service pair serves every spec: each spec makes runs of its own and asserts about those,
//! so they do not interfere, and the suite costs one start-up.

mod replicas;
mod screenshots;

use std::{net::SocketAddr, path::Path, process::Command, time::Duration};

use arbor_tests::{
    Cluster, Profile, Service,
    auth::{Person, Tokens},
    eventually,
    process::{free_port, workspace_root},
    tools::{chromium, npm_ci, target_dir},
};

/// Payments to quorum-co and edit-co need two of `payments`; other payments and gates one
/// approver.
const POLICY: &str = r#"
[[approval]]
name = "two-of-three"
tool = "ledger.append"
[[approval.when]]
arg = "/payee"
eq = "quorum-co"
[[approval.stage]]
name = "payments"
approvers = ["group:payments"]
required = 2

[[approval]]
name = "two-of-three-edit"
tool = "ledger.append"
[[approval.when]]
arg = "/payee"
eq = "edit-co"
[[approval.stage]]
name = "payments"
approvers = ["group:payments"]
required = 2
"#;

/// The people of the suite.
pub fn people() -> Vec<Person> {
    vec![
        Person::new("alice", &["approver"], &["payments"]),
        Person::new("bob", &["submitter", "approver"], &["payments"]),
        Person::new("carol", &["approver"], &["payments", "writers"]),
    ]
}

/// Both services with the inbox on, the policy and the people; the inbox's address.
pub async fn start(dir: &Path) -> (Cluster, Tokens, SocketAddr) {
    let policy = dir.join("policy.toml");
    std::fs::write(&policy, POLICY).unwrap();
    let web = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let approval_args = vec![
        "--policy".to_string(),
        policy.display().to_string(),
        "--web-listen".to_string(),
        web.to_string(),
    ];
    let (cluster, tokens) =
        Cluster::start_secure_people(Profile::Debug, &people(), Vec::new(), approval_args).await;
    listening(web).await;
    (cluster, tokens, web)
}

/// Waits until the inbox at `web` accepts connections (it listens beside the gRPC port).
pub async fn listening(web: SocketAddr) {
    eventually("the inbox to listen", Duration::from_secs(20), || async {
        tokio::net::TcpStream::connect(web).await.ok().map(|_| ())
    })
    .await;
}

/// What the specs read from their environment: where the services are, the CLIs, the tokens.
pub fn spec_env(cluster: &Cluster, tokens: &Tokens, web: SocketAddr) -> Vec<(String, String)> {
    services_env((&cluster.runner, &cluster.approval), tokens, web)
}

/// [`spec_env`] for one runner and one approval service (a replica each, say).
pub fn services_env(
    (runner, approval): (&Service, &Service),
    tokens: &Tokens,
    web: SocketAddr,
) -> Vec<(String, String)> {
    let mut env = vec![
        ("INBOX_URL".to_string(), format!("http://{web}")),
        ("RUNNER_URL".to_string(), runner.url()),
        ("APPROVAL_URL".to_string(), approval.url()),
        (
            "RUNNER_BIN".to_string(),
            runner.binary.display().to_string(),
        ),
        (
            "APPROVAL_BIN".to_string(),
            approval.binary.display().to_string(),
        ),
        ("TOKEN_SAM".to_string(), tokens.submitter.clone()),
        ("CHROMIUM".to_string(), chromium().display().to_string()),
        ("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD".to_string(), "1".into()),
    ];
    for who in ["alice", "bob", "carol"] {
        env.push((
            format!("TOKEN_{}", who.to_uppercase()),
            tokens.people[who].clone(),
        ));
    }
    env
}

/// One browser suite at a time in this process: one Chromium, whose live-update deadlines are
/// not shared with another suite's.
pub static ONE_BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `npx playwright test ARGS` in `tests/browser` with `env`, its results (screenshots and
/// traces of failures) under `target/browser/{name}`; panics with its output (and the tails of
/// the services' logs) on failure.
pub fn playwright(name: &str, env: &[(String, String)], args: &[&str], services: &[&Service]) {
    let dir = npm_ci(&workspace_root().join("tests/browser"));
    let results = target_dir().join("browser").join(name);
    let out = Command::new("npx")
        .args(["--no-install", "playwright", "test"])
        .args(args)
        .current_dir(&dir)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("ARBOR_BROWSER_OUT", &results)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run npx (is Node.js installed? `apt-get install -y nodejs npm`): {e}")
        });
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        println!("{stdout}");
    }
    assert!(
        out.status.success(),
        "playwright test {args:?} failed ({}); screenshots and traces under {}\n{stdout}\n{stderr}\n{}",
        out.status,
        results.display(),
        services
            .iter()
            .map(|s| format!("--- {} (log tail) ---\n{}", s.log.display(), s.log_tail()))
            .collect::<String>(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_in_a_real_chromium() {
    // Tools first: a missing browser or Node fails here, naming the install command.
    chromium();
    let _one = ONE_BROWSER.lock().await;
    npm_ci(&workspace_root().join("tests/browser"));
    let dir = tempfile::tempdir().unwrap();
    let (cluster, tokens, web) = start(dir.path()).await;
    let env = spec_env(&cluster, &tokens, web);
    // `ARBOR_BROWSER_SPECS="specs/live.spec.ts specs/bulk.spec.ts"` runs only those.
    let only = std::env::var("ARBOR_BROWSER_SPECS").unwrap_or_default();
    let mut args: Vec<&str> = only.split_whitespace().collect();
    // The replica specs run against replicas (`replicas.rs`).
    args.extend(["--grep-invert", "@replicas"]);
    let services = [&cluster.runner, &cluster.approval];
    // Playwright blocks; the services are separate processes, so this thread may wait on it.
    tokio::task::block_in_place(|| playwright("suite", &env, &args, &services));
}
