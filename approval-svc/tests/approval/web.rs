//! The web inbox over real HTTP on 127.0.0.1:0, beside the gRPC API of the same service:
//! nothing without a session, sign-in and sign-out, CSRF, the security headers, untrusted text
//! escaped, the submitter told why they cannot decide, a stale digest refused with what
//! changed, a decision through the web recorded exactly as one through gRPC, and the event
//! stream with its resumption.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;

use arbor_shared::{
    auth::{Authenticator, hash_token},
    json::to_proto_value,
    proto::{approval::v1 as pb, runner::v1::DecisionKind},
};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::json;

use crate::support::*;

fn tokens() -> Authenticator {
    let mut text = String::new();
    for (name, role) in [
        ("ana", "approver"),
        ("bob", "approver"),
        ("sam", "approver"),
    ] {
        text.push_str(&format!(
            "[[principal]]\nname = '{name}'\nroles = ['{role}']\ntoken_sha256 = '{}'\n",
            hash_token(&format!("{name}-token"))
        ));
    }
    Authenticator::from_toml(&text).unwrap()
}

struct Page {
    status: u16,
    headers: http::HeaderMap,
    body: String,
}

impl Page {
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }

    /// The CSRF token of the page's forms.
    fn csrf(&self) -> String {
        let at = self
            .body
            .find("name=\"csrf\" value=\"")
            .expect("a form with csrf")
            + 19;
        self.body[at..at + 32].to_string()
    }
}

/// A browser of one person: their session cookie, if signed in.
#[derive(Clone)]
struct Browser {
    addr: SocketAddr,
    cookie: Option<String>,
}

impl Browser {
    fn new(addr: SocketAddr) -> Self {
        Self { addr, cookie: None }
    }

    async fn response(
        &self,
        method: &str,
        path: &str,
        form: Option<&[(&str, &str)]>,
        extra: &[(&str, &str)],
    ) -> http::Response<hyper::body::Incoming> {
        let stream = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let mut req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "localhost");
        if let Some(c) = &self.cookie {
            req = req.header("cookie", format!("arbor_session={c}"));
        }
        for (k, v) in extra {
            req = req.header(*k, *v);
        }
        let body = match form {
            Some(f) => {
                req = req.header("content-type", "application/x-www-form-urlencoded");
                form_urlencoded::Serializer::new(String::new())
                    .extend_pairs(f)
                    .finish()
            }
            None => String::new(),
        };
        sender
            .send_request(req.body(Full::new(Bytes::from(body))).unwrap())
            .await
            .unwrap()
    }

    async fn send(&self, method: &str, path: &str, form: Option<&[(&str, &str)]>) -> Page {
        let res = self.response(method, path, form, &[]).await;
        let (parts, body) = res.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        Page {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }

    async fn get(&self, path: &str) -> Page {
        self.send("GET", path, None).await
    }

    async fn post(&self, path: &str, form: &[(&str, &str)]) -> Page {
        self.send("POST", path, Some(form)).await
    }

    async fn sign_in(addr: SocketAddr, token: &str) -> Self {
        let res = Self::new(addr).post("/sign-in", &[("token", token)]).await;
        assert_eq!(res.status, 303, "{}", res.body);
        let cookie = res.header("set-cookie");
        let sid = cookie
            .strip_prefix("arbor_session=")
            .and_then(|c| c.split(';').next())
            .unwrap()
            .to_string();
        Self {
            addr,
            cookie: Some(sid),
        }
    }
}

struct Env {
    _dir: tempfile::TempDir,
    runner: FakeRunner,
    svc: Svc,
    web: SocketAddr,
    /// ana's gRPC client.
    client: Client,
}

async fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let runner = FakeRunner::start().await;
    let mut cfg = config(dir.path(), &runner.url());
    cfg.auth = tokens();
    let (svc, web) = Svc::start_web(cfg).await;
    let client = svc.client_as(Some("ana-token")).await;
    Env {
        _dir: dir,
        runner,
        svc,
        web,
        client,
    }
}

async fn seed(e: &Env, r: arbor_shared::proto::runner::v1::ApprovalRequested) -> pb::Approval {
    let id = r.request_id.clone();
    e.runner.push_request(r);
    wait_for(&e.client, &id, "seeded", |_| true).await
}

