//! How `postern result` and `postern approvals` show the admin API's JSON to an operator:
//! text as text, binary summarized, nothing a terminal would interpret.

use std::borrow::Cow;

use serde_json::Value;

use crate::journal::{as_text, unb64};

fn s(v: &Value) -> Cow<'_, str> {
    printable(v.as_str().unwrap_or("-"))
}

/// A journaled string as a terminal may show it: control characters (an escape sequence, a
/// carriage return forging a line) escaped. Agents and origins choose much of what is
/// journaled.
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.contains(char::is_control) {
        return Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c.is_control() {
            true => shown.extend(c.escape_default()),
            false => shown.push(c),
        }
    }
    Cow::Owned(shown)
}

/// The stored result (SPEC §5.5 "Result"): HTTP, SSH or a tunnel's counts.
pub fn result(r: &Value, saved: Option<&str>) -> Vec<String> {
    let complete = if r["complete"].as_bool() == Some(true) {
        "complete"
    } else {
        "incomplete"
    };
    let mut out = vec![
        format!("invocation  {}", s(&r["invocation_id"])),
        format!("outcome     {} ({complete})", s(&r["outcome"])),
    ];
    if r.get("status").is_some() {
        http_result(r, saved, &mut out);
    } else if r.get("tunnel").is_some() {
        tunnel_result(r, &mut out);
    } else {
        ssh_result(r, saved, &mut out);
    }
    out
}

fn http_result(r: &Value, saved: Option<&str>, out: &mut Vec<String>) {
    out.push(format!("status      {}", r["status"]));
    out.push("headers".into());
    for h in r["headers"].as_array().into_iter().flatten() {
        out.push(format!("  {}: {}", s(&h[0]), s(&h[1])));
    }
    match r["body_base64"].as_str().and_then(unb64) {
        Some(body) => stream("body", &body, saved, out),
        None => out.push(format!(
            "body        (not stored: {} bytes, digest {})",
            r["bytes"],
            s(&r["digest"])
        )),
    }
}

/// A tunnel keeps counts, never bytes: postern could not read them.
fn tunnel_result(r: &Value, out: &mut Vec<String>) {
    let t = &r["tunnel"];
    out.push(format!(
        "tunnel      {} bytes up, {} bytes down, closed by {}",
        t["bytes_up"],
        t["bytes_down"],
        s(&t["closed_by"])
    ));
    out.push(format!(
        "body        (not stored: a tunnel's bytes are not read; digest {})",
        s(&r["digest"])
    ));
}

fn ssh_result(r: &Value, saved: Option<&str>, out: &mut Vec<String>) {
    match (r["exit_status"].as_i64(), r["exit_signal"].as_str()) {
        (Some(code), _) => out.push(format!("exit_status {code}")),
        (None, Some(signal)) => out.push(format!("exit_signal {signal}")),
        (None, None) => out.push("exit_status (none)".into()),
    }
    let stdout = r["stdout_base64"]
        .as_str()
        .and_then(unb64)
        .unwrap_or_default();
    let stderr = r["stderr_base64"]
        .as_str()
        .and_then(unb64)
        .unwrap_or_default();
    stream("stdout", &stdout, saved, out);
    stream("stderr", &stderr, None, out);
}

/// One body: its size, then the text, or a binary summary; `saved` when written to a file.
fn stream(name: &str, bytes: &[u8], saved: Option<&str>, out: &mut Vec<String>) {
    let n = bytes.len();
    if let Some(file) = saved {
        out.push(format!("{name:<11} {n} bytes written to {file}"));
        return;
    }
    match as_text(bytes) {
        Some(text) if n > 0 => {
            out.push(format!("{name:<11} {n} bytes"));
            out.push(text.trim_end_matches('\n').to_owned());
        }
        Some(_) => out.push(format!("{name:<11} (empty)")),
        None => out.push(format!(
            "{name:<11} (binary, {n} bytes; --output FILE to save)"
        )),
    }
}

