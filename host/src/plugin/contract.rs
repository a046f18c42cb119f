//! What this host accepts of a component: the WIT package version it speaks, and the
//! interfaces a plugin may import.

use semver::Version;

/// The WIT package this host implements.
pub const WIT_PACKAGE: &str = "capstan:plugin";

/// The version of [`WIT_PACKAGE`] this host implements.
pub const WIT_VERSION: &str = "0.2.1";

/// The version of `capstan:channel` (`wit/channel/channel.wit`), the messaging adapters'
/// contract, this host implements.
pub const CHANNEL_WIT_VERSION: &str = "0.2.0";

/// The interface a plugin must export.
pub const TOOL_INTERFACE: &str = "tool";

/// Interfaces a plugin may import, each by its exact `namespace:package/interface` name.
///
/// Everything else is refused at load, before the component is compiled: nothing that
/// reaches a model or a conversation. `wasi:sockets` is accepted because standard runtimes
/// (Python's, JavaScript's) import it, but every address is refused; `wasi:http` requests
/// are refused unless the call holds a `net:` rule, and each is checked by the host.
pub const ALLOWED_IMPORTS: &[&str] = &[
    "capstan:plugin/types",
    "capstan:plugin/log",
    "capstan:plugin/tasks",
    "capstan:plugin/memory",
    "capstan:plugin/secrets",
    // Types only: what a messaging adapter's export speaks of.
    "capstan:channel/types",
    // The channel's mailbox: refused at every call but an email channel's adapter's.
    "capstan:channel/mail",
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:clocks/monotonic-clock",
    "wasi:clocks/wall-clock",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
    "wasi:filesystem/types",
    "wasi:filesystem/preopens",
    "wasi:sockets/network",
    "wasi:sockets/instance-network",
    "wasi:sockets/tcp",
    "wasi:sockets/tcp-create-socket",
    "wasi:sockets/udp",
    "wasi:sockets/udp-create-socket",
    "wasi:sockets/ip-name-lookup",
    "wasi:http/types",
    "wasi:http/outgoing-handler",
];

/// The WASI release line the host implements: a component's WASI imports must be of it.
const WASI_LINE: &str = "0.2.";

/// Whether an import name such as `wasi:filesystem/types@0.2.6` is on [`ALLOWED_IMPORTS`],
/// at a version this host implements (`capstan:plugin` at a [supported
/// version](version_supported), WASI 0.2).
pub fn import_allowed(name: &str) -> bool {
    let (interface, version) = split_version(name);
    if !ALLOWED_IMPORTS.contains(&interface) {
        return false;
    }
    match version {
        Some(version) if interface.starts_with("capstan:plugin/") => version_supported(version),
        Some(version) if interface.starts_with("capstan:channel/") => {
            version == CHANNEL_WIT_VERSION
        }
        Some(version) => version.starts_with(WASI_LINE),
        None => false,
    }
}

/// Splits `ns:pkg/iface@1.2.3` into the interface and its version.
pub fn split_version(name: &str) -> (&str, Option<&str>) {
    match name.split_once('@') {
        Some((interface, version)) => (interface, Some(version)),
        None => (name, None),
    }
}

/// Whether a component built against `capstan:plugin@{version}` can run here: same major
/// version (for 0.x, same minor, as Cargo reads semver), and not newer than ours.
pub fn version_supported(version: &str) -> bool {
    let (Ok(theirs), Ok(ours)) = (Version::parse(version), Version::parse(WIT_VERSION)) else {
        return false;
    };
    let same_line = if ours.major == 0 {
        theirs.major == 0 && theirs.minor == ours.minor
    } else {
        theirs.major == ours.major
    };
    same_line && theirs <= ours
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_of_the_same_line_and_not_newer_are_supported() {
        assert!(version_supported("0.2.1"));
        assert!(version_supported("0.2.0"), "0.2.1 only added interfaces");
        assert!(
            !version_supported("0.1.0"),
            "0.1 had task status and priority as strings"
        );
        assert!(!version_supported("0.3.0"));
        assert!(!version_supported("1.0.0"));
        assert!(!version_supported("0.2.2"), "newer than this host");
    }

    #[test]
    fn imports_are_allowed_by_exact_interface_and_a_version_the_host_implements() {
        assert!(import_allowed("wasi:filesystem/types@0.2.6"));
        assert!(import_allowed("wasi:sockets/tcp@0.2.12"));
        assert!(import_allowed("capstan:plugin/log@0.2.1"));
        assert!(import_allowed("capstan:channel/types@0.2.0"));
        assert!(import_allowed("capstan:channel/mail@0.2.0"));
        assert!(!import_allowed("capstan:channel/types@0.1.0"));
        assert!(!import_allowed("capstan:channel/types@0.3.0"));
        assert!(!import_allowed("capstan:channel/adapter@0.1.0"));
        for refused in [
            "wasi:sockets/made-up@0.2.12",
            "wasi:filesystem/types@0.3.0",
            "wasi:filesystem/types",
            "wasi:cli/run@0.2.6",
            "capstan:plugin/log@0.1.0",
            "capstan:plugin/model@0.2.1",
        ] {
            assert!(!import_allowed(refused), "{refused}");
        }
        assert!(!version_supported("not-a-version"));
    }

    #[test]
    fn only_listed_interfaces_may_be_imported() {
        assert!(import_allowed("wasi:filesystem/preopens@0.2.6"));
        assert!(import_allowed("wasi:cli/terminal-stdout@0.2.6"));
        assert!(import_allowed("capstan:plugin/log@0.2.0"));
        assert!(!import_allowed("capstan:plugin/log@0.1.0"));
        assert!(!import_allowed("capstan:plugin/log@1.0.0"));
        assert!(import_allowed("wasi:sockets/tcp@0.2.6"));
        assert!(import_allowed("wasi:http/outgoing-handler@0.2.6"));
        assert!(!import_allowed("wasi:http/incoming-handler@0.2.6"));
        assert!(!import_allowed("capstan:evil/model@0.1.0"));
        assert!(!import_allowed("wasi:cli/environmental@0.2.6"));
    }
}
