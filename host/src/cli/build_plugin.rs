//! `capstan plugins build [DIR]`: builds a project `capstan plugins new` wrote, in its
//! language, showing each step, and puts the component at `DIR/NAME.wasm`.
//!
//! Rust takes whichever `wasm32-wasip2` route works offline: rustup's target if installed,
//! else Debian's Rust with its std sources and wasi-libc, building std for the target (the
//! route `scripts/setup` takes on a machine without rustup's target).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{Context as _, bail};
use clap::Args;

use super::new_plugin::{File, JS_HELPER, Lang, PYTHON_HELPER, WIT, lang_name, rust_sdk};
use crate::plugin::trust::write_whole;

/// The target every plugin is built for.
const TARGET: &str = "wasm32-wasip2";

/// Debian's packages behind the offline Rust route.
const DEBIAN_PACKAGES: &str = "rustc-web cargo-web rust-web-src wasi-libc";

#[derive(Debug, Args)]
pub(crate) struct BuildCommand {
    /// The project [default: the current directory].
    dir: Option<PathBuf>,
    /// First bring the project to this capstan's contract: write its wit/ and SDK helper
    /// anew (Python, JavaScript), or point its capstan-sdk dependency at this capstan's
    /// sdk/ (Rust). Its own code is left as it is.
    #[arg(long)]
    update_wit: bool,
    /// The capstan-sdk crate for `--update-wit` on a Rust project [default: the sdk/ this
    /// capstan was built from].
    #[arg(long, value_name = "DIR")]
    sdk: Option<PathBuf>,
}

/// A plugin project: its language, its name (the component's file stem) and its folder.
#[derive(Debug)]
struct Project {
    lang: Lang,
    name: String,
    dir: PathBuf,
}

impl BuildCommand {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        let dir = self.dir.clone().unwrap_or_else(|| PathBuf::from("."));
        let project = Project::find(&dir)?;
        let started = Instant::now();
        if self.update_wit {
            update_wit(&project, self.sdk.as_deref())?;
        }
        step(&format!(
            "building the {} plugin `{}` in {}",
            lang_name(project.lang),
            project.name,
            dir.display()
        ));
        let built = match project.lang {
            Lang::Rust => build_rust(&project)?,
            Lang::Python => build_script(&project, "bash", &["build.sh"])?,
            Lang::Js => build_js(&project)?,
        };
        let size = std::fs::metadata(&built)
            .with_context(|| format!("the build wrote no {}", built.display()))?
            .len();
        crate::say!(
            "built {} ({:.1} MB) in {:.0} s; next: capstan plugins inspect {}",
            built.display(),
            size as f64 / 1e6,
            started.elapsed().as_secs_f64(),
            built.display()
        );
        Ok(ExitCode::SUCCESS)
    }
}

impl Project {
    /// The project in `dir`, by the files `plugins new` writes for each language.
    fn find(dir: &Path) -> anyhow::Result<Project> {
        let has = |file: &str| dir.join(file).is_file();
        let (lang, name) = if has("Cargo.toml") {
            (Lang::Rust, cargo_name(dir)?)
        } else if has("app.py") && has("build.sh") {
            (Lang::Python, python_name(dir)?)
        } else if has("plugin.js") && has("package.json") {
            (Lang::Js, package_name(dir)?)
        } else {
            bail!(
                "{} holds no plugin project: expected Cargo.toml (Rust), app.py and build.sh \
                 (Python), or plugin.js and package.json (JavaScript); make one with \
                 `capstan plugins new --lang rust|python|js NAME`",
                dir.display()
            );
        };
        Ok(Project {
            lang,
            name,
            dir: dir.to_owned(),
        })
    }

    /// Where the component ends up.
    fn component(&self) -> PathBuf {
        self.dir.join(format!("{}.wasm", self.name))
    }
}

fn step(what: &str) {
    crate::say!("==> {what}");
}

fn read(dir: &Path, file: &str) -> anyhow::Result<String> {
    let path = dir.join(file);
    std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
}

/// `[package] name` of a Cargo.toml; the crate's `[lib] name`, when set, names the file.
fn cargo_name(dir: &Path) -> anyhow::Result<String> {
    let text = read(dir, "Cargo.toml")?;
    let manifest: toml::Table = toml::from_str(&text)
        .with_context(|| format!("{}: not valid TOML", dir.join("Cargo.toml").display()))?;
    let lib = manifest
        .get("lib")
        .and_then(|lib| lib.get("name"))
        .and_then(|n| n.as_str());
    let package = manifest
        .get("package")
        .and_then(|p| p.get("name"))
        .and_then(|n| n.as_str());
    match lib.or(package) {
        Some(name) => Ok(name.replace('-', "_")),
        None => bail!("{}: no [package] name", dir.join("Cargo.toml").display()),
    }
}

