//! Typed values read back from a row's text columns: a stored id or status that does not
//! parse is an error naming the column, never a value taken on trust.

use std::str::FromStr;

use tokio_postgres::Row;

use crate::services::ServiceError;

/// Column `index` of `row`, parsed.
pub(super) fn parsed<T>(row: &Row, index: usize) -> Result<T, ServiceError>
where
    T: FromStr,
    T::Err: std::fmt::Display,
{
    let text: String = row.get(index);
    unreadable(row, index, text.parse())
}

/// Column `index` of `row`, parsed when not NULL.
pub(super) fn parsed_opt<T>(row: &Row, index: usize) -> Result<Option<T>, ServiceError>
where
    T: FromStr,
    T::Err: std::fmt::Display,
{
    let text: Option<String> = row.get(index);
    text.map(|text| unreadable(row, index, text.parse()))
        .transpose()
}

fn unreadable<T, E: std::fmt::Display>(
    row: &Row,
    index: usize,
    parsed: Result<T, E>,
) -> Result<T, ServiceError> {
    parsed.map_err(|err| {
        let column = row.columns().get(index).map_or("?", |c| c.name());
        ServiceError::Invalid(format!(
            "a stored `{column}` cannot be read ({err}); the row was written by something other \
             than capstan, or damaged"
        ))
    })
}
