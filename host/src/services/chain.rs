//! The audit chain: every approval, denial, withdrawal, use of an approval and flow
//! refusal, as a row that holds the hash of the row before it, signed with the host's
//! Ed25519 key. Anyone with the rows and the hosts' public keys can check, offline, that no
//! row was changed, dropped, reordered or added by someone without a key
//! ([`Verifier`], `capstan audit verify`).

use std::fmt;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use ring::rand::SystemRandom;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::ServiceError;
use crate::text::{hex, unhex};

/// What a chain row records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChainEvent {
    /// A person approved a parked call.
    Approved,
    /// A person denied a parked call.
    Denied,
    /// A parked call stopped waiting before anyone decided.
    Withdrawn,
    /// A call ran on a use of an approval.
    Used,
    /// A call was refused by the flow rules.
    Refused,
    /// A person vouched for a handle's value a parked call carried (its digest and name
    /// in the row), with the approval of the call: every later use of it is trusted.
    Endorsed,
    /// A call used a value as trusted on an endorsement (the value's digest and name in
    /// the row, the endorsing approval).
    Vouched,
    /// A decision the chain recorded that the store then refused (the approval was
    /// decided or withdrawn meanwhile): it stands for nothing.
    Voided,
}

impl ChainEvent {
    const ALL: [ChainEvent; 8] = [
        ChainEvent::Approved,
        ChainEvent::Denied,
        ChainEvent::Withdrawn,
        ChainEvent::Used,
        ChainEvent::Refused,
        ChainEvent::Endorsed,
        ChainEvent::Vouched,
        ChainEvent::Voided,
    ];

    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            ChainEvent::Approved => "approved",
            ChainEvent::Denied => "denied",
            ChainEvent::Withdrawn => "withdrawn",
            ChainEvent::Used => "used",
            ChainEvent::Refused => "refused",
            ChainEvent::Endorsed => "endorsed",
            ChainEvent::Vouched => "vouched",
            ChainEvent::Voided => "voided",
        }
    }
}

impl fmt::Display for ChainEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ChainEvent {
    type Err = ServiceError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        ChainEvent::ALL
            .into_iter()
            .find(|e| e.as_str() == text)
            .ok_or_else(|| ServiceError::Invalid(format!("`{text}` is not a chain event")))
    }
}

/// A row to add to the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainRecord {
    /// What happened.
    pub event: ChainEvent,
    /// The process whose call it was, e.g. `worker:3`.
    pub process: String,
    /// The tool.
    pub tool: String,
    /// The digest of the call's canonical arguments, in hex.
    pub digest: String,
    /// The approval it concerns, if any.
    pub approval: Option<u64>,
    /// Who decided: a person's name or token, or `host` for the host's own refusals.
    pub by: String,
    /// Why, or the lease given.
    pub detail: String,
}

impl ChainRecord {
    /// The row of `event` about `approval`, by `by`.
    pub fn of_approval(
        approval: &super::Approval,
        event: ChainEvent,
        by: &str,
        detail: &str,
    ) -> Self {
        ChainRecord {
            event,
            process: approval.process.to_string(),
            tool: approval.tool.clone(),
            digest: approval.digest.to_string(),
            approval: Some(approval.id.get()),
            by: by.to_owned(),
            detail: detail.to_owned(),
        }
    }
}

/// A stored chain row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ChainEntry {
    /// Its place: 1, 2, ... with no gap.
    pub seq: u64,
    /// Unix seconds.
    pub at: i64,
    /// What happened.
    pub event: ChainEvent,
    /// The process whose call it was.
    pub process: String,
    /// The tool.
    pub tool: String,
    /// The digest of the call's canonical arguments, in hex.
    pub digest: String,
    /// The approval it concerns.
    pub approval: Option<u64>,
    /// Who decided.
    pub by: String,
    /// Why, or the lease given.
    pub detail: String,
    /// The public key of the host that signed it, in hex.
    pub key: String,
    /// The hash of the row before it (64 zeros for the first), in hex.
    pub prev: String,
    /// This row's hash, in hex: [`entry_hash`].
    pub hash: String,
    /// The Ed25519 signature of the hash by `key`, in hex.
    pub signature: String,
}

