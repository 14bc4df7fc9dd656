//! The access log: one structured line per settled invocation (target `postern::access`),
//! whatever its transport. Query values are dropped; nothing secret is in a record.

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::projection::Record;

/// Logs a record that just settled.
pub fn settled(record: &Record) {
    let duration_ms = OffsetDateTime::parse(&record.created_at, &Rfc3339)
        .ok()
        .map(|start| (OffsetDateTime::now_utc() - start).whole_milliseconds())
        .and_then(|ms| u64::try_from(ms).ok());
    let status = record.result.as_ref().and_then(|r| r.status);
    tracing::info!(
        target: "postern::access",
        invocation = %record.invocation_id,
        agent = %record.agent,
        route = record.route.as_deref().unwrap_or("-"),
        method = record.method.as_deref().unwrap_or("-"),
        target = %without_query_values(&record.target),
        status,
        outcome = %record.outcome,
        code = record.code.map(|c| c.as_str()).unwrap_or("-"),
        duration_ms,
        "settled"
    );
}

/// `https://h/p?a=1&b=2` → `https://h/p?a=&b=`: the names say what was asked, values may
/// be personal or secret.
fn without_query_values(target: &str) -> String {
    let Some((base, query)) = target.split_once('?') else {
        return target.to_owned();
    };
    let names: Vec<&str> = query
        .split('&')
        .map(|kv| kv.split('=').next().unwrap_or(""))
        .collect();
    format!("{base}?{}=", names.join("=&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_dropped() {
        assert_eq!(without_query_values("https://h/p"), "https://h/p");
        assert_eq!(
            without_query_values("https://h/p?a=1&token=s3cret&flag"),
            "https://h/p?a=&token=&flag="
        );
    }
}
