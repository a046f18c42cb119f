//! Raw bindings generated from `wit/plugin.wit`. Plugin authors use the typed API at the
//! crate root instead; these stay public for the export macro.

// Generated from the WIT, whose own comments document the contract.
#![allow(missing_docs)]

wit_bindgen::generate!({
    path: "../wit",
    world: "plugin",
    pub_export_macro: true,
    export_macro_name: "__export_plugin_world",
    default_bindings_module: "capstan_sdk::bindings",
});
