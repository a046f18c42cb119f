//! `capstan plugins new --lang rust|python|js NAME`: a working plugin project, from the
//! templates in `sdk/templates/`, with the SDK helper and the WIT it builds against.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};

use crate::tools::HostTool;

/// The longest plugin name: it is also the name of its first tool.
const MAX_NAME: usize = 48;

/// The language a new plugin is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Lang {
    /// Rust, with capstan-sdk; cargo and the wasm32-wasip2 target.
    Rust,
    /// Python, with the capstan_sdk package; componentize-py from PyPI.
    Python,
    /// JavaScript, with capstan.js; ComponentizeJS from npm.
    Js,
}

#[derive(Debug, Args)]
pub(crate) struct NewCommand {
    /// The plugin's name, also the name of its first tool: a lowercase letter, then
    /// lowercase letters, digits and `_`.
    name: String,
    /// The language.
    #[arg(long, value_enum)]
    lang: Lang,
    /// Where to write it [default: ./NAME]; must not exist yet, or be empty.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// The capstan-sdk crate a Rust plugin depends on [default: the sdk/ this capstan
    /// was built from].
    #[arg(long, value_name = "DIR")]
    sdk: Option<PathBuf>,
}

/// One file of a template: its path in the project and its text.
pub(crate) type File = (&'static str, &'static str);

/// The plugin contract every project builds against, as this host implements it.
pub(crate) const WIT: &[File] = &[
    ("wit/plugin.wit", include_str!("../../../wit/plugin.wit")),
    (
        "wit/plugin-wasi.wit",
        include_str!("../../../wit/plugin-wasi.wit"),
    ),
    (
        "wit/deps/cli.wit",
        include_str!("../../../wit/deps/cli.wit"),
    ),
    (
        "wit/deps/clocks.wit",
        include_str!("../../../wit/deps/clocks.wit"),
    ),
    (
        "wit/deps/filesystem.wit",
        include_str!("../../../wit/deps/filesystem.wit"),
    ),
    (
        "wit/deps/http.wit",
        include_str!("../../../wit/deps/http.wit"),
    ),
    ("wit/deps/io.wit", include_str!("../../../wit/deps/io.wit")),
    (
        "wit/deps/random.wit",
        include_str!("../../../wit/deps/random.wit"),
    ),
    (
        "wit/deps/sockets.wit",
        include_str!("../../../wit/deps/sockets.wit"),
    ),
];

const RUST: &[File] = &[
    (
        "BINDINGS.md",
        include_str!("../../../sdk/templates/rust/BINDINGS.md"),
    ),
    (
        "Cargo.toml",
        include_str!("../../../sdk/templates/rust/Cargo.toml"),
    ),
    (
        "src/lib.rs",
        include_str!("../../../sdk/templates/rust/src/lib.rs"),
    ),
    (
        ".gitignore",
        include_str!("../../../sdk/templates/rust/gitignore"),
    ),
];

/// The Python helper, a package beside `app.py`: `--update-wit` writes it anew.
pub(crate) const PYTHON_HELPER: &[File] = &[
    (
        "capstan_sdk/__init__.py",
        include_str!("../../../sdk/python/capstan_sdk/__init__.py"),
    ),
    (
        "capstan_sdk/http.py",
        include_str!("../../../sdk/python/capstan_sdk/http.py"),
    ),
];

/// The JavaScript helper, beside `plugin.js`: `--update-wit` writes it anew.
pub(crate) const JS_HELPER: &[File] = &[("capstan.js", include_str!("../../../sdk/js/capstan.js"))];

const PYTHON: &[File] = &[
    (
        "BINDINGS.md",
        include_str!("../../../sdk/templates/python/BINDINGS.md"),
    ),
    (
        "app.py",
        include_str!("../../../sdk/templates/python/app.py"),
    ),
    (
        "requirements.txt",
        include_str!("../../../sdk/templates/python/requirements.txt"),
    ),
    (
        "build.sh",
        include_str!("../../../sdk/templates/python/build.sh"),
    ),
    (
        ".gitignore",
        include_str!("../../../sdk/templates/python/gitignore"),
    ),
];