#[tokio::test]
async fn nothing_without_a_session_and_every_response_has_the_security_headers() {
    let e = env().await;
    seed(&e, node_request("r1", "run-1")).await;
    let anon = Browser::new(e.web);
    for path in [
        "/queue",
        "/items/r1",
        "/items/r1/edit",
        "/questions/run-1/q1",
        "/",
    ] {
        let res = anon.get(path).await;
        assert_eq!(res.status, 303, "{path}");
        assert!(
            matches!(res.header("location"), "/sign-in" | "/queue"),
            "{path}"
        );
    }
    for path in [
        "/fragments/queue?q=mine",
        "/fragments/counts",
        "/items/r1/live",
        "/items/r1/timeline",
        "/events",
    ] {
        assert_eq!(anon.get(path).await.status, 401, "{path}");
    }
    let res = anon
        .post(
            "/items/r1/decide",
            &[("decision", "approve"), ("csrf", "x")],
        )
        .await;
    assert_eq!(res.status, 303);
    assert_eq!(res.header("location"), "/sign-in");

    let page = anon.get("/sign-in").await;
    assert_eq!(page.status, 200);
    let csp = page.header("content-security-policy");
    for part in [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "frame-ancestors 'none'",
        "form-action 'self'",
        "base-uri 'none'",
    ] {
        assert!(csp.contains(part), "{csp}");
    }
    assert_eq!(page.header("x-content-type-options"), "nosniff");
    assert_eq!(page.header("referrer-policy"), "same-origin");
    assert!(!page.body.contains("<script>") && !page.body.contains("style="));
    assert_eq!(
        get(&mut e.client.clone(), "r1").await.state,
        pb::ApprovalState::Pending as i32
    );
}

#[tokio::test]
async fn sign_in_keeps_the_token_on_the_server_and_sign_out_ends_the_session() {
    let e = env().await;
    let refused = Browser::new(e.web)
        .post("/sign-in", &[("token", "not-a-token")])
        .await;
    assert_eq!(refused.status, 401);
    assert!(refused.header("set-cookie").is_empty());

    let res = Browser::new(e.web)
        .post("/sign-in", &[("token", "ana-token")])
        .await;
    let cookie = res.header("set-cookie");
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let sid = cookie
        .split(';')
        .next()
        .unwrap()
        .trim_start_matches("arbor_session=");
    assert_eq!(sid.len(), 32, "128 random bits as hex");

    let ana = Browser::sign_in(e.web, "ana-token").await;
    let page = ana.get("/queue").await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("Signed in as <strong>ana</strong>"));
    assert!(
        !page.body.contains("ana-token"),
        "the token never reaches a page"
    );

    // Without the CSRF token the sign-out is refused and the session lives on.
    assert_eq!(ana.post("/sign-out", &[]).await.status, 403);
    assert_eq!(ana.get("/queue").await.status, 200);
    let out = ana.post("/sign-out", &[("csrf", &page.csrf())]).await;
    assert_eq!(out.status, 303);
    assert!(out.header("set-cookie").contains("Max-Age=0"));
    assert_eq!(ana.get("/queue").await.status, 303, "the session is gone");
    assert_eq!(ana.get("/events").await.status, 401);
}

#[tokio::test]
async fn a_post_without_the_csrf_token_is_refused_and_changes_nothing() {
    let e = env().await;
    let a = seed(&e, node_request("r1", "run-1")).await;
    let ana = Browser::sign_in(e.web, "ana-token").await;
    let before = audit_actions(&mut e.client.clone(), "r1").await.len();
    for form in [
        vec![("decision", "approve"), ("digest", a.args_digest.as_str())],
        vec![
            ("decision", "approve"),
            ("digest", a.args_digest.as_str()),
            ("csrf", "00000000000000000000000000000000"),
        ],
    ] {
        let res = ana.post("/items/r1/decide", &form).await;
        assert_eq!(res.status, 403, "{}", res.body);
        assert!(res.body.contains("Nothing was changed"));
    }
    for path in ["/items/r1/comment", "/items/r1/claim", "/bulk"] {
        assert_eq!(
            ana.post(path, &[("text", "hi"), ("id", "r1")]).await.status,
            403
        );
    }
    let now = get(&mut e.client.clone(), "r1").await;
    assert_eq!(now.state, pb::ApprovalState::Pending as i32);
    assert!(now.comments.is_empty() && now.claim.is_none());
    assert_eq!(
        audit_actions(&mut e.client.clone(), "r1").await.len(),
        before
    );
}

