//! Requests held until an operator answers (SPEC §3.5). Held in memory only: after a
//! restart, recovery settles a held invocation as `BROKER_RESTARTED_BEFORE_DISPATCH`.

use std::collections::HashMap;
use std::sync::Mutex;

use serde::Serialize;
use serde_json::Value;
use tokio::sync::oneshot;

/// One held request, as `GET /v1/approvals` lists it (SPEC §5.5), with what an operator
/// needs to decide: method, target, body size and a bounded, redacted preview.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Held {
    pub invocation_id: String,
    pub agent: String,
    pub route: String,
    pub method: String,
    pub target: String,
    pub fingerprint: String,
    pub requested_at: String,
    pub expires_at: String,
    pub body_bytes: usize,
    pub body_preview: String,
    /// The credential the request would be sent with (its id, never its value).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
    /// A binary body's first `HEX_BYTES` as hex (a text body is in the preview).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_hex: Option<String>,
    /// The request's headers as `[name, value]`, sensitive-looking values redacted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<(String, String)>,
    /// Headers past the shown ones (sent too when approved).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub headers_not_shown: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// How many headers, and how much of each value, an operator is shown.
const SHOWN_HEADERS: usize = 64;
const SHOWN_VALUE: usize = 256;
const SHOWN_NAME: usize = 128;

/// A request's headers as an operator reads them: names lowercased, values of
/// sensitive-looking names (`authorization`, `cookie`, `x-api-key`, …) redacted, long ones
/// cut, bytes that are not text said so.
pub fn shown_headers(headers: &http::HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .take(SHOWN_HEADERS)
        .map(|(name, value)| {
            let name = clipped(name.as_str(), SHOWN_NAME).to_ascii_lowercase();
            let shown = match (
                sensitive_header(&name),
                std::str::from_utf8(value.as_bytes()),
            ) {
                (true, _) => REDACTED.to_owned(),
                (false, Ok(v)) => clipped(v, SHOWN_VALUE),
                (false, Err(_)) => format!("(binary, {} bytes)", value.len()),
            };
            (name, shown)
        })
        .collect()
}

/// `text` up to `max` bytes (on a character boundary), `…` marking a cut.
fn clipped(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let cut = (0..=max).rev().find(|i| text.is_char_boundary(*i));
    format!("{}…", &text[..cut.unwrap_or(0)])
}

/// How many of a request's headers `shown_headers` leaves out (approving sends them too).
pub fn headers_not_shown(headers: &http::HeaderMap) -> usize {
    headers.len().saturating_sub(SHOWN_HEADERS)
}

/// A header name that ends in a sensitive word (`x-auth-token`, `x-api-key`, `cookie`): one
/// that only holds one (`x-token-target`) is shown, else an agent could hide any value.
fn sensitive_header(lower: &str) -> bool {
    SENSITIVE.iter().any(|k| lower.ends_with(k))
}

/// How much of a body the preview shows: enough for a whole API call's JSON, so what an
/// operator approves is what they read (a field past the preview is flagged, not hidden).
pub const PREVIEW_BYTES: usize = 4096;

/// How much of a binary body the hex view shows.
pub const HEX_BYTES: usize = 64;

/// A binary body's head as hex bytes (`89 50 4e 47 …`); none for text (see `preview`).
pub fn hex_head(body: &[u8]) -> Option<String> {
    let head = body.get(..PREVIEW_BYTES).unwrap_or(body);
    if body.is_empty() || crate::journal::as_text(head).is_some() {
        return None;
    }
    let shown = body.get(..HEX_BYTES).unwrap_or(body);
    let mut hex: Vec<String> = shown.iter().map(|b| format!("{b:02x}")).collect();
    if shown.len() < body.len() {
        hex.push("…".into());
    }
    Some(hex.join(" "))
}

/// Names whose values a preview never shows (form fields, JSON keys, header-like lines).
const SENSITIVE: &[&str] = &[
    "authorization",
    "password",
    "passwd",
    "secret",
    "token",
    "api_key",
    "apikey",
    "api-key",
    "cookie",
    "credential",
    "private_key",
];

const REDACTED: &str = "[redacted]";

