//! On PostgreSQL, a read of a range of keys (a run's inbox, a thread's queue entries, the last
//! event of a prefix) reads the pages of its range, however many keys of the same table follow
//! it. The runner's connections plan every statement once (a generic plan); a range whose upper
//! bound were only a filter (`$3 IS NULL OR k < $3`) would walk every key after the range
//! whenever the range holds fewer rows than the page asks for.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use arbor_runner_svc::store::{LAST_IN_RANGE, POSTGRES_SESSION, SCAN_RANGE, T};
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
