//! A page of exported events as an OTLP `ExportLogsServiceRequest`: one log record per
//! event, its fields as `postern.*` attributes. Only what `Exported` holds goes in (the
//! same fields `postern audit export` prints): never event data, bodies or secrets.

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs, SeverityNumber};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

use crate::journal::Exported;

/// The request body of one batch, protobuf-encoded.
pub fn encode(events: &[Exported], node: Option<&str>) -> Bytes {
    Bytes::from(request(events, node).encode_to_vec())
}

/// One resource (this postern, and its fleet node id if it has one), one scope, the records.
pub fn request(events: &[Exported], node: Option<&str>) -> ExportLogsServiceRequest {
    let mut resource = vec![
        text("service.name", "postern"),
        text("service.version", env!("CARGO_PKG_VERSION")),
    ];
    if let Some(node) = node {
        resource.push(text("postern.node", node));
    }
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(Resource {
                attributes: resource,
                ..Resource::default()
            }),
            scope_logs: vec![ScopeLogs {
                scope: Some(InstrumentationScope {
                    name: "postern.journal".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..InstrumentationScope::default()
                }),
                log_records: events.iter().map(record).collect(),
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

fn record(e: &Exported) -> LogRecord {
    let time = unix_nanos(&e.ts);
    let mut attributes = vec![
        int("postern.seq", e.seq),
        text("postern.invocation_id", &e.invocation_id),
        text("postern.kind", e.kind.as_str()),
        text("postern.source", e.source.as_str()),
        text("postern.hop", &e.hop),
        text("postern.hash", &e.hash),
        text("postern.prev_hash", &e.prev_hash),
    ];
    // Absent when the record is gone (retention) or has none: no empty strings.
    let facts = [
        ("postern.agent", e.agent.as_deref()),
        ("postern.route", e.route.as_deref()),
        ("postern.outcome", e.outcome.map(|o| o.as_str())),
        ("postern.code", e.code.map(|c| c.as_str())),
    ];
    attributes.extend(facts.iter().filter_map(|(k, v)| v.map(|v| text(k, v))));
    LogRecord {
        time_unix_nano: time,
        observed_time_unix_nano: time,
        severity_number: SeverityNumber::Info as i32,
        severity_text: "INFO".into(),
        body: Some(string_value(e.kind.as_str())),
        attributes,
        event_name: "postern.journal_event".into(),
        ..LogRecord::default()
    }
}

/// The event's RFC 3339 time in Unix nanoseconds; 0 (OTLP's "unknown") if it does not parse.
fn unix_nanos(ts: &str) -> u64 {
    time::OffsetDateTime::parse(ts, &time::format_description::well_known::Rfc3339)
        .ok()
        .and_then(|t| u64::try_from(t.unix_timestamp_nanos()).ok())
        .unwrap_or(0)
}

fn string_value(value: &str) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::StringValue(value.to_owned())),
    }
}

fn text(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(string_value(value)),
        ..KeyValue::default()
    }
}

fn int(key: &str, value: u64) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        // A seq never reaches 2^63: saturate rather than wrap if one ever did.
        value: Some(AnyValue {
            value: Some(any_value::Value::IntValue(
                i64::try_from(value).unwrap_or(i64::MAX),
            )),
        }),
        ..KeyValue::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{Code, Outcome};
    use crate::journal::{EventKind, Source};

    fn exported(seq: u64) -> Exported {
        Exported {
            seq,
            ts: "2026-01-02T03:04:05.678Z".into(),
            invocation_id: "act_1".into(),
            kind: EventKind::ActionAccepted,
            source: Source::TransportObserved,
            hop: "agent".into(),
            hash: "sha256:bb".into(),
            prev_hash: "sha256:aa".into(),
            agent: Some("ci".into()),
            route: None,
            outcome: Some(Outcome::Unknown),
            code: Some(Code::RemoteTimeout),
        }
    }

    fn attr<'a>(r: &'a LogRecord, key: &str) -> Option<&'a any_value::Value> {
        r.attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref()?.value.as_ref())
    }

    #[test]
    fn each_event_is_one_record_with_its_fields_as_attributes() {
        let bytes = encode(&[exported(7), exported(8)], Some("a"));
        let decoded = ExportLogsServiceRequest::decode(bytes).unwrap();
        let resource = &decoded.resource_logs[0];
        let res_attrs = &resource.resource.as_ref().unwrap().attributes;
        assert!(res_attrs.iter().any(|kv| kv.key == "postern.node"));
        let records = &resource.scope_logs[0].log_records;
        assert_eq!(records.len(), 2);
        let r = &records[0];
        assert_eq!(attr(r, "postern.seq"), Some(&any_value::Value::IntValue(7)));
        let s = |v: &str| Some(any_value::Value::StringValue(v.into()));
        assert_eq!(attr(r, "postern.kind").cloned(), s("ACTION_ACCEPTED"));
        assert_eq!(attr(r, "postern.agent").cloned(), s("ci"));
        assert_eq!(attr(r, "postern.outcome").cloned(), s("unknown"));
        assert_eq!(attr(r, "postern.code").cloned(), s("REMOTE_TIMEOUT"));
        assert_eq!(attr(r, "postern.hash").cloned(), s("sha256:bb"));
        assert_eq!(attr(r, "postern.source").cloned(), s("transport_observed"));
        assert_eq!(attr(r, "postern.route"), None, "no route, no attribute");
        assert_eq!(r.time_unix_nano, 1_767_323_045_678_000_000);
    }

    #[test]
    fn a_time_that_does_not_parse_is_unknown() {
        assert_eq!(unix_nanos("yesterday"), 0);
    }
}
