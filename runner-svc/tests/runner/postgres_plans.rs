//! On PostgreSQL, a read of a range of keys (a run's inbox, a thread's queue entries, the last
//! event of a prefix, a counter's stripes) reads the pages of its range, however many keys of
//! the same table follow it. The runner's connections plan every statement once (a generic
//! plan); a range whose upper bound were only a filter (`$3 IS NULL OR k < $3`) would walk
//! every key after the range whenever the range holds fewer rows than the page asks for. And
//! a delete or a claim of a few keys reads those keys, however small the table was when the
//! connection planned it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use arbor_runner_svc::store::{
    T,
    postgres::{
        COUNTER_ROWS, DELETE_KEYS, LAST_IN_RANGE, LOCK_FIRST, SCAN_RANGE,
        SESSION as POSTGRES_SESSION,
    },
};
use arbor_testkit::PgCluster;

#[test]
fn a_range_read_reads_a_few_pages_however_many_keys_follow_it() {
    const AFTER: usize = 20_000;
    let cluster = PgCluster::shared();
    let url = cluster.fresh_database("range_plans");
    let store = common::open_postgres(&url);
    let t = T::Inbox as usize;
    // Five keys of the range `a/`, then many of the range `b/` in the same table.
    cluster
        .psql(
            &url,
            &format!(
                "INSERT INTO runner_kv (t, k, v) \
                 SELECT {t}, convert_to('a/' || i, 'UTF8'), '\\x00' FROM generate_series(1, 5) i; \
                 INSERT INTO runner_kv (t, k, v) \
                 SELECT {t}, convert_to('b/' || lpad(i::text, 6, '0'), 'UTF8'), '\\x00' \
                 FROM generate_series(1, {AFTER}) i; ANALYZE runner_kv;"
            ),
        )
        .unwrap();

    // What the store reads: the range and nothing after it, the last key of each range, and
    // (no bound) the whole table.
    let inbox = store.tree(T::Inbox);
    let a: Vec<Vec<u8>> = inbox
        .scan_prefix(b"a/")
        .keys()
        .map(|k| k.unwrap())
        .collect();
    assert_eq!(a.len(), 5);
    assert!(a.iter().all(|k| k.starts_with(b"a/")));
    let (last, _) = inbox.last_with_prefix(b"a/").unwrap().unwrap();
    assert_eq!(last, b"a/5");
    let (last, _) = inbox.last_with_prefix(b"b/").unwrap().unwrap();
    assert_eq!(last, format!("b/{AFTER:06}").as_bytes());
    assert_eq!(inbox.iter().count(), 5 + AFTER);

    // How much of the table those reads of `a/` visit, as the runner's connections plan them.
    let range = "'a/'::bytea, 'a0'::bytea";
    for (what, statement, types, args, rows) in [
        (
            "a page of the range",
            SCAN_RANGE,
            "smallint, bytea, bytea, bigint",
            format!("{t}, {range}, 64"),
            5,
        ),
        (
            "a counter's rows (its key, and its stripes as a range)",
            COUNTER_ROWS,
            "smallint, bytea, bytea, bytea",
            format!("{t}, 'a/'::bytea, {range}"),
            5,
        ),
        (
            "the last key of the range",
            LAST_IN_RANGE,
            "smallint, bytea, bytea",
            format!("{t}, {range}"),
            1,
        ),
    ] {
        let plan = cluster.explain(&url, POSTGRES_SESSION, statement, types, &args);
        let pages = arbor_testkit::pages(&plan);
        assert_eq!(plan["Actual Rows"], rows, "{what}: {plan:#}");
        assert!(
            pages <= 10,
            "{what} read {pages} pages for {rows} rows: {plan:#}"
        );
    }
}

/// A connection keeps the generic plan it made at a statement's first use until an analyze of
/// the table invalidates it, and a fresh database is small when the runner's connections first
/// delete or claim keys. The plan made then must still read only the keys asked for once the
/// table has grown: PostgreSQL planned a bitmap scan of the whole table `t` filtered by key,
/// so a delete of three queue entries read every queued job (the benchmark's deletes read 80
/// to 100 pages each).
#[test]
fn a_few_keys_planned_on_a_small_table_read_a_few_pages_once_it_has_grown() {
    const GROWN: usize = 20_000;
    let cluster = PgCluster::shared();
    let t = T::Queue as usize;
    let keys = "ARRAY['q-000005', 'q-010005', 'q-019995']::bytea[]";
    let absent = "ARRAY['absent']::bytea[]";
    for (what, statement, types, first, args, rows) in [
        (
            "a delete of three keys",
            DELETE_KEYS,
            "smallint, bytea[]",
            format!("{t}, {absent}"),
            format!("{t}, {keys}"),
            3,
        ),
        (
            "a claim of the first two of three keys",
            LOCK_FIRST,
            "smallint, bytea[], bigint",
            format!("{t}, {absent}, 1"),
            format!("{t}, {keys}, 2"),
            2,
        ),
    ] {
        let url = cluster.fresh_database("key_plans");
        drop(common::open_postgres(&url));
        // A young database: ten keys in each table.
        cluster
            .psql(
                &url,
                "INSERT INTO runner_kv (t, k, v) SELECT t, convert_to('young-' || i, 'UTF8'), \
                 '\\x00' FROM generate_series(0, 17) t, generate_series(1, 10) i",
            )
            .unwrap();
        // The statement planned and run on it, as a connection's first use does, then the
        // table grown to GROWN keys, in the same session, with nothing to make the plan again.
        let meanwhile = format!(
            "EXECUTE measured ({first}); INSERT INTO runner_kv (t, k, v) \
             SELECT {t}, convert_to('q-' || lpad(i::text, 6, '0'), 'UTF8'), '\\x00' \
             FROM generate_series(1, {GROWN}) i"
        );
        let plan =
            cluster.explain_after(&url, POSTGRES_SESSION, statement, types, &meanwhile, &args);
        let pages = arbor_testkit::pages(&plan);
        // A delete's rows are those of the scan below it.
        let found = match plan["Node Type"].as_str() {
            Some("ModifyTable") => &plan["Plans"][0]["Actual Rows"],
            _ => &plan["Actual Rows"],
        };
        assert_eq!(*found, rows, "{what}: {plan:#}");
        assert!(
            pages <= 20,
            "{what} read {pages} pages for {rows} rows: {plan:#}"
        );
    }
}
