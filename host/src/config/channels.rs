//! `[channels.NAME]`: messaging adapters `capstan serve` runs, who may talk through them,
//! and to which conversation.

use std::collections::BTreeMap;
use std::path::PathBuf;

use capstan_caps::NetRule;
use serde::Deserialize;

use super::error::{KeyError, key_error};
use super::network::parse_rules;
use crate::net::mail::{MailAccount, MailServer, Protocol};
use crate::secrets::SecretSpec;

/// The longest channel name: it starts the name of every conversation it opens.
pub const MAX_CHANNEL_NAME: usize = 16;

/// How a channel's messages are mapped to conversations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConversationPer {
    /// One conversation per room (chat, channel, mailbox).
    Room,
    /// One per thread, or per room for messages in no thread.
    Thread,
    /// One per sender, across rooms.
    Sender,
}

impl ConversationPer {
    /// Its name in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            ConversationPer::Room => "room",
            ConversationPer::Thread => "thread",
            ConversationPer::Sender => "sender",
        }
    }
}

/// How the host knows an event pushed to `POST /hooks/NAME` comes from the platform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookSignature {
    /// Slack's `v0` signature: HMAC-SHA256 of `v0:TIMESTAMP:BODY` with the app's signing
    /// secret, held by `[secrets.NAME]`.
    Slack {
        /// The secret's name.
        secret: String,
    },
    /// Discord's: Ed25519 over `TIMESTAMP` and the body, checked with the application's
    /// public key.
    Discord {
        /// The key.
        public_key: [u8; 32],
    },
}

/// Senders named in a channel's lists: by the platform's id, or `*` for everyone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Senders {
    any: bool,
    ids: Vec<String>,
}

impl Senders {
    /// Whether `id` is on the list.
    ///
    /// ```
    /// use capstan_host::config::Config;
    ///
    /// let text = "[secrets.T]\nenv = \"T\"\nhosts = [\"api.telegram.org\"]\n\
    ///             [channels.tg]\nadapter = \"telegram.wasm\"\nnet = [\"api.telegram.org\"]\n\
    ///             allow = [\"*\"]\ntrusted = [\"42\"]\n";
    /// let config = Config::parse(text, "capstan.toml".as_ref()).unwrap();
    /// let tg = &config.channels[0];
    /// assert!(tg.allow.contains("7") && tg.trusted.contains("42") && !tg.trusted.contains("7"));
    /// ```
    pub fn contains(&self, id: &str) -> bool {
        self.any || self.ids.iter().any(|known| known == id)
    }

    /// Whether the list names nobody.
    pub fn is_empty(&self) -> bool {
        !self.any && self.ids.is_empty()
    }

    /// The list as the config writes it.
    pub fn names(&self) -> Vec<String> {
        if self.any {
            vec!["*".into()]
        } else {
            self.ids.clone()
        }
    }
}

