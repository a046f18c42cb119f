//! Loading a component: its file read and checked, compiled (or taken from the cache),
//! linked, and its tools described (or taken from the cache, sealed).

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use super::PluginHost;
use crate::flow::Label;
use crate::ids::Caller;
use crate::net::Egress;
use crate::plugin::bindings::PluginPre;
use crate::plugin::bindings::exports::capstan::plugin::tool::ToolSpec;
use crate::plugin::cache::{CacheKey, CacheOutcome, Kind, stamp_of};
use crate::plugin::contract::WIT_VERSION;
use crate::plugin::error::LoadError;
use crate::plugin::failure;
use crate::plugin::inspect::{check_exports, check_header, check_imports, outline};
use crate::plugin::loaded::{LoadedPlugin, RawToolSpec, ToolInfo};
use crate::plugin::offline::{imports_http, link_http_as_traps};
use crate::plugin::progress::LoadProgress;
use crate::plugin::sandbox::{CallScope, Sandbox};
use crate::plugin::trust::ComponentDigest;
use wasmtime::component::Component;

impl PluginHost {
    /// Loads and checks one component file: it must be a component exporting
    /// `capstan:plugin/tool` at a supported version, import only what plugins may import,
    /// link, and describe valid tools.
    pub async fn load(&self, path: &Path) -> Result<LoadedPlugin, LoadError> {
        let prepared = self.prepare(path)?;
        self.finish(prepared).await
    }

    /// The blocking half of [`PluginHost::load`]: reads and checks the file, compiles it
    /// (or takes its artifact from the cache), links it, and finds its cached tool list.
    /// Nothing of the plugin runs.
    pub(crate) fn prepare(&self, path: &Path) -> Result<Prepared, LoadError> {
        self.prepare_file(path, true)
    }

    /// [`PluginHost::prepare`], taking what the cache recorded of the file as it was last
    /// read if `use_record` and the file has not changed since.
    fn prepare_file(&self, path: &Path, use_record: bool) -> Result<Prepared, LoadError> {
        let file = open_plugin_file(path)?;
        let started = Instant::now();
        let began = std::time::SystemTime::now();
        let stamp = stamp_of(&file).map_err(|source| read_error(path, source))?;
        // A file unchanged since it was last read is not read again: its digest and
        // outline were kept (sealed) in the cache, and its bytes are needed only to
        // compile it.
        let known = use_record
            .then(|| self.cache.known_source(&self.engine, &stamp))
            .flatten();
        let (digest, outline, read) = match known {
            Some(known) => {
                tracing::debug!(
                    plugin = %path.display(),
                    "unchanged since it was read: its digest and outline taken from the cache"
                );
                (known.digest, known.outline, None)
            }
            None => {
                let bytes = read_plugin_bytes(path, &file)?;
                check_header(path, &bytes)?;
                let outline = outline(path, &bytes)?;
                let digest = ComponentDigest::of(&bytes);
                let after = stamp_of(&file).map_err(|source| read_error(path, source))?;
                self.cache
                    .remember_source(&self.engine, began, (stamp, after), digest, &outline);
                (digest, outline, Some(bytes))
            }
        };
        // What it imports and exports is checked before anything is compiled.
        check_imports(path, &outline)?;
        let wit_version = check_exports(path, &outline)?;
        let key = self.cache.key(&self.engine, &digest);
        // Before anything of it is compiled: an unsigned component never reaches Cranelift.
        let signer = self.check_signature(path, digest, &key)?;
        let compile_started = std::cell::Cell::new(None);
        // Why the bytes a compile needed were not read, if they were not.
        let unread = std::cell::Cell::new(None);
        let compile = || {
            let bytes = match &read {
                Some(bytes) => std::borrow::Cow::Borrowed(bytes.as_slice()),
                None => match read_plugin_bytes(path, &file) {
                    Ok(bytes) if ComponentDigest::of(&bytes) == digest => {
                        std::borrow::Cow::Owned(bytes)
                    }
                    Ok(_) => {
                        unread.set(Some(Unread::NotAsRecorded));
                        wasmtime::bail!("not the bytes recorded");
                    }
                    Err(err) => {
                        unread.set(Some(Unread::Failed(err)));
                        wasmtime::bail!("unreadable");
                    }
                },
            };
            compile_started.set(Some((Instant::now(), bytes.len())));
            if let Some(progress) = &self.progress {
                progress(LoadProgress::Compiling {
                    path,
                    bytes: bytes.len(),
                });
            }
            Component::new(&self.engine, &*bytes)
        };
        let loaded = self.cache.load_keyed(&self.engine, &key, &compile);
        match unread.take() {
            None => {}
            Some(Unread::Failed(err)) => return Err(err),
            // Changed without its stamp moving (written through a mapping, or on a file
            // system whose server keeps the times): forgotten, and read in full.
            Some(Unread::NotAsRecorded) => {
                if stamp_of(&file).is_ok_and(|now| now == stamp) {
                    tracing::warn!(
                        plugin = %path.display(),
                        "the file changed without its change time moving; reading it in full"
                    );
                } else {
                    tracing::debug!(plugin = %path.display(), "changed while it was loaded");
                }
                self.cache.forget_source(&self.engine, &stamp);
                return self.prepare_file(path, false);
            }
        }
        if let (Some(progress), Some((since, bytes)), true) =
            (&self.progress, compile_started.get(), loaded.is_ok())
        {
            progress(LoadProgress::Compiled {
                path,
                bytes,
                took: since.elapsed(),
            });
        }
        let (component, cache) = loaded.map_err(|err| {
            match failure::pool_limit(&err, &self.limits).or_else(|| failure::async_abi(&err)) {
                Some(reason) => LoadError::OverLimit {
                    path: path.to_owned(),
                    reason,
                },
                None => LoadError::Invalid {
                    path: path.to_owned(),
                    reason: format!("{err:#}"),
                },
            }
        })?;
        let link_error = |err: wasmtime::Error| LoadError::Link {
            path: path.to_owned(),
            reason: format!("{err:#}"),
        };
        // A component importing wasi:http links twice: with traps in its place for calls
        // without a network grant, and with it for calls that hold one.
        let (pre, online_pre) = if imports_http(&outline.imports) {
            let mut offline = self.linker.clone();
            link_http_as_traps(&mut offline, &self.engine, &component).map_err(link_error)?;
            let online = self
                .online_linker
                .instantiate_pre(&component)
                .map_err(link_error)?;
            (offline, Some(PluginPre::new(online).map_err(link_error)?))
        } else {
            (self.linker.clone(), None)
        };
        let pre = pre.instantiate_pre(&component).map_err(link_error)?;
        let pre = PluginPre::new(pre).map_err(link_error)?;
        // What describe() said of these very bytes on this engine, if the cache kept it
        // sealed: the plugin need not be instantiated to start.
        let cached_tools = self
            .cache
            .entry::<CachedTools>(&key, Kind::Tools)
            .filter(|cached| cached.described_by == self.describing_host())
            .map(|cached| cached.tools);
        Ok(Prepared {
            path: path.to_owned(),
            digest,
            signer,
            wit_version,
            imports: outline.imports,
            cache,
            key,
            cached_tools,
            pre,
            online_pre,
            started,
        })
    }

