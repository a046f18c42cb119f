//! Typed values read back from a row's text columns: a stored id or status that does not
//! parse is an error naming the column, never a value taken on trust.

use std::str::FromStr;

use rusqlite::Row;

use crate::flow::Label;
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

/// The rows of a listing (`what` each is), leaving out, with a warning naming why, a row
/// whose text does not read back: one damaged row never hides the others. Any other
/// error fails the listing.
pub(super) fn readable<T>(
    what: &str,
    rows: impl Iterator<Item = rusqlite::Result<T>>,
) -> rusqlite::Result<Vec<T>> {
    let mut kept = Vec::new();
    for row in rows {
        match row {
            Ok(row) => kept.push(row),
            Err(rusqlite::Error::FromSqlConversionFailure(column, _, err)) => {
                tracing::warn!("{what} is left out: its column {column} cannot be read ({err})");
            }
            Err(err) => return Err(err),
        }
    }
    Ok(kept)
}

/// Column `index` of `row`, a stored label: one that does not read back could have said
/// anything, so it is [`Label::unknown`] (with a warning).
pub(super) fn label(row: &Row<'_>, index: usize) -> rusqlite::Result<Label> {
    let text: String = row.get(index)?;
    Ok(serde_json::from_str(&text).unwrap_or_else(|err| {
        tracing::warn!("a stored label cannot be read ({err}): taken as untrusted");
        Label::unknown()
    }))
}

/// `label` as a column holds it.
pub(super) fn label_text(label: &Label) -> String {
    serde_json::to_string(label).expect("a label serializes")
}
