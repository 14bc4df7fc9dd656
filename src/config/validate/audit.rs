//! `[audit]` (SPEC §5.8): where the journal's events are exported as OTLP log records.

use super::Checker;
use super::via::host_and_port;
use crate::config::raw::RawAudit;
use crate::config::{AuditConfig, OtlpEndpoint, Scheme};

pub(super) fn validate(c: &mut Checker<'_>, raw: &RawAudit) -> AuditConfig {
    let otlp_endpoint = raw
        .otlp_endpoint
        .as_deref()
        .and_then(|text| match endpoint(text) {
            Ok(e) => Some(e),
            Err(why) => {
                c.bad("audit.otlp_endpoint", why);
                None
            }
        });
    AuditConfig { otlp_endpoint }
}

/// `http(s)://host[:port][/base]`: the OTLP/HTTP base URL logs are posted under
/// (`{base}/v1/logs`). No credentials, query or fragment: postern sends nothing else.
fn endpoint(text: &str) -> Result<OtlpEndpoint, String> {
    let uri: http::Uri = text
        .parse()
        .map_err(|_| "is not a URL such as \"http://collector:4318\"".to_owned())?;
    let (scheme, default_port) = match uri.scheme_str() {
        Some("http") => (Scheme::Http, 80),
        Some("https") => (Scheme::Https, 443),
        _ => return Err("must be an http:// or https:// URL".into()),
    };
    let Some(authority) = uri.authority() else {
        return Err("names no host".into());
    };
    // Said without the URL: what precedes `@` would be a password.
    if authority.as_str().contains('@') {
        return Err("must not carry credentials (user:password@)".into());
    }
    if uri.query().is_some() || text.contains('#') {
        return Err("must be a base URL without query or fragment".into());
    }
    let (host, port) = host_and_port(authority, default_port)?;
    Ok(OtlpEndpoint {
        scheme,
        host,
        port,
        base_path: uri.path().trim_end_matches('/').to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::endpoint;

    #[test]
    fn an_endpoint_is_a_base_url_logs_go_under() {
        let e = endpoint("http://Collector:4318").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("collector", 4318));
        assert_eq!(e.logs_path(), "/v1/logs");
        assert_eq!(e.to_string(), "http://collector:4318");
        let e = endpoint("https://otel.example/prefix/").unwrap();
        assert_eq!((e.port, e.logs_path()), (443, "/prefix/v1/logs".into()));
        let given = crate::config::OtlpEndpoint {
            base_path: "/prefix/v1/logs".into(),
            ..e.clone()
        };
        assert_eq!(given.logs_path(), "/prefix/v1/logs");
        let e = endpoint("http://[::1]:4318").unwrap();
        assert_eq!(
            (e.host.as_str(), e.authority()),
            ("::1", "[::1]:4318".into())
        );
        for bad in [
            "collector:4318",
            "grpc://collector:4317",
            "http://u:pw@collector:4318",
            "http://collector:4318?token=x",
            "http://collector:4318#x",
            "http://collector:99999",
            "http://",
        ] {
            assert!(endpoint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_bad_endpoint_is_reported_with_its_path_and_without_its_text() {
        let errors = crate::config::parse(
            "[audit]\notlp_endpoint = \"http://u:hunter2@c:1\"\n",
            None,
            &|_| None,
        )
        .unwrap_err();
        let text = format!("{errors}");
        assert!(text.contains("audit.otlp_endpoint"), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
        let ok = crate::config::parse("[audit]\notlp_endpoint = \"http://c:1\"\n", None, &|_| None);
        assert!(ok.unwrap().audit.otlp_endpoint.is_some());
        let unknown = crate::config::parse("[audit]\nendpoint = \"http://c:1\"\n", None, &|_| None);
        assert!(unknown.is_err());
    }

    #[test]
    fn a_reload_that_changes_the_endpoint_needs_a_restart() {
        let parse = |text: &str| crate::config::parse(text, None, &|_| None).unwrap();
        let none = parse("");
        let one = parse("[audit]\notlp_endpoint = \"http://c:1\"\n");
        let other = parse("[audit]\notlp_endpoint = \"http://c:2\"\n");
        assert!(
            crate::config::diff(&none, &one)
                .restart_needed
                .contains(&"audit")
        );
        assert!(
            crate::config::diff(&one, &other)
                .restart_needed
                .contains(&"audit")
        );
        assert!(crate::config::diff(&one, &one).restart_needed.is_empty());
    }
}