    /// The rest of [`PluginHost::load`]: the tool list, from the cache or from a
    /// `describe()` call (then kept), checked either way; a list that fails the checks is
    /// never kept.
    pub(crate) async fn finish(&self, prepared: Prepared) -> Result<LoadedPlugin, LoadError> {
        let Prepared {
            path,
            digest,
            signer,
            wit_version,
            imports,
            cache,
            key,
            cached_tools,
            pre,
            online_pre,
            started,
        } = prepared;
        let name: Arc<str> = plugin_name(&path).into();
        let tools_cached = cached_tools.is_some();
        let tools = match cached_tools {
            Some(cached) => {
                ToolInfo::from_specs(&path, cached.into_iter().map(ToolSpec::from).collect())?
            }
            None => {
                let specs = self
                    .describe(&pre, &name, &wit_version)
                    .await
                    .map_err(|reason| LoadError::Describe {
                        path: path.clone(),
                        reason,
                    })?;
                let raw = specs.iter().cloned().map(RawToolSpec::from).collect();
                let tools = ToolInfo::from_specs(&path, specs)?;
                let kept = CachedTools {
                    described_by: self.describing_host(),
                    tools: raw,
                };
                self.cache.store_entry(&key, Kind::Tools, &kept);
                tools
            }
        };
        tracing::debug!(
            plugin = %path.display(),
            ?cache,
            tools_cached,
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            "plugin loaded"
        );
        Ok(LoadedPlugin {
            serial: NEXT_PLUGIN_SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            path,
            name,
            wit_version,
            imports,
            tools,
            cache,
            digest,
            signer,
            pin: OnceLock::new(),
            tools_cached,
            pre,
            online_pre,
        })
    }

    /// The signer that lets the component at `path` in, where the config requires a
    /// signature: verified once, then known from the cache (sealed beside the artifact, for
    /// these bytes, this signature file and these trusted keys), so a warm start pays no
    /// Ed25519 check.
    fn check_signature(
        &self,
        path: &Path,
        digest: ComponentDigest,
        key: &CacheKey,
    ) -> Result<Option<String>, LoadError> {
        let signers = &self.trust.signers;
        if !signers.are_required() {
            return Ok(None);
        }
        let keys = signers.fingerprint();
        let known = self.cache.entry::<VerifiedSignature>(key, Kind::Signature);
        let cached = |file: &[u8; 32]| {
            known
                .as_ref()
                .is_some_and(|seen| seen.file == *file && seen.keys == keys)
        };
        let verified = signers
            .check_file(path, &plugin_name(path), digest, cached)
            .map_err(|reason| LoadError::Signature {
                path: path.to_owned(),
                reason,
            })?;
        let seen = VerifiedSignature {
            file: verified.file_digest,
            keys,
        };
        if known.as_ref() != Some(&seen) {
            self.cache.store_entry(key, Kind::Signature, &seen);
        }
        Ok(Some(verified.signer))
    }

