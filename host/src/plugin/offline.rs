//! `wasi:http` as traps: what a call without a network grant links in its place.
//!
//! A component that imports `wasi:http` (every standard Python runtime does, used or not)
//! must link to load. A call whose tool holds a `net` grant gets wasmtime-wasi-http behind
//! the egress checks; every other call gets these stubs, so no code of the HTTP stack, not
//! even building a request's headers, is reachable from it. Each stub traps with
//! [`NotLinked`], which the host turns into an error naming the missing grant.

use wasmtime::Engine;
use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, Linker, ResourceType};

use super::sandbox::Sandbox;

/// The prefix of every `wasi:http` interface name.
const WASI_HTTP: &str = "wasi:http/";

/// A call reached a `wasi:http` function it was not linked to: its tool holds no `net`
/// grant.
#[derive(Debug)]
pub(crate) struct NotLinked {
    /// The function, as `interface#name`.
    pub(crate) import: String,
}

impl std::fmt::Display for NotLinked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "`{}` is not linked for this call: the tool holds no network grant",
            self.import
        )
    }
}

impl std::error::Error for NotLinked {}

/// Whether a component with these imports imports any `wasi:http` interface.
pub(crate) fn imports_http(imports: &[String]) -> bool {
    imports.iter().any(|name| name.starts_with(WASI_HTTP))
}

/// Defines every `wasi:http` import of `component` in `linker` as a trap.
///
/// Functions (constructors and methods included) trap with [`NotLinked`]. Resources that
/// an `wasi:http` interface declares get fresh host types that no value ever has; the ones
/// it only re-exports (`wasi:io` streams and pollables, or `types` resources named again by
/// `outgoing-handler`) are left to their own definition, as wasmtime-wasi-http leaves them.
pub(crate) fn link_http_as_traps(
    linker: &mut Linker<Sandbox>,
    engine: &Engine,
    component: &Component,
) -> wasmtime::Result<()> {
    let ty = component.component_type();
    // Resources of the other imports, then each stubbed one: seen once, defined once.
    let mut defined: Vec<ResourceType> = ty
        .imports(engine)
        .filter(|(name, _)| !name.starts_with(WASI_HTTP))
        .flat_map(|(_, import)| instance_resources(engine, import.ty))
        .collect();
    // Imports come in dependency order, so a resource's declaring interface comes before
    // any that re-exports it.
    for (interface, import) in ty.imports(engine) {
        if !interface.starts_with(WASI_HTTP) {
            continue;
        }
        let ComponentItem::ComponentInstance(instance) = import.ty else {
            continue;
        };
        let mut stubs = linker.instance(interface)?;
        for (name, export) in instance.exports(engine) {
            match export.ty {
                ComponentItem::ComponentFunc(_) => {
                    let import = format!("{interface}#{name}");
                    stubs.func_new(name, move |_, _, _, _| {
                        Err(wasmtime::Error::new(NotLinked {
                            import: import.clone(),
                        }))
                    })?;
                }
                ComponentItem::Resource(resource) if !defined.contains(&resource) => {
                    defined.push(resource);
                    let stub = u32::try_from(defined.len()).unwrap_or(u32::MAX);
                    stubs.resource(name, ResourceType::host_dynamic(stub), |_, _| Ok(()))?;
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// The resources an imported instance exports; nothing for other imports.
fn instance_resources(engine: &Engine, item: ComponentItem) -> Vec<ResourceType> {
    let ComponentItem::ComponentInstance(instance) = item else {
        return Vec::new();
    };
    instance
        .exports(engine)
        .filter_map(|(_, export)| match export.ty {
            ComponentItem::Resource(resource) => Some(resource),
            _ => None,
        })
        .collect()
}
