//! The secrets' values, read once at start from where the config says.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;

use super::{Redactor, SecretName, SecretSource, SecretSpec};

/// The most a secret file may hold: keys and tokens are small.
const MAX_SECRET_BYTES: u64 = 64 << 10;

/// The shortest secret accepted: a shorter value would be redacted wherever its few
/// characters happen to appear, and is too weak to guard anything besides.
pub const MIN_SECRET_BYTES: usize = 8;

/// One loaded secret. Its `Debug` form never shows the value.
#[derive(Clone)]
pub struct Secret {
    spec: SecretSpec,
    value: Arc<str>,
}

impl Secret {
    /// What the config declares about it.
    pub fn spec(&self) -> &SecretSpec {
        &self.spec
    }

    /// The value. Only the egress and the signing oracle should read it.
    pub(crate) fn value(&self) -> &str {
        &self.value
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("name", &self.spec.name)
            .field("source", &self.spec.source)
            .field("value", &"<redacted>")
            .finish()
    }
}

/// Every secret the config declares, with its value.
///
/// ```
/// use capstan_host::secrets::{SecretName, SecretSource, SecretSpec, Secrets};
///
/// // SAFETY: no other thread reads the environment in this example.
/// unsafe { std::env::set_var("DOC_API_KEY", "key-0123456789") };
/// let spec = SecretSpec {
///     name: "API_KEY".parse().unwrap(),
///     source: SecretSource::Env("DOC_API_KEY".into()),
///     hosts: vec!["api.example.com".parse().unwrap()],
///     header: None,
///     path_prefix: None,
/// };
/// let secrets = Secrets::load(&[spec]).unwrap();
/// assert!(secrets.get("API_KEY").is_some());
/// assert_eq!(secrets.redactor().redact("got key-0123456789"), "got [redacted secret API_KEY]");
/// ```
#[derive(Debug, Clone, Default)]
pub struct Secrets {
    by_name: BTreeMap<SecretName, Secret>,
    /// Hides every secret's value and every other value the host holds ([`Secrets::hiding`]).
    redactor: Redactor,
}

/// A secret whose value cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("secret {name}: {problem}; {fix}")]
pub struct LoadSecretError {
    /// The secret.
    pub name: SecretName,
    /// What went wrong.
    pub problem: String,
    /// What to do.
    pub fix: String,
}

impl Secrets {
    /// No secrets.
    pub fn none() -> Self {
        Secrets::default()
    }

    /// Reads every secret's value from its source.
    pub fn load(specs: &[SecretSpec]) -> Result<Self, LoadSecretError> {
        let mut by_name = BTreeMap::new();
        for spec in specs {
            let value = read_value(spec)?;
            by_name.insert(
                spec.name.clone(),
                Secret {
                    spec: spec.clone(),
                    value: value.into(),
                },
            );
        }
        let redactor = Redactor::new(
            by_name
                .values()
                .map(|s: &Secret| (s.spec.name.clone(), s.value.clone())),
        );
        Ok(Secrets { by_name, redactor })
    }

    /// These secrets, whose redactor also hides `values`: the other values the host holds
    /// and no one outside may read (the serve tokens, the provider's key), so that what a
    /// tool returns, a log line or a door's answer hides them as it hides a secret.
    ///
    /// ```
    /// use capstan_host::secrets::Secrets;
    ///
    /// let secrets = Secrets::none().hiding([("token.ops".parse().unwrap(), "tok-0123456789abcdef".into())]);
    /// assert_eq!(
    ///     secrets.redactor().redact("read tok-0123456789abcdef"),
    ///     "read [redacted secret token.ops]"
    /// );
    /// ```
    pub fn hiding(mut self, values: impl IntoIterator<Item = (SecretName, Arc<str>)>) -> Self {
        self.redactor = self.redactor.with(values);
        self
    }

    /// The secret called `name`.
    pub fn get(&self, name: &str) -> Option<&Secret> {
        self.by_name
            .iter()
            .find(|(n, _)| n.as_str() == name)
            .map(|(_, s)| s)
    }

    /// Every secret, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Secret> {
        self.by_name.values()
    }

    /// What hides every value.
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }
}

fn read_value(spec: &SecretSpec) -> Result<String, LoadSecretError> {
    let table = format!("[secrets.{}]", spec.name);
    read_source(&spec.source, &table, MIN_SECRET_BYTES).map_err(|(problem, fix)| LoadSecretError {
        name: spec.name.clone(),
        problem,
        fix,
    })
}

/// Reads a value kept out of the config (a secret, a token) from `source`, declared in
/// `table` (e.g. `[secrets.API_KEY]`): one line of at least `min_bytes`, without control
/// characters. `Err` holds what is wrong and what to do.
pub(crate) fn read_source(
    source: &SecretSource,
    table: &str,
    min_bytes: usize,
) -> Result<String, (String, String)> {
    let value = match source {
        SecretSource::Env(var) => std::env::var(var).map_err(|err| {
            (
                format!(
                    "environment variable {var} {}",
                    match err {
                        std::env::VarError::NotPresent => "is not set",
                        std::env::VarError::NotUnicode(_) => "is not valid UTF-8",
                    }
                ),
                format!("set {var} in capstan's environment, or change `env` in {table}"),
            )
        })?,
        SecretSource::File(path) => read_file(path).map_err(|problem| {
            (
                format!("cannot read {}: {problem}", path.display()),
                format!("check `file` in {table}"),
            )
        })?,
    };
    let value = value.trim_end_matches(['\r', '\n']).to_owned();
    if value.len() < min_bytes {
        return Err((
            format!(
                "its value ({source}) is {} bytes, shorter than the {min_bytes} it needs",
                value.len()
            ),
            "use the real key or token".into(),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err((
            format!("its value ({source}) holds control characters"),
            "store the value alone, on one line".into(),
        ));
    }
    Ok(value)
}

fn read_file(path: &PathBuf) -> Result<String, String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut text = String::new();
    file.take(MAX_SECRET_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    if text.len() as u64 > MAX_SECRET_BYTES {
        return Err(format!("larger than {} KiB", MAX_SECRET_BYTES >> 10));
    }
    Ok(text)
}