/// The held requests, oldest first (SPEC §5.5 "Approvals").
pub fn approvals(list: &Value) -> Vec<String> {
    let held = list["approvals"].as_array().cloned().unwrap_or_default();
    if held.is_empty() {
        return vec!["no requests wait for approval".into()];
    }
    let mut out = Vec::new();
    for h in &held {
        let gone = if h["stale"] == true {
            "  (STALE: a reload removed its route; approving it refuses it, ROUTE_DENIED)"
        } else if h["caller_gone"] == true {
            "  (CALLER GONE: approving still dispatches)"
        } else {
            ""
        };
        out.push(format!(
            "{}  {} {}{gone}",
            s(&h["invocation_id"]),
            s(&h["method"]),
            s(&h["target"])
        ));
        out.push(format!(
            "  agent {}  route {}  requested {}  expires {}",
            s(&h["agent"]),
            s(&h["route"]),
            s(&h["requested_at"]),
            s(&h["expires_at"])
        ));
        out.push(format!("  fingerprint {}", s(&h["fingerprint"])));
        for pair in h["headers"].as_array().into_iter().flatten() {
            out.push(format!("  header {}: {}", s(&pair[0]), s(&pair[1])));
        }
        if let Some(n) = h["headers_not_shown"].as_u64() {
            out.push(format!(
                "  ({n} more headers not shown; approving sends them: deny what you cannot read whole)"
            ));
        }
        out.push(format!(
            "  body {} bytes: {}",
            h["body_bytes"],
            s(&h["body_preview"])
        ));
    }
    out
}

/// What `approve`/`deny` decided, from the record the daemon journaled.
pub fn decision(id: &str, approve: bool, record: &Value) -> String {
    let verb = if approve { "approved" } else { "denied" };
    let what = format!("{id} {} {}", s(&record["method"]), s(&record["target"]));
    match (approve, record["code"].as_str()) {
        (true, None) => format!("{what}: {verb}; dispatching"),
        (true, Some(code)) => format!(
            "{what}: {verb}, but not dispatched: {code} ({})",
            s(&record["outcome"])
        ),
        (false, code) => format!(
            "{what}: {verb}: {} ({})",
            code.unwrap_or("APPROVAL_DENIED"),
            s(&record["outcome"])
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn control_characters_are_shown_escaped() {
        assert_eq!(printable("ci \"ok\""), "ci \"ok\"");
        assert_eq!(printable("h\u{1b}[2J\r\nforged"), "h\\u{1b}[2J\\r\\nforged");
    }

    #[test]
    fn an_http_result_shows_text_and_summarizes_binary() {
        let text = json!({"invocation_id":"act_1","outcome":"committed","status":201,
            "headers":[["content-type","text/plain"]],"body_base64":"aGk=","complete":true});
        let lines = result(&text, None);
        assert!(lines.contains(&"  content-type: text/plain".to_owned()));
        assert_eq!(lines.last().map(String::as_str), Some("hi"));
        let binary = json!({"invocation_id":"act_1","outcome":"committed","status":200,
            "headers":[],"body_base64":"AAEC","complete":true});
        assert_eq!(
            result(&binary, None).last().map(String::as_str),
            Some("body        (binary, 3 bytes; --output FILE to save)")
        );
    }

    #[test]
    fn a_tunnel_result_shows_its_counts_and_no_body() {
        let r = json!({"invocation_id":"act_3","outcome":"committed","complete":true,
            "tunnel":{"bytes_up":517,"bytes_down":4096,"closed_by":"agent"},
            "digest":"sha256:ab","bytes":4096});
        let lines = result(&r, None);
        assert!(
            lines
                .contains(&"tunnel      517 bytes up, 4096 bytes down, closed by agent".to_owned()),
            "{lines:?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("body        (not stored")),
            "{lines:?}"
        );
    }

    #[test]
    fn an_ssh_result_shows_exit_status_and_both_streams() {
        let r = json!({"invocation_id":"act_2","outcome":"committed","exit_status":23,
            "stdout_base64":"b2sK","stderr_base64":"","complete":true});
        let lines = result(&r, None);
        assert!(lines.contains(&"exit_status 23".to_owned()), "{lines:?}");
        assert!(lines.contains(&"ok".to_owned()), "{lines:?}");
        assert!(
            lines.contains(&"stderr      (empty)".to_owned()),
            "{lines:?}"
        );
    }
}
