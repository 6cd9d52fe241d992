//! `[telemetry]`: OpenTelemetry trace export over OTLP/HTTP. Off unless an endpoint is
//! given, in the file or (overriding it, as the environment does for every key) by the
//! standard `OTEL_EXPORTER_OTLP_ENDPOINT` or `--otlp-endpoint`.

use serde::Deserialize;

use super::Error;

pub(crate) const DEFAULT_SERVICE_NAME: &str = "commitpoint";

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTelemetry {
    /// The collector's base URL, e.g. `http://127.0.0.1:4318`; spans go to `/v1/traces` under it.
    pub otlp_endpoint: Option<String>,
    pub service_name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TelemetryOptions {
    /// Where spans are POSTed (the base URL with `/v1/traces`); `None`: export is off.
    pub traces_url: Option<String>,
    pub service_name: String,
}

impl Default for TelemetryOptions {
    fn default() -> Self {
        Self { traces_url: None, service_name: DEFAULT_SERVICE_NAME.to_string() }
    }
}

impl TelemetryOptions {
    /// `endpoint`: from the environment or a flag, which win over the file.
    pub(super) fn resolve(raw: &RawTelemetry, endpoint: Option<&str>) -> Result<Self, Error> {
        let endpoint = endpoint.or(raw.otlp_endpoint.as_deref()).map(str::trim).filter(|e| !e.is_empty());
        let traces_url = endpoint.map(traces_url).transpose()?;
        let service_name = match raw.service_name.as_deref().map(str::trim) {
            None => DEFAULT_SERVICE_NAME.to_string(),
            Some(name) if !name.is_empty() && name.len() <= 255 && !name.chars().any(char::is_control) => {
                name.to_string()
            }
            Some(_) => {
                return Err(Error::Invalid {
                    key: "telemetry.service_name",
                    reason: "must be 1-255 characters without control characters".into(),
                });
            }
        };
        Ok(Self { traces_url, service_name })
    }

    pub(crate) fn describe(&self) -> String {
        match &self.traces_url {
            None => "[telemetry]\n# trace export: off".to_string(),
            Some(url) => format!("[telemetry]\n# traces to {url}\nservice_name = {:?}", self.service_name),
        }
    }
}

/// The OTLP/HTTP convention (as for `OTEL_EXPORTER_OTLP_ENDPOINT`): the endpoint is a base
/// URL and each signal has its path under it. Only plain http(s) with a host is accepted, and
/// no credentials in the URL: a collector's token would then show in `config check`.
fn traces_url(endpoint: &str) -> Result<String, Error> {
    let invalid = |reason: String| Error::Invalid { key: "telemetry.otlp_endpoint", reason };
    let url = super::file::http_url("telemetry.otlp_endpoint", endpoint)?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(invalid("must not hold credentials; send them with OTEL_EXPORTER_OTLP_HEADERS".into()));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid(format!("{endpoint:?} must not have a query or fragment")));
    }
    Ok(format!("{}/v1/traces", url.as_str().trim_end_matches('/')))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(endpoint: Option<&str>) -> RawTelemetry {
        RawTelemetry { otlp_endpoint: endpoint.map(str::to_owned), service_name: None }
    }

    #[test]
    fn off_unless_an_endpoint_is_given() {
        assert_eq!(TelemetryOptions::resolve(&raw(None), None).unwrap(), TelemetryOptions::default());
        assert_eq!(TelemetryOptions::resolve(&raw(Some(" ")), None).unwrap().traces_url, None);
    }

    #[test]
    fn the_signal_path_goes_under_the_base_url() {
        let at = |e: &str| TelemetryOptions::resolve(&raw(Some(e)), None).unwrap().traces_url.unwrap();
        assert_eq!(at("http://127.0.0.1:4318"), "http://127.0.0.1:4318/v1/traces");
        assert_eq!(at("https://otel.internal/collector/"), "https://otel.internal/collector/v1/traces");
    }

    #[test]
    fn the_environment_wins_over_the_file() {
        let options = TelemetryOptions::resolve(&raw(Some("http://file:4318")), Some("http://env:4318")).unwrap();
        assert_eq!(options.traces_url.as_deref(), Some("http://env:4318/v1/traces"));
    }

    #[test]
    fn bad_endpoints_are_refused_naming_the_key() {
        for bad in
            ["127.0.0.1:4318", "localhost", "ftp://host/", "http://user:pw@host:4318", "http://h/?a=1", "http://"]
        {
            let err = TelemetryOptions::resolve(&raw(Some(bad)), None).unwrap_err().to_string();
            assert!(err.starts_with("telemetry.otlp_endpoint: "), "{bad}: {err}");
        }
    }

    #[test]
    fn a_blank_service_name_is_refused() {
        let raw = RawTelemetry { otlp_endpoint: None, service_name: Some(" ".into()) };
        let err = TelemetryOptions::resolve(&raw, None).unwrap_err().to_string();
        assert!(err.starts_with("telemetry.service_name: "), "{err}");
    }
}
