//! Host bindings generated from `wit/channel/channel.wit`: the `capstan:channel/adapter`
//! export and the `capstan:channel/mail` import. The other imports are the tool plugin's
//! own (the adapter world includes it), so an adapter links with the plugin's linker and
//! its bindings.

wasmtime::component::bindgen!({
    path: ["../wit", "../wit/channel"],
    world: "capstan:channel/messaging-adapter",
    with: {
        "capstan:plugin": crate::plugin::bindings::capstan::plugin,
        "capstan:plugin/tool": crate::plugin::bindings::exports::capstan::plugin::tool,
    },
    imports: {
        "capstan:channel/mail.fetch": async,
        "capstan:channel/mail.send": async,
    },
    exports: { default: async },
});
