//! `capstan plugins list|inspect|new|build|lock|diff|accept|keygen|sign|verify`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;

use super::HostArgs;
use super::build_plugin::BuildCommand;
use super::new_plugin::NewCommand;
use super::table::print_table;
use crate::mcp::Servers;
use crate::plugin::trust::{
    Changes, ComponentDigest, Lock, SignatureFile, Signer, Signers, Trust, signature_path,
    write_whole,
};
use crate::plugin::{LoadedPlugin, ToolInfo};
use crate::services::HostKey;

#[derive(Debug, Subcommand)]
pub(crate) enum PluginsCommand {
    /// Every loaded tool with its plugin file, WIT version and declared capabilities.
    List {
        #[command(flatten)]
        host: HostArgs,
    },
    /// One component: its tools, capabilities and imports, or why it is refused.
    Inspect {
        /// The component file.
        file: PathBuf,
        #[command(flatten)]
        host: HostArgs,
    },
    /// Write a working plugin project: `--lang rust|python|js NAME`.
    New(NewCommand),
    /// Build a project `plugins new` wrote, in its language, into DIR/NAME.wasm.
    Build(BuildCommand),
    /// Write capstan.lock beside the config: each plugin's digest, contract, tools and
    /// capabilities, and each MCP server's tools, as they are now. While it exists, a
    /// component or MCP tool that differs is not offered until accepted.
    Lock {
        #[command(flatten)]
        host: HostArgs,
    },
    /// Show what an update changes: tools added and removed, capabilities widened or
    /// narrowed, descriptions and schemas changed. Exits 0 when a lock would let it in
    /// with `plugins.accept_narrowing` (nothing, or only narrowing), 1 when it needs
    /// `plugins accept`, 2 when a component cannot be loaded.
    Diff {
        /// The component now.
        old: PathBuf,
        /// The update.
        new: PathBuf,
        #[command(flatten)]
        host: HostArgs,
    },
    /// Accept a plugin or MCP server as it is now: show what changed and pin it in
    /// capstan.lock (a plugin whose file is gone is dropped from it).
    Accept {
        /// The plugin (its file name without `.wasm`) or the MCP server (`[mcp.NAME]`).
        name: String,
        #[command(flatten)]
        host: HostArgs,
    },
    /// Make an Ed25519 signing key (PKCS#8, owner-only) and print its public half for
    /// `[plugins.signers.NAME] public`.
    Keygen {
        /// Where to write the key; an existing file is never replaced.
        key: PathBuf,
    },
    /// Sign a component: writes FILE.sig beside it.
    Sign {
        /// The component file.
        file: PathBuf,
        /// The signing key (from `capstan plugins keygen`).
        #[arg(long, value_name = "KEY")]
        key: PathBuf,
    },
    /// Check a component's signature (FILE.sig) against the keys the config trusts for it.
    Verify {
        /// The component file.
        file: PathBuf,
        /// Also trust this public key (64 hex digits) for any plugin.
        #[arg(long, value_name = "PUBLIC_KEY")]
        trust: Vec<String>,
        #[command(flatten)]
        host: HostArgs,
    },
}

impl PluginsCommand {
    pub(crate) async fn run(self) -> anyhow::Result<ExitCode> {
        match self {
            PluginsCommand::List { host } => {
                let config = host.config()?;
                let registry = host
                    .registry_on(&config, host.inspecting_host(&config)?, None)
                    .await?;
                let rows: Vec<Vec<String>> = registry
                    .plugins()
                    .iter()
                    .flat_map(|plugin| plugin.tools().iter().map(move |tool| row(plugin, tool)))
                    .collect();
                let mut out = crate::secrets::stdout();
                print_table(&mut out, &["TOOL", "PLUGIN", "WIT", "CAPABILITIES"], &rows)?;
                if rows.is_empty() {
                    writeln!(out, "(no tools loaded)")?;
                }
                Ok(ExitCode::SUCCESS)
            }
            PluginsCommand::New(new) => new.run(),
            PluginsCommand::Build(build) => build.run(),
            PluginsCommand::Lock { host } => lock(&host).await,
            PluginsCommand::Diff { old, new, host } => diff(&host, &old, &new).await,
            PluginsCommand::Accept { name, host } => accept(&host, &name).await,
            PluginsCommand::Keygen { key } => keygen(&key),
            PluginsCommand::Sign { file, key } => sign(&file, &key),
            PluginsCommand::Verify { file, trust, host } => verify(&host, &file, &trust),
            PluginsCommand::Inspect { file, host } => {
                match host.host(&host.config()?)?.load(&file).await {
                    Ok(plugin) => {
                        print_plugin(&mut crate::secrets::stdout(), &plugin)?;
                        Ok(ExitCode::SUCCESS)
                    }
                    Err(err) => {
                        crate::say!("refused: {err}");
                        Ok(ExitCode::FAILURE)
                    }
                }
            }
        }
    }
}