/// The component `build.sh` writes: its `-o NAME.wasm`.
fn python_name(dir: &Path) -> anyhow::Result<String> {
    let text = read(dir, "build.sh")?;
    let name = text
        .lines()
        .filter(|line| line.contains("componentize-py") && line.contains(" componentize "))
        .find_map(|line| {
            let mut words = line.split_whitespace().skip_while(|word| *word != "-o");
            words.nth(1)?.strip_suffix(".wasm")
        });
    match name {
        Some(name) => Ok(name.to_owned()),
        None => bail!(
            "{}: no `-o NAME.wasm` in its componentize-py line; restore it from `capstan \
             plugins new --lang python`",
            dir.join("build.sh").display()
        ),
    }
}

/// package.json's `name`.
fn package_name(dir: &Path) -> anyhow::Result<String> {
    let text = read(dir, "package.json")?;
    let package: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: not valid JSON", dir.join("package.json").display()))?;
    match package.get("name").and_then(|n| n.as_str()) {
        Some(name) => Ok(name.to_owned()),
        None => bail!("{}: no `name`", dir.join("package.json").display()),
    }
}

/// Runs `program args` in the project with the terminal's output, so its own progress
/// shows; fails naming the command.
fn run_in(project: &Project, command: &mut Command, shown: &str) -> anyhow::Result<()> {
    let status = command
        .current_dir(&project.dir)
        .status()
        .with_context(|| format!("starting `{shown}` (is it installed?)"))?;
    if !status.success() {
        bail!(
            "`{shown}` failed ({status}) in {}; its output is above",
            project.dir.display()
        );
    }
    Ok(())
}

fn build_script(project: &Project, program: &str, args: &[&str]) -> anyhow::Result<PathBuf> {
    let shown = format!("{program} {}", args.join(" "));
    run_in(project, Command::new(program).args(args), &shown)?;
    Ok(project.component())
}

fn build_js(project: &Project) -> anyhow::Result<PathBuf> {
    if !project.dir.join("node_modules").is_dir() {
        step("installing ComponentizeJS from npm into node_modules (once; npm ci)");
        run_in(
            project,
            Command::new("npm").args(["ci", "--no-audit", "--no-fund"]),
            "npm ci",
        )?;
    }
    step("componentize-js: plugin.js -> a component (StarlingMonkey; about 30 s)");
    run_in(
        project,
        Command::new("npm").args(["run", "--silent", "build"]),
        "npm run build",
    )?;
    Ok(project.component())
}

/// How cargo builds for `wasm32-wasip2` on this machine.
enum RustRoute {
    /// rustup's target.
    Rustup,
    /// Debian's Rust with `-Zbuild-std`, linking with the rustup toolchain's
    /// `wasm-component-ld` (in `bin`).
    DebianBuildStd { bin: PathBuf },
}

impl RustRoute {
    /// The route for the project in `dir` (whose rust-toolchain file, if any, picks the
    /// toolchain rustup answers for).
    fn find(dir: &Path) -> anyhow::Result<RustRoute> {
        let installed = Command::new("rustup")
            .args(["target", "list", "--installed"])
            .current_dir(dir)
            .output()
            .map(|out| {
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .any(|l| l == TARGET)
            })
            .unwrap_or(false);
        if installed {
            return Ok(RustRoute::Rustup);
        }
        let debian = Path::new("/usr/bin/cargo").is_file()
            && Path::new("/usr/lib/rustlib/src/rust/library").is_dir()
            && Path::new("/usr/lib/wasm32-wasi").is_dir();
        if debian {
            let text = |args: &[&str]| -> Option<String> {
                let out = Command::new("rustc").args(args).output().ok()?;
                Some(String::from_utf8_lossy(&out.stdout).into_owned())
            };
            let host = text(&["-vV"]).and_then(|v| {
                v.lines()
                    .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
            });
            let sysroot = text(&["--print", "sysroot"]).map(|s| PathBuf::from(s.trim()));
            if let (Some(host), Some(sysroot)) = (host, sysroot) {
                let bin = sysroot.join("lib/rustlib").join(host).join("bin");
                if bin.join("wasm-component-ld").is_file() {
                    return Ok(RustRoute::DebianBuildStd { bin });
                }
            }
        }
        bail!(
            "no {TARGET} toolchain found. Install one of:\n  - rustup's target: rustup \
             target add {TARGET}\n  - offline, on Debian 12, as root: apt-get install -t \
             bookworm-security {DEBIAN_PACKAGES} (with a rustup toolchain, 1.82 or newer, for \
             its wasm-component-ld)\nthen run this again"
        )
    }