/// One line an operator can read: the first `PREVIEW_BYTES` of a text body with the values
/// of sensitive-looking fields redacted, or `(binary, N bytes)`.
pub fn preview(body: &[u8]) -> String {
    let head = body.get(..PREVIEW_BYTES).unwrap_or(body);
    let Some(text) = crate::journal::as_text(head) else {
        return format!("(binary, {} bytes)", body.len());
    };
    // Keys written with escapes (`api\u005fkey`) are read as the names they are.
    let text = ascii_unescaped(text);
    // One line: line breaks shown escaped (as_text admits no other control character).
    let mut line = redact(&text)
        .replace('\n', "\\n")
        .replace('\r', "\\r")
        .replace('\t', "\\t");
    if head.len() < body.len() {
        line.push('…');
    }
    line
}

/// JSON's `\u00XX` escapes of letters, digits, `_` and `-` replaced by the character.
fn ascii_unescaped(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains("\\u00") {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("\\u00") {
        let plain = rest
            .get(at + 4..at + 6)
            .and_then(|hex| u8::from_str_radix(hex, 16).ok())
            .filter(|c| c.is_ascii_alphanumeric() || *c == b'_' || *c == b'-');
        out.push_str(&rest[..at]);
        match plain {
            Some(c) => {
                out.push(char::from(c));
                rest = &rest[at + 6..];
            }
            None => {
                out.push_str("\\u00");
                rest = &rest[at + 4..];
            }
        }
    }
    out.push_str(rest);
    std::borrow::Cow::Owned(out)
}

/// Replaces the value after each sensitive name with `[redacted]`.
fn redact(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let (mut copied, mut from) = (0, 0);
    while let Some(key_end) = next_sensitive(&lower, from) {
        from = key_end;
        let span = value_span(text.as_bytes(), key_end).or_else(|| part_span(&lower, key_end));
        let Some((start, end)) = span else {
            continue;
        };
        out.push_str(text.get(copied..start).unwrap_or_default());
        out.push_str(REDACTED);
        (copied, from) = (end, end);
    }
    out.push_str(text.get(copied..).unwrap_or_default());
    out
}

/// The end of the earliest sensitive name at or after `from`.
fn next_sensitive(lower: &str, from: usize) -> Option<usize> {
    let rest = lower.get(from..)?;
    SENSITIVE
        .iter()
        .filter_map(|k| rest.find(k).map(|at| (at, at + k.len())))
        .min()
        .map(|(_, end)| from + end)
}

/// The value after a name: the rest of the name, an optional closing quote, `=` or `:`,
/// then a quoted or bare value. `None` when no separator follows.
fn value_span(b: &[u8], mut i: usize) -> Option<(usize, usize)> {
    let at = |i: usize| b.get(i).copied();
    while at(i).is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-') {
        i += 1;
    }
    if matches!(at(i), Some(b'"' | b'\'')) {
        i += 1;
    }
    while at(i) == Some(b' ') {
        i += 1;
    }
    if !matches!(at(i), Some(b'=' | b':')) {
        return None;
    }
    i += 1;
    while at(i) == Some(b' ') {
        i += 1;
    }
    if let Some(end) = quoted_end(b, i) {
        return Some((i + 1, end));
    }
    let start = i + usize::from(at(i).is_some_and(|c| c == b'"' || c == b'\''));
    // A bare value is one word (two after an auth scheme: `Bearer x`): what follows it in
    // XML, GraphQL or prose (`<amount>`, `amount: 1000000`) stays in sight.
    let word_end = |from: usize| {
        (from..b.len())
            .find(|e| at(*e).is_some_and(ends_bare_value))
            .unwrap_or(b.len())
    };
    let first = word_end(start);
    let scheme = b.get(start..first).is_some_and(|w| {
        AUTH_SCHEMES
            .iter()
            .any(|s| w.eq_ignore_ascii_case(s.as_bytes()))
    });
    match scheme && at(first) == Some(b' ') {
        true => Some((start, word_end(first + 1))),
        false => Some((start, first)),
    }
}

