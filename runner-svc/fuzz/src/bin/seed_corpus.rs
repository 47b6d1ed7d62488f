//! Writes the seed corpora: the encoded checkpoint of each known tree after every step of a
//! cooperative run (fresh, suspended, decided, finished), and each tree document as JSON (first
//! byte even) and YAML (first byte odd) for `tree_parse`.
//!
//! `cargo +nightly run --bin seed_corpus -- corpus` from `runner-svc/fuzz`.

use std::path::PathBuf;

use arbor_runner_fuzz::{T0, THREAD_ID, TREES, answer, env, specs};
use arbor_runner_svc::engine::{self, Checkpoint};
use arbor_shared::domain::SuspensionState;
use serde_json::json;

fn main() -> std::io::Result<()> {
    let root = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "corpus".into()));
    let ck_dir = root.join("checkpoint_decode");
    let tree_dir = root.join("tree_parse");
    std::fs::create_dir_all(&ck_dir)?;
    std::fs::create_dir_all(&tree_dir)?;

    for spec in specs() {
        let input = json!({"order": {"id": 7, "amount": 12.5}});
        let mut ck = Checkpoint::new(
            spec,
            THREAD_ID,
            input.as_object().cloned().unwrap_or_default(),
        );
        let mut now = T0;
        for step in 0..12 {
            std::fs::write(
                ck_dir.join(format!("{}-step{step:02}", spec.id())),
                ck.encode(),
            )?;
            let decisions = ck
                .suspensions()
                .filter(|s| s.state == SuspensionState::Active)
                .map(|s| answer(s, &format!("seed-{step}")))
                .collect();
            let out = engine::tick(spec, &mut ck, decisions, &env(spec, now));
            now += 1_000;
            if out.status != engine::TickStatus::Running {
                std::fs::write(ck_dir.join(format!("{}-final", spec.id())), ck.encode())?;
                break;
            }
        }
    }

    for (i, doc) in TREES.iter().enumerate() {
        let mut json_seed = vec![0u8];
        json_seed.extend_from_slice(doc.as_bytes());
        std::fs::write(tree_dir.join(format!("tree{i}.json")), json_seed)?;
        let value: serde_json::Value = serde_json::from_str(doc).map_err(std::io::Error::other)?;
        let yaml = yaml_of(&value, 0);
        let mut yaml_seed = vec![1u8];
        yaml_seed.extend_from_slice(yaml.as_bytes());
        std::fs::write(tree_dir.join(format!("tree{i}.yaml")), yaml_seed)?;
    }
    Ok(())
}

/// Block-style YAML of a JSON value; scalars are written as JSON, which YAML reads as-is.
fn yaml_of(value: &serde_json::Value, indent: usize) -> String {
    let pad = " ".repeat(indent);
    match value {
        serde_json::Value::Object(map) if !map.is_empty() => map
            .iter()
            .map(|(k, v)| match v {
                serde_json::Value::Object(m) if !m.is_empty() => {
                    format!("{pad}{k}:\n{}", yaml_of(v, indent + 2))
                }
                serde_json::Value::Array(a) if !a.is_empty() => {
                    format!("{pad}{k}:\n{}", yaml_of(v, indent + 2))
                }
                _ => format!("{pad}{k}: {v}\n"),
            })
            .collect(),
        serde_json::Value::Array(items) if !items.is_empty() => items
            .iter()
            // The item's block at indent + 2, its first line moved up behind the dash.
            .map(|v| format!("{pad}- {}", yaml_of(v, indent + 2).trim_start()))
            .collect(),
        other => format!("{pad}{other}\n"),
    }
}
