//! What the config and `capstan.lock` say the host trusts.

use crate::config::Config;
use crate::plugin::trust::{Lock, LockError, Pins, Trust};

/// The signers of `config`, and the lock beside it if there is one (read now: a lock that
/// cannot be read stops the start, naming its file and line). Where the config requires a
/// lock (`plugins.require_lock`) and there is none, nothing is let in.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("capstan.toml");
/// let config = capstan_host::config::Config::parse("", &path).unwrap();
/// let trust = capstan_host::app::trust(&config).unwrap();
/// assert!(trust.pins.is_none(), "no capstan.lock beside it");
/// ```
pub fn trust(config: &Config) -> Result<Trust, LockError> {
    let pins = match Lock::read(&config.lock_file)? {
        Some(lock) => Some(Pins::new(lock, &config.lock_file, config.accept_narrowing)),
        None if config.require_lock => Some(Pins::missing(&config.lock_file)),
        None => None,
    };
    Ok(Trust {
        signers: config.signers.clone(),
        pins,
    })
}
