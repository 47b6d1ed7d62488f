//! A connection of one thread's own ([`Dedicated`]), a transaction's deferred `BEGIN`
//! ([`LazyBegin`]) and statements prepared once per connection ([`Prepared`]).

use std::cell::Cell;

use deadpool_postgres::ClientWrapper;
use tokio_postgres::{NoTls, Row, types::ToSql};

use super::DbError;

/// A connection of one thread's own, outside the pool, whose I/O runs on that thread while it
/// waits on the runtime [`Dedicated::connection`] returns: a round trip is the thread's own
/// write and read, without the hand-over to the pool's runtime and back that a pooled
/// connection costs. Made on first use, and again after [`Dedicated::reset`].
pub struct Dedicated {
    pub(super) config: tokio_postgres::Config,
    pub(super) rt: tokio::runtime::Runtime,
    pub(super) client: Option<ClientWrapper>,
}

impl Dedicated {
    /// The connection (connecting first when there is none, or it has closed) and the runtime
    /// to wait on it with.
    pub fn connection(&mut self) -> Result<(&ClientWrapper, &tokio::runtime::Runtime), DbError> {
        let client = match self.client.take().filter(|c| !c.is_closed()) {
            Some(client) => client,
            None => {
                let (client, connection) = self.rt.block_on(self.config.connect(NoTls))?;
                let driver = self.rt.spawn(async move {
                    if let Err(e) = connection.await {
                        tracing::debug!(error = %e, "dedicated connection closed");
                    }
                });
                ClientWrapper::new(client, driver)
            }
        };
        Ok((self.client.insert(client), &self.rt))
    }

    /// Drops the connection (after a failure that may have left it unusable).
    pub fn reset(&mut self) {
        self.client = None;
    }
}

/// A transaction's `BEGIN`, sent with its first statement in the same round trip instead of in
/// a round trip of its own.
pub struct LazyBegin {
    sql: &'static str,
    sent: Cell<bool>,
}

impl LazyBegin {
    /// `sql` is the `BEGIN` statement (with its isolation level).
    pub const fn new(sql: &'static str) -> Self {
        Self {
            sql,
            sent: Cell::new(false),
        }
    }

    /// A transaction whose `BEGIN` was sent already.
    pub const fn begun(sql: &'static str) -> Self {
        Self {
            sql,
            sent: Cell::new(true),
        }
    }

    /// Sends `BEGIN` unless it was sent. Join it ahead of the statement it precedes: a join
    /// polls its futures in order, and each sends its request on its first poll.
    pub async fn before(&self, client: &ClientWrapper) -> Result<(), tokio_postgres::Error> {
        if !self.sent.replace(true) {
            client.batch_execute(self.sql).await?;
        }
        Ok(())
    }

    /// Whether the transaction was begun and not ended.
    pub fn open(&self) -> bool {
        self.sent.get()
    }

    /// Marks the transaction ended; answers whether it was open (so whether a `COMMIT` or
    /// `ROLLBACK` is due).
    pub fn end(&self) -> bool {
        self.sent.replace(false)
    }
}

/// The statements of a connection's queries, parsed and planned once per connection (the
/// pooled connection keeps them): a statement sent as text is parsed again and costs a round
/// trip of its own before it runs.
pub trait Prepared {
    fn prepared_query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Vec<Row>, tokio_postgres::Error>>;
    fn prepared_query_opt(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Option<Row>, tokio_postgres::Error>>;
    fn prepared_query_one(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Row, tokio_postgres::Error>>;
    fn prepared_execute(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<u64, tokio_postgres::Error>>;
}

impl Prepared for ClientWrapper {
    async fn prepared_query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let statement = self.prepare_cached(sql).await?;
        self.query(&statement, params).await
    }

    async fn prepared_query_opt(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, tokio_postgres::Error> {
        let statement = self.prepare_cached(sql).await?;
        self.query_opt(&statement, params).await
    }

    async fn prepared_query_one(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, tokio_postgres::Error> {
        let statement = self.prepare_cached(sql).await?;
        self.query_one(&statement, params).await
    }

    async fn prepared_execute(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        let statement = self.prepare_cached(sql).await?;
        self.execute(&statement, params).await
    }
}
