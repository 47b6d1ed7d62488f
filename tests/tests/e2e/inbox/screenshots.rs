//! Not a check: regenerates the inbox screenshots the docs show (`docs/img/inbox-*.png`) against
//! services started as the browser tests start them. Run it with `bash tests/browser/screenshots.sh`.

use super::{playwright, spec_env, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "regenerates docs/img; run with tests/browser/screenshots.sh"]
async fn regenerate_the_docs_screenshots() {
    std::fs::create_dir_all(arbor_tests::process::workspace_root().join("docs/img")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cluster, tokens, web) = start(dir.path()).await;
    let env = spec_env(&cluster, &tokens, web);
    let services = [&cluster.runner, &cluster.approval];
    let args = ["--config", "playwright.screenshots.config.ts"];
    tokio::task::block_in_place(|| playwright("screenshots", &env, &args, &services));
}
