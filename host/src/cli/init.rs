//! `capstan init`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Args;

use crate::config::{CONFIG_FILE, DEFAULT_CONFIG};

#[derive(Debug, Args)]
pub(crate) struct InitCommand {
    /// The directory to write capstan.toml in.
    #[arg(default_value = ".")]
    dir: PathBuf,
    /// Replace an existing capstan.toml.
    #[arg(long)]
    force: bool,
}

impl InitCommand {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        let path = self.dir.join(CONFIG_FILE);
        // A config there would be refused by every later command.
        super::check_config_path(super::read_writable_workspaces()?, &path)?;
        if path.exists() && !self.force {
            bail!("{} exists; pass --force to replace it", path.display());
        }
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))?;
        std::fs::write(&path, DEFAULT_CONFIG)
            .with_context(|| format!("writing {}", path.display()))?;
        std::io::Write::write_fmt(
            &mut crate::secrets::stdout(),
            format_args!("wrote {}\n", path.display()),
        )?;
        Ok(ExitCode::SUCCESS)
    }
}