    /// `cargo build` for the target, by this route.
    fn command(&self) -> Command {
        let mut cargo = self.cargo();
        cargo.args(["build", "--release", "--target", TARGET]);
        if let RustRoute::DebianBuildStd { .. } = self {
            cargo.arg("-Zbuild-std=std,panic_abort");
        }
        cargo
    }

    /// Where cargo puts what it builds in `dir`: `target_directory` of `cargo metadata`,
    /// which follows CARGO_TARGET_DIR and `build.target-dir` in any `.cargo/config.toml`.
    fn target_dir(&self, dir: &Path) -> anyhow::Result<PathBuf> {
        let out = self
            .cargo()
            .args(["metadata", "--no-deps", "--format-version", "1"])
            .current_dir(dir)
            .stderr(std::process::Stdio::inherit())
            .output()
            .context("running `cargo metadata`")?;
        anyhow::ensure!(
            out.status.success(),
            "`cargo metadata` failed ({}) in {}",
            out.status,
            dir.display()
        );
        let metadata: serde_json::Value =
            serde_json::from_slice(&out.stdout).context("reading what `cargo metadata` printed")?;
        match metadata.get("target_directory").and_then(|d| d.as_str()) {
            Some(target) => Ok(PathBuf::from(target)),
            None => bail!("`cargo metadata` named no target_directory"),
        }
    }

    /// cargo with this route's environment.
    fn cargo(&self) -> Command {
        match self {
            RustRoute::Rustup => Command::new("cargo"),
            RustRoute::DebianBuildStd { bin } => {
                let path = std::env::var_os("PATH").unwrap_or_default();
                let mut dirs = vec![PathBuf::from("/usr/bin"), bin.join("gcc-ld")];
                dirs.extend(std::env::split_paths(&path));
                let mut cargo = Command::new("/usr/bin/cargo");
                cargo
                    .env("PATH", std::env::join_paths(dirs).unwrap_or(path))
                    .env("RUSTC_BOOTSTRAP", "1")
                    .env("RUSTC", "/usr/bin/rustc")
                    .env(
                        "RUSTFLAGS",
                        format!(
                            "-C linker={} -C link-self-contained=no -L /usr/lib/wasm32-wasi",
                            bin.join("wasm-component-ld").display()
                        ),
                    );
                cargo
            }
        }
    }
}

fn build_rust(project: &Project) -> anyhow::Result<PathBuf> {
    let route = RustRoute::find(&project.dir)?;
    match &route {
        RustRoute::Rustup => step(&format!(
            "cargo build --release --target {TARGET} (rustup's target)"
        )),
        RustRoute::DebianBuildStd { .. } => step(&format!(
            "cargo build for {TARGET} with Debian's Rust and -Zbuild-std (rustup's target \
             is not installed); the first build of a project compiles std for the target and \
             the SDK's dependencies, 1 to 5 minutes on 2 cores"
        )),
    }
    run_in(project, &mut route.command(), "cargo build")?;
    let built = route
        .target_dir(&project.dir)?
        .join(TARGET)
        .join("release")
        .join(format!("{}.wasm", project.name));
    let component = project.component();
    std::fs::copy(&built, &component)
        .with_context(|| format!("copying {} to {}", built.display(), component.display()))?;
    Ok(component)
}

/// Writes the project's wit/ and helper anew (Python, JavaScript) or points its capstan-sdk
/// at this capstan's (Rust).
fn update_wit(project: &Project, sdk: Option<&Path>) -> anyhow::Result<()> {
    let files: Vec<File> = match project.lang {
        Lang::Rust => return update_rust_sdk(project, sdk),
        Lang::Python => [WIT, PYTHON_HELPER].concat(),
        Lang::Js => [WIT, JS_HELPER].concat(),
    };
    step(&format!(
        "writing wit/ (capstan:plugin@{}) and the SDK helper of this capstan",
        crate::plugin::contract::WIT_VERSION
    ));
    for (path, text) in files {
        refuse_links(&project.dir, path)?;
        let target = project.dir.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        write_whole(&target, text.as_bytes())
            .with_context(|| format!("writing {}", target.display()))?;
    }
    Ok(())
}

