//! The labels of written workspace files, in PostgreSQL (as the SQLite store keeps them).

use async_trait::async_trait;

use super::Postgres;
use super::prepared::Prepared;
use crate::flow::Label;
use crate::services::Operation;
use crate::services::{FileLabel, FileLabels, FileStamp, ServiceError, stored_file_label};

/// The stamp's numbers as PostgreSQL keeps them (signed 64 bits, the bits unchanged).
fn signed(n: u64) -> i64 {
    n as i64
}

#[async_trait]
impl FileLabels for Postgres {
    async fn record(&self, workspace: &str, rows: Vec<FileLabel>) -> Result<(), ServiceError> {
        let mut client = self.client().await?;
        let failed = |err| self.failed(Operation::FilesRecord, err);
        let tx = client.transaction().await.map_err(failed)?;
        let insert = tx
            .prepare_cached(
                "INSERT INTO file_labels (workspace, dev, ino, path, len, ctime_ns, label)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (workspace, dev, ino) DO UPDATE SET
                   path = excluded.path, len = excluded.len, ctime_ns = excluded.ctime_ns,
                   label = excluded.label",
            )
            .await
            .map_err(failed)?;
        for row in &rows {
            let stamp = row.stamp;
            let label = serde_json::to_string(&row.label).expect("a label serializes");
            tx.execute(
                &insert,
                &[
                    &workspace,
                    &signed(stamp.dev),
                    &signed(stamp.ino),
                    &row.path,
                    &signed(stamp.len),
                    &stamp.ctime_ns,
                    &label,
                ],
            )
            .await
            .map_err(failed)?;
        }
        tx.commit().await.map_err(failed)?;
        Ok(())
    }

    async fn get(
        &self,
        workspace: &str,
        stamps: Vec<FileStamp>,
    ) -> Result<Vec<FileLabel>, ServiceError> {
        let client = self.client().await?;
        let failed = |err| self.failed(Operation::FilesGet, err);
        let select = client
            .prepare_cached(
                "SELECT path, label, len, ctime_ns FROM file_labels
                 WHERE workspace = $1 AND dev = $2 AND ino = $3",
            )
            .await
            .map_err(failed)?;
        let mut found = Vec::new();
        for asked in stamps {
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
                [&workspace, &signed(asked.dev), &signed(asked.ino)];
            for row in client.query(&select, &params).await.map_err(failed)? {
                let (path, text): (String, String) = (row.get(0), row.get(1));
                let stamp = FileStamp {
                    len: row.get::<_, i64>(2) as u64,
                    ctime_ns: row.get(3),
                    ..asked
                };
                found.push(FileLabel {
                    label: stored_file_label(&text, &path),
                    path,
                    stamp,
                });
            }
        }
        Ok(found)
    }

    async fn beneath(&self, workspace: &str, dir: &str) -> Result<Label, ServiceError> {
        let dir = dir.trim_matches('/');
        let dir = if dir == "." { "" } else { dir };
        let client = self.client().await?;
        let rows = client
            .query_cached(
                "SELECT DISTINCT label FROM file_labels
                 WHERE workspace = $1 AND ($2 = '' OR left(path, length($2) + 1) = $2 || '/')",
                &[&workspace, &dir],
            )
            .await
            .map_err(|err| self.failed(Operation::FilesBeneath, err))?;
        let mut joined = Label::trusted();
        for row in rows {
            joined.join(&stored_file_label(row.get(0), &format!("{dir}/*")));
        }
        Ok(joined)
    }
}
