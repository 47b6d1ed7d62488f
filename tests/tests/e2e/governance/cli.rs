//! The command line a person uses: `pending --mine` shows the quorum, `vote` answers with the
//! progress and who is still to vote, `comment`, and `approve --digest` takes the decision.

use std::sync::Arc;

use arbor_shared::proto::runner::v1 as rpb;
use arbor_tests::{Binaries, Profile};

use super::{Env, Expect, payment};

/// Runs `approval-svc ARGS` as `who` against approval replica 0; its stdout (it must succeed).
async fn cli(env: &Env, who: &str, args: &[&str]) -> String {
    let out = tokio::process::Command::new(Binaries::get(Profile::Debug).approval)
        .args(args)
        .args([
            "--addr",
            &env.approval_urls[0],
            "--token",
            env.tokens.of(who),
        ])
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "approval-svc {args:?} as {who}: {stderr}"
    );
    stdout
}

pub async fn a_person_votes_from_the_command_line(env: Arc<Env>) -> Vec<Expect> {
    let args = payment(4000, "cli-co");
    let a = env.submit("gov-cli", &args).await;
    let id = a.request_id.as_str();
    let mine = cli(&env, "paul", &["pending", "--mine"]).await;
    assert!(
        mine.contains(id) && mine.contains("0 of 2 in payments"),
        "{mine}"
    );
    let not_mine = cli(&env, "pam", &["pending", "--mine"]).await;
    assert!(
        !not_mine.contains(id),
        "pam is excluded by the rule: {not_mine}"
    );
    let voted = cli(&env, "paul", &["vote", id, "approve", "--reason", "ok"]).await;
    assert!(
        voted.contains("PENDING") && voted.contains("1 of 2 in payments"),
        "{voted}"
    );
    assert!(voted.contains("waiting on pete, pia"), "{voted}");
    let commented = cli(&env, "pete", &["comment", id, "amount checked"]).await;
    assert!(commented.contains("1 comments"), "{commented}");
    let stale = tokio::process::Command::new(Binaries::get(Profile::Debug).approval)
        .args(["approve", id, "--digest", "sha256:00"])
        .args([
            "--addr",
            &env.approval_urls[0],
            "--token",
            env.tokens.of("pia"),
        ])
        .output()
        .await
        .unwrap();
    assert!(!stale.status.success(), "a stale digest is refused");
    assert!(String::from_utf8_lossy(&stale.stderr).contains("FailedPrecondition"));
    let decided = cli(&env, "pia", &["approve", id, "--digest", &a.args_digest]).await;
    assert!(decided.contains("RESOLVED"), "{decided}");
    env.wait_run("gov-cli", rpb::RunStatus::Succeeded).await;
    let shown = cli(&env, "pia", &["show", id]).await;
    let shown: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(shown["args_digest"], a.args_digest.as_str());
    assert_eq!(shown["comments"][0]["author"], "pete");
    vec![("gov-cli".into(), Some(args))]
}
