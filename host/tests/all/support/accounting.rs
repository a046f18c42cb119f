//! The accounting of the store-fault tests: every request a client sends is heard as
//! stored, pending or refused, and every message is then found stored exactly once,
//! whichever it was.

use std::collections::BTreeMap;

/// How a request ended, from its client's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Heard {
    /// 200: answered and stored.
    Stored,
    /// 202 `not_yet_stored`: answered, kept, to be stored once the store is back.
    Pending,
    /// Refused (503 and the like) or no answer at all: nothing may be relied on; sent
    /// again with the same key.
    Refused,
}

/// The requests of one test: message `n` is `message {n}`, sent with idempotency key
/// `key-{n}`.
#[derive(Debug, Default)]
pub struct Accounts {
    heard: BTreeMap<usize, (Heard, String)>,
}

impl Accounts {
    /// Sends message `n` to conversation `main` at `url`, waiting for its answer, and
    /// classifies what came back; an answer outside the accounting fails the test.
    pub async fn send(client: &reqwest::Client, url: &str, n: usize) -> (Heard, String) {
        let sent = client
            .post(format!("{url}/v1/channels/main/messages"))
            .header("Idempotency-Key", format!("key-{n}"))
            .json(&serde_json::json!({ "text": format!("message {n}"), "wait": true }))
            .send()
            .await;
        let Ok(response) = sent else {
            return (Heard::Refused, "no response".into());
        };
        let status = response.status().as_u16();
        let body: serde_json::Value = response.json().await.unwrap_or_default();
        let heard = match (status, body["outcome"].as_str()) {
            (200, Some("stored")) => Heard::Stored,
            (202, Some("not_yet_stored" | "pending")) => Heard::Pending,
            (500.., _) => Heard::Refused,
            _ => panic!("an answer outside the accounting: {status} {body}"),
        };
        (heard, body.to_string())
    }

    /// Sends the next message and keeps what was heard.
    pub async fn next(&mut self, client: &reqwest::Client, url: &str) -> Heard {
        let n = self.heard.len();
        let heard = Self::send(client, url, n).await;
        self.record(n, heard.clone());
        heard.0
    }

    /// Keeps what was heard of message `n`, sent by the test itself.
    pub fn record(&mut self, n: usize, heard: (Heard, String)) {
        assert!(self.heard.insert(n, heard).is_none(), "message {n} twice");
    }

    /// How many were sent.
    pub fn len(&self) -> usize {
        self.heard.len()
    }

    /// The messages refused when first sent.
    pub fn refused(&self) -> Vec<usize> {
        self.heard
            .iter()
            .filter(|(_, (heard, _))| *heard == Heard::Refused)
            .map(|(n, _)| *n)
            .collect()
    }

    /// How many were heard other than stored.
    pub fn not_stored(&self) -> usize {
        self.heard
            .values()
            .filter(|(h, _)| *h != Heard::Stored)
            .count()
    }

    /// Sends every refused message again with its key; each must now be taken (it was not
    /// before) and stored.
    pub async fn resend_refused(&self, client: &reqwest::Client, url: &str) {
        for (n, (heard, _)) in &self.heard {
            if *heard == Heard::Refused {
                let (again, body) = Self::send(client, url, *n).await;
                assert_eq!(again, Heard::Stored, "message {n} sent again: {body}");
                // Refused means not taken: the retry is taken, not answered as a repeat.
                let body: serde_json::Value = serde_json::from_str(&body).unwrap();
                assert_ne!(
                    body["repeated"], true,
                    "message {n} was refused, yet taken: {body}"
                );
            }
        }
    }

    /// Sends every message again with its key, as a client that never heard back would:
    /// each is answered as a repeat, and taken no second time ([`Accounts::settle`] then
    /// finds it stored once).
    pub async fn resend_all(&self, client: &reqwest::Client, url: &str) {
        for n in self.heard.keys() {
            let (again, body) = Self::send(client, url, *n).await;
            assert_eq!(again, Heard::Stored, "message {n} sent again: {body}");
            let body: serde_json::Value = serde_json::from_str(&body).unwrap();
            // A door says so of a repeat it answers itself; one the owner answers for a
            // forwarding host is not marked (that it was taken once is checked in the
            // store, by `settle`).
            let forwarded = body["events"]
                .as_array()
                .is_some_and(|events| events.iter().any(|e| e["type"] == "forwarded"));
            assert!(
                forwarded || body["repeated"] == true,
                "message {n} not answered as a repeat: {body}"
            );
        }
    }

    /// The messages not in `stored` (the user messages stored, as text).
    pub fn missing(&self, stored: &[String]) -> Vec<usize> {
        self.heard
            .keys()
            .copied()
            .filter(|n| !stored.contains(&format!("message {n}")))
            .collect()
    }

    /// Checks that each message is in `stored` exactly once and returns the table: how
    /// many were heard each way.
    pub fn settle(&self, stored: &[String]) -> BTreeMap<Heard, usize> {
        for (n, (how, body)) in &self.heard {
            let times = stored
                .iter()
                .filter(|said| **said == format!("message {n}"))
                .count();
            assert_eq!(
                times, 1,
                "message {n} ({how:?}: {body}) stored {times} times"
            );
        }
        let mut table = BTreeMap::new();
        for (heard, _) in self.heard.values() {
            *table.entry(*heard).or_insert(0) += 1;
        }
        table
    }

    /// Waits until every message is in what `stored` reads (the user messages stored, as
    /// text), sends every one again with its key through `url` ([`Accounts::resend_all`]),
    /// then checks each is stored once: the table of what the clients heard.
    pub async fn settled(
        &self,
        client: &reqwest::Client,
        url: &str,
        mut stored: impl AsyncFnMut() -> Vec<String>,
    ) -> BTreeMap<Heard, usize> {
        super::until("every acknowledged message stored", async || {
            match self.missing(&stored().await) {
                missing if missing.is_empty() => Ok(()),
                missing => Err(format!("{missing:?} of {self:?}")),
            }
        })
        .await;
        self.resend_all(client, url).await;
        self.settle(&stored().await)
    }
}