/// The closing quote of a quoted value opening at `i`: within `MAX_QUOTED` bytes, on one
/// line, and holding no other quote or markup. Else the quote is not taken for one (it may
/// open another string of the body, and a span to its close would hide what lies between).
fn quoted_end(b: &[u8], i: usize) -> Option<usize> {
    let quote = b.get(i).copied().filter(|c| *c == b'"' || *c == b'\'')?;
    let rest = b.get(i + 1..)?;
    let len = rest.iter().take(MAX_QUOTED + 1).position(|c| *c == quote)?;
    let inside = rest.get(..len)?;
    let plain = !inside
        .iter()
        .any(|c| matches!(c, b'"' | b'\'' | b'<' | b'>' | b'\n' | b'\r'));
    plain.then_some(i + 1 + len)
}

/// The longest quoted value a preview hides whole.
const MAX_QUOTED: usize = 512;

/// Schemes an `Authorization`-like value starts with: the credential is the next word.
const AUTH_SCHEMES: &[&str] = &["bearer", "basic", "token", "digest", "negotiate", "bot"];

fn ends_bare_value(c: u8) -> bool {
    c.is_ascii_whitespace()
        || matches!(
            c,
            b'&' | b',' | b'}' | b']' | b';' | b'<' | b'>' | b'"' | b'\'' | b')' | b'('
        )
}

/// A multipart field's content when the name sits in its `Content-Disposition` line
/// (`name="password"`): from after the part's blank line to the next boundary line.
fn part_span(lower: &str, key_end: usize) -> Option<(usize, usize)> {
    // A multipart body opens with its boundary line; any other body is not one.
    if !lower.trim_start_matches(['\r', '\n']).starts_with("--") {
        return None;
    }
    let line_start = lower.get(..key_end)?.rfind('\n').map_or(0, |i| i + 1);
    if !lower
        .get(line_start..key_end)?
        .contains("content-disposition")
    {
        return None;
    }
    let after = lower.get(key_end..)?;
    let (blank, width) = [("\r\n\r\n", 4), ("\n\n", 2)]
        .into_iter()
        .filter_map(|(b, w)| after.find(b).map(|at| (at, w)))
        .min()?;
    // The part's own headers only: a boundary before the blank line is another part.
    if after.get(..blank)?.contains("\n--") {
        return None;
    }
    let start = key_end + blank + width;
    let end = lower.get(start..)?.find("\n--").map_or(lower.len(), |at| {
        let end = start + at;
        match lower.as_bytes().get(end.wrapping_sub(1)) {
            Some(b'\r') => end - 1,
            _ => end,
        }
    });
    Some((start, end))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Approve,
    Deny,
}

/// An operator's decision on a held request: the verdict, a note, and where it was given
/// (`api` for the API and the CLI, `console` for the web console).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub verdict: Verdict,
    pub note: Option<String>,
    pub via: &'static str,
}

impl Decision {
    /// A verdict nobody gave for this request alone (a suspension's denial).
    fn standing(verdict: Verdict) -> Self {
        Decision {
            verdict,
            note: None,
            via: "api",
        }
    }
}

/// An operator's decision, and where the exchange sends the record once it journaled it.
#[derive(Debug)]
pub struct Answer {
    pub decision: Decision,
    pub recorded: oneshot::Sender<Value>,
    /// Evidence of a denial no operator gave for this request alone: the agent's suspension
    /// (SPEC §5.8 kill switch), recorded as the failure's `suspension`.
    pub because: Option<Value>,
}

/// A held request as listed: with whether its caller is still connected. An approved
/// request whose caller left still dispatches (its result is stored and fetchable), so an
/// operator must see that before approving what may be an abandoned duplicate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Listed {
    #[serde(flatten)]
    pub held: Held,
    pub caller_gone: bool,
}

type Waiting = HashMap<String, (Listed, oneshot::Sender<Answer>)>;

/// The requests waiting for an answer, by invocation id.
#[derive(Debug, Default)]
pub struct Approvals {
    held: Mutex<Waiting>,
    /// Suspended agents (SPEC §5.8), with the suspension's evidence: a request of theirs
    /// is denied as it is held. Checked under the same lock a suspension denies under, so a
    /// request that passed the suspension check just before cannot slip into the wait.
    barred: Mutex<HashMap<String, Value>>,
    /// Moves on whenever the held set changes (the console's live list).
    changes: tokio::sync::watch::Sender<u64>,
}