#[tokio::test]
async fn untrusted_text_is_rendered_as_text() {
    let e = env().await;
    let mut r = tool_request("r1", "run-1", "deploy.apply");
    r.title = "<script>alert(1)</script>".into();
    r.tool_args = Some(to_proto_value(
        &json!({"name": "\"><img src=x onerror=alert(2)>"}),
    ));
    seed(&e, r).await;
    let ana = Browser::sign_in(e.web, "ana-token").await;
    let comment = "<b onmouseover=alert(3)>hi</b>";
    let item = ana.get("/items/r1").await;
    ana.post(
        "/items/r1/comment",
        &[("csrf", &item.csrf()), ("text", comment)],
    )
    .await;
    for path in ["/queue?q=pending", "/items/r1", "/items/r1/edit"] {
        let page = ana.get(path).await;
        assert_eq!(page.status, 200, "{path}");
        assert!(!page.body.contains("<script>alert"), "{path}");
        assert!(!page.body.contains("<img src=x"), "{path}");
        assert!(!page.body.contains("<b onmouseover"), "{path}");
        assert!(
            page.body
                .contains("&#60;script&#62;alert(1)&#60;/script&#62;"),
            "{path}"
        );
    }
    let item = ana.get("/items/r1").await;
    assert!(item.body.contains("&#60;img src=x onerror=alert(2)&#62;"));
    assert!(
        item.body
            .contains("&#60;b onmouseover=alert(3)&#62;hi&#60;/b&#62;")
    );
}

#[tokio::test]
async fn a_decision_through_the_web_is_recorded_as_one_through_grpc() {
    let e = env().await;
    let a1 = seed(&e, node_request("r1", "run-1")).await;
    seed(&e, node_request("r2", "run-2")).await;
    let ana = Browser::sign_in(e.web, "ana-token").await;
    let item = ana.get("/items/r1").await;
    assert!(
        item.body.contains("any approver may decide it"),
        "{}",
        item.body
    );
    let res = ana
        .post(
            "/items/r1/decide",
            &[
                ("csrf", &item.csrf()),
                ("digest", &a1.args_digest),
                ("decision", "reject"),
                ("reason", "not now"),
            ],
        )
        .await;
    assert_eq!(res.status, 303, "{}", res.body);
    assert_eq!(res.header("location"), "/items/r1");
    let mut grpc = resolve_req("r2", DecisionKind::Reject);
    grpc.reason = "not now".into();
    e.client.clone().resolve(grpc).await.unwrap();

    let strip = |entries: Vec<pb::AuditEntry>| -> Vec<(i32, String, i32, String, i32)> {
        entries
            .into_iter()
            .map(|x| (x.action, x.actor, x.decision, x.reason, x.source))
            .collect()
    };
    let web = strip(audit_actions(&mut e.client.clone(), "r1").await);
    let api = strip(audit_actions(&mut e.client.clone(), "r2").await);
    assert_eq!(web, api);
    assert!(
        web.iter()
            .any(|(_, actor, _, reason, _)| actor == "ana" && reason == "not now")
    );
    let decided = ana.get("/items/r1?done=reject").await;
    assert!(
        decided
            .body
            .contains("Your decision (reject) was recorded.")
    );
    assert!(
        !decided.body.contains("id=\"decide\""),
        "a decided item offers no decision"
    );
}

#[tokio::test]
async fn each_queue_is_counted_and_the_runs_events_come_after_the_item_page() {
    let e = env().await;
    for (id, run) in [("r1", "run-1"), ("r2", "run-2"), ("r3", "run-3")] {
        seed(&e, node_request(id, run)).await;
    }
    e.client
        .clone()
        .resolve(resolve_req("r1", DecisionKind::Approve))
        .await
        .unwrap();
    let ana = Browser::sign_in(e.web, "ana-token").await;
    let counts = ana.get("/fragments/counts").await;
    for (queue, n) in [("mine", 2), ("pending", 2), ("overdue", 0), ("decided", 1)] {
        assert!(
            counts
                .body
                .contains(&format!("data-count=\"{queue}\">{n}</span>")),
            "{queue}: {}",
            counts.body
        );
    }
    // The page names where its run's events come from; they are not in it.
    let item = ana.get("/items/r2").await;
    assert!(
        item.body.contains("data-load=\"/items/r2/timeline\""),
        "{}",
        item.body
    );
    assert_eq!(ana.get("/items/nope/timeline").await.status, 404);
}

