//! A TCP proxy for partition tests: it forwards every connection to one upstream address and
//! can, at any moment, cut every connection (RST), stall them (stop forwarding bytes without
//! closing anything), refuse new connections, blackhole the open connections for good (as a
//! crashed host or a lost NAT entry leaves them: no FIN, no RST), and restore. It counts the
//! round trips its clients make, and can hold the server's answers back, as a distant server's
//! are, so that a client which sends without waiting shows it.

#![allow(clippy::expect_used)] // a test fixture: failing the test is its error path

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream, tcp::OwnedReadHalf, tcp::OwnedWriteHalf},
    sync::watch,
    task::JoinHandle,
};

/// What the proxy does with bytes and connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward everything.
    Forward,
    /// Hold every byte: nothing is forwarded and nothing is closed. New connections are accepted
    /// and stalled too.
    Stall,
    /// Connections are closed at once, new ones included.
    Down,
}

struct Shared {
    mode: watch::Sender<Mode>,
    /// Bumped by `cut`: every connection open at that moment is reset.
    cuts: watch::Sender<u64>,
    /// Bumped by `blackhole`: every connection open at that moment never forwards again.
    freezes: watch::Sender<u64>,
    accepted: AtomicU64,
    forwarded_bytes: AtomicU64,
    round_trips: AtomicU64,
    /// How long each answer is held back, in microseconds (see `delay_answers`).
    answer_delay_us: AtomicU64,
}

/// A running proxy; dropping it stops accepting (open connections end with the test runtime).
pub struct Proxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.shared.mode.send_replace(Mode::Down);
    }
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Shared {
            mode: watch::channel(Mode::Forward).0,
            cuts: watch::channel(0).0,
            freezes: watch::channel(0).0,
            accepted: AtomicU64::new(0),
            forwarded_bytes: AtomicU64::new(0),
            round_trips: AtomicU64::new(0),
            answer_delay_us: AtomicU64::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, upstream, shared.clone()));
        Proxy {
            addr,
            upstream,
            shared,
            accept,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Resets every open connection now; new connections are served as the mode says.
    pub fn cut(&self) {
        self.shared.cuts.send_modify(|n| *n += 1);
    }

    /// Stops forwarding on every connection, old and new, without closing any.
    pub fn stall(&self) {
        self.shared.mode.send_replace(Mode::Stall);
    }

    /// Resets every connection and refuses new ones until `restore`.
    pub fn down(&self) {
        self.shared.mode.send_replace(Mode::Down);
        self.cut();
    }

    /// Freezes every connection open now, for good (until a `cut`); new connections are served
    /// as the mode says. Only a client that notices the silence itself (keepalive, deadlines)
    /// gets going again.
    pub fn blackhole(&self) {
        self.shared.freezes.send_modify(|n| *n += 1);
    }

    /// Forwards again; stalled connections continue where they stopped.
    pub fn restore(&self) {
        self.shared.mode.send_replace(Mode::Forward);
    }

    pub fn mode(&self) -> Mode {
        *self.shared.mode.borrow()
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }

    /// Bytes forwarded so far, both directions.
    pub fn forwarded_bytes(&self) -> u64 {
        self.shared.forwarded_bytes.load(Ordering::Relaxed)
    }

    /// Holds every answer (server to client bytes) back by `delay` before passing it on, from
    /// now on; zero forwards at once again. A client that pipelines has sent all of its
    /// requests long before the first answer reaches it, so [`round_trips`](Self::round_trips)
    /// counts only the times it waited, however its requests are split into writes.
    pub fn delay_answers(&self, delay: Duration) {
        let us = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.shared.answer_delay_us.store(us, Ordering::SeqCst);
    }

    /// Round trips so far, over all connections: the times a client sent something after an
    /// answer had reached it since its last send. Requests sent together are one.
    pub fn round_trips(&self) -> u64 {
        self.shared.round_trips.load(Ordering::SeqCst)
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        shared.accepted.fetch_add(1, Ordering::Relaxed);
        if *shared.mode.borrow() == Mode::Down {
            reset(&client);
            continue;
        }
        tokio::spawn(connection(client, upstream, shared.clone()));
    }
}

/// Closing with a zero linger sends RST, as a dropped path or a dead middlebox does.
fn reset(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
}

async fn connection(client: TcpStream, upstream: SocketAddr, shared: Arc<Shared>) {
    let mut cuts = shared.cuts.subscribe();
    cuts.borrow_and_update();
    let born = *shared.freezes.borrow();
    let Ok(server) = TcpStream::connect(upstream).await else {
        reset(&client);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    reset(&client);
    reset(&server);
    let (client_r, client_w) = client.into_split();
    let (server_r, server_w) = server.into_split();
    let answered = Arc::new(AtomicBool::new(true));
    let up = pump(
        client_r,
        server_w,
        shared.clone(),
        born,
        Way::Up(answered.clone()),
    );
    let down = pump(
        server_r,
        client_w,
        shared.clone(),
        born,
        Way::Down(answered),
    );
    tokio::select! {
        _ = async { tokio::join!(up, down) } => {}
        _ = cuts.changed() => {}
    }
    // Dropping both halves of both sockets closes them with RST (linger 0).
}

/// Which way a pump copies, with the connection's "the server has answered since the client's
/// last send" flag, which the round trips are counted by.
enum Way {
    Up(Arc<AtomicBool>),
    Down(Arc<AtomicBool>),
}

/// Copies one direction, holding bytes while the proxy is stalled (or for good once the
/// connection is blackholed). Ends on EOF, an error, or `Down`.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    shared: Arc<Shared>,
    born: u64,
    way: Way,
) {
    let mut mode = shared.mode.subscribe();
    let mut freezes = shared.freezes.subscribe();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if !forwarding(&mut mode, &mut freezes, born).await {
            return;
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => {
                    let _ = to.shutdown().await;
                    return;
                }
                Ok(n) => n,
            },
            // A blackholed path does not even deliver an EOF.
            _ = async { freezes.wait_for(|f| *f > born).await.is_ok() } => {
                std::future::pending().await
            }
        };
        match &way {
            Way::Up(answered) if answered.swap(false, Ordering::SeqCst) => {
                shared.round_trips.fetch_add(1, Ordering::SeqCst);
            }
            Way::Up(_) => {}
            Way::Down(_) => {
                let delay = shared.answer_delay_us.load(Ordering::SeqCst);
                if delay > 0 {
                    tokio::time::sleep(Duration::from_micros(delay)).await;
                }
            }
        }
        // Bytes read just before a stall are held back too.
        if !forwarding(&mut mode, &mut freezes, born).await {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        if let Way::Down(answered) = &way {
            answered.store(true, Ordering::SeqCst);
        }
        shared
            .forwarded_bytes
            .fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Waits while stalled (forever once blackholed); false once the proxy is down.
async fn forwarding(
    mode: &mut watch::Receiver<Mode>,
    freezes: &mut watch::Receiver<u64>,
    born: u64,
) -> bool {
    loop {
        let frozen = *freezes.borrow_and_update() > born;
        if frozen {
            std::future::pending::<()>().await;
        }
        let now = *mode.borrow_and_update();
        match now {
            Mode::Forward => return true,
            Mode::Down => return false,
            Mode::Stall => {}
        }
        tokio::select! {
            changed = mode.changed() => if changed.is_err() { return false },
            changed = freezes.changed() => if changed.is_err() { return false },
        }
    }
}
