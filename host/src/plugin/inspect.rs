//! Structural checks of a component before it is linked: the file format, the `tool`
//! export and its WIT version, and the imports.

use std::path::Path;

use wasmtime::Engine;
use wasmtime::component::Component;

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

/// Finds the `capstan:plugin/tool` export and checks its version; returns the version.
pub(crate) fn check_exports(
    path: &Path,
    engine: &Engine,
    component: &Component,
) -> Result<String, LoadError> {
    let ty = component.component_type();
    let exports: Vec<&str> = ty.exports(engine).map(|(name, _)| name).collect();
    let wanted = format!("{WIT_PACKAGE}/{TOOL_INTERFACE}");
    let Some(export) = exports.iter().find(|name| split_version(name).0 == wanted) else {
        return Err(LoadError::MissingToolExport {
            path: path.to_owned(),
            exports: if exports.is_empty() {
                "nothing".into()
            } else {
                exports.join(", ")
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

/// Checks every import against the allow-list; returns the import names.
pub(crate) fn check_imports(
    path: &Path,
    engine: &Engine,
    component: &Component,
) -> Result<Vec<String>, LoadError> {
    let ty = component.component_type();
    let imports: Vec<String> = ty
        .imports(engine)
        .map(|(name, _)| name.to_owned())
        .collect();
    if let Some(bad) = imports.iter().find(|name| !import_allowed(name)) {
        return Err(LoadError::ImportNotProvided {
            path: path.to_owned(),
            import: bad.clone(),
            allowed: ALLOWED_IMPORTS.join(", "),
        });
    }
    Ok(imports)
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
