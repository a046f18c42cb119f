//! How spans leave the host: OTLP/HTTP protobuf ([`super::otlp`] writes it), posted by the
//! host's HTTP client, on a runtime of the batches' own thread, to the receiver the config
//! or the standard `OTEL_EXPORTER_OTLP_*` variables name.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

use super::otlp::{self, EncodedResource};

/// The most of a receiver's answer read: it says only whether it took the batch.
const MAX_ANSWER: usize = 64 * 1024;

/// How long one batch may take to send, unless `OTEL_EXPORTER_OTLP_TIMEOUT` says.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Where spans go: the receiver's `/v1/traces` URL, the headers each batch carries
/// (`OTEL_EXPORTER_OTLP_HEADERS`) and how long one may take.
#[derive(Clone, PartialEq)]
pub(super) struct Target {
    url: reqwest::Url,
    headers: HeaderMap,
    timeout: Duration,
}

impl Target {
    /// The target `endpoint` names (a base URL, `/v1/traces` added) or, unset, the
    /// variables: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as it is, else
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` with `/v1/traces` added. `var` reads a variable.
    pub(super) fn resolve(
        endpoint: Option<&str>,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Target, String> {
        let set = |name: &str| var(name).filter(|value| !value.trim().is_empty());
        let traces = |base: &str| {
            let base = base.trim();
            match base.split_once('?') {
                Some((path, query)) => {
                    format!("{}/v1/traces?{query}", path.trim_end_matches('/'))
                }
                None => format!("{}/v1/traces", base.trim_end_matches('/')),
            }
        };
        let (url, from) = if let Some(base) = endpoint {
            (traces(base), "[telemetry] otlp_endpoint")
        } else if let Some(url) = set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            (url.trim().to_owned(), "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        } else if let Some(base) = set("OTEL_EXPORTER_OTLP_ENDPOINT") {
            (traces(&base), "OTEL_EXPORTER_OTLP_ENDPOINT")
        } else {
            return Err("no receiver is named: set [telemetry] otlp_endpoint".into());
        };
        let url = reqwest::Url::parse(&url)
            .ok()
            .filter(|url| matches!(url.scheme(), "http" | "https") && url.has_host())
            .ok_or_else(|| format!("{from} is not an http(s) URL with a host"))?;
        // The signal's own variable wins over the general one, for each setting.
        let setting = |name: &str| {
            let traces = name.replacen("OTLP_", "OTLP_TRACES_", 1);
            set(&traces)
                .map(|value| (traces, value))
                .or_else(|| set(name).map(|value| (name.to_owned(), value)))
        };
        let mut headers = HeaderMap::new();
        if let Some((name, list)) = setting("OTEL_EXPORTER_OTLP_HEADERS") {
            for (key, value) in parse_headers(&list, &name)? {
                headers.insert(key, value);
            }
        }
        let timeout = match setting("OTEL_EXPORTER_OTLP_TIMEOUT") {
            None => TIMEOUT,
            Some((name, ms)) => match ms.trim().parse::<u64>() {
                Ok(ms) if ms > 0 => Duration::from_millis(ms),
                _ => {
                    return Err(format!(
                        "{name} is not a whole number of milliseconds above 0: {ms:?}"
                    ));
                }
            },
        };
        if let Some((name, protocol)) =
            setting("OTEL_EXPORTER_OTLP_PROTOCOL").filter(|(_, p)| p.trim() != "http/protobuf")
        {
            return Err(format!(
                "{name}={protocol:?}: spans are sent as http/protobuf only; set it to that \
                 or unset it"
            ));
        }
        if let Some((name, compression)) =
            setting("OTEL_EXPORTER_OTLP_COMPRESSION").filter(|(_, c)| c.trim() != "none")
        {
            return Err(format!(
                "{name}={compression:?}: spans are sent uncompressed; set it to none or \
                 unset it"
            ));
        }
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-protobuf"),
        );
        headers.insert(
            http::header::USER_AGENT,
            HeaderValue::from_static(concat!("capstan/", env!("CARGO_PKG_VERSION"))),
        );
        Ok(Target {
            url,
            headers,
            timeout,
        })
    }
}

impl std::fmt::Debug for Target {
    /// The receiver's scheme, host, port and path only: a URL from the environment may
    /// hold a credential, and header values are marked sensitive.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let url = &self.url;
        f.debug_struct("Target")
            .field(
                "url",
                &format_args!(
                    "{}://{}:{}{}",
                    url.scheme(),
                    url.host_str().unwrap_or_default(),
                    url.port_or_known_default().unwrap_or_default(),
                    url.path()
                ),
            )
            .field("headers", &self.headers)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// `key=value,...` with each value percent-decoded, as the OTLP exporter's
/// specification says. A value is never quoted back: it is often a credential.
fn parse_headers(list: &str, var: &str) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    let mut headers = Vec::new();
    for pair in list
        .split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
    {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(format!(
                "{var}: an entry has no `=` (write name=value, separated by commas)"
            ));
        };
        let key = key.trim();
        // Not quoted either: a value written with `:` instead of `=` would be in it.
        let name = HeaderName::try_from(key).map_err(|_| {
            format!("{var}: an entry's name is not a header name (write name=value)")
        })?;
        let decoded = percent_encoding::percent_decode_str(value.trim())
            .decode_utf8()
            .map_err(|_| format!("{var}: the value of {key:?} is not UTF-8 once decoded"))?;
        let mut value = HeaderValue::try_from(decoded.as_ref())
            .map_err(|_| format!("{var}: the value of {key:?} is not a valid header value"))?;
        value.set_sensitive(true);
        headers.push((name, value));
    }
    Ok(headers)
}

/// The exporter to `target`, naming the process as `resource` says.
pub(super) fn exporter(target: Target, resource: EncodedResource) -> Result<OtlpHttp, String> {
    let client = reqwest::Client::builder()
        // A receiver answers where it is; a redirect elsewhere is not followed.
        .redirect(reqwest::redirect::Policy::none())
        .timeout(target.timeout)
        .build()
        .map_err(|err| format!("cannot make the HTTP client: {err}"))?;
    Ok(OtlpHttp {
        client,
        target,
        resource,
        last_size: AtomicUsize::new(0),
        failing: AtomicBool::new(false),
    })
}

/// Posts each batch, encoded with every string through the log's redactor, to its
/// [`Target`] from the batches' own thread and runtime, so that a host runtime that is
/// busy, single-threaded or gone never holds a flush up;
/// the first batch of a run of failed ones is logged, and the batch that ends the run.
#[derive(Debug)]
pub(super) struct OtlpHttp {
    client: reqwest::Client,
    target: Target,
    resource: EncodedResource,
    /// The last body's size: the next one's buffer is made that large at once.
    last_size: AtomicUsize,
    failing: AtomicBool,
}

impl OtlpHttp {
    async fn send(&self, body: Vec<u8>) -> Result<(), String> {
        let request = self
            .client
            .post(self.target.url.clone())
            .headers(self.target.headers.clone())
            .body(body);
        let mut response = request.send().await.map_err(|err| {
            // With the cause, but not the URL (the endpoint is in the config).
            let mut causes = String::new();
            let mut cause = std::error::Error::source(&err);
            while let Some(inner) = cause {
                causes.push_str(&format!(": {inner}"));
                cause = inner.source();
            }
            format!("cannot reach it: {}{causes}", err.without_url())
        })?;
        let status = response.status();
        // Read (up to a bound) so that the connection is kept for the next batch.
        let mut read = 0;
        while let Ok(Some(chunk)) = response.chunk().await {
            read += chunk.len();
            if read > MAX_ANSWER {
                break;
            }
        }
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("it answered {status}"))
        }
    }

    /// Frames `spans` (entries already encoded, each as its span ended) as one request
    /// and sends it on `runtime`, waiting for the answer (bounded by the target's
    /// timeout): called on the batches' own thread, whose runtime this is.
    pub(super) fn export(&self, spans: &[u8], runtime: &tokio::runtime::Runtime) {
        let mut body = Vec::with_capacity(self.last_size.load(Ordering::Relaxed));
        otlp::encode_batch(
            &mut body,
            &self.resource,
            spans,
            &crate::secrets::log_redactor(),
        );
        self.last_size.store(body.len(), Ordering::Relaxed);
        let sent = runtime.block_on(self.send(body));
        match &sent {
            Err(err) if !self.failing.swap(true, Ordering::Relaxed) => tracing::warn!(
                "spans could not be sent to the OTLP receiver ({err}); they are dropped, and \
                 the next failures are not logged until a batch is sent: check [telemetry] \
                 otlp_endpoint or OTEL_EXPORTER_OTLP_ENDPOINT"
            ),
            Ok(()) if self.failing.swap(false, Ordering::Relaxed) => {
                tracing::warn!("spans are sent to the OTLP receiver again")
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(endpoint: Option<&str>, vars: &[(&str, &str)]) -> Result<Target, String> {
        Target::resolve(endpoint, |name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn the_config_wins_and_the_signal_variable_is_taken_as_it_is() {
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://general:4318/"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://traces:4318/custom",
            ),
        ];
        let url = |t: Result<Target, String>| t.unwrap().url.to_string();
        assert_eq!(
            url(resolve(Some("http://config:4318"), &vars)),
            "http://config:4318/v1/traces"
        );
        assert_eq!(url(resolve(None, &vars)), "http://traces:4318/custom");
        assert_eq!(
            url(resolve(None, &vars[..1])),
            "http://general:4318/v1/traces"
        );
        let err = resolve(None, &[("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://x")]).unwrap_err();
        assert!(err.contains("OTEL_EXPORTER_OTLP_ENDPOINT"), "{err}");
    }

    #[test]
    fn headers_are_decoded_and_their_values_never_quoted() {
        let general = (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "a=1, authorization=Bearer%20s3cret",
        );
        let target = resolve(Some("http://x"), &[general]).unwrap();
        assert_eq!(target.headers["a"], "1");
        assert_eq!(target.headers["authorization"], "Bearer s3cret");
        assert!(target.headers["authorization"].is_sensitive());
        assert!(!format!("{target:?}").contains("s3cret"));
        // The signal's own variable is taken whole, as every other setting is.
        let traces = ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "a=2");
        let target = resolve(Some("http://x"), &[general, traces]).unwrap();
        assert_eq!(target.headers["a"], "2");
        assert!(!target.headers.contains_key("authorization"));
        for bad in [
            "authorization",
            "bad name=s3cret",
            "x=s3cret%0A",
            "Authorization: Basic s3cret==",
        ] {
            let err =
                resolve(Some("http://x"), &[("OTEL_EXPORTER_OTLP_HEADERS", bad)]).unwrap_err();
            assert!(err.starts_with("OTEL_EXPORTER_OTLP_HEADERS"), "{err}");
            assert!(!err.contains("s3cret"), "{err}");
        }
    }

    #[test]
    fn a_timeout_is_milliseconds_and_other_protocols_are_refused() {
        let target = resolve(Some("http://x"), &[("OTEL_EXPORTER_OTLP_TIMEOUT", "2500")]);
        assert_eq!(target.unwrap().timeout, Duration::from_millis(2500));
        for (name, value) in [
            ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "soon"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip"),
        ] {
            let err = resolve(Some("http://x"), &[(name, value)]).unwrap_err();
            assert!(err.starts_with(name), "{err}");
        }
        let plain = [
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "none"),
        ];
        assert!(resolve(Some("http://x"), &plain).is_ok());
        // The signal's own variable wins over a general one it could not use.
        let overridden = [
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "soon"),
            ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "700"),
        ];
        let target = resolve(Some("http://x"), &overridden).unwrap();
        assert_eq!(target.timeout, Duration::from_millis(700));
        // No time at all would fail every batch.
        let err = resolve(Some("http://x"), &[("OTEL_EXPORTER_OTLP_TIMEOUT", "0")]);
        assert!(err.unwrap_err().contains("above 0"));
    }

    #[test]
    fn a_query_stays_after_the_path_and_credentials_stay_out_of_debug() {
        let vars = [(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "https://u:pw@r.example/base/?key=k1",
        )];
        let target = resolve(None, &vars).unwrap();
        assert_eq!(target.url.path(), "/base/v1/traces");
        assert_eq!(target.url.query(), Some("key=k1"));
        let shown = format!("{target:?}");
        assert!(
            shown.contains("https://r.example:443/base/v1/traces"),
            "{shown}"
        );
        assert!(!shown.contains("pw") && !shown.contains("k1"), "{shown}");
    }
}
