//! Structural checks of a component before it is linked: the file format, the `tool`
//! export and its WIT version, and the imports.

use std::path::Path;

use super::contract::{
    ALLOWED_IMPORTS, TOOL_INTERFACE, WIT_PACKAGE, WIT_VERSION, import_allowed, split_version,
    version_supported,
};
use super::error::LoadError;

/// Checks the header: a WebAssembly component, not a core module or other bytes.
pub(crate) fn check_header(path: &Path, bytes: &[u8]) -> Result<(), LoadError> {
    const MAGIC: &[u8] = b"\0asm";
    const CORE_VERSION: &[u8] = &[1, 0, 0, 0];
    const COMPONENT_LAYER: &[u8] = &[0x0d, 0, 1, 0];
    if !bytes.starts_with(MAGIC) {
        return Err(LoadError::NotWasm {
            path: path.to_owned(),
        });
    }
    match bytes.get(4..8) {
        Some(CORE_VERSION) => Err(LoadError::CoreModule {
            path: path.to_owned(),
        }),
        Some(COMPONENT_LAYER) => Ok(()),
        _ => Err(LoadError::Invalid {
            path: path.to_owned(),
            reason: "unknown WebAssembly version or layer in the header".into(),
        }),
    }
}

/// A component's own imports and exports, read from its bytes before anything is compiled,
/// so a plugin that cannot run here is refused in milliseconds, not after its compilation.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Outline {
    /// The names of its imports, e.g. `wasi:filesystem/types@0.2.6`.
    pub imports: Vec<String>,
    /// The names of its exports.
    pub exports: Vec<String>,
}

/// Reads the top-level imports and exports of the component in `bytes`. The modules and
/// components nested in it are skipped unread (they are their own business, and most of
/// the bytes; compiling checks them), so this looks at the top-level sections only.
pub(crate) fn outline(path: &Path, bytes: &[u8]) -> Result<Outline, LoadError> {
    use wasmparser::{Chunk, Parser, Payload};
    let invalid = |reason: String| LoadError::Invalid {
        path: path.to_owned(),
        reason,
    };
    let mut outline = Outline {
        imports: Vec::new(),
        exports: Vec::new(),
    };
    let mut parser = Parser::new(0);
    let mut rest = bytes;
    loop {
        let chunk = parser
            .parse(rest, true)
            .map_err(|e| invalid(e.to_string()))?;
        // With the whole input given as final, the parser errs rather than ask for more.
        let Chunk::Parsed { payload, consumed } = chunk else {
            return Err(invalid("the file ends early".into()));
        };
        rest = &rest[consumed..];
        match payload {
            // The parser has moved past the nested one's bytes; so does the input.
            Payload::ModuleSection {
                unchecked_range, ..
            }
            | Payload::ComponentSection {
                unchecked_range, ..
            } => {
                rest = rest.get(unchecked_range.len()..).ok_or_else(|| {
                    invalid(format!(
                        "a nested module or component at byte {} runs past the end of the file",
                        unchecked_range.start
                    ))
                })?;
            }
            Payload::ComponentImportSection(reader) => {
                for import in reader {
                    let import = import.map_err(|e| invalid(e.to_string()))?;
                    outline.imports.push(import.name.name.to_owned());
                }
            }
            Payload::ComponentExportSection(reader) => {
                for export in reader {
                    let export = export.map_err(|e| invalid(e.to_string()))?;
                    outline.exports.push(export.name.name.to_owned());
                }
            }
            Payload::End(_) => return Ok(outline),
            _ => {}
        }
    }
}

/// Finds the `capstan:plugin/tool` export and checks its version; returns the version.
pub(crate) fn check_exports(path: &Path, outline: &Outline) -> Result<String, LoadError> {
    let wanted = format!("{WIT_PACKAGE}/{TOOL_INTERFACE}");
    let Some(export) = outline
        .exports
        .iter()
        .find(|name| split_version(name).0 == wanted)
    else {
        return Err(LoadError::MissingToolExport {
            path: path.to_owned(),
            exports: if outline.exports.is_empty() {
                "nothing".into()
            } else {
                outline.exports.join(", ")
            },
        });
    };
    let found = split_version(export).1.unwrap_or("(no version)");
    if !version_supported(found) {
        return Err(LoadError::WitVersion {
            path: path.to_owned(),
            found: found.to_owned(),
            supported: WIT_VERSION,
        });
    }
    Ok(found.to_owned())
}

/// Checks every import against the allow-list, refusing with all that are not on it.
pub(crate) fn check_imports(path: &Path, outline: &Outline) -> Result<(), LoadError> {
    let refused: Vec<String> = outline
        .imports
        .iter()
        .filter(|name| !import_allowed(name))
        .cloned()
        .collect();
    if refused.is_empty() {
        return Ok(());
    }
    // An interface of ours at another version is the contract's version, not a stray
    // dependency: named as such, with both versions.
    let contract = refused.iter().find_map(|name| {
        let (interface, version) = split_version(name);
        let ours = ALLOWED_IMPORTS.contains(&interface)
            && interface.starts_with(&format!("{WIT_PACKAGE}/"));
        ours.then(|| version.unwrap_or("(no version)"))
    });
    if let Some(found) = contract {
        return Err(LoadError::WitVersion {
            path: path.to_owned(),
            found: found.to_owned(),
            supported: WIT_VERSION,
        });
    }
    Err(LoadError::ImportsNotProvided {
        path: path.to_owned(),
        imports: refused,
        allowed: ALLOWED_IMPORTS.join(", "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outline_names_the_top_level_only_and_a_cut_component_is_invalid() {
        let bytes = wat::parse_str(
            r#"(component
                (import "wasi:io/streams@0.2.6" (instance))
                (core module (import "env" "hidden" (func)))
                (component (import "nested:only/this@1.0.0" (instance)))
                (core module $m (func (export "f")))
                (core instance $i (instantiate $m))
                (func (export "run") (canon lift (core func $i "f")))
            )"#,
        )
        .unwrap();
        let path = Path::new("p.wasm");
        let outline = outline(path, &bytes).unwrap();
        assert_eq!(outline.imports, ["wasi:io/streams@0.2.6"]);
        assert_eq!(outline.exports, ["run"]);
        // Inside a nested component, and inside the header of the first section. (A cut
        // on a section boundary leaves a well-formed component that exports less.)
        for cut in [100, 9] {
            assert!(
                matches!(outline_of(&bytes[..cut]), Err(LoadError::Invalid { .. })),
                "cut at {cut}: {:?}",
                outline_of(&bytes[..cut])
            );
        }
    }

    fn outline_of(bytes: &[u8]) -> Result<Outline, LoadError> {
        outline(Path::new("p.wasm"), bytes)
    }

    #[test]
    fn the_header_tells_modules_components_and_junk_apart() {
        let path = Path::new("p.wasm");
        assert!(check_header(path, b"\0asm\x0d\0\x01\0rest").is_ok());
        assert!(matches!(
            check_header(path, b"\0asm\x01\0\0\0"),
            Err(LoadError::CoreModule { .. })
        ));
        assert!(matches!(
            check_header(path, b"#!/bin/sh"),
            Err(LoadError::NotWasm { .. })
        ));
        assert!(matches!(
            check_header(path, b"\0as"),
            Err(LoadError::NotWasm { .. })
        ));
        assert!(matches!(
            check_header(path, b"\0asm\x0d"),
            Err(LoadError::Invalid { .. })
        ));
    }
}
