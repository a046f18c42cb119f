//! The secrets an agent's calls may use, and the other values the host holds that its
//! redactor must know.

use std::sync::Arc;

use crate::config::{Config, ProviderSettings};
use crate::secrets::{
    LoadSecretError, MIN_SECRET_BYTES, Redactor, SecretName, Secrets, read_source,
};

/// Reads `[secrets.*]`, and gives their redactor every other value the host holds
/// ([`Secrets::hiding`]): each serve token's (`token.NAME`) and the provider's key
/// (`provider.api_key`). So a tool reading one from a file, a model quoting one or an
/// error holding one shows it to nobody, through any door. Every value is hidden in the process's log from then on ([`Redactor::hide_in_logs`]).
///
/// [`Redactor::hide_in_logs`]: crate::secrets::Redactor::hide_in_logs
pub fn load_secrets(config: &Config) -> Result<Secrets, LoadSecretError> {
    let secrets = Secrets::load(&config.secrets)?.hiding(held_values(config));
    secrets.redactor().hide_in_logs();
    Ok(secrets)
}

/// Hides in the process's log and terminal every value of `config` that can be read now:
/// each `[secrets.*]` value, serve token and the provider's key. It fails on none (a
/// command that runs no call, such as `tasks` or `policy`, must work where a secret's
/// source is absent), but what it prints of a model's or a tool's text is still redacted.
pub fn hide_readable_values(config: &Config) {
    let secrets = config.secrets.iter().filter_map(|spec| {
        let table = format!("[secrets.{}]", spec.name);
        let value = read_source(&spec.source, &table, MIN_SECRET_BYTES).ok()?;
        Some((spec.name.clone(), Arc::from(value)))
    });
    Redactor::new(secrets.chain(held_values(config))).hide_in_logs();
}

/// The values the host holds beside `[secrets.*]` that no one outside may read. A value
/// that cannot be read is left out here: the part that needs it (`capstan serve`, the
/// provider) refuses to start, naming it. A value shorter than a secret may be
/// ([`MIN_SECRET_BYTES`]) is left out too: hiding it would hide words.
fn held_values(config: &Config) -> Vec<(SecretName, Arc<str>)> {
    let tokens = config.serve.tokens.iter().filter_map(|spec| {
        let table = format!("[serve.tokens.{}]", spec.name);
        let value = read_source(&spec.source, &table, MIN_SECRET_BYTES).ok()?;
        Some((
            format!("token.{}", spec.name).parse().ok()?,
            Arc::from(value),
        ))
    });
    let provider = match &config.provider {
        ProviderSettings::OpenAi { api_key_env, .. } => std::env::var(api_key_env)
            .ok()
            .filter(|key| key.len() >= MIN_SECRET_BYTES)
            .and_then(|key| Some(("provider.api_key".parse().ok()?, Arc::from(key)))),
        ProviderSettings::Scripted { .. } => None,
    };
    tokens.chain(provider).collect()
}