/// The hash of the row at `seq`, made at `at`, of `record`, signed by `key`, after the row
/// whose hash is `prev`: SHA-256 over `prev` and each field, each length-prefixed, so no
/// two different rows hash alike.
pub fn entry_hash(prev: &[u8; 32], seq: u64, at: i64, record: &ChainRecord, key: &str) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(b"capstan-audit-chain-v1");
    hash.update(prev);
    hash.update(seq.to_be_bytes());
    hash.update(at.to_be_bytes());
    let approval = record.approval.map(|n| n.to_string()).unwrap_or_default();
    for field in [
        record.event.as_str(),
        &record.process,
        &record.tool,
        &record.digest,
        &approval,
        &record.by,
        &record.detail,
        key,
    ] {
        hash.update((field.len() as u64).to_be_bytes());
        hash.update(field.as_bytes());
    }
    hash.finalize().into()
}

/// The entry the backend stores for `record` at `seq` and `at` after `prev`, signed by
/// `key`: the one way every backend makes a row.
pub fn sealed(
    prev: &[u8; 32],
    seq: u64,
    at: i64,
    record: ChainRecord,
    key: &HostKey,
) -> ChainEntry {
    let public = key.public_hex();
    let hash = entry_hash(prev, seq, at, &record, &public);
    let signature = key.sign(&hash);
    ChainEntry {
        seq,
        at,
        event: record.event,
        process: record.process,
        tool: record.tool,
        digest: record.digest,
        approval: record.approval,
        by: record.by,
        detail: record.detail,
        key: public,
        prev: hex(prev),
        hash: hex(&hash),
        signature: hex(&signature),
    }
}

/// The hash a chain starts from.
pub const GENESIS: [u8; 32] = [0; 32];

/// An Ed25519 signing key: a host's, for its audit chain; a publisher's, for the
/// components it signs (`capstan plugins sign`).
pub struct HostKey {
    pair: Ed25519KeyPair,
}

impl HostKey {
    /// A new random key, as PKCS#8 bytes to keep, and the key.
    pub fn generate() -> Result<(Vec<u8>, HostKey), ServiceError> {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new())
            .map_err(|_| ServiceError::Invalid("no randomness to make a host key from".into()))?;
        let key = HostKey::from_pkcs8(pkcs8.as_ref())?;
        Ok((pkcs8.as_ref().to_vec(), key))
    }

    /// A key that lives as long as this process: for services that keep nothing.
    pub fn ephemeral() -> HostKey {
        HostKey::generate()
            .expect("the system has randomness for a key")
            .1
    }

    /// The key in PKCS#8 `bytes`.
    pub fn from_pkcs8(bytes: &[u8]) -> Result<HostKey, ServiceError> {
        Ed25519KeyPair::from_pkcs8(bytes)
            .map(|pair| HostKey { pair })
            .map_err(|err| ServiceError::Invalid(format!("not an Ed25519 PKCS#8 key ({err})")))
    }

    /// The public key, in hex.
    pub fn public_hex(&self) -> String {
        hex(self.pair.public_key().as_ref())
    }

    /// The Ed25519 signature of `message`.
    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        self.pair.sign(message).as_ref().to_vec()
    }
}

impl fmt::Debug for HostKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostKey({})", self.public_hex())
    }
}

/// Where the chain's rows are kept: each backend appends a row in one transaction that
/// reads the last row, so rows from several hosts make one line.
#[async_trait]
pub trait ChainStore: Send + Sync {
    /// Appends `record`, sealed by `key` ([`sealed`]) after the last row.
    async fn append(
        &self,
        record: ChainRecord,
        key: Arc<HostKey>,
    ) -> Result<ChainEntry, ServiceError>;

    /// At most `limit` (1..=1000) rows after `after`, oldest first.
    async fn entries(&self, after: u64, limit: u32) -> Result<Vec<ChainEntry>, ServiceError>;
}

/// The audit chain of one host: its rows' store, and the key it signs with.
///
/// ```
/// use capstan_host::services::{ChainEvent, ChainRecord, Services, Verifier};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let services = Services::in_memory();
/// let refused = ChainRecord {
///     event: ChainEvent::Refused,
///     process: "worker:1".into(),
///     tool: "send_money".into(),
///     digest: String::new(),
///     approval: None,
///     by: "host".into(),
///     detail: "untrusted_send".into(),
/// };
/// services.chain.record(refused).await.unwrap();
/// let rows = services.chain.entries(0, 100).await.unwrap();
/// let mut verifier = Verifier::new(vec![services.chain.public_key()]);
/// verifier.check(&rows).unwrap();
/// assert_eq!(verifier.rows(), 1);
/// # });
/// ```
#[derive(Clone)]
pub struct AuditChain {
    store: Arc<dyn ChainStore>,
    key: Arc<RwLock<Arc<HostKey>>>,
}

