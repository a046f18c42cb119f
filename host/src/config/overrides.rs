//! Layers of a configuration: the embedded defaults, the file over them ([`merge`]), and
//! the keys a command sets over both ([`Override`]).

use super::ConfigError;

/// One key of the config set for one command (`--set limits.max_turns=4`), laid over the
/// file with the same names and the same checks; an error it causes names the flag.
///
/// ```
/// use capstan_host::config::{Config, Override};
///
/// let four = Override::parse("--set", "limits.max_turns=4").unwrap();
/// let config = Config::parse_with("", "capstan.toml".as_ref(), &[four]).unwrap();
/// assert_eq!(config.limits.max_turns, 4);
///
/// let zero = Override::parse("--set", "limits.max_turns=0").unwrap();
/// let err = Config::parse_with("", "capstan.toml".as_ref(), &[zero]).unwrap_err();
/// assert_eq!(err.to_string(), "--set limits.max_turns=0: `limits.max_turns`: must be at least 1");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// How it was given, for messages: `--set limits.max_turns=0`, `--deadline 0`.
    pub(super) flag: String,
    /// The dotted key.
    pub(super) key: String,
    pub(super) value: toml::Value,
}

impl Override {
    /// `key` set to `value`, given as `flag`.
    pub fn new(flag: impl Into<String>, key: impl Into<String>, value: toml::Value) -> Self {
        Override {
            flag: flag.into(),
            key: key.into(),
            value,
        }
    }

    /// `key=value` given with `flag`: the value is read as TOML (`4`, `true`, `"text"`,
    /// `["a", "b"]`), or taken as a string if it is not TOML (`agent.name=helper`).
    pub fn parse(flag: &str, assignment: &str) -> Result<Self, ConfigError> {
        let given = format!("{flag} {assignment}");
        let Some((key, value)) = assignment.split_once('=') else {
            return Err(ConfigError {
                file: given,
                key: None,
                position: None,
                message: "expected KEY=VALUE, e.g. limits.max_turns=4".into(),
            });
        };
        let key = key.trim();
        if key.is_empty() || key.split('.').any(str::is_empty) {
            return Err(ConfigError {
                file: given,
                key: None,
                position: None,
                message: "the key is empty; name it as in capstan.toml, e.g. limits.max_turns"
                    .into(),
            });
        }
        let value = value.trim();
        let value = toml::from_str::<toml::Table>(&format!("v = {value}"))
            .ok()
            .and_then(|mut table| table.remove("v"))
            .unwrap_or_else(|| toml::Value::String(value.to_owned()));
        Ok(Override::new(given, key, value))
    }
}

/// Sets dotted `key` in `table`, making the tables on the way.
pub(super) fn set_dotted(
    table: &mut toml::Table,
    key: &str,
    value: toml::Value,
) -> Result<(), String> {
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts.pop().unwrap_or(key);
    let mut here = table;
    for part in parts {
        let next = here
            .entry(part)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        here = next
            .as_table_mut()
            .ok_or_else(|| format!("`{part}` is not a table, so `{key}` cannot be set"))?;
    }
    here.insert(last.to_owned(), value);
    Ok(())
}

/// Lays `theirs` over `ours`: tables merge key by key, anything else replaces.
pub(super) fn merge(ours: &mut toml::Table, theirs: toml::Table) {
    for (key, value) in theirs {
        match (ours.get_mut(&key), value) {
            (Some(toml::Value::Table(mine)), toml::Value::Table(new)) => merge(mine, new),
            (_, value) => {
                ours.insert(key, value);
            }
        }
    }
}
