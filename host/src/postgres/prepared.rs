//! Statements prepared once per connection.
//!
//! tokio-postgres runs a statement given as text in two round trips: one to prepare it
//! (parse and describe), one to bind and run it. A statement prepared once per pooled
//! connection and kept in its cache costs one round trip from its second use on. Every
//! statement the services send on a pooled connection goes through [`Prepared`]; the
//! text is its key, so it must be the same text each time (values go in parameters,
//! never in the text).

use std::future::Future;

use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Error, Row};

/// The parameters of one statement.
pub(super) type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// Runs statements through the connection's cache of prepared statements: a pooled
/// connection or a transaction on one.
pub(super) trait Prepared: GenericClient {
    /// Runs `sql`, prepared once on this connection; the number of rows it changed.
    fn execute_cached<'a>(
        &'a self,
        sql: &'a str,
        params: Params<'a>,
    ) -> impl Future<Output = Result<u64, Error>> + Send + 'a {
        async move {
            let statement = self.prepare_cached(sql).await?;
            self.execute(&statement, params).await
        }
    }

    /// The rows `sql` returns, prepared once on this connection.
    fn query_cached<'a>(
        &'a self,
        sql: &'a str,
        params: Params<'a>,
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send + 'a {
        async move {
            let statement = self.prepare_cached(sql).await?;
            self.query(&statement, params).await
        }
    }

    /// The one row `sql` returns (an error for none or more), prepared once on this
    /// connection.
    fn query_one_cached<'a>(
        &'a self,
        sql: &'a str,
        params: Params<'a>,
    ) -> impl Future<Output = Result<Row, Error>> + Send + 'a {
        async move {
            let statement = self.prepare_cached(sql).await?;
            self.query_one(&statement, params).await
        }
    }

    /// The row `sql` returns, if any (an error for more than one), prepared once on this
    /// connection.
    fn query_opt_cached<'a>(
        &'a self,
        sql: &'a str,
        params: Params<'a>,
    ) -> impl Future<Output = Result<Option<Row>, Error>> + Send + 'a {
        async move {
            let statement = self.prepare_cached(sql).await?;
            self.query_opt(&statement, params).await
        }
    }
}

impl<C: GenericClient> Prepared for C {}