impl AuditChain {
    /// The chain kept by `store`, signed by a key of this process only until
    /// [`AuditChain::sign_with`] gives it the host's.
    pub fn new(store: Arc<dyn ChainStore>) -> Self {
        AuditChain {
            store,
            key: Arc::new(RwLock::new(Arc::new(HostKey::ephemeral()))),
        }
    }

    /// Signs from now on with `key`, in every clone of this chain.
    pub fn sign_with(&self, key: HostKey) {
        *self.key.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(key);
    }

    /// The public key it signs with, in hex.
    pub fn public_key(&self) -> String {
        self.current().public_hex()
    }

    fn current(&self) -> Arc<HostKey> {
        self.key.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Appends `record`, signed.
    pub async fn record(&self, record: ChainRecord) -> Result<ChainEntry, ServiceError> {
        self.store.append(record, self.current()).await
    }

    /// At most `limit` rows after `after`, oldest first.
    pub async fn entries(&self, after: u64, limit: u32) -> Result<Vec<ChainEntry>, ServiceError> {
        self.store.entries(after, limit).await
    }
}

impl fmt::Debug for AuditChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AuditChain({})", self.public_key())
    }
}

/// Where a chain is broken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the audit chain is broken at row {seq}: {why}")]
pub struct ChainBreak {
    /// The first row that does not hold.
    pub seq: u64,
    /// Why.
    pub why: String,
}

/// Checks a chain's rows in order, a page at a time: each follows the one before (seq and
/// hash), its hash is its content's, its signature is valid by a trusted key, and each use
/// of an approval follows an approval of that call with a use left (so an approval
/// written into the store without a person's signed row is found at its first use).
///
/// ```
/// use capstan_host::services::{HostKey, Verifier};
///
/// let key = HostKey::ephemeral();
/// let mut verifier = Verifier::new(vec![key.public_hex()]);
/// verifier.check(&[]).unwrap();
/// assert_eq!(verifier.rows(), 0);
/// ```
#[derive(Debug, Clone)]
pub struct Verifier {
    trusted: Vec<String>,
    seq: u64,
    prev: [u8; 32],
    keys: Vec<String>,
    /// Each approval seen: its call, and the uses it has left.
    leases: std::collections::HashMap<u64, (String, String, String, u64)>,
    /// Each endorsing approval seen: its process, the values it may still endorse, and
    /// the digests it endorsed.
    endorsements: std::collections::HashMap<u64, (String, u64, Vec<String>)>,
}

impl Verifier {
    /// A verifier of a chain from its start, trusting the keys `trusted` (hex).
    pub fn new(trusted: Vec<String>) -> Self {
        Verifier {
            trusted,
            seq: 0,
            prev: GENESIS,
            keys: Vec::new(),
            leases: std::collections::HashMap::new(),
            endorsements: std::collections::HashMap::new(),
        }
    }

    /// The rows checked so far.
    pub fn rows(&self) -> u64 {
        self.seq
    }

    /// The hash of the last row checked, in hex (64 zeros before any).
    pub fn head(&self) -> String {
        hex(&self.prev)
    }

    /// The keys that signed the rows checked.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// Checks `rows`, the next rows of the chain.
    pub fn check(&mut self, rows: &[ChainEntry]) -> Result<(), ChainBreak> {
        for row in rows {
            self.check_row(row)?;
        }
        Ok(())
    }

    fn check_row(&mut self, row: &ChainEntry) -> Result<(), ChainBreak> {
        let broken = |why: String| ChainBreak { seq: row.seq, why };
        if row.seq != self.seq + 1 {
            return Err(ChainBreak {
                seq: self.seq + 1,
                why: format!(
                    "row {} comes next: a row is missing or out of order",
                    row.seq
                ),
            });
        }
        if row.prev != hex(&self.prev) {
            return Err(broken(
                "it does not follow the row before (its `prev` differs)".into(),
            ));
        }
        let record = ChainRecord {
            event: row.event,
            process: row.process.clone(),
            tool: row.tool.clone(),
            digest: row.digest.clone(),
            approval: row.approval,
            by: row.by.clone(),
            detail: row.detail.clone(),
        };
        let hash = entry_hash(&self.prev, row.seq, row.at, &record, &row.key);
        if row.hash != hex(&hash) {
            return Err(broken(
                "its content does not match its hash: it was changed".into(),
            ));
        }
        if !self.trusted.contains(&row.key) {
            return Err(broken(format!(
                "it is signed by key {}, which is not trusted (add it with --trust if it is \
                 one of your hosts')",
                row.key
            )));
        }
        let (Some(key), Some(signature)) = (unhex(&row.key), unhex(&row.signature)) else {
            return Err(broken("its key or signature is not hex".into()));
        };
        if UnparsedPublicKey::new(&ED25519, key)
            .verify(&hash, &signature)
            .is_err()
        {
            return Err(broken("its signature is not valid for its key".into()));
        }
        self.follow_leases(row).map_err(broken)?;
        if !self.keys.contains(&row.key) {
            self.keys.push(row.key.clone());
        }
        (self.seq, self.prev) = (row.seq, hash);
        Ok(())
    }