/// One `[channels.NAME]` table.
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelSpec {
    /// Its name: lowercase letters, digits and `-`.
    pub name: String,
    /// The adapter component, resolved against the config file's directory.
    pub adapter: PathBuf,
    /// The hosts its adapter may reach.
    pub net: Vec<NetRule>,
    /// The `[secrets.NAME]` its requests may carry.
    pub secrets: Vec<String>,
    /// How messages map to conversations.
    pub per: ConversationPer,
    /// Who may talk to the agent through it (the `channel` profile).
    pub allow: Senders,
    /// Who talks to the admin conversation instead (the `cortex` profile), in direct
    /// messages; in a room with others they talk as anyone on `allow` does.
    pub admins: Senders,
    /// Whose messages are labelled trusted; everyone else's are
    /// `untrusted(chat:NAME:SENDER)`.
    pub trusted: Senders,
    /// In rooms with others, answer only messages that speak to the bot.
    pub addressed_only: bool,
    /// How long a poll may wait for a message (a long poll), in milliseconds.
    pub poll_wait_ms: u32,
    /// `[channels.NAME.settings]`, as JSON: handed to the adapter as is.
    pub settings: String,
    /// `[channels.NAME.email]`: the mailbox the host reads and sends through for the
    /// adapter (`capstan:channel/mail`).
    pub email: Option<MailAccount>,
    /// `[channels.NAME.hook]`: the platform pushes its events to `POST /hooks/NAME`,
    /// signed, and the adapter is not polled.
    pub hook: Option<HookSignature>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawChannel {
    adapter: PathBuf,
    #[serde(default)]
    net: Vec<String>,
    #[serde(default)]
    secrets: Vec<String>,
    #[serde(default)]
    conversation: Option<String>,
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    admins: Vec<String>,
    #[serde(default)]
    trusted: Vec<String>,
    #[serde(default)]
    addressed_only: Option<bool>,
    #[serde(default)]
    poll_wait_secs: Option<u32>,
    #[serde(default)]
    settings: Option<toml::Table>,
    #[serde(default)]
    email: Option<RawEmail>,
    #[serde(default)]
    hook: Option<RawHook>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHook {
    signature: String,
    #[serde(default)]
    secret: Option<String>,
    #[serde(default)]
    public_key: Option<String>,
}

/// `raw`, the `[TABLE.hook]` of a channel.
fn check_hook(
    table: &str,
    raw: RawHook,
    secrets: &[SecretSpec],
) -> Result<HookSignature, KeyError> {
    let table = format!("{table}.hook");
    match (raw.signature.as_str(), raw.secret, raw.public_key) {
        ("slack", Some(secret), None) => {
            if !secrets.iter().any(|s| s.name.as_str() == secret) {
                return Err(key_error(
                    &format!("{table}.secret"),
                    format!(
                        "names the secret holding Slack's signing secret, and no \
                         [secrets.{secret}] is configured; add that table"
                    ),
                ));
            }
            Ok(HookSignature::Slack { secret })
        }
        ("discord", None, Some(key)) => {
            let bytes = crate::text::unhex(&key)
                .and_then(|v| <[u8; 32]>::try_from(v).ok())
                .ok_or_else(|| {
                    key_error(
                        &format!("{table}.public_key"),
                        "the application's public key is 64 hexadecimal digits (Discord's \
                         developer portal, General Information)",
                    )
                })?;
            Ok(HookSignature::Discord { public_key: bytes })
        }
        ("slack", _, _) => Err(key_error(
            &table,
            "signature = \"slack\" takes `secret` (the [secrets.NAME] holding the app's \
             signing secret) and no `public_key`",
        )),
        ("discord", _, _) => Err(key_error(
            &table,
            "signature = \"discord\" takes `public_key` (the application's) and no `secret`",
        )),
        (other, _, _) => Err(key_error(
            &format!("{table}.signature"),
            format!("`{other}` is not one of \"slack\" or \"discord\""),
        )),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEmail {
    imap: String,
    smtp: String,
    user: String,
    password: String,
    address: String,
    #[serde(default)]
    folder: Option<String>,
}

/// `raw`, the `[TABLE.email]` of a channel, checked against the `secrets` configured.
fn check_email(
    table: &str,
    raw: RawEmail,
    secrets: &[SecretSpec],
) -> Result<MailAccount, KeyError> {
    let table = format!("{table}.email");
    let server = |key: &str, text: &str, protocol: Protocol| -> Result<MailServer, KeyError> {
        let server: MailServer = text
            .parse()
            .map_err(|e: String| key_error(&format!("{table}.{key}"), e))?;
        if server.protocol != protocol {
            return Err(key_error(
                &format!("{table}.{key}"),
                format!("`{text}` is not an {} server", key.to_uppercase()),
            ));
        }
        Ok(server)
    };
    let imap = server("imap", &raw.imap, Protocol::Imap)?;
    let smtp = server("smtp", &raw.smtp, Protocol::Smtp)?;
    if !secrets.iter().any(|s| s.name.as_str() == raw.password) {
        return Err(key_error(
            &format!("{table}.password"),
            format!(
                "names the secret holding the password, and no [secrets.{}] is configured; \
                 add that table (env = \"VARIABLE\" or file = \"PATH\")",
                raw.password
            ),
        ));
    }
    let plausible = |text: &str| {
        text.split_once('@')
            .is_some_and(|(l, d)| !l.is_empty() && (d.contains('.') || d == "localhost"))
            && !text
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || c == '<')
    };
    if !plausible(&raw.address) {
        return Err(key_error(
            &format!("{table}.address"),
            format!(
                "`{}` is not an address such as agent@example.org",
                raw.address
            ),
        ));
    }
    if raw.user.is_empty() || raw.user.chars().any(char::is_control) {
        return Err(key_error(
            &format!("{table}.user"),
            "the login name is empty or has control characters",
        ));
    }
    let folder = raw.folder.unwrap_or_else(|| "INBOX".into());
    // IMAP names other folders in modified UTF-7, which the host does not write.
    if folder.is_empty()
        || !folder.is_ascii()
        || folder
            .chars()
            .any(|c| c.is_control() || c == '"' || c == '\\')
    {
        return Err(key_error(
            &format!("{table}.folder"),
            "an ASCII folder name without quotes, backslashes or control characters",
        ));
    }
    Ok(MailAccount {
        imap,
        smtp,
        user: raw.user,
        password: raw.password,
        address: raw.address,
        folder,
    })
}

/// The longest long poll: well inside a call's deadline.
pub const MAX_POLL_WAIT_SECS: u32 = 5;

pub(super) fn check_channels(
    raw: BTreeMap<String, RawChannel>,
    secrets: &[SecretSpec],
    resolve: &impl Fn(PathBuf) -> PathBuf,
) -> Result<Vec<ChannelSpec>, KeyError> {
    let mut channels = Vec::new();
    for (name, raw) in raw {
        let table = format!("channels.{name}");
        let name_ok = !name.is_empty()
            && name.len() <= MAX_CHANNEL_NAME
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !name_ok {
            return Err(key_error(
                &table,
                format!(
                    "a channel's name is 1 to {MAX_CHANNEL_NAME} lowercase letters, digits or \
                     '-'; it starts the names of its conversations"
                ),
            ));
        }
        let net = parse_rules(&format!("{table}.net"), &raw.net)?;
        for (i, secret) in raw.secrets.iter().enumerate() {
            if !secrets.iter().any(|s| s.name.as_str() == secret) {
                return Err(key_error(
                    &format!("{table}.secrets[{i}]"),
                    format!("no [secrets.{secret}] is configured; add that table first"),
                ));
            }
        }
        let per = match raw.conversation.as_deref() {
            None | Some("room") => ConversationPer::Room,
            Some("thread") => ConversationPer::Thread,
            Some("sender") => ConversationPer::Sender,
            Some(other) => {
                return Err(key_error(
                    &format!("{table}.conversation"),
                    format!("`{other}` is not one of \"room\", \"thread\" or \"sender\""),
                ));
            }
        };
        let senders = |key: &str, list: Vec<String>| -> Result<Senders, KeyError> {
            let mut senders = Senders::default();
            for (i, id) in list.into_iter().enumerate() {
                if id == "*" {
                    senders.any = true;
                } else if id.trim().is_empty() || id.trim() != id || id.len() > 256 {
                    return Err(key_error(
                        &format!("{table}.{key}[{i}]"),
                        "a sender is the platform's id for them (1 to 256 characters, no space \
                         around it), or `*`",
                    ));
                } else {
                    senders.ids.push(id);
                }
            }
            Ok(senders)
        };
        // Email addresses are read without regard to case (the adapter lowers them).
        let email = raw.email.is_some();
        let lower = |list: Vec<String>| -> Vec<String> {
            if email {
                list.into_iter().map(|id| id.to_lowercase()).collect()
            } else {
                list
            }
        };
        let allow = senders("allow", lower(raw.allow))?;
        let admins = senders("admins", lower(raw.admins))?;
        let trusted = senders("trusted", lower(raw.trusted))?;
        if trusted.any {
            return Err(key_error(
                &format!("{table}.trusted"),
                "name each trusted sender; `*` would take anyone on the platform at their word",
            ));
        }
        if admins.any {
            return Err(key_error(
                &format!("{table}.admins"),
                "name each admin; `*` would give everyone on the platform the cortex's tools",
            ));
        }
        let wait = raw.poll_wait_secs.unwrap_or(MAX_POLL_WAIT_SECS);
        if wait > MAX_POLL_WAIT_SECS {
            return Err(key_error(
                &format!("{table}.poll_wait_secs"),
                format!("must be 0 to {MAX_POLL_WAIT_SECS} seconds, got {wait}"),
            ));
        }
        let settings = serde_json::to_string(&raw.settings.unwrap_or_default())
            .map_err(|e| key_error(&format!("{table}.settings"), e.to_string()))?;
        let email = raw
            .email
            .map(|email| check_email(&table, email, secrets))
            .transpose()?;
        let hook = raw
            .hook
            .map(|hook| check_hook(&table, hook, secrets))
            .transpose()?;
        channels.push(ChannelSpec {
            adapter: resolve(raw.adapter),
            net,
            secrets: raw.secrets,
            per,
            allow,
            admins,
            trusted,
            addressed_only: raw.addressed_only.unwrap_or(true),
            poll_wait_ms: wait * 1000,
            settings,
            email,
            hook,
            name,
        });
    }
    Ok(channels)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::Config;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, Path::new("/etc/capstan/capstan.toml")).map_err(|e| e.to_string())
    }

    #[test]
    fn a_channel_is_read_with_its_defaults() {
        let config = parse(
            "[channels.mx]\nadapter = \"adapters/matrix.wasm\"\nnet = [\"http://127.0.0.1:8008\"]\n\
             allow = [\"@alice:localhost\"]\n[channels.mx.settings]\nhomeserver = \"http://x\"\n",
        )
        .unwrap();
        let mx = &config.channels[0];
        assert_eq!(mx.adapter, Path::new("/etc/capstan/adapters/matrix.wasm"));
        assert_eq!(mx.per, super::ConversationPer::Room);
        assert!(mx.addressed_only && mx.trusted.is_empty());
        assert_eq!(mx.settings, r#"{"homeserver":"http://x"}"#);
    }

    #[test]
    fn an_email_table_is_read_with_its_servers_and_inbox() {
        let config = parse(
            "[secrets.PW]\nenv = \"PW\"\n[channels.mail]\nadapter = \"email.wasm\"\n\
             allow = [\"Alice@Example.org\"]\n[channels.mail.email]\nimap = \"imaps://imap.example.org\"\n\
             smtp = \"smtp+starttls://smtp.example.org\"\nuser = \"agent\"\npassword = \"PW\"\n\
             address = \"agent@example.org\"\n",
        )
        .unwrap();
        let email = config.channels[0].email.as_ref().unwrap();
        assert_eq!(email.imap.to_string(), "imaps://imap.example.org:993");
        assert_eq!(
            email.smtp.to_string(),
            "smtp+starttls://smtp.example.org:587"
        );
        assert_eq!(
            (email.folder.as_str(), email.password.as_str()),
            ("INBOX", "PW")
        );
    }

    #[test]
    fn bad_tables_are_refused_naming_the_key() {
        for (text, said) in [
            ("[channels.Bad]\nadapter = \"a.wasm\"\n", "`channels.Bad`"),
            (
                "[channels.a]\nadapter = \"a.wasm\"\nsecrets = [\"NOPE\"]\n",
                "`channels.a.secrets[0]`: no [secrets.NOPE]",
            ),
            (
                "[channels.a]\nadapter = \"a.wasm\"\nconversation = \"day\"\n",
                "`channels.a.conversation`",
            ),
            (
                "[channels.a]\nadapter = \"a.wasm\"\nadmins = [\"*\"]\n",
                "`channels.a.admins`",
            ),
            (
                "[channels.a]\nadapter = \"a.wasm\"\npoll_wait_secs = 60\n",
                "`channels.a.poll_wait_secs`",
            ),
            (
                "[channels.a]\nadapter = \"a.wasm\"\ntoken = \"x\"\n",
                "token",
            ),
            (
                "[channels.m]\nadapter = \"e.wasm\"\n[channels.m.email]\nimap = \"imaps://i.example.org\"\n\
                 smtp = \"smtps://s.example.org\"\nuser = \"u\"\npassword = \"PW\"\naddress = \"a@example.org\"\n",
                "`channels.m.email.password`: names the secret holding the password, and no [secrets.PW]",
            ),
            (
                "[secrets.PW]\nenv = \"PW\"\n[channels.m]\nadapter = \"e.wasm\"\n[channels.m.email]\n\
                 imap = \"imap://mail.example.org\"\nsmtp = \"smtps://s.example.org\"\nuser = \"u\"\n\
                 password = \"PW\"\naddress = \"a@example.org\"\n",
                "`channels.m.email.imap`: `imap://mail.example.org` would send the password in plain text",
            ),
            (
                "[secrets.PW]\nenv = \"PW\"\n[channels.m]\nadapter = \"e.wasm\"\n[channels.m.email]\n\
                 imap = \"smtps://s.example.org\"\nsmtp = \"smtps://s.example.org\"\nuser = \"u\"\n\
                 password = \"PW\"\naddress = \"a@example.org\"\n",
                "`channels.m.email.imap`: `smtps://s.example.org` is not an IMAP server",
            ),
            (
                "[secrets.PW]\nenv = \"PW\"\n[channels.m]\nadapter = \"e.wasm\"\n[channels.m.email]\n\
                 imap = \"imaps://i.example.org\"\nsmtp = \"smtps://s.example.org\"\nuser = \"u\"\n\
                 password = \"PW\"\naddress = \"nobody\"\n",
                "`channels.m.email.address`",
            ),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(said), "{text}: {err}");
        }
    }
}
