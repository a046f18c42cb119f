//! Typed values read back from a row's text columns: a stored id or status that does not
//! parse is an error naming the column, never a value taken on trust.

use std::str::FromStr;

use tokio_postgres::Row;

use crate::flow::Label;
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

/// `rows` read by `read` (`what` each is), leaving out, with a warning naming why, a row
/// whose text does not read back: one damaged row (or one a newer host wrote) never hides
/// the others, nor stops a host that lists them.
pub(super) fn readable<T>(
    what: &str,
    rows: &[Row],
    read: impl Fn(&Row) -> Result<T, ServiceError>,
) -> Vec<T> {
    rows.iter()
        .filter_map(|row| match read(row) {
            Ok(item) => Some(item),
            Err(err) => {
                tracing::warn!("{what} is left out: {err}");
                None
            }
        })
        .collect()
}

/// Column `index` of `row`, a stored label: one that does not read back could have said
/// anything, so it is [`Label::unknown`] (with a warning).
pub(super) fn label(row: &Row, index: usize) -> Label {
    let text: String = row.get(index);
    serde_json::from_str(&text).unwrap_or_else(|err| {
        tracing::warn!("a stored label cannot be read ({err}): taken as untrusted");
        Label::unknown()
    })
}

/// `label` as a column holds it.
pub(super) fn label_text(label: &Label) -> String {
    serde_json::to_string(label).expect("a label serializes")
}