const JS: &[File] = &[
    (
        "BINDINGS.md",
        include_str!("../../../sdk/templates/js/BINDINGS.md"),
    ),
    (
        "plugin.js",
        include_str!("../../../sdk/templates/js/plugin.js"),
    ),
    (
        "package.json",
        include_str!("../../../sdk/templates/js/package.json"),
    ),
    (
        "package-lock.json",
        include_str!("../../../sdk/templates/js/package-lock.json"),
    ),
    (".npmrc", include_str!("../../../sdk/templates/js/npmrc")),
    (
        ".gitignore",
        include_str!("../../../sdk/templates/js/gitignore"),
    ),
];

/// The files that run as programs.
const EXECUTABLE: &[&str] = &["build.sh"];

impl NewCommand {
    /// Writes the project, then says how to build, inspect, call and grant it.
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        check_name(&self.name)?;
        let dir = self
            .dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(&self.name));
        let sdk = match self.lang {
            Lang::Rust => Some(rust_sdk(self.sdk.as_deref())?),
            _ => None,
        };
        let files: Vec<File> = match self.lang {
            Lang::Rust => RUST.to_vec(),
            Lang::Python => [PYTHON, PYTHON_HELPER, WIT].concat(),
            Lang::Js => [JS, JS_HELPER, WIT].concat(),
        };
        // The SDK's path goes into Cargo.toml as a TOML string, quotes and all.
        let sdk = sdk.as_deref().map_or_else(String::new, |p| {
            toml::Value::String(p.display().to_string()).to_string()
        });
        make_empty_dir(&dir)?;
        for (path, text) in files {
            let text = text
                .replace("{{name}}", &self.name)
                .replace("{{tool}}", &self.name)
                .replace("{{sdk}}", &sdk);
            write_file(&dir, path, &text)?;
        }
        std::io::Write::write_fmt(
            &mut crate::secrets::stdout(),
            format_args!("{}\n", next_steps(self.lang, &self.name, &dir)),
        )?;
        Ok(ExitCode::SUCCESS)
    }
}

/// Names a plugin may not take: the host's own tools, and what Rust and Cargo keep (its
/// crate is named after it).
const RESERVED_NAMES: &[&str] = &[
    "test",
    "std",
    "core",
    "alloc",
    "proc_macro",
    "as",
    "break",
    "const",
    "continue",
    "crate",
    "else",
    "enum",
    "extern",
    "false",
    "fn",
    "for",
    "if",
    "impl",
    "in",
    "let",
    "loop",
    "match",
    "mod",
    "move",
    "mut",
    "pub",
    "ref",
    "return",
    "self",
    "static",
    "struct",
    "super",
    "trait",
    "true",
    "type",
    "unsafe",
    "use",
    "where",
    "while",
    "async",
    "await",
    "dyn",
    "abstract",
    "become",
    "box",
    "do",
    "final",
    "macro",
    "override",
    "priv",
    "typeof",
    "unsized",
    "virtual",
    "yield",
    "try",
    "gen",
];

fn check_name(name: &str) -> anyhow::Result<()> {
    if HostTool::named(name).is_some() {
        bail!("`{name}` is the name of a host tool; a plugin's tools may not take it");
    }
    if RESERVED_NAMES.contains(&name) {
        bail!(
            "`{name}` is kept by Rust or Cargo, and the plugin's crate would be named after it; choose another, e.g. `{name}_tool`"
        );
    }
    if !crate::text::is_plain_name(name, MAX_NAME) {
        bail!(
            "`{}` cannot name a plugin: it is also its first tool's name, so a lowercase \
             letter, then lowercase letters, digits and `_`, at most {MAX_NAME} (e.g. `{}`)",
            name.escape_debug(),
            suggest(name)
        );
    }
    Ok(())
}

/// A name like `name` that is valid.
fn suggest(name: &str) -> String {
    let mut out: String = name
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(MAX_NAME)
        .collect();
    if !out.starts_with(|c: char| c.is_ascii_lowercase()) {
        out.insert_str(0, "tool_");
        out.truncate(MAX_NAME);
    }
    if RESERVED_NAMES.contains(&out.as_str()) || HostTool::named(&out).is_some() {
        out.push_str("_tool");
    }
    out
}