#[tokio::test]
async fn the_submitter_sees_the_item_and_why_they_cannot_decide_it() {
    let e = env().await;
    // node_request runs are submitted by "sam".
    let a = seed(&e, node_request("r1", "run-1")).await;
    let sam = Browser::sign_in(e.web, "sam-token").await;
    let page = sam.get("/items/r1").await;
    assert_eq!(page.status, 200);
    assert!(
        page.body
            .contains("You submitted this run; someone else must decide it.")
    );
    assert!(
        !page.body.contains("value=\"approve\""),
        "no Approve button for the submitter"
    );
    let queue = sam.get("/queue?q=mine").await;
    assert!(
        !queue.body.contains("/items/r1\""),
        "not in sam's For me queue"
    );
    assert!(
        sam.get("/queue?q=pending")
            .await
            .body
            .contains("/items/r1\"")
    );
    // Posted anyway, the same rule refuses it.
    let res = sam
        .post(
            "/items/r1/decide",
            &[
                ("csrf", &page.csrf()),
                ("digest", &a.args_digest),
                ("decision", "approve"),
            ],
        )
        .await;
    assert_eq!(res.status, 403, "{}", res.body);
    let now = get(&mut e.client.clone(), "r1").await;
    assert_eq!(now.state, pb::ApprovalState::Pending as i32);
}

#[tokio::test]
async fn a_stale_digest_is_refused_with_what_changed() {
    let e = env().await;
    let a = seed(&e, tool_request("r1", "run-1", "deploy.apply")).await;
    let ana = Browser::sign_in(e.web, "ana-token").await;
    let page = ana.get("/items/r1").await;
    let shown = r#"{"entry":{"replicas":2}}"#;
    let res = ana
        .post(
            "/items/r1/decide",
            &[
                ("csrf", &page.csrf()),
                (
                    "digest",
                    "sha256:0000000000000000000000000000000000000000000000000000000000000000",
                ),
                ("shown", shown),
                ("decision", "approve"),
            ],
        )
        .await;
    assert_eq!(res.status, 409, "{}", res.body);
    assert!(
        res.body.contains("what you decided on changed"),
        "{}",
        res.body
    );
    assert!(res.body.contains("What changed"));
    assert!(
        res.body.contains("{&#34;replicas&#34;:2}") && res.body.contains("{&#34;replicas&#34;:3}")
    );
    let now = get(&mut e.client.clone(), "r1").await;
    assert_eq!(now.state, pb::ApprovalState::Pending as i32);
    assert_eq!(now.args_digest, a.args_digest);
}

#[tokio::test]
async fn an_edit_is_checked_against_the_schema_before_it_is_sent() {
    let e = env().await;
    let mut r = tool_request("r1", "run-1", "deploy.apply");
    r.tool_args = Some(to_proto_value(
        &json!({"service": "billing", "replicas": 3}),
    ));
    seed(&e, r).await;
    let ana = Browser::sign_in(e.web, "ana-token").await;
    let form = ana.get("/items/r1/edit").await;
    assert!(form.body.contains("name=\"arg.replicas\""), "{}", form.body);
    let a = get(&mut e.client.clone(), "r1").await;
    let bad = ana
        .post(
            "/items/r1/decide",
            &[
                ("csrf", &form.csrf()),
                ("digest", &a.args_digest),
                ("decision", "edit"),
                ("arg.service", "billing"),
                ("arg.replicas", "many"),
            ],
        )
        .await;
    assert_eq!(bad.status, 422);
    assert!(bad.body.contains("id=\"err-replicas\""), "{}", bad.body);
    assert_eq!(
        get(&mut e.client.clone(), "r1").await.args_digest,
        a.args_digest
    );
    let ok = ana
        .post(
            "/items/r1/decide",
            &[
                ("csrf", &form.csrf()),
                ("digest", &a.args_digest),
                ("decision", "edit"),
                ("arg.service", "billing"),
                ("arg.replicas", "5"),
            ],
        )
        .await;
    assert_eq!(ok.status, 303, "{}", ok.body);
    let now = wait_for(&e.client, "r1", "edited", |a| {
        a.state != pb::ApprovalState::Pending as i32
    })
    .await;
    let d = now.decision.unwrap();
    assert_eq!(d.kind, DecisionKind::Edit as i32);
    assert_eq!(
        arbor_shared::json::from_optional_value(d.args.as_ref()),
        json!({"service": "billing", "replicas": 5})
    );
}