impl Approvals {
    /// Holds a request; the receiver gets the operator's answer (at once a denial, when
    /// its agent is suspended).
    pub fn hold(&self, held: Held) -> oneshot::Receiver<Answer> {
        let (tx, rx) = oneshot::channel();
        let Ok(mut map) = self.held.lock() else {
            return rx;
        };
        let barred = self
            .barred
            .lock()
            .ok()
            .and_then(|b| b.get(&held.agent).cloned());
        if let Some(because) = barred {
            let (recorded, _) = oneshot::channel();
            let _ = tx.send(Answer {
                decision: Decision::standing(Verdict::Deny),
                recorded,
                because: Some(because),
            });
            return rx;
        }
        let id = held.invocation_id.clone();
        let listed = Listed {
            held,
            caller_gone: false,
        };
        map.insert(id, (listed, tx));
        drop(map);
        self.bump();
        rx
    }

    /// A receiver that sees every change of the held set.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn bump(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// SPEC §5.8: denies every request `agent` has held, with `because` as evidence, and
    /// every one it holds until `lift`. The ids denied.
    pub fn bar(&self, agent: &str, because: Value) -> Vec<String> {
        let Ok(mut map) = self.held.lock() else {
            return Vec::new();
        };
        if let Ok(mut barred) = self.barred.lock() {
            barred.insert(agent.to_owned(), because.clone());
        }
        let ids: Vec<String> = map
            .iter()
            .filter(|(_, (l, _))| l.held.agent == agent)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &ids {
            if let Some((_, waiter)) = map.remove(id) {
                // The record goes to no one: the suspension's answer lists the ids.
                let (recorded, _) = oneshot::channel();
                let because = Some(because.clone());
                let _ = waiter.send(Answer {
                    decision: Decision::standing(Verdict::Deny),
                    recorded,
                    because,
                });
            }
        }
        drop(map);
        if !ids.is_empty() {
            self.bump();
        }
        ids
    }

    /// The agent was resumed: its requests wait for an operator again.
    pub fn lift(&self, agent: &str) {
        if let Ok(mut barred) = self.barred.lock() {
            barred.remove(agent);
        }
    }

    /// Every held request, oldest first.
    pub fn list(&self) -> Vec<Listed> {
        let mut out: Vec<Listed> = self
            .held
            .lock()
            .map(|m| m.values().map(|(h, _)| h.clone()).collect())
            .unwrap_or_default();
        out.sort_by(|a, b| a.held.requested_at.cmp(&b.held.requested_at));
        out
    }

    /// The caller of a held request disconnected.
    pub fn caller_gone(&self, id: &str) {
        if let Ok(mut map) = self.held.lock()
            && let Some((listed, _)) = map.get_mut(id)
        {
            listed.caller_gone = true;
            drop(map);
            self.bump();
        }
    }

    /// Hands the verdict to the waiting exchange; `None` when nothing waits under `id`
    /// (never held, already answered, or expired). The receiver yields the record.
    pub fn answer(&self, id: &str, decision: Decision) -> Option<oneshot::Receiver<Value>> {
        let (_, waiter) = self.held.lock().ok()?.remove(id)?;
        self.bump();
        let (recorded, rx) = oneshot::channel();
        let because = None;
        waiter
            .send(Answer {
                decision,
                recorded,
                because,
            })
            .ok()?;
        Some(rx)
    }

