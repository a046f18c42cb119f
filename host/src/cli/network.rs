//! The network part of `capstan policy`: what each process kind and tool may reach, the
//! secrets, and `--why` for one request.

use std::io::Write;
use std::process::ExitCode;

use capstan_caps::Capability;

use crate::config::Config;
use crate::net::{GrantSource, NetScope, target_of};
use crate::policy::{Decision, ProcessKind};
use crate::tools::ToolCatalog;

/// Prints, per process kind, the network rules and secrets it is granted, and for each
/// tool offered to it that declares `net:`, what its calls may reach.
pub(super) fn print_network(
    out: &mut impl Write,
    config: &Config,
    catalog: &ToolCatalog,
) -> std::io::Result<()> {
    writeln!(out, "\nnetwork:")?;
    for kind in ProcessKind::ALL {
        let profile = config.policy.profile(kind);
        let rules: Vec<String> = profile.grants().net_rules().map(expanded).collect();
        let secrets: Vec<&str> = profile.grants().secret_names().collect();
        if rules.is_empty() && secrets.is_empty() {
            writeln!(out, "  {:<11}no network", format!("{kind}:"))?;
            continue;
        }
        writeln!(
            out,
            "  {:<11}net: {}; secrets: {}",
            format!("{kind}:"),
            or_none(&rules.join(", ")),
            or_none(&secrets.join(", "))
        )?;
        for tool in catalog.tools() {
            let declares_net = tool
                .capabilities
                .iter()
                .any(|c| matches!(c, Capability::Net(_)));
            if !declares_net || !catalog.is_offered(kind, tool.name()) {
                continue;
            }
            let grants = profile.grants_for(tool.name());
            let Ok(effective) = grants.effective(tool.name(), &tool.capabilities) else {
                continue;
            };
            let (mut reach, mut keys) = (Vec::new(), Vec::new());
            for cap in &effective {
                match cap {
                    Capability::Net(rule) => reach.push(expanded(rule)),
                    Capability::Secret(name) => keys.push(name.as_str()),
                    _ => {}
                }
            }
            writeln!(
                out,
                "    {:<18}reaches {}; secrets {}",
                tool.name(),
                reach.join(", "),
                or_none(&keys.join(", "))
            )?;
        }
    }
    if !config.secrets.is_empty() {
        writeln!(out, "\nsecrets:")?;
        for secret in &config.secrets {
            let hosts: Vec<String> = secret.hosts.iter().map(ToString::to_string).collect();
            let sent = match &secret.header {
                Some(header) => format!(
                    "sent in {} to {}",
                    header.name(),
                    or_none(&hosts.join(", "))
                ),
                None => "for signing only".to_owned(),
            };
            writeln!(
                out,
                "  {:<14}from the {}; {sent}",
                secret.name, secret.source
            )?;
        }
    }
    Ok(())
}

/// A rule as written and with every part spelled out: `* (any method, https, any public
/// host, port 443)`.
fn expanded(rule: &capstan_caps::NetRule) -> String {
    format!("\"{rule}\" ({})", rule.expanded())
}

/// What one half of the decision says of a request: the rule of it that allows it, or
/// that none does.
fn half(rule: Option<&capstan_caps::NetRule>) -> String {
    match rule {
        Some(rule) => format!("allows it, by {}", expanded(rule)),
        None => "does not allow it".to_owned(),
    }
}

fn or_none(text: &str) -> &str {
    if text.is_empty() { "none" } else { text }
}