/// Refuses to write `relative` under `dir` through a symbolic link: it could lead the write
/// anywhere (into another project, or a checkout of the SDK itself).
fn refuse_links(dir: &Path, relative: &str) -> anyhow::Result<()> {
    let mut at = dir.to_owned();
    for part in Path::new(relative).components() {
        at.push(part);
        match std::fs::symlink_metadata(&at) {
            Ok(meta) if meta.file_type().is_symlink() => bail!(
                "{} is a symbolic link; --update-wit writes only files of the project itself: \
                 replace the link with a directory or file, or update it by hand",
                at.display()
            ),
            _ => {}
        }
    }
    Ok(())
}

fn update_rust_sdk(project: &Project, sdk: Option<&Path>) -> anyhow::Result<()> {
    let sdk = rust_sdk(sdk)?;
    refuse_links(&project.dir, "Cargo.toml")?;
    let manifest = project.dir.join("Cargo.toml");
    let text = read(&project.dir, "Cargo.toml")?;
    let path = toml::Value::String(sdk.display().to_string()).to_string();
    // Only the path's string changes, in the `capstan-sdk = { path = "..", .. }` line of
    // [dependencies]: every other key, line and comment stays as it is.
    let mut section = String::new();
    let mut changed = 0;
    let mut lines: Vec<String> = Vec::new();
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if trimmed.starts_with('[') {
            section = trimmed.trim_end().to_owned();
        }
        let key = trimmed.split(['=', ' ', '\t']).next().unwrap_or("");
        let updated = (section == "[dependencies]" && key == "capstan-sdk")
            .then(|| replace_path(line, &path))
            .flatten();
        if let Some(updated) = updated {
            lines.push(updated);
            changed += 1;
            continue;
        }
        lines.push(line.to_owned());
    }
    let updated = lines.concat();
    let parsed: Result<toml::Table, _> = toml::from_str(&updated);
    let points = parsed.ok().is_some_and(|table| {
        table
            .get("dependencies")
            .and_then(|d| d.get("capstan-sdk"))
            .and_then(|d| d.get("path"))
            .and_then(|p| p.as_str())
            == Some(&sdk.display().to_string())
    });
    if changed != 1 || !points {
        bail!(
            "{}: found no `capstan-sdk = {{ path = \"...\" }}` line under [dependencies] to \
             update; set its path to {} by hand",
            manifest.display(),
            sdk.display()
        );
    }
    step(&format!("pointing capstan-sdk at {}", sdk.display()));
    write_whole(&manifest, updated.as_bytes())
        .with_context(|| format!("writing {}", manifest.display()))
}

/// `line` with the string after `path =` replaced by `path`, or `None` without one.
fn replace_path(line: &str, path: &str) -> Option<String> {
    let key = line.find("path")?;
    let rest = &line[key + "path".len()..];
    let eq = rest.find('=')?;
    if !rest[..eq].trim().is_empty() {
        return None;
    }
    let after_eq = &rest[eq + 1..];
    let open = after_eq.find('"')?;
    if !after_eq[..open].trim().is_empty() {
        return None;
    }
    let value = &after_eq[open + 1..];
    let mut escaped = false;
    let close = value.char_indices().find_map(|(i, c)| match c {
        '\\' if !escaped => {
            escaped = true;
            None
        }
        '"' if !escaped => Some(i),
        _ => {
            escaped = false;
            None
        }
    })?;
    let start = key + "path".len() + eq + 1 + open;
    let end = start + 1 + close + 1;
    Some(format!("{}{path}{}", &line[..start], &line[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_sdk_path_string_changes() {
        let path = "\"/new/sdk\"";
        assert_eq!(
            replace_path(
                "capstan-sdk = { path = \"/old/sdk\", features = [\"x\"] } # ours\n",
                path
            )
            .as_deref(),
            Some("capstan-sdk = { path = \"/new/sdk\", features = [\"x\"] } # ours\n")
        );
        assert_eq!(
            replace_path("capstan-sdk={path=\"a\\\"b\"}\n", path).as_deref(),
            Some("capstan-sdk={path=\"/new/sdk\"}\n")
        );
        assert_eq!(replace_path("capstan-sdk = \"0.1\"\n", path), None);
        assert_eq!(
            replace_path("capstan-sdk = { pathology = 1 }\n", path),
            None
        );
    }

    #[test]
    fn the_python_component_is_named_by_the_componentize_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("build.sh"),
            "set -o pipefail\n.venv/bin/componentize-py -d wit -w plugin-wasi componentize app -o notes.wasm\n",
        )
        .unwrap();
        assert_eq!(python_name(dir.path()).unwrap(), "notes");
    }
}