/// Reads the event stream until it holds `needle`; answers the last event id seen.
async fn read_until(body: &mut hyper::body::Incoming, seen: &mut String, needle: &str) -> String {
    tokio::time::timeout(WAIT, async {
        while !seen.contains(needle) {
            let frame = body.frame().await.unwrap().unwrap();
            if let Some(data) = frame.data_ref() {
                seen.push_str(&String::from_utf8_lossy(data));
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no event with {needle} in: {seen}"));
    seen.lines()
        .filter_map(|l| l.strip_prefix("id: ").or_else(|| l.strip_prefix("id:")))
        .next_back()
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[tokio::test]
async fn the_event_stream_tells_changes_and_resumes_from_the_last_event_id() {
    let e = env().await;
    let ana = Browser::sign_in(e.web, "ana-token").await;
    let res = ana.response("GET", "/events", None, &[]).await;
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.headers().get("content-type").unwrap(),
        "text/event-stream"
    );
    let mut body = res.into_body();
    let mut seen = String::new();
    e.runner.push_request(node_request("r1", "run-1"));
    let last = read_until(&mut body, &mut seen, "\"r1\"").await;
    assert!(!last.is_empty(), "each event has an id: {seen}");
    drop(body);

    // Missed while disconnected: a decision on r1 and a new request r2.
    e.client
        .clone()
        .resolve(resolve_req("r1", DecisionKind::Approve))
        .await
        .unwrap();
    seed(&e, node_request("r2", "run-2")).await;
    let res = ana
        .response("GET", "/events", None, &[("last-event-id", &last)])
        .await;
    let mut body = res.into_body();
    let mut seen = String::new();
    read_until(&mut body, &mut seen, "\"r2\"").await;
    assert!(
        seen.contains("\"r1\""),
        "the missed decision is replayed: {seen}"
    );
    assert!(!seen.contains("event: reset"), "{seen}");

    // An id from another process (or too old) is told to start over.
    let res = ana
        .response("GET", "/events", None, &[("last-event-id", "elsewhere:5")])
        .await;
    let mut body = res.into_body();
    let mut seen = String::new();
    read_until(&mut body, &mut seen, "event: reset").await;
    e.svc.stop().await;
}

#[tokio::test]
async fn behind_a_proxy_the_identity_header_signs_people_in_and_questions_are_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let runner = FakeRunner::start().await;
    let mut cfg = config(dir.path(), &runner.url());
    cfg.auth = tokens();
    cfg.web.identity_header = Some(http::HeaderName::from_static("x-forwarded-user"));
    let (svc, web) = Svc::start_web(cfg).await;
    let anon = Browser::new(web);
    let as_ana = [("x-forwarded-user", "ana")];

    // Nobody named, or a name the tokens file does not know: no session.
    assert_eq!(anon.get("/sign-in").await.status, 401);
    let res = anon
        .response("GET", "/sign-in", None, &[("x-forwarded-user", "mallory")])
        .await;
    assert_eq!(res.status(), 401);
    // A pasted token is not a way in here.
    let pasted = anon.post("/sign-in", &[("token", "ana-token")]).await;
    assert!(pasted.header("set-cookie").is_empty());

    let res = anon.response("GET", "/sign-in", None, &as_ana).await;
    assert_eq!(res.status(), 303);
    let cookie = res.headers()["set-cookie"].to_str().unwrap().to_string();
    let sid = cookie
        .split(';')
        .next()
        .unwrap()
        .trim_start_matches("arbor_session=");
    let ana = Browser {
        addr: web,
        cookie: Some(sid.to_string()),
    };
    let res = ana.response("GET", "/queue", None, &as_ana).await;
    assert_eq!(res.status(), 200);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("Signed in as <strong>ana</strong>"));
    assert!(
        body.contains("holds no token of yours"),
        "questions are read-only: {body}"
    );

    // The same cookie with another identity, or none: the session ends.
    let res = ana
        .response("GET", "/queue", None, &[("x-forwarded-user", "bob")])
        .await;
    assert_eq!(res.status(), 303);
    assert_eq!(ana.get("/queue").await.status, 303);
    svc.stop().await;
}
