//! Host bindings generated from `wit/plugin.wit`.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "plugin",
    exports: { default: async },
});
