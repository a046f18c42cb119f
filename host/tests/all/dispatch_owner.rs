//! Invariant: `dispatch` is the only module that sends a prompt to a model. This test
//! parses every source file of the host with `syn` and fails if code outside `dispatch/`
//! calls a provider's `complete`, whether as a method (`provider.complete(..)`), through
//! the trait (`Provider::complete(..)`, `<P as Provider>::complete(..)`), or by taking the
//! function as a value to call later (`let f = Provider::complete;`).
//!
//! `llm/` is where providers are defined; it may forward `complete` from one provider to
//! another (the recorder, `Box<dyn Provider>`), which sends no new prompt.

use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// One forbidden use: where and how.
#[derive(Debug, PartialEq, Eq)]
struct Finding {
    line: usize,
    what: &'static str,
}

#[derive(Default)]
struct CompleteCalls {
    found: Vec<Finding>,
}

const METHOD: &str = "complete";

impl<'ast> Visit<'ast> for CompleteCalls {
    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        if call.method == METHOD {
            self.found.push(Finding {
                line: call.method.span().start().line,
                what: "method call",
            });
        }
        syn::visit::visit_expr_method_call(self, call);
    }

    fn visit_expr_path(&mut self, path: &'ast syn::ExprPath) {
        // Any path ending in `complete`: `Provider::complete`, `<P as Provider>::complete`,
        // an alias of the trait followed by `::complete`, or the function taken as a value.
        if let Some(last) = path.path.segments.last()
            && last.ident == METHOD
            && (path.path.segments.len() > 1 || path.qself.is_some())
        {
            self.found.push(Finding {
                line: last.ident.span().start().line,
                what: "path to complete",
            });
        }
        syn::visit::visit_expr_path(self, path);
    }
}

fn scan(source: &str) -> Vec<Finding> {
    let file = syn::parse_file(source).expect("the source parses");
    let mut visitor = CompleteCalls::default();
    visitor.visit_file(&file);
    visitor.found
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

#[test]
fn only_dispatch_calls_a_providers_complete() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 20, "found the sources: {}", files.len());
    let mut violations = Vec::new();
    let mut dispatch_calls = 0;
    for file in files {
        let rel = file
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let found = scan(&std::fs::read_to_string(&file).unwrap());
        if rel.starts_with("dispatch/") {
            dispatch_calls += found.len();
        } else if !rel.starts_with("llm/") {
            violations.extend(
                found
                    .into_iter()
                    .map(|f| format!("src/{rel}:{} ({})", f.line, f.what)),
            );
        }
    }
    assert!(
        violations.is_empty(),
        "prompts sent outside dispatch: {violations:#?}"
    );
    assert!(dispatch_calls >= 1, "the scan finds dispatch's own call");
}

#[test]
fn the_scan_catches_method_calls_trait_paths_and_aliases() {
    let source = r#"
        use crate::llm::Provider as Model;
        async fn sneaky(p: &dyn Provider, r: &Request) {
            p.complete(r).await;
            Provider::complete(p, r).await;
            <dyn Provider as Provider>::complete(p, r).await;
            Model::complete(p, r).await;
            let f = Provider::complete;
            let _ = completed(p); // another function: fine
            let _ = p.completion(); // another method: fine
        }
    "#;
    let found = scan(source);
    let lines: Vec<usize> = found.iter().map(|f| f.line).collect();
    assert_eq!(lines, [4, 5, 6, 7, 8], "{found:?}");
}