    /// Stops holding `id` (its wait ended without an answer).
    pub fn release(&self, id: &str) {
        if let Ok(mut map) = self.held.lock()
            && map.remove(id).is_some()
        {
            drop(map);
            self.bump();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(id: &str, at: &str) -> Held {
        Held {
            invocation_id: id.into(),
            agent: "ci".into(),
            route: "pay".into(),
            method: "POST".into(),
            target: "https://pay.test/charge".into(),
            fingerprint: "sha256:x".into(),
            requested_at: at.into(),
            expires_at: at.into(),
            body_bytes: 0,
            body_preview: String::new(),
            credential: None,
            body_hex: None,
            headers: Vec::new(),
            headers_not_shown: 0,
        }
    }

    #[test]
    fn escaped_json_keys_and_multipart_fields_are_redacted() {
        let json = br#"{"api\u005fkey": "sk-live-1", "amount": 5}"#;
        let shown = preview(json);
        assert!(!shown.contains("sk-live-1"), "{shown}");
        assert!(shown.contains("amount"), "{shown}");
        let form = b"--b\r\nContent-Disposition: form-data; name=\"password\"\r\n\r\nhunter2\r\n\
                     --b\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nhello\r\n--b--\r\n";
        let shown = preview(form);
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("hello"), "{shown}");
        // A name that only looks sensitive outside a part's header is left alone.
        assert_eq!(
            preview(b"my password\n\nis not here"),
            "my password\\n\\nis not here"
        );
        assert_eq!(preview(br"\u00zz \u0022"), r"\u00zz \u0022");
    }

    #[test]
    fn headers_are_shown_with_sensitive_values_redacted() {
        let mut h = http::HeaderMap::new();
        let mut put = |n: &'static str, v: &[u8]| {
            if let Ok(v) = http::HeaderValue::from_bytes(v) {
                h.append(n, v);
            }
        };
        put("x-request-note", b"refund order 7");
        put("authorization", b"Bearer postern:pay");
        put("cookie", b"session=abc");
        put("x-api-key", b"k");
        put("x-auth-token", b"t");
        put("x-account-token-target", b"mallory");
        put("x-long", "é".repeat(300).as_bytes());
        put("x-raw", &[0xff, 0xfe]);
        let long_name = http::HeaderName::from_bytes(&[b'n'; 300]);
        if let Ok(name) = long_name {
            h.append(name, http::HeaderValue::from_static("v"));
        }
        let shown = shown_headers(&h);
        let get = |n: &str| shown.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
        assert_eq!(get("x-request-note"), Some("refund order 7"));
        for n in ["authorization", "cookie", "x-api-key", "x-auth-token"] {
            assert_eq!(get(n), Some(REDACTED), "{n}");
        }
        assert_eq!(
            get("x-account-token-target"),
            Some("mallory"),
            "not a token's name"
        );
        assert_eq!(headers_not_shown(&h), 0);
        for n in 0..SHOWN_HEADERS {
            let name = http::HeaderName::from_bytes(format!("x-pad-{n}").as_bytes());
            if let Ok(name) = name {
                h.append(name, http::HeaderValue::from_static("x"));
            }
        }
        assert_eq!(shown_headers(&h).len(), SHOWN_HEADERS);
        assert_eq!(headers_not_shown(&h), 9, "the rest is counted, not hidden");
        assert!(get("x-long").is_some_and(|v| v.ends_with('…') && v.len() <= SHOWN_VALUE + 3));
        assert_eq!(get("x-raw"), Some("(binary, 2 bytes)"));
        assert!(
            shown
                .iter()
                .any(|(n, _)| n.len() <= SHOWN_NAME + 3 && n.starts_with("nnn"))
        );
    }

    fn decide(verdict: Verdict) -> Decision {
        Decision {
            verdict,
            note: None,
            via: "api",
        }
    }

