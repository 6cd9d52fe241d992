//! Statements run inside a transaction, prepared once per connection where the connection
//! has a statement cache (a pooled one), and prepared anew otherwise.
//!
//! Without a prepared statement every query is two round trips (parse, then bind and
//! execute) and a parse and plan on the server each time: on the hot paths (intake, a
//! claim, a result's commit) that was most of the database's CPU (issue 28). The same
//! functions serve transactions that have no cache (a batch step's, the driver's), so
//! they take any [`Tx`].

use std::future::Future;

use tokio_postgres::types::ToSql;
use tokio_postgres::{Row, Statement, Transaction};

use super::{Error, pg};

/// A transaction the store's statements run in.
pub(super) trait Tx: Sync {
    /// The transaction, for statements not worth caching.
    fn raw(&self) -> &Transaction<'_>;

    /// `sql` prepared on this transaction's connection.
    fn prepared<'s>(
        &'s self,
        sql: &'s str,
    ) -> impl Future<Output = Result<Statement, tokio_postgres::Error>> + Send + 's;
}

impl Tx for Transaction<'_> {
    fn raw(&self) -> &Transaction<'_> {
        self
    }

    fn prepared<'s>(
        &'s self,
        sql: &'s str,
    ) -> impl Future<Output = Result<Statement, tokio_postgres::Error>> + Send + 's {
        self.prepare(sql)
    }
}

impl Tx for deadpool_postgres::Transaction<'_> {
    fn raw(&self) -> &Transaction<'_> {
        self
    }

    fn prepared<'s>(
        &'s self,
        sql: &'s str,
    ) -> impl Future<Output = Result<Statement, tokio_postgres::Error>> + Send + 's {
        self.prepare_cached(sql)
    }
}

pub(super) async fn query(
    tx: &impl Tx,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
    context: &'static str,
) -> Result<Vec<Row>, Error> {
    let statement = tx.prepared(sql).await.map_err(pg(context))?;
    tx.raw().query(&statement, params).await.map_err(pg(context))
}

pub(super) async fn query_one(
    tx: &impl Tx,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
    context: &'static str,
) -> Result<Row, Error> {
    let statement = tx.prepared(sql).await.map_err(pg(context))?;
    tx.raw().query_one(&statement, params).await.map_err(pg(context))
}

pub(super) async fn query_opt(
    tx: &impl Tx,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
    context: &'static str,
) -> Result<Option<Row>, Error> {
    let statement = tx.prepared(sql).await.map_err(pg(context))?;
    tx.raw().query_opt(&statement, params).await.map_err(pg(context))
}

pub(super) async fn execute(
    tx: &impl Tx,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
    context: &'static str,
) -> Result<u64, Error> {
    let statement = tx.prepared(sql).await.map_err(pg(context))?;
    tx.raw().execute(&statement, params).await.map_err(pg(context))
}
