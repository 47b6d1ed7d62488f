//! The sled ApprovalStore on real files: the conformance suite, plus what only sled has (the
//! pending count rebuilt for a database written before the count existed).

// Helpers outside #[test] functions may fail loudly too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::conformance;
use crate::support;

use arbor_approval_svc::{ApprovalStore, store::SledStore};
use conformance::{Backend, pending_by_scan};

/// A sled store in a temporary directory, opened the way `approval-svc serve` opens it.
struct Sled;

impl Backend for Sled {
    type Store = SledStore;
    type Place = tempfile::TempDir;

    async fn place() -> Self::Place {
        tempfile::tempdir().unwrap()
    }

    /// `store::open` also waits for a dropped store's background thread to let go of sled's
    /// lock, like a restart would.
    async fn open(place: &Self::Place) -> SledStore {
        arbor_approval_svc::store::open(place.path()).await.unwrap()
    }
}

conformance::suite!(Sled);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pending_count_is_rebuilt_for_an_old_store() {
    let dir = Sled::place().await;
    conformance::the_pending_count_moves_with_every_transition::<Sled>(&dir).await;
    // What an older release left behind: the approvals, no count.
    {
        let db = support::eventually("the database to reopen", support::WAIT, || async {
            arbor_shared::sled_backend::sled_config(dir.path(), 8 << 20)
                .open()
                .ok()
        })
        .await;
        let meta = db.open_tree("meta").unwrap();
        assert!(meta.remove(b"count/pending").unwrap().is_some());
        meta.flush().unwrap();
    }
    let store = Sled::open(&dir).await;
    assert_eq!(store.pending_count().unwrap(), 1);
    assert_eq!(pending_by_scan(&store), 1);
}