fn row(plugin: &LoadedPlugin, tool: &ToolInfo) -> Vec<String> {
    vec![
        tool.name.clone(),
        plugin.path().display().to_string(),
        plugin.wit_version().to_owned(),
        capabilities(tool),
    ]
}

fn capabilities(tool: &ToolInfo) -> String {
    if tool.capabilities.is_empty() {
        return "(none)".into();
    }
    let names: Vec<String> = tool.capabilities.iter().map(ToString::to_string).collect();
    names.join(",")
}

fn print_plugin(out: &mut impl Write, plugin: &LoadedPlugin) -> std::io::Result<()> {
    writeln!(out, "plugin:  {}", plugin.name())?;
    writeln!(out, "file:    {}", plugin.path().display())?;
    writeln!(out, "wit:     capstan:plugin@{}", plugin.wit_version())?;
    writeln!(out, "compile: {}", plugin.cache_outcome().as_str())?;
    writeln!(out, "imports:")?;
    for import in plugin.imports() {
        writeln!(out, "  {import}")?;
    }
    writeln!(out, "tools:")?;
    for tool in plugin.tools() {
        writeln!(out, "  {}  [{}]", tool.name, capabilities(tool))?;
        writeln!(out, "    {}", tool.description)?;
        writeln!(out, "    args: {}", tool.args_schema)?;
    }
    Ok(())
}