    /// Keeps each approval's uses, and refuses a use no approval allows.
    fn follow_leases(&mut self, row: &ChainEntry) -> Result<(), String> {
        let call = || (row.process.clone(), row.tool.clone(), row.digest.clone());
        match (row.event, row.approval) {
            (ChainEvent::Approved, Some(id)) => {
                let uses = row
                    .detail
                    .split_once(" use")
                    .and_then(|(n, _)| n.parse().ok())
                    .ok_or_else(|| format!("approval #{id}'s uses cannot be read"))?;
                let (process, tool, digest) = call();
                // An approval that endorses says how many values: `..., endorses N value(s)`.
                if let Some(values) = row
                    .detail
                    .split_once(", endorses ")
                    .and_then(|(_, n)| n.split_once(' '))
                    .and_then(|(n, _)| n.parse().ok())
                {
                    self.endorsements
                        .insert(id, (process.clone(), values, Vec::new()));
                }
                self.leases.insert(id, (process, tool, digest, uses));
            }
            (ChainEvent::Used, Some(id)) => {
                let Some(lease) = self.leases.get_mut(&id) else {
                    return Err(format!(
                        "a call ran on approval #{id}, which no signed row approved: the \
                         approval was written into the store, not given by a person"
                    ));
                };
                if (&lease.0, &lease.1, &lease.2) != (&row.process, &row.tool, &row.digest) {
                    return Err(format!(
                        "a call ran on approval #{id} that is not the call it approved"
                    ));
                }
                if lease.3 == 0 {
                    return Err(format!("a call ran on approval #{id} after its last use"));
                }
                lease.3 -= 1;
            }
            (ChainEvent::Endorsed, id) => {
                let endorsing = id.and_then(|id| self.endorsements.get_mut(&id));
                match endorsing {
                    Some((process, left, digests)) if *process == row.process && *left > 0 => {
                        *left -= 1;
                        digests.push(row.digest.clone());
                    }
                    _ => {
                        return Err(format!(
                            "a value was endorsed with approval {}, which no signed row \
                             approved as endorsing it",
                            id.map_or("(none)".into(), |id| format!("#{id}"))
                        ));
                    }
                }
            }
            (ChainEvent::Vouched, id) => {
                let endorsed = id.and_then(|id| self.endorsements.get(&id)).is_some_and(
                    |(process, _, digests)| {
                        *process == row.process && digests.contains(&row.digest)
                    },
                );
                if !endorsed {
                    return Err(format!(
                        "a call used a value as endorsed by approval {}, which no signed \
                         row endorsed: the endorsement was written into the store, not given \
                         by a person",
                        id.map_or("(none)".into(), |id| format!("#{id}"))
                    ));
                }
            }
            (ChainEvent::Voided, Some(id)) => {
                self.leases.remove(&id);
                self.endorsements.remove(&id);
            }
            _ => {}
        }
        Ok(())
    }
}

