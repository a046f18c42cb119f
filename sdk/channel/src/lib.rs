//! Write messaging adapters: components that bring a chat platform to the host.
//!
//! An adapter implements [`Adapter`] and exports it with [`export_adapter!`].
//! The host polls it for new messages and hands each to a conversation, and sends the
//! conversations' replies through it. It is a plugin like any other: it reaches the
//! platform with [`capstan_sdk::http`] over the host's egress, which holds the bot token and
//! injects it (in a header, or as the path prefix some platforms want), so an adapter never
//! sees its credential. What it returns is untrusted text; the host labels it by sender.
//!
//! ```
//! use capstan_channel::{Adapter, AdapterError, Batch, Outbound, Platform, Feature};
//!
//! struct Echo;
//!
//! impl Adapter for Echo {
//!     fn describe(_settings: String) -> Result<Platform, AdapterError> {
//!         Ok(Platform {
//!             name: "echo".into(),
//!             max_text: 4096,
//!             features: vec![Feature::Mentions],
//!             capabilities: vec!["net:chat.example.com".into()],
//!         })
//!     }
//!     fn poll(_s: String, cursor: Option<String>, _wait_ms: u32) -> Result<Batch, AdapterError> {
//!         Ok(Batch { messages: vec![], cursor })
//!     }
//!     fn send(_s: String, message: Outbound) -> Result<String, AdapterError> {
//!         Ok(format!("sent-{}", message.text.len()))
//!     }
//! }
//!
//! capstan_channel::export_adapter!(Echo);
//! # fn main() {}
//! ```

use serde::de::DeserializeOwned;

#[doc(hidden)]
pub use capstan_sdk as __sdk;

use capstan_sdk::http::{HttpError, Response};

#[doc(hidden)]
pub mod bindings {
    //! Raw bindings generated from `wit/channel/channel.wit`; the imports are the
    //! plugin's own ([`capstan_sdk::bindings`]).

    // Generated from the WIT, whose own comments document the contract.
    #![allow(missing_docs)]

    wit_bindgen::generate!({
        path: ["../../wit", "../../wit/channel"],
        world: "capstan:channel/messaging-adapter",
        with: {
            "capstan:plugin/types@0.2.1": capstan_sdk::bindings::capstan::plugin::types,
            "capstan:plugin/log@0.2.1": capstan_sdk::bindings::capstan::plugin::log,
            "capstan:plugin/tasks@0.2.1": capstan_sdk::bindings::capstan::plugin::tasks,
            "capstan:plugin/memory@0.2.1": capstan_sdk::bindings::capstan::plugin::memory,
            "capstan:plugin/secrets@0.2.1": capstan_sdk::bindings::capstan::plugin::secrets,
        },
        pub_export_macro: true,
        export_macro_name: "__export_adapter_world",
        default_bindings_module: "capstan_channel::bindings",
    });
}

pub use bindings::capstan::channel::types::{
    AdapterError, Attachment, Batch, Feature, Inbound, Outbound, Platform, Received, Sender,
};

/// The channel's mailbox, for an email adapter: the host reads it over IMAP and sends
/// over SMTP with the account `[channels.NAME.email]` names, which the adapter never sees.
/// An adapter of a channel without that table is answered `denied`.
pub mod mail {
    pub use crate::bindings::capstan::channel::mail::{Fetched, Letter, Mark, Stored, fetch, send};
}

/// A messaging adapter: what the host calls. Each call runs in a fresh sandbox; keep the
/// state that must survive (where the last poll ended) in the cursor, which the host
/// stores.
///
/// `settings` is the channel's `[channels.NAME.settings]` table as JSON, the same on
/// every call: read it with [`settings`].
pub trait Adapter {
    /// What the adapter supports and needs.
    fn describe(settings: String) -> Result<Platform, AdapterError>;

    /// New messages since `cursor` (`None`: from now on), waiting up to `wait_ms` for one.
    /// By default the platform is not polled: it pushes its events ([`Adapter::receive`]).
    fn poll(settings: String, cursor: Option<String>, wait_ms: u32) -> Result<Batch, AdapterError> {
        let _ = (settings, cursor, wait_ms);
        Err(AdapterError::Failed(
            "this platform pushes its events to the host: give the channel a \
             [channels.NAME.hook] table and point the platform at POST /hooks/NAME"
                .into(),
        ))
    }

    /// Reads an event the platform pushed (its signature checked by the host): what to
    /// answer at once, and the messages it brought. It must read the same messages from
    /// the same body every time, and send nothing. By default the platform pushes nothing.
    fn receive(settings: String, body: String) -> Result<Received, AdapterError> {
        let _ = (settings, body);
        Err(AdapterError::Failed(
            "this adapter polls its platform: it takes no pushed events".into(),
        ))
    }

    /// Sends `message`; the platform's id for it.
    fn send(settings: String, message: Outbound) -> Result<String, AdapterError>;

    /// Replaces the text of message `id`. By default the platform has no edits.
    fn edit(settings: String, room: String, id: String, text: String) -> Result<(), AdapterError> {
        let _ = (settings, room, id, text);
        Err(AdapterError::Failed(
            "this adapter does not edit messages".into(),
        ))
    }

    /// Shows that the bot is writing. By default nothing is shown.
    fn typing(settings: String, room: String, thread: Option<String>) -> Result<(), AdapterError> {
        let _ = (settings, room, thread);
        Ok(())
    }
}