/// `plugins lock`: pins what loads now, signatures checked, lock ignored.
async fn lock(host: &HostArgs) -> anyhow::Result<ExitCode> {
    let config = host.config()?;
    let registry = host
        .registry_on(&config, host.unpinned_host(&config)?, Some(Servers::Named))
        .await?;
    let mut lock = registry.lock();
    let path = &config.lock_file;
    let before = Lock::read(path).ok().flatten();
    // A server that is down now keeps the pins it had: a lock written during its outage
    // must not drop it (and then refuse all its tools once it is back).
    for spec in &config.mcp {
        let (name, down) = (&spec.name, registry.source_down(&spec.name));
        let kept = before.as_ref().and_then(|before| before.mcp.get(name));
        if let (Some(why), Some(kept), false) = (down, kept, lock.mcp.contains_key(name)) {
            crate::say!(
                "warning: MCP server `{name}` is down ({}); its pins are kept from the lock \
                 before",
                crate::text::one_line(why)
            );
            lock.mcp.insert(name.clone(), kept.clone());
        }
    }
    lock.write(path)
        .with_context(|| format!("writing {}", path.display()))?;
    let mut out = crate::secrets::stdout();
    let tools: usize = lock.mcp.values().map(|server| server.tools.len()).sum();
    writeln!(
        out,
        "wrote {}: {} plugins, {} MCP servers with {tools} tools",
        path.display(),
        lock.plugins.len(),
        lock.mcp.len(),
    )?;
    if let Some(before) = before {
        print_lock_changes(&mut out, &before, &lock)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// What changed between two locks, a table per plugin or server that changed.
fn print_lock_changes(out: &mut impl Write, before: &Lock, after: &Lock) -> std::io::Result<()> {
    for (name, pin) in &after.plugins {
        let changes = match before.plugins.get(name) {
            Some(old) => Changes::of_plugin(old, pin),
            None => Changes::not_locked(),
        };
        print_changes(out, &format!("plugin {name}"), &changes)?;
    }
    for (name, pin) in &after.mcp {
        let changes = match before.mcp.get(name) {
            Some(old) => Changes::of_server(old, pin),
            None => Changes::not_locked(),
        };
        print_changes(out, &format!("MCP server {name}"), &changes)?;
    }
    for name in before
        .plugins
        .keys()
        .filter(|n| !after.plugins.contains_key(*n))
    {
        writeln!(out, "plugin {name}: no longer pinned")?;
    }
    for name in before.mcp.keys().filter(|n| !after.mcp.contains_key(*n)) {
        writeln!(out, "MCP server {name}: no longer pinned")?;
    }
    Ok(())
}

/// `changes` of `what` as a table, if there are any.
fn print_changes(out: &mut impl Write, what: &str, changes: &Changes) -> std::io::Result<()> {
    if changes.is_empty() {
        return Ok(());
    }
    writeln!(out, "\n{what}:")?;
    print_table(
        out,
        &["TOOL", "CHANGE", "DETAIL", "DIRECTION"],
        &changes.rows(),
    )
}

/// `plugins diff OLD NEW`: the two components' pins compared.
async fn diff(host: &HostArgs, old: &Path, new: &Path) -> anyhow::Result<ExitCode> {
    let config = host.config()?;
    // Both are read as they are: no signature or lock stands between a person and a diff.
    let plugins = host.inspecting_host(&config)?.with_trust(Trust::default());
    let (old, new) = match (plugins.load(old).await, plugins.load(new).await) {
        (Ok(old), Ok(new)) => (old, new),
        (Err(err), _) | (_, Err(err)) => {
            crate::say!("error: {err}");
            return Ok(ExitCode::from(2));
        }
    };
    let changes = Changes::of_plugin(old.pin(), new.pin());
    let mut out = crate::secrets::stdout();
    writeln!(out, "old: {}  {}", old.path().display(), old.digest())?;
    writeln!(out, "new: {}  {}", new.path().display(), new.digest())?;
    if changes.is_empty() {
        writeln!(out, "(no changes)")?;
        return Ok(ExitCode::SUCCESS);
    }
    print_changes(&mut out, "changes", &changes)?;
    Ok(if changes.only_narrows() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `plugins accept NAME`: the lock's entry for a plugin or MCP server replaced by what is
/// there now, after showing what changed.
async fn accept(host: &HostArgs, name: &str) -> anyhow::Result<ExitCode> {
    let config = host.config()?;
    let path = &config.lock_file;
    let mut lock = Lock::read(path)?.with_context(|| {
        format!(
            "there is no {} to accept `{name}` into; `capstan plugins lock` writes one",
            path.display()
        )
    })?;
    let is_server = config.mcp.iter().any(|spec| spec.name == name);
    let servers = is_server.then(|| format!("{name}.tool"));
    let registry = host
        .registry_on(
            &config,
            host.unpinned_host(&config)?,
            servers.as_deref().map(Servers::OfTool),
        )
        .await?;
    let mut out = crate::secrets::stdout();
    let now = registry.lock();
    // A plugin and an MCP server may share a name: `accept NAME` takes both, each shown.
    let mut accepted = false;
    if is_server {
        let Some(pin) = now.mcp.get(name) else {
            let why = registry
                .source_down(name)
                .unwrap_or("it offers no tools")
                .to_owned();
            anyhow::bail!("MCP server `{name}` cannot be accepted: {why}; nothing was changed");
        };
        let changes = match lock.mcp.get(name) {
            Some(old) => Changes::of_server(old, pin),
            None => Changes::not_locked(),
        };
        print_changes(&mut out, &format!("MCP server {name}"), &changes)?;
        lock.mcp.insert(name.to_owned(), pin.clone());
        accepted = true;
    }
    if let Some(pin) = now.plugins.get(name) {
        let changes = match lock.plugins.get(name) {
            Some(old) => Changes::of_plugin(old, pin),
            None => Changes::not_locked(),
        };
        print_changes(&mut out, &format!("plugin {name}"), &changes)?;
        lock.plugins.insert(name.to_owned(), pin.clone());
        accepted = true;
    } else if let Some(refused) = registry.refused().iter().find(|err| {
        err.path()
            .file_stem()
            .is_some_and(|stem| stem.to_string_lossy() == name)
    }) {
        anyhow::bail!("plugin `{name}` cannot be accepted: {refused}; nothing was changed");
    } else if lock.plugins.remove(name).is_some() {
        writeln!(
            out,
            "plugin `{name}`: its file is gone; dropped from the lock"
        )?;
        accepted = true;
    }
    if !accepted {
        anyhow::bail!(
            "no plugin or MCP server is named `{name}` (plugins: {}; MCP servers: {})",
            names(now.plugins.keys()),
            names(config.mcp.iter().map(|spec| &spec.name)),
        );
    }
    lock.write(path)
        .with_context(|| format!("writing {}", path.display()))?;
    writeln!(out, "accepted `{name}` into {}", path.display())?;
    Ok(ExitCode::SUCCESS)
}

fn names<'a>(names: impl Iterator<Item = &'a String>) -> String {
    let names: Vec<&str> = names.map(String::as_str).collect();
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// The most a key file may hold: PKCS#8 Ed25519 is 83 bytes.
const MAX_KEY_BYTES: u64 = 4096;

/// `plugins keygen KEY`.
fn keygen(path: &Path) -> anyhow::Result<ExitCode> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let (pkcs8, key) = HostKey::generate()?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| {
            format!(
                "creating {} (an existing key is never replaced)",
                path.display()
            )
        })?;
    file.write_all(&pkcs8)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", path.display()))?;
    let mut out = crate::secrets::stdout();
    writeln!(out, "wrote {}; its public key:", path.display())?;
    writeln!(out, "{}", key.public_hex())?;
    writeln!(
        out,
        "\nTo trust it, add to capstan.toml:\n\n[plugins.signers.NAME]\npublic = \"{}\"\nplugins = [\"*\"]",
        key.public_hex()
    )?;
    Ok(ExitCode::SUCCESS)
}

/// `plugins sign FILE --key KEY`.
fn sign(file: &Path, key_path: &Path) -> anyhow::Result<ExitCode> {
    let pkcs8 = read_regular(key_path, MAX_KEY_BYTES)?;
    let key = HostKey::from_pkcs8(&pkcs8).with_context(|| {
        format!(
            "{}: not a key from `capstan plugins keygen`",
            key_path.display()
        )
    })?;
    let digest = ComponentDigest::of(&read_regular(file, MAX_COMPONENT_BYTES)?);
    let signature = signature_path(file);
    // Renamed into place: a symlink planted at the name is replaced, never followed.
    write_whole(&signature, &SignatureFile::sign(&key, digest).to_json())
        .with_context(|| format!("writing {}", signature.display()))?;
    writeln!(
        crate::secrets::stdout(),
        "signed {} ({digest}) with key {}: {}",
        file.display(),
        key.public_hex(),
        signature.display()
    )?;
    Ok(ExitCode::SUCCESS)
}

/// `plugins verify FILE`: the config's signers, and `--trust` keys for any plugin.
fn verify(host: &HostArgs, file: &Path, trust: &[String]) -> anyhow::Result<ExitCode> {
    let config = host.config()?;
    let mut keys = config.signers.keys().to_vec();
    for public in trust {
        keys.push(
            Signer::new("--trust", public, ["*"])
                .map_err(|why| anyhow::anyhow!("--trust: {why}"))?,
        );
    }
    if keys.is_empty() {
        anyhow::bail!(
            "no key is trusted: add a [plugins.signers.NAME] to the config, or pass --trust \
             PUBLIC_KEY"
        );
    }
    let digest = ComponentDigest::of(&read_regular(file, MAX_COMPONENT_BYTES)?);
    let name = file
        .file_stem()
        .map(|stem| stem.to_string_lossy().into_owned())
        .unwrap_or_default();
    match Signers::required(keys).check_file(file, &name, digest, |_| false) {
        Ok(verified) => {
            writeln!(
                crate::secrets::stdout(),
                "{}: signed by `{}` ({digest})",
                file.display(),
                verified.signer
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => {
            crate::say!("{}: {err}", file.display());
            Ok(ExitCode::FAILURE)
        }
    }
}

/// The most of a component `sign` and `verify` read: what the host loads, and room.
const MAX_COMPONENT_BYTES: u64 = 64 << 20;

/// A file's bytes, at most `max`; anything but a regular file (a FIFO would block) is
/// refused.
fn read_regular(file: &Path, max: u64) -> anyhow::Result<Vec<u8>> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(file)
        .with_context(|| format!("reading {}", file.display()))?;
    if !opened.metadata()?.is_file() {
        anyhow::bail!("{} is not a regular file", file.display());
    }
    let mut bytes = Vec::new();
    opened
        .take(max + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {}", file.display()))?;
    if bytes.len() as u64 > max {
        anyhow::bail!("{} is over {max} bytes", file.display());
    }
    Ok(bytes)
}
