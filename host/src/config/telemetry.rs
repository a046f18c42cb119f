//! `[telemetry]`: where traces go, and whether they may carry content.

use serde::Deserialize;

use super::error::{KeyError, key_error};
use crate::telemetry::TraceSettings;

/// The `service.name` of the host's spans.
const SERVICE_NAME: &str = "capstan";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTelemetry {
    #[serde(default)]
    otlp_endpoint: Option<String>,
    content: bool,
}

impl RawTelemetry {
    /// The trace settings; an endpoint must be an http or https URL with a host.
    pub(super) fn check(self) -> Result<TraceSettings, KeyError> {
        let otlp_endpoint = self.otlp_endpoint.as_deref().map(endpoint).transpose()?;
        Ok(TraceSettings {
            otlp_endpoint,
            content: self.content,
            service_name: SERVICE_NAME.to_owned(),
        })
    }
}

/// `otlp_endpoint` checked, as the URL parser spells it (percent-encoded, international
/// names in punycode), which the exporter takes.
fn endpoint(endpoint: &str) -> Result<String, KeyError> {
    let bad = |why: String| {
        key_error(
            "telemetry.otlp_endpoint",
            format!(
                "{why}: give the OTLP/HTTP receiver's base URL, e.g. \
                 \"http://127.0.0.1:4318\" (spans go to its /v1/traces)"
            ),
        )
    };
    let url = url::Url::parse(endpoint).map_err(|err| bad(format!("not a URL ({err})")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(bad(format!(
            "`{}` is not an http or https URL with a host",
            url.scheme()
        )));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad("it has a query or a fragment".into()));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad(
            "it holds a user name or password; give a receiver's credentials in \
             OTEL_EXPORTER_OTLP_HEADERS instead"
                .into(),
        ));
    }
    if url.path().trim_end_matches('/').ends_with("/v1/traces") {
        return Err(bad("it ends in /v1/traces, which is added to it".into()));
    }
    Ok(url.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(endpoint: &str) -> Result<TraceSettings, KeyError> {
        RawTelemetry {
            otlp_endpoint: Some(endpoint.to_owned()),
            content: false,
        }
        .check()
    }

    #[test]
    fn an_endpoint_is_an_http_url_with_a_host() {
        let settings = check("http://127.0.0.1:4318").unwrap();
        assert_eq!(
            settings.otlp_endpoint.as_deref(),
            Some("http://127.0.0.1:4318/")
        );
        assert_eq!(settings.service_name, "capstan");
        check("https://collector.example/otlp/").unwrap();
        // Spelled as the exporter takes it.
        let spelled = check("http://ex\u{e4}mple.com:4318/a b").unwrap();
        assert_eq!(
            spelled.otlp_endpoint.as_deref(),
            Some("http://xn--exmple-cua.com:4318/a%20b")
        );
        for bad in [
            "127.0.0.1:4318",
            "ftp://collector",
            "http://host/?x=1",
            "file:///tmp",
            "",
            "http://user:secret@collector:4318",
            "http://collector:4318/v1/traces",
            "http://collector:4318/v1/traces/",
        ] {
            let (key, why) = check(bad).unwrap_err();
            assert_eq!(key, "telemetry.otlp_endpoint", "{bad}");
            assert!(why.contains("/v1/traces"), "{bad}: {why}");
            assert!(!why.contains("secret"), "{bad}: {why}");
        }
    }
}
