//! The bad-input rows of the governance RPCs: Delegate, RevokeDelegation, ListDelegations,
//! Claim, Reassign, Comment, a stale digest on Resolve and the new list filters.

use arbor_shared::{
    proto::{approval::v1 as apb, runner::v1 as rpb},
    time::timestamp,
};
use arbor_tests::clients::{ApprovalClient, approvals_as};

use super::{Case, DENIED, Fixture, INVALID, NOT_FOUND, PRECONDITION, case, unit};

const HOUR_MS: u64 = 3_600_000;

fn now_ms() -> u64 {
    arbor_shared::time::now_ms()
}

fn delegation(to: &str) -> apb::DelegateRequest {
    apb::DelegateRequest {
        to: to.into(),
        ends: Some(timestamp(now_ms() + HOUR_MS)),
        ..Default::default()
    }
}

pub(super) fn cases(fx: &Fixture) -> Vec<Case> {
    let alice = approvals_as(&fx.approval_url, Some(&fx.tokens.approver));
    let sam = approvals_as(&fx.approval_url, Some(&fx.tokens.submitter));
    let delegate = |who: &ApprovalClient, r: apb::DelegateRequest| {
        let mut who = who.clone();
        async move { unit(who.delegate(r).await) }
    };
    let claim = |who: &ApprovalClient, r: apb::ClaimRequest| {
        let mut who = who.clone();
        async move { unit(who.claim(r).await) }
    };
    let comment = |who: &ApprovalClient, r: apb::CommentRequest| {
        let mut who = who.clone();
        async move { unit(who.comment(r).await) }
    };
    let gate = fx.gate_request.clone();
    let mut alice_ = alice.clone();
    let mut alice2 = alice.clone();
    let mut alice3 = alice.clone();
    let mut alice4 = alice.clone();
    let mut alice5 = alice.clone();
    let mut sam_ = sam.clone();
    let stale = apb::ResolveRequest {
        request_id: gate.clone(),
        decision: rpb::DecisionKind::Approve as i32,
        expected_digest: "sha256:0000".into(),
        ..Default::default()
    };
    vec![
        case(
            "Delegate: no delegate",
            INVALID,
            delegate(&alice, delegation("")),
        ),
        case(
            "Delegate: no end",
            INVALID,
            delegate(
                &alice,
                apb::DelegateRequest {
                    to: "bob".into(),
                    ..Default::default()
                },
            ),
        ),
        case(
            "Delegate: an end in the past",
            INVALID,
            delegate(
                &alice,
                apb::DelegateRequest {
                    ends: Some(timestamp(now_ms() - HOUR_MS)),
                    ..delegation("bob")
                },
            ),
        ),
        case(
            "Delegate: to oneself",
            INVALID,
            delegate(&alice, delegation("alice")),
        ),
        case(
            "Delegate: a scope that is no glob",
            INVALID,
            delegate(
                &alice,
                apb::DelegateRequest {
                    scope: "[".into(),
                    ..delegation("bob")
                },
            ),
        ),
        case(
            "Delegate: more than a year",
            INVALID,
            delegate(
                &alice,
                apb::DelegateRequest {
                    ends: Some(timestamp(now_ms() + 400 * 24 * HOUR_MS)),
                    ..delegation("bob")
                },
            ),
        ),
        case(
            "Delegate: another's seat, not an operator",
            DENIED,
            delegate(
                &alice,
                apb::DelegateRequest {
                    from: "bob".into(),
                    ..delegation("carol")
                },
            ),
        ),
        case(
            "Delegate: a submitter",
            DENIED,
            delegate(&sam, delegation("bob")),
        ),
        case(
            "Delegate: a NUL in the delegate",
            INVALID,
            delegate(&alice, delegation("b\0b")),
        ),
        case("RevokeDelegation: no id", INVALID, async move {
            unit(
                alice_
                    .revoke_delegation(apb::RevokeDelegationRequest::default())
                    .await,
            )
        }),
        case("RevokeDelegation: unknown id", NOT_FOUND, async move {
            let r = apb::RevokeDelegationRequest { id: "nope".into() };
            unit(alice2.revoke_delegation(r).await)
        }),
        case("ListDelegations: a submitter", DENIED, async move {
            unit(
                sam_.list_delegations(apb::ListDelegationsRequest::default())
                    .await,
            )
        }),
        case(
            "ListDelegations: another's, as an approver",
            DENIED,
            async move {
                let r = apb::ListDelegationsRequest {
                    principal: "bob".into(),
                };
                unit(alice3.list_delegations(r).await)
            },
        ),
        case(
            "Claim: no request id",
            INVALID,
            claim(&alice, apb::ClaimRequest::default()),
        ),
        case(
            "Claim: unknown request",
            NOT_FOUND,
            claim(
                &alice,
                apb::ClaimRequest {
                    request_id: "nope".into(),
                    ..Default::default()
                },
            ),
        ),
        case(
            "Claim: a release with a ttl",
            INVALID,
            claim(
                &alice,
                apb::ClaimRequest {
                    request_id: gate.clone(),
                    ttl_ms: 5,
                    release: true,
                },
            ),
        ),
        case(
            "Claim: an approval already pruned",
            PRECONDITION,
            claim(
                &alice,
                apb::ClaimRequest {
                    request_id: fx.done_request.clone(),
                    ..Default::default()
                },
            ),
        ),
        case(
            "Claim: a submitter",
            DENIED,
            claim(
                &sam,
                apb::ClaimRequest {
                    request_id: gate.clone(),
                    ..Default::default()
                },
            ),
        ),
        case("Reassign: no one to give it to", INVALID, async move {
            let r = apb::ReassignRequest {
                request_id: "x".into(),
                to: String::new(),
            };
            unit(alice4.reassign(r).await)
        }),
        case(
            "Comment: empty",
            INVALID,
            comment(
                &alice,
                apb::CommentRequest {
                    request_id: gate.clone(),
                    text: " ".into(),
                },
            ),
        ),
        case(
            "Comment: over 4096 bytes",
            INVALID,
            comment(
                &alice,
                apb::CommentRequest {
                    request_id: gate.clone(),
                    text: "x".repeat(5000),
                },
            ),
        ),
        case(
            "Comment: a NUL",
            INVALID,
            comment(
                &alice,
                apb::CommentRequest {
                    request_id: gate.clone(),
                    text: "a\0b".into(),
                },
            ),
        ),
        case(
            "Comment: unknown request",
            NOT_FOUND,
            comment(
                &alice,
                apb::CommentRequest {
                    request_id: "nope".into(),
                    text: "hi".into(),
                },
            ),
        ),
        case(
            "Resolve: a digest that is not the approval's",
            PRECONDITION,
            async move { unit(alice5.resolve(stale).await) },
        ),
        case("ListApprovals: a group with a NUL", INVALID, {
            let mut alice = alice.clone();
            async move {
                let r = apb::ListApprovalsRequest {
                    filter: Some(apb::ApprovalFilter {
                        group: "a\0".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                unit(alice.list_approvals(r).await)
            }
        }),
    ]
}

/// A mistake in an approval rule stops approval-svc at start-up with the file, the rule's line
/// and the accepted values, before it serves anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_approval_rule_stops_start_up_naming_the_file_the_line_and_what_is_accepted() {
    use arbor_tests::{Binaries, Profile, process::run_to_exit};
    let bins = Binaries::get(Profile::Debug);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.toml");
    let cases = [
        (
            "default = \"ask\"\n\n[[approval]]\ntool = \"pay*\"\n[[approval.stage]]\napprovers = [\"team:x\"]\n",
            vec!["approval[0] (line 3)", "user:NAME, group:NAME or role:NAME"],
        ),
        (
            "[[approval]]\n[[approval.stage]]\napprovers = [\"user:a\"]\non_reject = \"never\"\n",
            vec!["line 4", "veto", "count"],
        ),
        (
            "[[approval]]\n[[approval.stage]]\napprovers = [\"user:a\"]\nrequired = \"most\"\n",
            vec!["\"all\" or a percentage"],
        ),
    ];
    for (text, wanted) in cases {
        std::fs::write(&file, text).unwrap();
        let args = vec![
            "serve".to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--data-dir".into(),
            dir.path().join("data").display().to_string(),
            "--metrics-listen".into(),
            "off".into(),
            "--policy".into(),
            file.display().to_string(),
        ];
        let exited = run_to_exit(&bins.approval, &args, std::time::Duration::from_secs(20)).await;
        assert!(
            !exited.timed_out && exited.code.is_some_and(|c| c != 0),
            "{exited:?}"
        );
        for w in wanted.into_iter().chain([file.to_str().unwrap()]) {
            assert!(exited.stderr.contains(w), "{w:?} in {}", exited.stderr);
        }
        assert!(!exited.stderr.contains("panicked"), "{}", exited.stderr);
    }
}
