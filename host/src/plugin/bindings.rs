//! Host bindings generated from `wit/plugin.wit`.
//!
//! The `tasks` and `memory` imports are async: they run their SQLite work on a blocking
//! thread, so a slow store never holds an executor thread and the call's deadline can
//! abandon a guest waiting in one of them.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "plugin",
    imports: {
        "capstan:plugin/tasks": async,
        "capstan:plugin/memory": async,
    },
    exports: { default: async },
});
