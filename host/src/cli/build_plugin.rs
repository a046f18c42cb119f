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
        .split_whitespace()
        .skip_while(|word| *word != "-o")
        .nth(1)
        .and_then(|file| file.strip_suffix(".wasm"));
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
    fn find() -> anyhow::Result<RustRoute> {
        let installed = Command::new("rustup")
            .args(["target", "list", "--installed"])
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

    fn command(&self) -> Command {
        match self {
            RustRoute::Rustup => {
                let mut cargo = Command::new("cargo");
                cargo.args(["build", "--release", "--target", TARGET]);
                cargo
            }
            RustRoute::DebianBuildStd { bin } => {
                let path = std::env::var_os("PATH").unwrap_or_default();
                let mut dirs = vec![PathBuf::from("/usr/bin"), bin.join("gcc-ld")];
                dirs.extend(std::env::split_paths(&path));
                let mut cargo = Command::new("/usr/bin/cargo");
                cargo
                    .args(["build", "--release", "-Zbuild-std=std,panic_abort"])
                    .args(["--target", TARGET])
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
    let route = RustRoute::find()?;
    match &route {
        RustRoute::Rustup => step(&format!(
            "cargo build --release --target {TARGET} (rustup's target)"
        )),
        RustRoute::DebianBuildStd { .. } => step(&format!(
            "cargo build for {TARGET} with Debian's Rust and -Zbuild-std (offline); the \
             first build compiles std for the target, about a minute on 2 cores"
        )),
    }
    run_in(project, &mut route.command(), "cargo build")?;
    // Cargo's own CARGO_TARGET_DIR, when set, is where it built (a relative one from the
    // project).
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|dir| !dir.is_empty())
        .map_or_else(|| project.dir.join("target"), |dir| project.dir.join(dir));
    let built = target_dir
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

fn update_rust_sdk(project: &Project, sdk: Option<&Path>) -> anyhow::Result<()> {
    let sdk = rust_sdk(sdk)?;
    let manifest = project.dir.join("Cargo.toml");
    let text = read(&project.dir, "Cargo.toml")?;
    let line = format!(
        "capstan-sdk = {{ path = {} }}",
        toml::Value::String(sdk.display().to_string())
    );
    let mut found = false;
    let updated: Vec<String> = text
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("capstan-sdk") && l.contains('=') {
                found = true;
                line.clone()
            } else {
                l.to_owned()
            }
        })
        .collect();
    if !found {
        bail!(
            "{}: no `capstan-sdk = ...` dependency line to update; add `{line}` under \
             [dependencies]",
            manifest.display()
        );
    }
    step(&format!("pointing capstan-sdk at {}", sdk.display()));
    write_whole(&manifest, (updated.join("\n") + "\n").as_bytes())
        .with_context(|| format!("writing {}", manifest.display()))
}