/// The hash (hex `text`) of a stored row, as bytes.
pub fn hash_bytes(text: &str) -> Option<[u8; 32]> {
    unhex(text).and_then(|bytes| bytes.try_into().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(n: u64) -> ChainRecord {
        ChainRecord {
            event: ChainEvent::Refused,
            process: "worker:1".into(),
            tool: "send".into(),
            digest: String::new(),
            approval: Some(n),
            by: "host".into(),
            detail: format!("row {n}"),
        }
    }

    fn verify(rows: &[ChainEntry], trusted: &[String]) -> Result<u64, ChainBreak> {
        let mut verifier = Verifier::new(trusted.to_vec());
        verifier.check(rows).map(|()| verifier.rows())
    }

    fn chain(key: &HostKey, n: u64) -> Vec<ChainEntry> {
        let mut rows: Vec<ChainEntry> = Vec::new();
        for seq in 1..=n {
            let prev = rows
                .last()
                .and_then(|r| hash_bytes(&r.hash))
                .unwrap_or(GENESIS);
            rows.push(sealed(&prev, seq, 1_700_000_000, record(seq), key));
        }
        rows
    }

    #[test]
    fn a_changed_dropped_reordered_or_foreign_row_breaks_the_chain_where_it_is() {
        let key = HostKey::ephemeral();
        let trusted = [key.public_hex()];
        let rows = chain(&key, 5);
        assert_eq!(verify(&rows, &trusted).unwrap(), 5);

        let mut changed = rows.clone();
        changed[2].detail = "row 3, rewritten".into();
        let broken = verify(&changed, &trusted).unwrap_err();
        assert_eq!(broken.seq, 3);
        assert!(broken.why.contains("was changed"), "{broken}");

        let mut dropped = rows.clone();
        dropped.remove(1);
        assert_eq!(verify(&dropped, &trusted).unwrap_err().seq, 2);

        let mut swapped = rows.clone();
        swapped.swap(3, 4);
        assert_eq!(verify(&swapped, &trusted).unwrap_err().seq, 4);

        // Rewritten whole from row 3 by someone with another key: the hashes hold, the
        // key is not trusted.
        let forger = HostKey::ephemeral();
        let mut forged = rows[..2].to_vec();
        let mut prev = hash_bytes(&forged[1].hash).unwrap();
        for seq in 3..=5 {
            let row = sealed(&prev, seq, 1_700_000_000, record(seq + 10), &forger);
            prev = hash_bytes(&row.hash).unwrap();
            forged.push(row);
        }
        let broken = verify(&forged, &trusted).unwrap_err();
        assert_eq!(broken.seq, 3);
        assert!(broken.why.contains("not trusted"), "{broken}");
        // The forger naming the host's key, with its own signature: invalid.
        let mut claimed = forged.clone();
        claimed[2].key = key.public_hex();
        let record = ChainRecord {
            approval: Some(13),
            detail: "row 13".into(),
            ..record(13)
        };
        claimed[2].hash = hex(&entry_hash(
            &hash_bytes(&claimed[1].hash).unwrap(),
            3,
            1_700_000_000,
            &record,
            &key.public_hex(),
        ));
        let broken = verify(&claimed[..3], &trusted).unwrap_err();
        assert!(broken.why.contains("signature is not valid"), "{broken}");
        // Pages verify one after the other.
        let mut verifier = Verifier::new(trusted.to_vec());
        verifier.check(&rows[..2]).unwrap();
        verifier.check(&rows[2..]).unwrap();
        assert_eq!(verifier.rows(), 5);
        assert_eq!(verifier.head(), rows[4].hash);
    }

    #[test]
    fn a_use_of_an_approval_no_person_signed_or_past_its_uses_breaks_the_chain() {
        let key = HostKey::ephemeral();
        let trusted = [key.public_hex()];
        let row = |event, approval: u64, detail: &str| ChainRecord {
            event,
            process: "worker:1".into(),
            tool: "send".into(),
            digest: "ab".into(),
            approval: Some(approval),
            by: "person".into(),
            detail: detail.into(),
        };
        let seal = |records: Vec<ChainRecord>| {
            let mut rows: Vec<ChainEntry> = Vec::new();
            for record in records {
                let prev = rows
                    .last()
                    .and_then(|r| hash_bytes(&r.hash))
                    .unwrap_or(GENESIS);
                rows.push(sealed(&prev, rows.len() as u64 + 1, 0, record, &key));
            }
            rows
        };
        let approved = row(ChainEvent::Approved, 1, "1 use(s), 600 s");
        let used = row(ChainEvent::Used, 1, "0 use(s) left");
        assert_eq!(
            verify(&seal(vec![approved.clone(), used.clone()]), &trusted),
            Ok(2)
        );
        // Approved in the table, never by a person: its first use is the break.
        let broken = verify(&seal(vec![used.clone()]), &trusted).unwrap_err();
        assert!(broken.why.contains("no signed row approved"), "{broken}");
        let twice = seal(vec![approved.clone(), used.clone(), used.clone()]);
        assert_eq!(verify(&twice, &trusted).unwrap_err().seq, 3);
        let other = ChainRecord {
            digest: "cd".into(),
            ..used
        };
        let broken = verify(&seal(vec![approved, other]), &trusted).unwrap_err();
        assert!(broken.why.contains("not the call it approved"), "{broken}");
    }
}
