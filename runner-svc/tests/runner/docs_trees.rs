//! Every example tree in `docs/trees.md` and `docs/workers.md` registers with the real parser and
//! tool registry, so the reference can never drift from what the runner accepts. An example is a ```json block
//! with a top-level "root"; fragments are written in other blocks.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use arbor_runner_svc::engine::TreeFormat;

fn json_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match &mut current {
            None if line.trim_start() == "```json" => current = Some(String::new()),
            None => {}
            Some(_) if line.trim_start() == "```" => blocks.extend(current.take()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    blocks
}

#[tokio::test]
async fn every_example_tree_in_the_reference_registers() {
    let docs = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/");
    let doc = ["trees.md", "workers.md"]
        .map(|f| std::fs::read_to_string(format!("{docs}{f}")).expect("a reference page"))
        .join("\n");
    let dir = tempfile::tempdir().unwrap();
    let runner = common::Backend::Sled.open_runner(dir.path(), |_| {}).await;
    let mut ids = Vec::new();
    for block in json_blocks(&doc) {
        let value: serde_json::Value = serde_json::from_str(&block)
            .unwrap_or_else(|e| panic!("a ```json block is not JSON ({e}):\n{block}"));
        if value.get("root").is_none() {
            continue;
        }
        let (tree, existed) = runner
            .register_tree(&block, TreeFormat::Json)
            .await
            .unwrap_or_else(|e| panic!("example does not register: {e:?}\n{block}"));
        assert!(!existed, "two examples share the id {}", tree.id);
        ids.push(tree.id);
    }
    assert!(
        ids.len() >= 20,
        "only {} examples found: {ids:?}",
        ids.len()
    );
}
