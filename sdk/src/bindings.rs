//! Raw bindings generated from `wit/plugin.wit`. Plugin authors use the typed API at the
//! crate root instead; these stay public for the export macro.

wit_bindgen::generate!({
    path: "../wit",
    world: "plugin",
    pub_export_macro: true,
    export_macro_name: "__export_plugin_world",
    default_bindings_module: "capstan_sdk::bindings",
});