    /// What a cached tool list must have been made under to stand for a `describe()` here:
    /// this host's version and contract, and the memory limit a describe() instantiates
    /// under (a plugin that would not fit now is loaded only by running it again).
    fn describing_host(&self) -> String {
        format!(
            "capstan {} capstan:plugin@{WIT_VERSION} memory {}",
            env!("CARGO_PKG_VERSION"),
            self.limits.memory_bytes
        )
    }

    /// Runs `describe()` in a sandbox without capabilities.
    async fn describe(
        &self,
        pre: &PluginPre<Sandbox>,
        plugin: &Arc<str>,
        contract: &str,
    ) -> Result<Vec<crate::plugin::bindings::exports::capstan::plugin::tool::ToolSpec>, String>
    {
        let scope = CallScope {
            plugin: plugin.clone(),
            contract: contract.to_owned(),
            tool: "describe".into(),
            caller: Caller::client("host", None),
            capabilities: Vec::new(),
            services: None,
            network: self.network.clone(),
            log_lines: 0,
            label: Label::trusted(),
            reads: None,
            mail: None,
        };
        let sandbox = Sandbox::new(&self.limits, scope, None, Egress::default())
            .map_err(|e| e.to_string())?;
        self.run(pre, sandbox, async |instance, store| {
            instance.capstan_plugin_tool().call_describe(store).await
        })
        .await
        .outcome
        .map_err(|err| err.message().to_owned())
    }
}

/// Opens a plugin file without ever blocking in `open()`: the file is opened non-blocking
/// (a FIFO would otherwise wait for a writer) and refused unless it is a regular file (a
/// device such as `/dev/zero` would never end).
fn open_plugin_file(path: &Path) -> Result<std::fs::File, LoadError> {
    let read_error = |source| read_error(path, source);
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NONBLOCK);
    let file = options.open(path).map_err(read_error)?;
    let file_type = file.metadata().map_err(read_error)?.file_type();
    if !file_type.is_file() {
        return Err(LoadError::NotAFile {
            path: path.to_owned(),
            kind: describe_file_type(file_type),
        });
    }
    Ok(file)
}

/// All of the plugin file opened by [`open_plugin_file`] from its start, up to the size a
/// plugin may be.
fn read_plugin_bytes(path: &Path, mut file: &std::fs::File) -> Result<Vec<u8>, LoadError> {
    use std::io::{Read, Seek};
    file.rewind().map_err(|source| read_error(path, source))?;
    // Read one byte past the cap, so a file that grows while it is read is caught too.
    let mut bytes = Vec::new();
    file.take(MAX_PLUGIN_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| read_error(path, source))?;
    if bytes.len() as u64 > MAX_PLUGIN_BYTES {
        return Err(LoadError::OverLimit {
            path: path.to_owned(),
            reason: format!(
                "the file is larger than {} MiB, the most a plugin may be",
                MAX_PLUGIN_BYTES >> 20
            ),
        });
    }
    Ok(bytes)
}

/// Why the bytes of a plugin file known by its stamp were not compiled.
enum Unread {
    /// Reading them failed.
    Failed(LoadError),
    /// They are not the bytes recorded for its stamp.
    NotAsRecorded,
}

/// The error of a failed read of the plugin file at `path`.
fn read_error(path: &Path, source: std::io::Error) -> LoadError {
    LoadError::Read {
        path: path.to_owned(),
        source,
    }
}

/// A plugin compiled, checked and linked, not yet described: [`PluginHost::prepare`].
pub(crate) struct Prepared {
    path: PathBuf,
    digest: ComponentDigest,
    signer: Option<String>,
    wit_version: String,
    imports: Vec<String>,
    cache: CacheOutcome,
    key: CacheKey,
    cached_tools: Option<Vec<RawToolSpec>>,
    pre: PluginPre<Sandbox>,
    online_pre: Option<PluginPre<Sandbox>>,
    started: Instant,
}

/// A signature this host verified, as the artifact cache keeps it: the SHA-256 of the
/// signature file, and of the keys it was trusted under.
#[derive(PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct VerifiedSignature {
    file: [u8; 32],
    keys: [u8; 32],
}

/// A tool list as the artifact cache keeps it, with the host it was described under.
#[derive(serde::Serialize, serde::Deserialize)]
struct CachedTools {
    described_by: String,
    tools: Vec<RawToolSpec>,
}
/// Each loaded plugin's identity, for the instances processes keep of it.
static NEXT_PLUGIN_SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The largest plugin file read: components are a few MiB; a bigger file is refused
/// before it fills memory or ties up the compiler.
const MAX_PLUGIN_BYTES: u64 = 64 << 20;

/// What a file that is not a regular file is, for the refusal.
fn describe_file_type(file_type: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if file_type.is_char_device() {
            return "a character device";
        }
        if file_type.is_block_device() {
            return "a block device";
        }
        if file_type.is_socket() {
            return "a socket";
        }
    }
    if file_type.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

/// A plugin's name: its file name without `.wasm`.
fn plugin_name(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| PathBuf::from(path).display().to_string())
}