/// The capstan-sdk crate: `--sdk`, or the one this binary was built beside.
pub(crate) fn rust_sdk(flag: Option<&Path>) -> anyhow::Result<PathBuf> {
    let dir = match flag {
        Some(dir) => dir.to_owned(),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk"),
    };
    let manifest = dir.join("Cargo.toml");
    let is_sdk = std::fs::read_to_string(&manifest)
        .map(|text| text.contains("name = \"capstan-sdk\""))
        .unwrap_or(false);
    if !is_sdk {
        bail!(
            "no capstan-sdk crate at {}: pass --sdk DIR, the sdk/ folder of a Capstan checkout",
            dir.display()
        );
    }
    std::fs::canonicalize(&dir).with_context(|| format!("resolving {}", dir.display()))
}

/// Creates `dir`, or takes it if it exists and is empty: a project is never written over
/// files already there.
fn make_empty_dir(dir: &Path) -> anyhow::Result<()> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                bail!(
                    "{} already exists and is not empty; choose another name or --dir",
                    dir.display()
                );
            }
            Ok(())
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
        }
        Err(err) => Err(err).with_context(|| format!("reading {}", dir.display())),
    }
}

fn write_file(dir: &Path, path: &str, text: &str) -> anyhow::Result<()> {
    let target = dir.join(path);
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    // Created exclusively: a file (or a link) that appeared meanwhile is never written
    // through.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&target)
        .with_context(|| format!("creating {}", target.display()))?;
    std::io::Write::write_all(&mut file, text.as_bytes())
        .with_context(|| format!("writing {}", target.display()))?;
    if EXECUTABLE.contains(&path) {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("making {} executable", target.display()))?;
    }
    Ok(())
}

fn next_steps(lang: Lang, name: &str, dir: &Path) -> String {
    let dir = dir.display();
    let (how, source) = match lang {
        Lang::Rust => (
            "cargo with the wasm32-wasip2 target, or offline Debian's Rust",
            "src/lib.rs",
        ),
        Lang::Python => (
            "a venv with componentize-py from PyPI, then the build",
            "app.py",
        ),
        Lang::Js => ("ComponentizeJS from npm, then the build", "plugin.js"),
    };
    format!(
        "wrote the {name} plugin ({}) in {dir}. Next:\n\
         \n  capstan plugins build {dir}   # {how}\
         \n  capstan plugins inspect {dir}/{name}.wasm\
         \n  capstan tool call {name} '{{\"path\": \"{source}\"}}' --grant fs.read --workspace {dir} --plugins-dir {dir}\
         \n\nthen grant it to a process kind in capstan.toml (tools = [..., \"{name}\"], with \
         capabilities = [\"fs.read\"]) and put {name}.wasm in a directory of agent.plugins_dir. \
         BINDINGS.md says how the host's imports look in {}.",
        lang_name(lang),
        lang_name(lang),
    )
}

/// The language's name, as a person writes it.
pub(crate) fn lang_name(lang: Lang) -> &'static str {
    match lang {
        Lang::Rust => "Rust",
        Lang::Python => "Python",
        Lang::Js => "JavaScript",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_a_valid_one_suggested() {
        assert!(check_name("word_stats").is_ok());
        for reserved in ["spawn_worker", "test", "fn", "match"] {
            let err = check_name(reserved).unwrap_err().to_string();
            assert!(
                err.contains("host tool") || err.contains("kept by Rust"),
                "{err}"
            );
        }
        for bad in [
            "",
            "Word",
            "Test",
            "9lives",
            "has-dash",
            "a b",
            &"x".repeat(49),
        ] {
            let err = check_name(bad).unwrap_err().to_string();
            assert!(err.contains("cannot name a plugin"), "{err}");
            let suggested = suggest(bad);
            assert!(check_name(&suggested).is_ok(), "{bad:?} -> {suggested:?}");
        }
    }

    #[test]
    fn every_template_placeholder_is_known() {
        for (path, text) in [RUST, PYTHON, PYTHON_HELPER, JS, JS_HELPER].concat() {
            let mut rest = text;
            while let Some(start) = rest.find("{{") {
                let end = rest[start..].find("}}").expect("a closed placeholder") + start;
                let key = &rest[start + 2..end];
                assert!(
                    ["name", "tool", "sdk"].contains(&key),
                    "{path}: {{{{{key}}}}}"
                );
                rest = &rest[end..];
            }
        }
    }
}
