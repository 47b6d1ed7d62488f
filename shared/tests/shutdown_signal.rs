//! The shutdown signal is caught from the moment a service asks for it, not from the moment
//! its start-up first polls the future: SIGTERM during start-up (a rollout that changes its
//! mind) must lead to a clean shutdown, never to the default action that kills the process
//! before the store is flushed.

use std::time::Duration;

use nix::sys::signal::{Signal, raise};

// One test: a raised signal reaches every shutdown future in the process, so a second test
// running alongside would see this one's signals.
#[tokio::test]
async fn a_signal_sent_before_the_first_poll_is_kept_for_the_shutdown_future() {
    for sent in [Signal::SIGTERM, Signal::SIGINT] {
        let shutdown = arbor_shared::server::shutdown_signal();
        // Without the handlers in place already, this kills the test process.
        raise(sent).expect("raise");
        tokio::time::timeout(Duration::from_secs(10), shutdown)
            .await
            .unwrap_or_else(|_| panic!("{sent} sent before the first poll ends the wait"));
    }
    // (Last: polling a future installs handlers, which would hide the bug the loop above finds.)
    let quiet = arbor_shared::server::shutdown_signal();
    assert!(
        tokio::time::timeout(Duration::from_millis(200), quiet)
            .await
            .is_err(),
        "resolved with no signal sent"
    );
}
