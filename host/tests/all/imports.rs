//! Invariant: imports go one way. For every module of the host that has submodules, its
//! submodules' references to each other (by `use` or by path, outside `#[cfg(test)]`
//! code) form no cycle; nor do the crate's top-level modules. A cycle is reported with the
//! file and line of each reference that closes it.
//!
//! A reference counts wherever it is written: in code, in an inline module, inside a macro
//! call (`tokio::select!`, `json!`: paths starting at `crate`, `super` or `self` in its
//! tokens), through a parent's re-export (`super::Runtime` names `agent::runtime`), or by a
//! glob (`use super::*` names everything its target re-exports). The module tree itself
//! (`mod` items) is not a reference.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// A module, as the path from the crate root: `["agent", "channel"]`.
type ModPath = Vec<String>;

/// One reference from a module to another: where it is written and what it names.
#[derive(Debug, Clone)]
struct Reference {
    target: ModPath,
    file: PathBuf,
    line: usize,
}

/// The modules of the library crate, each with the references its file makes.
struct Crate {
    files: BTreeMap<ModPath, PathBuf>,
    references: BTreeMap<ModPath, Vec<Reference>>,
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The module a file under `src/` is: `agent/mod.rs` is `agent`, `agent/turn.rs` is
/// `agent::turn`. `None` for the binary's root, `main.rs`, a crate of its own.
fn module_of(src: &Path, file: &Path) -> Option<ModPath> {
    let relative = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = relative
        .iter()
        .map(|part| part.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop()?;
    match last.as_str() {
        "main.rs" if parts.is_empty() => None,
        "lib.rs" if parts.is_empty() => Some(parts),
        "mod.rs" => Some(parts),
        _ => {
            parts.push(last.strip_suffix(".rs")?.to_owned());
            Some(parts)
        }
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

impl Crate {
    fn read() -> Self {
        let src = src_dir();
        let mut paths = Vec::new();
        rust_files(&src, &mut paths);
        let files: BTreeMap<ModPath, PathBuf> = paths
            .into_iter()
            .filter_map(|file| Some((module_of(&src, &file)?, file)))
            .collect();
        let modules: BTreeSet<ModPath> = files.keys().cloned().collect();
        let found: BTreeMap<ModPath, Vec<Found>> = files
            .iter()
            .map(|(module, file)| {
                let source = std::fs::read_to_string(file).unwrap();
                let parsed = syn::parse_file(&source)
                    .unwrap_or_else(|err| panic!("{}: {err}", file.display()));
                let mut paths = Paths::default();
                paths.visit_file(&parsed);
                (module.clone(), paths.found)
            })
            .collect();
        // What each module re-exports: the name and the module it comes from.
        let no_exports = BTreeMap::new();
        let mut exports: BTreeMap<ModPath, BTreeMap<String, ModPath>> = BTreeMap::new();
        for (module, paths) in &found {
            for path in paths
                .iter()
                .filter(|p| p.reexport && !p.glob && p.inline.is_empty())
            {
                if let Some(target) = resolve(module, &path.segments, &modules, &no_exports) {
                    let name = path.segments.last().unwrap().clone();
                    exports
                        .entry(module.clone())
                        .or_default()
                        .insert(name, target);
                }
            }
        }
        let references = found
            .into_iter()
            .map(|(module, paths)| {
                let file = files[&module].clone();
                let mut references = Vec::new();
                for path in paths {
                    let mut within = module.clone();
                    within.extend(path.inline.iter().cloned());
                    let Some(target) = resolve(&within, &path.segments, &modules, &exports) else {
                        continue;
                    };
                    let mut targets = vec![target.clone()];
                    if path.glob {
                        targets.extend(
                            exports
                                .get(&target)
                                .into_iter()
                                .flat_map(|e| e.values().cloned()),
                        );
                    }
                    references.extend(targets.into_iter().map(|target| Reference {
                        target,
                        file: file.clone(),
                        line: path.line,
                    }));
                }
                (module, references)
            })
            .collect();
        Crate { files, references }
    }

    /// The submodules of `parent` and the references among them: an edge `a -> b` for
    /// every reference from `a` (or a module inside it) to `b` (or a module inside it).
    fn graph(&self, parent: &[String]) -> BTreeMap<String, Vec<(String, Reference)>> {
        let child_of = |module: &[String]| -> Option<String> {
            (module.len() > parent.len() && module.starts_with(parent))
                .then(|| module[parent.len()].clone())
        };
        let mut graph: BTreeMap<String, Vec<(String, Reference)>> = BTreeMap::new();
        for (module, references) in &self.references {
            let Some(from) = child_of(module) else {
                continue;
            };
            let edges = graph.entry(from.clone()).or_default();
            for reference in references {
                if let Some(to) = child_of(&reference.target)
                    && to != from
                {
                    edges.push((to, reference.clone()));
                }
            }
        }
        graph
    }

    /// Every module with submodules, the crate root included.
    fn parents(&self) -> BTreeSet<ModPath> {
        self.files
            .keys()
            .filter(|module| !module.is_empty())
            .map(|module| module[..module.len() - 1].to_vec())
            .collect()
    }
}

/// Resolves `segments`, written in `module`, to the module it names, if it names one of
/// this crate's (the longest known prefix, followed through re-exports).
fn resolve(
    module: &[String],
    segments: &[String],
    modules: &BTreeSet<ModPath>,
    exports: &BTreeMap<ModPath, BTreeMap<String, ModPath>>,
) -> Option<ModPath> {
    let (mut base, rest): (ModPath, &[String]) = match segments.first()?.as_str() {
        "crate" => (Vec::new(), &segments[1..]),
        "self" => (module.to_vec(), &segments[1..]),
        "super" => {
            let mut base = module.to_vec();
            let mut rest = segments;
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
            (base, rest)
        }
        first => {
            // A path starting at a child module of this one (`use events::Event;` in a
            // `mod.rs`); anything else is a local item or another crate.
            let mut child = module.to_vec();
            child.push(first.to_owned());
            if !modules.contains(&child) {
                return None;
            }
            (module.to_vec(), segments)
        }
    };
    for segment in rest {
        base.push(segment.clone());
        if modules.contains(&base) {
            continue;
        }
        base.pop();
        // An item the module re-exports lives in the module it came from.
        if let Some(origin) = exports.get(&base).and_then(|e| e.get(segment)) {
            base = origin.clone();
        }
        break;
    }
    Some(base)
}

/// One path written in a file.
struct Found {
    segments: Vec<String>,
    line: usize,
    /// The inline modules (`mod x { .. }`) it is written in, outermost first.
    inline: Vec<String>,
    /// A glob import: everything the path's target exports.
    glob: bool,
    /// A `pub`/`pub(crate)` import: the file re-exports it.
    reexport: bool,
}

/// Every path in a file outside `#[cfg(test)]` items: `use` trees, paths in code, and
/// paths in macro calls.
#[derive(Default)]
struct Paths {
    found: Vec<Found>,
    inline: Vec<String>,
    /// Whether the `use` item being read is visible outside its module.
    public_use: bool,
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr
                .parse_args::<syn::Meta>()
                .is_ok_and(|meta| meta.path().is_ident("test"))
    })
}

impl Paths {
    fn push(&mut self, segments: Vec<String>, line: usize, glob: bool) {
        self.found.push(Found {
            segments,
            line,
            inline: self.inline.clone(),
            glob,
            reexport: self.public_use,
        });
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.use_tree(prefix, &path.tree);
                prefix.pop();
            }
            syn::UseTree::Name(name) => {
                let mut full = prefix.clone();
                full.push(name.ident.to_string());
                self.push(full, name.ident.span().start().line, false);
            }
            syn::UseTree::Rename(rename) => {
                let mut full = prefix.clone();
                full.push(rename.ident.to_string());
                self.push(full, rename.ident.span().start().line, false);
            }
            syn::UseTree::Glob(glob) => {
                let line = glob.star_token.span.start().line;
                self.push(prefix.clone(), line, true);
            }
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Mod(item) => &item.attrs,
            syn::Item::Fn(item) => &item.attrs,
            syn::Item::Impl(item) => &item.attrs,
            syn::Item::Use(item) => &item.attrs,
            syn::Item::Struct(item) => &item.attrs,
            syn::Item::Enum(item) => &item.attrs,
            syn::Item::Const(item) => &item.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if !is_test_only(attrs) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        self.inline.push(item.ident.to_string());
        syn::visit::visit_item_mod(self, item);
        self.inline.pop();
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.public_use = !matches!(item.vis, syn::Visibility::Inherited);
        self.use_tree(&mut Vec::new(), &item.tree);
        self.public_use = false;
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if let Some(first) = path.segments.first() {
            let segments = path.segments.iter().map(|s| s.ident.to_string()).collect();
            self.push(segments, first.ident.span().start().line, false);
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        let mut tokens = Vec::new();
        flatten(mac.tokens.clone(), &mut tokens);
        let mut i = 0;
        while i < tokens.len() {
            let starts = matches!(&tokens[i], proc_macro2::TokenTree::Ident(id)
                if id == "crate" || id == "super" || id == "self");
            let after_colons = i >= 2 && is_colon(&tokens[i - 1]) && is_colon(&tokens[i - 2]);
            if !starts || after_colons {
                i += 1;
                continue;
            }
            let line = tokens[i].span().start().line;
            let mut segments = vec![tokens[i].to_string()];
            let mut j = i + 1;
            while j + 2 < tokens.len()
                && is_colon(&tokens[j])
                && is_colon(&tokens[j + 1])
                && matches!(tokens[j + 2], proc_macro2::TokenTree::Ident(_))
            {
                segments.push(tokens[j + 2].to_string());
                j += 3;
            }
            if segments.len() > 1 {
                self.push(segments, line, false);
            }
            i = j;
        }
        syn::visit::visit_macro(self, mac);
    }
}

/// The tokens of `stream`, with groups opened.
fn flatten(stream: proc_macro2::TokenStream, out: &mut Vec<proc_macro2::TokenTree>) {
    for token in stream {
        match token {
            proc_macro2::TokenTree::Group(group) => flatten(group.stream(), out),
            other => out.push(other),
        }
    }
}

fn is_colon(token: &proc_macro2::TokenTree) -> bool {
    matches!(token, proc_macro2::TokenTree::Punct(p) if p.as_char() == ':')
}

/// A cycle in `graph`, as the references that make it, if there is one.
fn find_cycle(graph: &BTreeMap<String, Vec<(String, Reference)>>) -> Option<Vec<Reference>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &BTreeMap<String, Vec<(String, Reference)>>,
        marks: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<(String, Reference)>,
    ) -> Option<Vec<Reference>> {
        marks.insert(node.to_owned(), Mark::Open);
        for (next, reference) in graph.get(node).into_iter().flatten() {
            match marks.get(next) {
                Some(Mark::Done) => {}
                Some(Mark::Open) => {
                    // The cycle: from where `next` was entered back round to here.
                    let start = stack.iter().position(|(from, _)| from == next).unwrap_or(0);
                    let mut cycle: Vec<Reference> =
                        stack[start..].iter().map(|(_, r)| r.clone()).collect();
                    cycle.push(reference.clone());
                    return Some(cycle);
                }
                None => {
                    stack.push((node.to_owned(), reference.clone()));
                    if let Some(cycle) = visit(next, graph, marks, stack) {
                        return Some(cycle);
                    }
                    stack.pop();
                }
            }
        }
        marks.insert(node.to_owned(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if !marks.contains_key(node)
            && let Some(cycle) = visit(node, graph, &mut marks, &mut Vec::new())
        {
            return Some(cycle);
        }
    }
    None
}

fn describe(parent: &[String], cycle: &[Reference]) -> String {
    let src = src_dir();
    let steps: Vec<String> = cycle
        .iter()
        .map(|r| {
            format!(
                "  {}:{} names {}",
                r.file.strip_prefix(&src).unwrap_or(&r.file).display(),
                r.line,
                r.target.join("::")
            )
        })
        .collect();
    let within = if parent.is_empty() {
        "the crate".to_owned()
    } else {
        parent.join("::")
    };
    format!("an import cycle within {within}:\n{}", steps.join("\n"))
}

#[test]
fn the_modules_of_the_host_import_one_way() {
    let krate = Crate::read();
    let cycles: Vec<String> = krate
        .parents()
        .iter()
        .filter_map(|parent| Some(describe(parent, &find_cycle(&krate.graph(parent))?)))
        .collect();
    assert!(cycles.is_empty(), "{}", cycles.join("\n\n"));
}

#[test]
fn the_agent_core_is_layered_processes_below_the_runtime() {
    let krate = Crate::read();
    let agent = krate.graph(&["agent".to_owned()]);
    let names = |from: &str| -> BTreeSet<String> {
        agent
            .get(from)
            .into_iter()
            .flatten()
            .map(|(to, _)| to.clone())
            .collect()
    };
    // Processes reach each other only through the spawner (which hands each its kit),
    // never by module.
    let processes = ["channel", "branch", "worker"];
    for process in processes {
        let reached = names(process);
        for other in processes.iter().filter(|p| **p != process) {
            assert!(
                !reached.contains(*other),
                "{process} imports {other}: {reached:?}"
            );
        }
        assert!(
            !reached.contains("runtime"),
            "{process} imports the runtime"
        );
        assert!(reached.contains("spawning"), "{process}: {reached:?}");
    }
    // No process, nor what it runs, holds the runtime's context: each is handed the
    // handles of its kit, and the spawner builds those from handles, not from the context.
    for module in processes
        .iter()
        .chain(&["compactor", "repeats", "tool_calls", "spawning"])
    {
        let reached = names(module);
        assert!(!reached.contains("context"), "{module} imports the context");
    }
    // The compactor is run inside the channel's turn, and imports no process.
    for process in processes {
        assert!(
            !names("compactor").contains(process),
            "compactor imports {process}"
        );
    }
    // Processes ask their kits' handles (conversations, the reporter, worker records),
    // never the services behind them.
    for process in processes
        .iter()
        .chain(&["compactor", "repeats", "tool_calls"])
    {
        let file = src_dir().join(format!("agent/{process}.rs"));
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(
            !text.contains(".services"),
            "{} reaches into the services",
            file.display()
        );
    }
    // Only the runtime knows the processes.
    for module in agent.keys().filter(|m| *m != "runtime") {
        let reached = names(module);
        for process in processes {
            assert!(!reached.contains(process), "{module} imports {process}");
        }
    }
}

/// What each room must never reach, and why: the rules that keep the next door and the next
/// tool a one-room change.
const NEVER: &[(&str, &[&str], &str)] = &[
    (
        "cli",
        &["store", "postgres"],
        "the CLI names no backend: it opens the configured store through `app`",
    ),
    (
        "serve",
        &[
            "store", "postgres", "app", "plugin", "policy", "dispatch", "llm",
        ],
        "a door names no backend, no sandbox, no policy and no model: it sends through the \
         exchange (`agent`), writes through the one outbound type (`secrets`), and reads the \
         tools through the runtime's router",
    ),
    (
        "messaging",
        &[
            "store", "postgres", "app", "dispatch", "llm", "tools", "serve", "mcp", "cli",
        ],
        "a door names no backend and no model: it sends through the exchange (`agent`) and \
         drives its adapters through the sandbox room (`plugin::adapter`)",
    ),
    (
        "mcp",
        &["agent", "policy", "store", "postgres"],
        "a door to the tools alone learns them from the tools room (`tools::ToolCatalog`) and \
         calls them through `tools::ToolRouter`, which decides each call",
    ),
    (
        "tools",
        &["agent", "app", "cli", "serve", "mcp", "store", "postgres"],
        "the tools room sits below the processes and the doors, above the sandboxes",
    ),
    (
        "plugin",
        &[
            "tools", "agent", "app", "cli", "serve", "mcp", "dispatch", "llm", "store", "postgres",
        ],
        "the sandboxes know nothing of how tools are offered, of processes or of prompts",
    ),
    (
        "llm",
        &["plugin", "tools", "agent", "config", "net"],
        "a provider knows nothing of tools' sandboxes or the config",
    ),
    (
        "ids",
        &[
            "agent", "app", "cli", "config", "dispatch", "llm", "mcp", "net", "plugin", "policy",
            "postgres", "secrets", "serve", "services", "store", "tools",
        ],
        "the ids sit below everything: every room may name them",
    ),
    (
        "services",
        &[
            "agent", "app", "cli", "serve", "mcp", "tools", "plugin", "store", "postgres",
        ],
        "the service traits know no backend and no caller",
    ),
    (
        "flow",
        &[
            "agent", "app", "cli", "config", "dispatch", "llm", "mcp", "net", "plugin", "policy",
            "postgres", "secrets", "serve", "services", "store", "tools",
        ],
        "labels and the check at the sink are vocabulary below every room that labels or \
         decides: they name only ids and text",
    ),
    (
        "telemetry",
        &[
            "agent", "app", "cli", "config", "dispatch", "flow", "llm", "mcp", "net", "plugin",
            "policy", "postgres", "serve", "services", "store", "tools",
        ],
        "the metrics and traces are a leaf every room counts and traces into: they name only \
         ids, and the log's redactor every exported span passes",
    ),
];

#[test]
fn no_room_reaches_what_it_must_never_import() {
    let krate = Crate::read();
    let top = krate.graph(&[]);
    let mut broken = Vec::new();
    for (room, never, why) in NEVER {
        for (to, reference) in top.get(*room).into_iter().flatten() {
            if never.contains(&to.as_str()) {
                broken.push(format!(
                    "{}:{} names {to}: {room} must never import {to} ({why})",
                    reference.file.display(),
                    reference.line
                ));
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
    // The rules name rooms that exist.
    for (room, never, _) in NEVER {
        for name in std::iter::once(room).chain(never.iter()) {
            assert!(
                krate.files.contains_key(&vec![(*name).to_owned()]),
                "no room `{name}`"
            );
        }
    }
}

#[test]
fn a_cycle_is_found_and_named() {
    let reference = |to: &str, line| Reference {
        target: vec![to.to_owned()],
        file: PathBuf::from(format!("{to}.rs")),
        line,
    };
    let mut graph = BTreeMap::new();
    graph.insert("a".to_owned(), vec![("b".to_owned(), reference("b", 1))]);
    graph.insert("b".to_owned(), vec![("c".to_owned(), reference("c", 2))]);
    graph.insert("c".to_owned(), vec![("a".to_owned(), reference("a", 3))]);
    let cycle = find_cycle(&graph).expect("a -> b -> c -> a");
    assert_eq!(cycle.len(), 3);
    let text = describe(&[], &cycle);
    assert!(
        text.contains("b.rs:1 names b") && text.contains("a.rs:3 names a"),
        "{text}"
    );
    graph.get_mut("c").unwrap().clear();
    assert!(find_cycle(&graph).is_none());
}

#[test]
fn a_tool_call_is_decided_in_one_place() {
    // The registry runs an offered call without asking the policy: only the router,
    // which asks the catalog's decision first, may hand it one.
    let mut files = Vec::new();
    rust_files(&src_dir(), &mut files);
    let callers: Vec<PathBuf> = files
        .into_iter()
        .filter(|path| !path.ends_with("plugin/registry.rs"))
        .filter(|path| {
            std::fs::read_to_string(path)
                .unwrap()
                .contains("call_offered(")
        })
        .collect();
    assert_eq!(
        callers,
        [src_dir().join("tools/router.rs")],
        "only the router hands the registry a decided call"
    );
}
