//! The web inbox under load: N runs waiting at a gate, then, signed in as an approver, the
//! *for me* queue's first page, an item page and the run's events it loads after it fetched over
//! and over (the time each takes,
//! measured on loopback: the server's time plus one local round trip), the page weight (the
//! queue's HTML with its stylesheet and script), and the time from a decision through the gRPC
//! API to its change on the inbox's event stream.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use arbor_shared::proto::{approval::v1 as apb, runner::v1 as rpb};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpStream,
};

use super::{
    cluster::{APPROVER, BenchCluster, Rules, SUBMITTER, Spec, Store},
    cycle::TREE,
};

#[derive(Debug, Clone)]
pub struct InboxResult {
    pub pending: usize,
    pub samples: usize,
    /// Sorted times of the *for me* queue's first page.
    pub queue: Vec<Duration>,
    /// Sorted times of an item page.
    pub item: Vec<Duration>,
    /// Sorted times of the item's run events, which the page loads after it.
    pub timeline: Vec<Duration>,
    /// Sorted times from a decision (its RPC sent) to its event on the stream.
    pub decision_to_event: Vec<Duration>,
    /// HTML of the queue page, and its stylesheet and script, in bytes.
    pub page_bytes: (usize, usize, usize),
}

/// The `q`-quantile of sorted `xs`, in ms.
pub fn pct_ms(xs: &[Duration], q: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let i = ((xs.len() as f64 - 1.0) * q).round() as usize;
    xs[i].as_secs_f64() * 1000.0
}

/// One HTTP/1.1 exchange on a connection of its own: status, headers (lowercased names), body.
async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    cookie: &str,
    body: &str,
) -> (u16, Vec<(String, String)>, String) {
    let mut s = TcpStream::connect(addr)
        .await
        .expect("connect to the inbox");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: bench\r\nconnection: close\r\ncookie: {cookie}\r\n\
         content-type: application/x-www-form-urlencoded\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.expect("read");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, body.to_string())
}

async fn timed(addr: SocketAddr, path: &str, cookie: &str, samples: usize) -> Vec<Duration> {
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t = Instant::now();
        let (status, _, _) = http(addr, "GET", path, cookie, "").await;
        times.push(t.elapsed());
        assert_eq!(status, 200, "GET {path}");
    }
    times.sort();
    times
}

pub async fn run(pending: usize, samples: usize) -> InboxResult {
    let web = SocketAddr::from(([127, 0, 0, 1], crate::process::free_port()));
    let web_arg = web.to_string();
    let cluster = BenchCluster::start_spec(&Spec {
        store: &Store::Sled,
        replicas: 1,
        approval: true,
        rules: Rules::Ask,
        runner_args: &[],
        approval_args: &["--web-listen", &web_arg],
        name: "bench-inbox",
    })
    .await;
    let mut runner = cluster.runner_as(SUBMITTER).await;
    runner
        .register_tree(rpb::RegisterTreeRequest {
            document: TREE.into(),
            format: 0,
        })
        .await
        .expect("register");
    let next = Arc::new(AtomicUsize::new(0));
    let mut submitters = Vec::new();
    for _ in 0..64 {
        let (mut runner, next) = (runner.clone(), next.clone());
        submitters.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < pending {
                runner
                    .submit_run(rpb::SubmitRunRequest {
                        tree_id: "bench-cycle".into(),
                        ..Default::default()
                    })
                    .await
                    .expect("submit");
            }
        }));
    }
    for s in submitters {
        s.await.expect("submitter");
    }
    let metrics = cluster.approvals[0].metrics_url();
    let deadline = Instant::now() + Duration::from_secs(3600);
    while crate::scrape::scrape(&metrics)
        .await
        .get("arbor_approval_pending", &[])
        .unwrap_or(0.0)
        < pending as f64
    {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for the approvals"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let (status, headers, _) =
        http(web, "POST", "/sign-in", "", &format!("token={APPROVER}")).await;
    assert_eq!(status, 303, "sign-in");
    let cookie = headers
        .iter()
        .find(|(k, _)| k == "set-cookie")
        .and_then(|(_, v)| v.split(';').next())
        .expect("a session cookie")
        .to_string();

    let (_, _, html) = http(web, "GET", "/queue?q=mine", &cookie, "").await;
    let asset = |ext: &str| {
        let at = html.find(&format!(".{ext}\"")).expect("an asset link");
        let start = html[..at].rfind("/static/").expect("a static path");
        format!("{}.{ext}", &html[start..at])
    };
    let (css, js) = (asset("css"), asset("js"));
    let (_, _, css_body) = http(web, "GET", &css, &cookie, "").await;
    let (_, _, js_body) = http(web, "GET", &js, &cookie, "").await;
    let item = html
        .split("href=\"/items/")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("an item on the first page")
        .to_string();

    let queue = timed(web, "/queue?q=mine", &cookie, samples).await;
    let item_times = timed(web, &format!("/items/{item}"), &cookie, samples).await;
    let timeline = timed(web, &format!("/items/{item}/timeline"), &cookie, samples).await;
    let decision_to_event = decisions(web, &cookie, &cluster, samples.min(pending)).await;
    cluster.stop().await;
    InboxResult {
        pending,
        samples,
        queue,
        item: item_times,
        timeline,
        decision_to_event,
        page_bytes: (html.len(), css_body.len(), js_body.len()),
    }
}

/// Approves `n` pending approvals one at a time through the gRPC API, each timed until its
/// change arrives on the inbox's event stream.
async fn decisions(
    web: SocketAddr,
    cookie: &str,
    cluster: &BenchCluster,
    n: usize,
) -> Vec<Duration> {
    let mut approvals = cluster.approvals_as(APPROVER).await;
    let ids: Vec<String> = approvals
        .list_approvals(apb::ListApprovalsRequest {
            filter: Some(apb::ApprovalFilter {
                states: vec![apb::ApprovalState::Pending as i32],
                ..Default::default()
            }),
            page_size: n as u32,
            page_token: String::new(),
        })
        .await
        .expect("list")
        .into_inner()
        .approvals
        .into_iter()
        .map(|a| a.request_id)
        .collect();
    let mut s = TcpStream::connect(web).await.expect("connect");
    let req = format!("GET /events HTTP/1.1\r\nhost: bench\r\ncookie: {cookie}\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("send");
    let mut stream = BufReader::new(s);
    let mut times = Vec::with_capacity(ids.len());
    for id in ids {
        let t = Instant::now();
        approvals
            .resolve(apb::ResolveRequest {
                request_id: id.clone(),
                decision: rpb::DecisionKind::Approve as i32,
                ..Default::default()
            })
            .await
            .expect("approve");
        let needle = format!("\"id\":\"{id}\"");
        let mut line = String::new();
        loop {
            line.clear();
            let read = tokio::time::timeout(Duration::from_secs(30), stream.read_line(&mut line))
                .await
                .expect("the decision's event within 30 s")
                .expect("read the stream");
            assert!(read > 0, "the event stream ended");
            if line.contains(&needle) {
                break;
            }
        }
        times.push(t.elapsed());
    }
    times.sort();
    times
}
