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
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outline {
    /// The names of its imports, e.g. `wasi:filesystem/types@0.2.6`.
    pub imports: Vec<String>,
    /// The names of its exports.
    pub exports: Vec<String>,
}

/// Reads the top-level imports and exports of the component in `bytes` (those of the
/// modules and components nested in it are their own business).
pub(crate) fn outline(path: &Path, bytes: &[u8]) -> Result<Outline, LoadError> {
    let invalid = |err: wasmparser::BinaryReaderError| LoadError::Invalid {
        path: path.to_owned(),
        reason: err.to_string(),
    };
    let mut outline = Outline {
        imports: Vec::new(),
        exports: Vec::new(),
    };
    let mut depth = 0usize;
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        match payload.map_err(invalid)? {
            wasmparser::Payload::ModuleSection { .. }
            | wasmparser::Payload::ComponentSection { .. } => depth += 1,
            wasmparser::Payload::End(_) if depth == 0 => break,
            wasmparser::Payload::End(_) => depth -= 1,
            wasmparser::Payload::ComponentImportSection(reader) if depth == 0 => {
                for import in reader {
                    outline
                        .imports
                        .push(import.map_err(invalid)?.name.name.to_owned());
                }
            }
            wasmparser::Payload::ComponentExportSection(reader) if depth == 0 => {
                for export in reader {
                    outline
                        .exports
                        .push(export.map_err(invalid)?.name.name.to_owned());
                }
            }
            _ => {}
        }
    }
    Ok(outline)
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