    #[test]
    fn a_preview_redacts_sensitive_values_and_summarizes_binary() {
        assert_eq!(
            preview(b"amount=5&api_token=t-1&note=hi"),
            "amount=5&api_token=[redacted]&note=hi"
        );
        assert_eq!(
            preview(b"{\"user\": \"a\", \"Password\": \"p w\"}"),
            "{\"user\": \"a\", \"Password\": \"[redacted]\"}"
        );
        assert_eq!(
            preview(b"Authorization: Bearer x\nok"),
            "Authorization: [redacted]\\nok"
        );
        assert_eq!(preview(b"tokens are fine"), "tokens are fine");
        // Only the value is hidden: what follows it in XML, GraphQL or prose stays in sight.
        assert_eq!(
            preview(b"<memo>ref token: 12</memo><amount>1000000</amount>"),
            "<memo>ref token: [redacted]</memo><amount>1000000</amount>"
        );
        assert_eq!(
            preview(b"{ pay(memo: \"secret: none\" amount: 1000000 to: \"mallory\") }"),
            "{ pay(memo: \"secret: [redacted]\" amount: 1000000 to: \"mallory\") }"
        );
        assert_eq!(
            preview(b"Authorization: token abc def"),
            "Authorization: [redacted] def"
        );
        // A quote that opens another string, or a blank line in JSON, hides nothing more.
        assert_eq!(
            preview(br#"{"a":"token:'", "amount": 1000000, "to": "mallory", "b":"'"}"#),
            r#"{"a":"token:'[redacted]", "amount": 1000000, "to": "mallory", "b":"'"}"#
        );
        assert_eq!(
            preview(b"{\"content-disposition token x\": 1,\n\n\"amount\": 1000000}"),
            "{\"content-disposition token x\": 1,\\n\\n\"amount\": 1000000}"
        );
        assert_eq!(preview(&[0, 1, 2, 255]), "(binary, 4 bytes)");
        assert_eq!(hex_head(&[0, 1, 2, 255]).as_deref(), Some("00 01 02 ff"));
        assert_eq!(hex_head(b"plain text"), None);
        let long = [7u8; 100];
        assert!(hex_head(&long).is_some_and(|h| h.ends_with("07 …")));
        let long = "a".repeat(PREVIEW_BYTES + 10);
        assert_eq!(preview(long.as_bytes()).chars().count(), PREVIEW_BYTES + 1);
    }

    #[test]
    fn an_answer_reaches_its_waiter_once() {
        let approvals = Approvals::default();
        let mut waiter = approvals.hold(held("act_b", "2026-01-01T00:00:02.000Z"));
        let _other = approvals.hold(held("act_a", "2026-01-01T00:00:01.000Z"));
        let ids: Vec<String> = approvals
            .list()
            .into_iter()
            .map(|h| h.held.invocation_id)
            .collect();
        assert_eq!(ids, ["act_a", "act_b"]);
        assert!(approvals.answer("act_b", decide(Verdict::Deny)).is_some());
        let got = waiter.try_recv().map(|a| a.decision.verdict).ok();
        assert_eq!(got, Some(Verdict::Deny));
        assert!(
            approvals
                .answer("act_b", decide(Verdict::Approve))
                .is_none(),
            "answered once"
        );
        assert!(
            approvals
                .answer("act_zz", decide(Verdict::Approve))
                .is_none()
        );
    }

    #[test]
    fn a_barred_agent_is_denied_what_it_holds_and_what_it_holds_next() {
        let approvals = Approvals::default();
        let mut first = approvals.hold(held("act_d", "2026-01-01T00:00:00.000Z"));
        let mut other = held("act_e", "2026-01-01T00:00:00.000Z");
        other.agent = "other".into();
        let _other = approvals.hold(other);
        let why = serde_json::json!({"id": "sus_1"});
        assert_eq!(approvals.bar("ci", why.clone()), ["act_d"]);
        let got = first
            .try_recv()
            .map(|a| (a.decision.verdict, a.because))
            .ok();
        assert_eq!(got, Some((Verdict::Deny, Some(why.clone()))));
        let mut next = approvals.hold(held("act_f", "2026-01-01T00:00:01.000Z"));
        let got = next
            .try_recv()
            .map(|a| (a.decision.verdict, a.because))
            .ok();
        assert_eq!(got, Some((Verdict::Deny, Some(why))));
        let listed: Vec<String> = approvals.list().into_iter().map(|l| l.held.agent).collect();
        assert_eq!(listed, ["other"], "another agent's request still waits");
        approvals.lift("ci");
        let _held = approvals.hold(held("act_g", "2026-01-01T00:00:02.000Z"));
        assert_eq!(
            approvals.list().len(),
            2,
            "resumed: held for an operator again"
        );
    }

    #[test]
    fn a_released_request_takes_no_answer() {
        let approvals = Approvals::default();
        let _waiter = approvals.hold(held("act_c", "2026-01-01T00:00:00.000Z"));
        approvals.release("act_c");
        assert!(approvals.list().is_empty());
        assert!(
            approvals
                .answer("act_c", decide(Verdict::Approve))
                .is_none()
        );
    }
}
