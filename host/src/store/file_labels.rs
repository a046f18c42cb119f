//! The labels of written workspace files, in SQLite. The types and the rules are the
//! services' (`services::file_labels`).

use rusqlite::params;

use super::{Store, StoreError};
use crate::flow::Label;
use crate::services::{FileLabel, FileStamp, stored_file_label};

/// The stamp's numbers as SQLite keeps them (signed 64 bits, the bits unchanged).
fn signed(n: u64) -> i64 {
    n as i64
}

impl Store {
    /// Records `rows` in `workspace`, each replacing its file's earlier row.
    pub(crate) fn record_file_labels(
        &self,
        workspace: &str,
        rows: &[FileLabel],
    ) -> Result<(), StoreError> {
        self.write(|tx| {
            let mut insert = tx.prepare_cached(
                "INSERT INTO file_labels (workspace, dev, ino, path, len, ctime_ns, label)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (workspace, dev, ino) DO UPDATE SET
                   path = excluded.path, len = excluded.len, ctime_ns = excluded.ctime_ns,
                   label = excluded.label",
            )?;
            for row in rows {
                let stamp = row.stamp;
                let label = serde_json::to_string(&row.label).expect("a label serializes");
                insert.execute(params![
                    workspace,
                    signed(stamp.dev),
                    signed(stamp.ino),
                    row.path,
                    signed(stamp.len),
                    stamp.ctime_ns,
                    label
                ])?;
            }
            Ok(())
        })
    }

    /// The rows of `workspace` for the files `stamps` name, with the stamps they hold.
    pub(crate) fn file_labels(
        &self,
        workspace: &str,
        stamps: &[FileStamp],
    ) -> Result<Vec<FileLabel>, StoreError> {
        let conn = self.conn();
        let mut select = conn.prepare_cached(
            "SELECT path, label, len, ctime_ns FROM file_labels
             WHERE workspace = ?1 AND dev = ?2 AND ino = ?3",
        )?;
        let mut found = Vec::new();
        for asked in stamps {
            let rows = select.query_map(
                params![workspace, signed(asked.dev), signed(asked.ino)],
                |row| {
                    let stamp = FileStamp {
                        len: row.get::<_, i64>(2)? as u64,
                        ctime_ns: row.get(3)?,
                        ..*asked
                    };
                    Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?, stamp))
                },
            )?;
            for row in rows {
                let (path, text, stamp) = row?;
                found.push(FileLabel {
                    label: stored_file_label(&text, &path),
                    path,
                    stamp,
                });
            }
        }
        Ok(found)
    }

    /// The join of the labels of `workspace`'s files written beneath `dir`.
    pub(crate) fn file_labels_beneath(
        &self,
        workspace: &str,
        dir: &str,
    ) -> Result<Label, StoreError> {
        let dir = dir.trim_matches('/');
        let dir = if dir == "." { "" } else { dir };
        let conn = self.conn();
        let mut select = conn.prepare_cached(
            "SELECT DISTINCT label FROM file_labels
             WHERE workspace = ?1 AND (?2 = '' OR substr(path, 1, length(?2) + 1) = ?2 || '/')",
        )?;
        let rows = select.query_map(params![workspace, dir], |row| row.get::<_, String>(0))?;
        let mut joined = Label::trusted();
        for text in rows {
            joined.join(&stored_file_label(&text?, &format!("{dir}/*")));
        }
        Ok(joined)
    }
}