/// The channel's settings, read as `T`.
///
/// ```
/// #[derive(serde::Deserialize)]
/// struct Settings { base_url: String }
///
/// let s: Settings = capstan_channel::settings(r#"{"base_url":"http://x"}"#).unwrap();
/// assert_eq!(s.base_url, "http://x");
/// assert!(capstan_channel::settings::<Settings>("{}").is_err());
/// ```
pub fn settings<T: DeserializeOwned>(json: &str) -> Result<T, AdapterError> {
    serde_json::from_str(json)
        .map_err(|e| AdapterError::Failed(format!("[channels] settings: {e}")))
}

impl From<HttpError> for AdapterError {
    fn from(err: HttpError) -> Self {
        match err {
            HttpError::Refused(m) => AdapterError::Denied(m),
            other => AdapterError::Failed(other.message().to_owned()),
        }
    }
}

/// The capabilities of an adapter that goes wherever its channel's grants say its platform
/// is (any host, internal ones included, by either scheme) with the secret they grant:
/// `[channels.NAME]`'s `net` and `secrets` decide, and the adapter declares no more.
///
/// ```
/// assert_eq!(capstan_channel::where_the_channel_grants().len(), 3);
/// ```
pub fn where_the_channel_grants() -> Vec<String> {
    ["net:*://*:*", "net:*://{internal}:*", "secret:*"]
        .map(String::from)
        .to_vec()
}

/// How long `response` asks to wait before the next request, in milliseconds, from its
/// `retry-after` header (seconds, possibly fractional); `None` without one.
///
/// ```
/// use capstan_channel::retry_after_ms;
/// use capstan_sdk::http::Response;
///
/// let r = Response {
///     status: 429,
///     headers: vec![("retry-after".into(), "2".into())],
///     body: vec![],
///     truncated: false,
/// };
/// assert_eq!(retry_after_ms(&r), Some(2000));
/// ```
pub fn retry_after_ms(response: &Response) -> Option<u64> {
    let value = response.header("retry-after")?;
    let seconds: f64 = value.trim().parse().ok()?;
    (seconds.is_finite() && seconds >= 0.0).then(|| (seconds * 1000.0).ceil() as u64)
}

/// Exports `$adapter`, a type implementing [`Adapter`],
/// as this component's `capstan:channel/adapter`, with a `capstan:plugin/tool` export that
/// offers no tool (an adapter is a plugin the host loads as any other).
#[macro_export]
macro_rules! export_adapter {
    ($adapter:ty) => {
        #[doc(hidden)]
        struct __CapstanAdapter;

        impl $crate::bindings::exports::capstan::channel::adapter::Guest
            for __CapstanAdapter
        {
            fn describe(
                settings: ::std::string::String,
            ) -> ::std::result::Result<$crate::Platform, $crate::AdapterError>
            {
                <$adapter as $crate::Adapter>::describe(settings)
            }

            fn poll(
                settings: ::std::string::String,
                cursor: ::std::option::Option<::std::string::String>,
                wait_ms: u32,
            ) -> ::std::result::Result<$crate::Batch, $crate::AdapterError> {
                <$adapter as $crate::Adapter>::poll(settings, cursor, wait_ms)
            }

            fn receive(
                settings: ::std::string::String,
                body: ::std::string::String,
            ) -> ::std::result::Result<$crate::Received, $crate::AdapterError> {
                <$adapter as $crate::Adapter>::receive(settings, body)
            }

            fn send(
                settings: ::std::string::String,
                message: $crate::Outbound,
            ) -> ::std::result::Result<::std::string::String, $crate::AdapterError>
            {
                <$adapter as $crate::Adapter>::send(settings, message)
            }

            fn edit(
                settings: ::std::string::String,
                room: ::std::string::String,
                id: ::std::string::String,
                text: ::std::string::String,
            ) -> ::std::result::Result<(), $crate::AdapterError> {
                <$adapter as $crate::Adapter>::edit(settings, room, id, text)
            }

            fn typing(
                settings: ::std::string::String,
                room: ::std::string::String,
                thread: ::std::option::Option<::std::string::String>,
            ) -> ::std::result::Result<(), $crate::AdapterError> {
                <$adapter as $crate::Adapter>::typing(settings, room, thread)
            }
        }

        impl $crate::bindings::exports::capstan::plugin::tool::Guest for __CapstanAdapter {
            fn describe() -> ::std::vec::Vec<
                $crate::bindings::exports::capstan::plugin::tool::ToolSpec,
            > {
                ::std::vec::Vec::new()
            }

            fn call(
                name: ::std::string::String,
                _args_json: ::std::string::String,
                _context: $crate::__sdk::bindings::capstan::plugin::types::CallContext,
            ) -> ::std::result::Result<
                ::std::string::String,
                $crate::bindings::exports::capstan::plugin::tool::ToolError,
            > {
                ::std::result::Result::Err(
                    $crate::bindings::exports::capstan::plugin::tool::ToolError::NotFound(
                        ::std::format!("a messaging adapter offers no tool `{name}`"),
                    ),
                )
            }
        }

        $crate::bindings::__export_adapter_world!(
            __CapstanAdapter with_types_in $crate::bindings
        );
    };
}