/// `--why KIND TOOL URL`: walks the decision for one request and prints each step; exits
/// 1 when the request would be refused.
pub(super) async fn explain(
    out: &mut impl Write,
    config: &Config,
    catalog: &ToolCatalog,
    why: &[String],
    method: &str,
) -> anyhow::Result<ExitCode> {
    let [kind, tool, url] = why else {
        anyhow::bail!("--why takes KIND TOOL URL");
    };
    let kind: ProcessKind = kind.parse().map_err(anyhow::Error::msg)?;
    let method: http::Method = method
        .to_ascii_uppercase()
        .parse()
        .map_err(|_| anyhow::anyhow!("--method `{method}` is not an HTTP method"))?;
    let uri: http::Uri = url
        .parse()
        .map_err(|err| anyhow::anyhow!("`{url}` is not a URL: {err}"))?;
    let refuse = |out: &mut dyn Write, why: String| -> anyhow::Result<ExitCode> {
        writeln!(out, "refused: {why}")?;
        Ok(ExitCode::from(1))
    };
    let target = match target_of(&method, &uri) {
        Ok(target) => target,
        Err(why) => return refuse(out, format!("the URL is not accepted: {why}")),
    };
    writeln!(out, "request: {target}")?;
    let Some(info) = catalog.tool(tool) else {
        return refuse(out, format!("no tool `{tool}` is loaded"));
    };
    match catalog.decide(kind, tool) {
        Decision::Offered => writeln!(out, "tool:    `{tool}` is offered to {kind}")?,
        other => {
            return refuse(
                out,
                format!(
                    "`{tool}` is not offered to {kind}: {other}; see `capstan policy` for the \
                     matrix"
                ),
            );
        }
    }
    let profile = config.policy.profile(kind);
    let grants = profile.grants_for(tool);
    let effective = grants
        .effective(tool, &info.capabilities)
        .map_err(|denial| anyhow::anyhow!("{denial}"))?;
    let source = GrantSource::profile(kind, profile, tool);
    let declared: Vec<String> = info
        .capabilities
        .iter()
        .filter_map(|c| match c {
            Capability::Net(rule) => Some(expanded(rule)),
            _ => None,
        })
        .collect();
    writeln!(
        out,
        "declared by the tool: {}",
        or_none(&declared.join(", "))
    )?;
    let granted: Vec<String> = grants.net_rules().map(expanded).collect();
    writeln!(out, "granted to {kind}: {}", or_none(&granted.join(", ")))?;
    let Some(scope) = NetScope::new(
        tool,
        &effective,
        &info.capabilities,
        grants.net_rules(),
        source,
    ) else {
        return refuse(out, format!("`{tool}` holds no network rule for {kind}"));
    };
    let (declared, granted) = scope.halves(&target, None);
    writeln!(out, "the declaration: {}", half(declared))?;
    writeln!(out, "the grant:       {}", half(granted))?;
    let rule = match scope.check(&target) {
        Ok(rule) => rule.clone(),
        Err(refusal) => return refuse(out, refusal.to_string()),
    };
    writeln!(out, "allowed by both: {}", expanded(&rule))?;
    let addrs = match &target.host {
        capstan_caps::TargetHost::Ip(ip) => vec![*ip],
        capstan_caps::TargetHost::Name(name) => {
            match tokio::net::lookup_host((name.as_str(), target.port)).await {
                Ok(addrs) => addrs.map(|a| a.ip()).collect(),
                Err(err) => {
                    writeln!(
                        out,
                        "addresses: cannot resolve {name} here ({err}); each address is checked \
                         when the request is made"
                    )?;
                    return Ok(ExitCode::SUCCESS);
                }
            }
        }
    };
    for ip in addrs {
        let class = crate::net::AddressClass::of(ip);
        writeln!(out, "address: {ip} ({class})")?;
        let (declared, granted) = scope.halves(&target, Some(class));
        writeln!(out, "  the declaration: {}", half(declared))?;
        writeln!(out, "  the grant:       {}", half(granted))?;
        if let Err(refusal) = scope.check_address(&rule, &target, ip) {
            return refuse(out, refusal.to_string());
        }
    }
    let secrets: Vec<String> = effective
        .iter()
        .filter_map(|c| match c {
            Capability::Secret(name) => config
                .secrets
                .iter()
                .find(|s| s.name.as_str() == name && s.bound_to(&target))
                .and_then(|s| {
                    s.header
                        .as_ref()
                        .map(|h| format!("{name} (in {})", h.name()))
                }),
            _ => None,
        })
        .collect();
    writeln!(out, "secrets injected: {}", or_none(&secrets.join(", ")))?;
    writeln!(out, "allowed")?;
    Ok(ExitCode::SUCCESS)
}
