//! Typed values read back from a row's text columns: a stored id or status that does not
//! parse is an error naming the column, never a value taken on trust.

use std::str::FromStr;

use rusqlite::Row;
use rusqlite::types::Type;

/// Column `index` of `row`, parsed.
pub(super) fn parsed<T>(row: &Row<'_>, index: usize) -> rusqlite::Result<T>
where
    T: FromStr,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    let text: String = row.get(index)?;
    text.parse()
        .map_err(|err| rusqlite::Error::FromSqlConversionFailure(index, Type::Text, Box::new(err)))
}

/// Column `index` of `row`, parsed when not NULL.
pub(super) fn parsed_opt<T>(row: &Row<'_>, index: usize) -> rusqlite::Result<Option<T>>
where
    T: FromStr,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    let text: Option<String> = row.get(index)?;
    text.map(|text| {
        text.parse().map_err(|err| {
            rusqlite::Error::FromSqlConversionFailure(index, Type::Text, Box::new(err))
        })
    })
    .transpose()
}
