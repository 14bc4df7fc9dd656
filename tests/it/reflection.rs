//! The reflection guard against an origin that echoes the injected credential in every
//! way it can: compressed (asked or not), in its reason phrase, base64 at any offset,
//! hex, `\u` escapes, percent-encoding, as a header name. A canary secret, and each of
//! its encodings, must surface nowhere an agent or operator can read.

use std::io::Write;
use std::process::Command;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use serde_json::Value;

use crate::origins::Origin;
use crate::support::{Daemon, Home, curl, get_json, secret_set};

const VAULT_KEY: &str = "vault-passphrase-for-tests";
const CANARY: &str = "canary-5f2a81-REFLECT-token";

/// The forms the canary must never take in any output.
fn forbidden() -> Vec<String> {
    let value = format!("Bearer {CANARY}");
    let mut v = vec![CANARY.to_owned(), CANARY.to_lowercase()];
    for e in [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD] {
        v.push(e.encode(CANARY));
        v.push(e.encode(&value));
        v.push(e.encode(format!("{CANARY}\n")));
    }
    for shift in ["x", "xy", "xyz"] {
        // The middle of the canary's base64 at an offset (the ends mix in other bits).
        let enc = STANDARD.encode(format!("{shift}{CANARY}"));
        v.push(enc[8..enc.len() - 8].to_owned());
    }
    let hex: String = CANARY.bytes().map(|b| format!("{b:02x}")).collect();
    v.push(hex.clone());
    v.push(hex.to_uppercase());
    v.push(CANARY.bytes().map(|b| format!("%{b:02X}")).collect());
    v.push(CANARY.bytes().map(|b| format!("%{b:02x}")).collect());
    v.push(
        CANARY
            .chars()
            .map(|c| format!("\\u{:04x}", c as u32))
            .collect(),
    );
    v.push(
        CANARY
            .chars()
            .map(|c| format!("\\u{:04X}", c as u32))
            .collect(),
    );
    v
}

fn assert_clean(what: &str, text: &str) {
    for f in forbidden() {
        assert!(
            !text.contains(&f),
            "{what} holds a form of the canary ({f}): {text}"
        );
    }
}

/// The echo an origin's debug endpoint makes of what it received, in every form.
fn forms_body(secret: &str, value: &str) -> String {
    let hex: String = secret.bytes().map(|b| format!("{b:02x}")).collect();
    let pct: String = secret.bytes().map(|b| format!("%{b:02x}")).collect();
    let esc: String = secret
        .chars()
        .map(|c| format!("\\u{:04X}", c as u32))
        .collect();
    format!(
        "b64={}\nurl={}\nat1={}\nat2={}\nat3={}\nhex={hex}\nHEX={}\npct={pct}\nesc={esc}\nnl={}\n",
        STANDARD.encode(value),
        URL_SAFE_NO_PAD.encode(value),
        STANDARD.encode(format!("{{\"t\":\"{secret}\"}}")),
        STANDARD.encode(format!("ab{secret}")),
        STANDARD.encode(format!("abc{secret}!")),
        hex.to_uppercase(),
        STANDARD.encode(format!("{secret}\n")),
    )
}

fn compress(coding: &str, plain: &[u8]) -> Vec<u8> {
    match coding {
        "gzip" => {
            let mut w = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            w.write_all(plain).unwrap();
            w.finish().unwrap()
        }
        "deflate" => {
            let mut w = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
            w.write_all(plain).unwrap();
            w.finish().unwrap()
        }
        "br" => {
            let mut out = Vec::new();
            {
                let mut w = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
                w.write_all(plain).unwrap();
            }
            out
        }
        "zstd" => zstd::encode_all(plain, 3).unwrap(),
        _ => plain.to_vec(),
    }
}

fn header<'a>(req: &'a str, name: &str) -> Option<&'a str> {
    req.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn respond(s: &mut std::net::TcpStream, reason: &str, headers: &[String], body: &[u8]) {
    let mut head = format!(
        "HTTP/1.1 200 {reason}\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    let mut out = format!("{head}\r\n").into_bytes();
    out.extend_from_slice(body);
    let _ = s.write_all(&out);
}

/// `/echo[?coding=C]`: the request head back, coded as asked (`Accept-Encoding`) or as
/// `coding` says whatever was asked; `/reason`: the credential as the reason phrase;
/// `/forms`: every encoding, and a header named by the secret; `/stream`: a gzip SSE
/// stream of the echo; `/bomb`: a small gzip of 8 MiB of zeros.
fn echo_origin() -> Origin {
    // The last credential a request brought, as an origin's debug page would keep it.
    let kept = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    Origin::script(move |s, req| {
        let req = String::from_utf8_lossy(req).into_owned();
        let path = req.split(' ').nth(1).unwrap_or("/").to_owned();
        let value = header(&req, "authorization").unwrap_or("").to_owned();
        if let (false, Ok(mut k)) = (value.is_empty(), kept.lock()) {
            *k = value.clone();
        }
        let secret = value.strip_prefix("Bearer ").unwrap_or("").to_owned();
        let asked = header(&req, "accept-encoding").unwrap_or("").to_owned();
        let asked = asked.split(',').map(str::trim).find(|c| *c != "identity");
        let coding = match path.split_once("coding=") {
            Some((_, c)) => Some(c.to_owned()),
            None => asked.map(str::to_owned),
        };
        let h = |c: &Option<String>| -> Vec<String> {
            c.iter().map(|c| format!("content-encoding: {c}")).collect()
        };
        match path.split('?').next().unwrap_or("") {
            "/reason" => respond(s, &value, &[], b"ok"),
            "/pub/last" => {
                let last = kept.lock().map(|k| k.clone()).unwrap_or_default();
                let body = format!("last={last}\nb64={}\n", STANDARD.encode(&last));
                respond(s, "OK", &[format!("x-last: {last}")], body.as_bytes())
            }
            "/hop" => {
                let member =
                    format!("proxy-status: cdn; error=connection_refused; details=\"{value}\"");
                let body = b"cdn error";
                let head = format!(
                    "HTTP/1.1 502 Bad Gateway\r\ncontent-length: {}\r\nconnection: close\r\n{member}\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes());
                let _ = s.write_all(body);
            }
            "/escaped" => {
                // One character escaped: no whole form of the secret matches.
                let json = secret.replacen('C', "\\u0043", 1);
                let pct = secret.replacen('a', "%61", 1);
                respond(
                    s,
                    "OK",
                    &[],
                    format!("{{\"a\":\"{json}\",\"b\":\"{pct}\"}}").as_bytes(),
                );
            }
            "/forms" => {
                let named = vec![format!("{}: 1", secret.to_lowercase())];
                respond(s, "OK", &named, forms_body(&secret, &value).as_bytes())
            }
            "/range" => {
                // Honours `Range`, as a static file server would.
                let body = format!("0123456789tok={secret}=end");
                let range = header(&req, "range").and_then(|r| r.strip_prefix("bytes="));
                let span = range.and_then(|r| r.split_once('-')).and_then(|(a, b)| {
                    let (a, b) = (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?);
                    body.get(a..=b.min(body.len() - 1))
                });
                match span {
                    Some(part) => {
                        let head = format!(
                            "HTTP/1.1 206 Partial Content\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{part}",
                            part.len()
                        );
                        let _ = s.write_all(head.as_bytes());
                    }
                    None => respond(s, "OK", &[], body.as_bytes()),
                }
            }
            "/stream" => stream_events(s, &value),
            "/escaped-stream" => escaped_events(s, &secret),
            // The echo packed as a file, no `Content-Encoding` saying so.
            "/packed" => {
                let head = vec!["content-type: application/gzip".to_owned()];
                respond(s, "OK", &head, &compress("gzip", req.as_bytes()))
            }
            "/packed-clean" => {
                let head = vec!["content-type: application/gzip".to_owned()];
                respond(s, "OK", &head, &compress("gzip", b"nothing secret in here"))
            }
            "/bomb" => {
                let zeros = vec![0u8; 8 << 20];
                let g = Some("gzip".to_owned());
                respond(s, "OK", &h(&g), &compress("gzip", &zeros));
            }
            _ => {
                let coding = coding.filter(|c| !c.is_empty());
                let body = compress(coding.as_deref().unwrap_or(""), req.as_bytes());
                respond(s, "OK", &h(&coding), &body);
            }
        }
    })
}

/// A chunked gzip event stream, flushed per event, echoing the credential.
fn stream_events(s: &mut std::net::TcpStream, value: &str) {
    let _ = s.write_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n",
    );
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    for i in 0..3 {
        gz.write_all(format!("data: {i} {value}\n\n").as_bytes())
            .unwrap();
        gz.flush().unwrap();
        let part = std::mem::take(gz.get_mut());
        let _ = s.write_all(format!("{:x}\r\n", part.len()).as_bytes());
        let _ = s.write_all(&part);
        let _ = s.write_all(b"\r\n");
        std::thread::sleep(std::time::Duration::from_millis(30));
    }
    let rest = gz.finish().unwrap();
    let _ = s.write_all(format!("{:x}\r\n", rest.len()).as_bytes());
    let _ = s.write_all(&rest);
    let _ = s.write_all(b"\r\n0\r\n\r\n");
}

/// The canary partly escaped, each form split across chunks inside an escape or the
/// secret, as a chunked event stream: what an origin escaping some characters sends.
fn escaped_events(s: &mut std::net::TcpStream, secret: &str) {
    let _ = s.write_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
    );
    let first = secret.replacen('c', "\\u0063", 1);
    let pct = secret.replacen('c', "%63", 1).replacen('e', "%65", 1);
    let hex = secret.replacen('F', "\\x46", 1);
    let mixed = secret
        .replacen('c', "\\u0063", 1)
        .replacen('n', "%6E", 1)
        .replacen('o', "&#111;", 1);
    let events = format!(
        "data: {{\"a\":\"{first}\"}}\n\ndata: {pct}\n\ndata: {hex}\n\ndata: Bearer {mixed}\n\n"
    );
    // Cut inside `\u0063`, `%63`, `\x46`, `&#111;` and in the middle of each secret.
    let mut cuts: Vec<usize> = ["\\u00", "%6", "\\x4", "&#1", "5f2a", "REF"]
        .iter()
        .flat_map(|m| events.match_indices(m).map(|(i, _)| i + 2))
        .collect();
    cuts.sort_unstable();
    let mut at = 0;
    for cut in cuts.into_iter().chain([events.len()]) {
        let part = &events[at..cut];
        at = cut;
        let _ = s.write_all(format!("{:x}\r\n{part}\r\n", part.len()).as_bytes());
        let _ = s.flush();
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = s.write_all(b"0\r\n\r\n");
}

/// `text` with `\uXXXX`, `\xXX`, `%XX` and `&#NN;` undone, as an agent would read it.
fn unescaped(text: &str) -> String {
    let re = regex::Regex::new(
        r"\\u([0-9a-fA-F]{4})|\\x([0-9a-fA-F]{2})|%([0-9a-fA-F]{2})|&#([0-9]{1,7});",
    )
    .unwrap();
    re.replace_all(text, |c: &regex::Captures| {
        let (digits, radix) = match (c.get(1).or(c.get(2)).or(c.get(3)), c.get(4)) {
            (Some(h), _) => (h.as_str(), 16),
            (None, Some(d)) => (d.as_str(), 10),
            (None, None) => return String::new(),
        };
        let code = u32::from_str_radix(digits, radix).unwrap();
        char::from_u32(code).map(String::from).unwrap_or_default()
    })
    .into_owned()
}

struct Setup {
    home: Home,
    daemon: Daemon,
    port: u16,
    origin: Origin,
}

fn setup() -> Setup {
    let origin = echo_origin();
    let port = origin.port();
    let home = Home::new();
    assert!(
        secret_set(&home, "tok", CANARY, Some(VAULT_KEY))
            .status
            .success()
    );
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\nbuffer_limit = \"1MiB\"\nmax_result_bytes = \"1MiB\"\n\
         [[credentials]]\nid = \"gh\"\nsecret = \"tok\"\ninject = {{ header = \"Authorization\", format = \"Bearer {{secret}}\" }}\n\
         [[routes]]\nid = \"echo\"\ncredential = \"gh\"\nmatch = {{ scheme = \"http\", host = \"origin.test\", port = {port} }}\nresolve = \"127.0.0.1:{port}\"\n\
         [[routes]]\nid = \"public\"\nmatch = {{ scheme = \"http\", host = \"origin.test\", port = {port}, path_prefix = \"/pub\" }}\nresolve = \"127.0.0.1:{port}\"\n\
         [[routes]]\nid = \"alias\"\nmatch = {{ scheme = \"http\", host = \"alias.test\", port = {port} }}\nresolve = \"127.0.0.1:{port}\"\n"
    );
    let daemon = Daemon::start_with(&home, Some(&config), &[("POSTERN_VAULT_KEY", VAULT_KEY)]);
    Setup {
        home,
        daemon,
        port,
        origin,
    }
}

impl Setup {
    /// curl through postern: status, body, head (with the reason phrase).
    fn get(&self, path: &str, extra: &[&str]) -> (u16, String, String) {
        let url = format!("http://origin.test:{}{path}", self.port);
        let mut args = vec!["-x", self.daemon.proxy.as_str()];
        args.extend_from_slice(extra);
        args.push(&url);
        curl(&args)
    }

    fn newest(&self) -> Value {
        let (_, list) = get_json(&self.daemon.url("/v1/invocations?limit=1"), &[]);
        list["invocations"][0].clone()
    }

    /// Every place the invocation can be read back from, as text.
    fn read_back(&self, id: &str) -> String {
        let mut seen = String::new();
        for path in [
            format!("/v1/invocations/{id}"),
            format!("/v1/invocations/{id}/events"),
            format!("/v1/invocations/{id}/result"),
            format!("/v1/invocations/{id}/result/body"),
        ] {
            seen.push_str(&curl(&[&self.daemon.url(&path)]).1);
        }
        for tail in ["result", "result/body"] {
            let internal = format!("http://postern.internal/v1/invocations/{id}/{tail}");
            seen.push_str(&curl(&["-x", &self.daemon.proxy, &internal]).1);
        }
        for args in [vec!["result", id], vec!["actions", "show", id, "--json"]] {
            let out = self.daemon.cli(&args, &[]);
            seen.push_str(&String::from_utf8_lossy(&out.stdout));
            seen.push_str(&String::from_utf8_lossy(&out.stderr));
        }
        seen
    }

    /// The stored result's body, decoded from base64 (checked in plain form too).
    fn stored_body(&self, id: &str) -> (Value, String) {
        let (_, res) = get_json(
            &self.daemon.url(&format!("/v1/invocations/{id}/result")),
            &[],
        );
        let b64 = res["body_base64"].as_str().unwrap_or("");
        let body = String::from_utf8_lossy(&STANDARD.decode(b64).unwrap_or_default()).into_owned();
        (res, body)
    }
}

#[test]
fn compressed_echoes_are_decoded_scanned_and_delivered_plain() {
    let s = setup();
    for (path, extra) in [
        ("/echo", vec!["--compressed"]),
        ("/echo", vec!["-H", "Accept-Encoding: gzip"]),
        ("/echo?coding=gzip", vec![]),
        ("/echo?coding=deflate", vec![]),
        ("/echo?coding=br", vec!["--compressed"]),
        ("/echo?coding=zstd", vec![]),
    ] {
        let (status, body, head) = s.get(path, &extra);
        assert_eq!(status, 200, "{path}: {head}");
        // Plain text proves postern decoded it: the agent got no coding to undo.
        assert!(
            body.contains("[postern:redacted]"),
            "{path} {extra:?}: {body:?}"
        );
        assert!(
            !head.to_ascii_lowercase().contains("content-encoding"),
            "{head}"
        );
        assert_clean(path, &format!("{head}\n{body}"));
        let r = s.newest();
        let id = r["invocation_id"].as_str().unwrap().to_owned();
        assert!(r["evidence"]["redactions"].as_u64() >= Some(1), "{r}");
        let (res, stored) = s.stored_body(&id);
        assert_eq!(res["body_stored"], true, "{res}");
        assert!(stored.contains("[postern:redacted]"), "{stored:?}");
        assert_clean("the stored body", &stored);
        assert_clean("the read-back views", &s.read_back(&id));
    }
    let req = s.origin.last_request().to_ascii_lowercase();
    assert!(
        req.contains("accept-encoding: identity"),
        "an agent that asked for nothing lets the origin send only identity: {req}"
    );
}

#[test]
fn a_route_without_the_credential_is_guarded_against_what_the_origin_kept_of_it() {
    let s = setup();
    let (status, _, head) = s.get("/plain", &[]);
    assert_eq!(status, 200, "{head}");
    // Another route to the same host injects nothing, but the origin kept the secret.
    let (status, body, head) = s.get("/pub/last", &[]);
    assert_eq!(status, 200, "{head}");
    let r = s.newest();
    assert_eq!(r["route"], "public", "{r}");
    assert_eq!(body.matches("[postern:redacted]").count(), 2, "{body}");
    assert_clean("the body", &body);
    assert_clean("the head", &head);
    let id = r["invocation_id"].as_str().unwrap().to_owned();
    assert_clean("the read-back views", &s.read_back(&id));
    let credential = &r["evidence"]["credential"];
    assert!(credential.is_null(), "nothing was injected: {r}");
    // A range of it would be a piece too short to know: the origin is not asked for one.
    let (status, body, head) = s.get("/pub/last", &["-r", "12-20"]);
    assert_eq!(status, 200, "{head}");
    assert!(body.contains("[postern:redacted]"), "{body}");
    let req = s.origin.last_request().to_ascii_lowercase();
    assert!(!req.contains("\r\nrange:"), "{req}");
    assert!(!req.contains("authorization"), "nothing injected: {req}");
    // The same origin under another name (pinned to the same address) is guarded too.
    let url = format!("http://alias.test:{}/pub/last", s.port);
    let (status, body, head) = curl(&["-x", s.daemon.proxy.as_str(), &url]);
    assert_eq!(status, 200, "{head}");
    assert!(body.contains("[postern:redacted]"), "{body}");
    assert_clean("the alias's body", &body);
}

#[test]
fn the_origin_reason_phrase_is_not_relayed() {
    let s = setup();
    let (status, body, head) = s.get("/reason", &[]);
    assert_eq!((status, body.as_str()), (200, "ok"), "{head}");
    assert!(
        head.starts_with("HTTP/1.1 200 OK"),
        "hyper's canonical phrase: {head}"
    );
    assert_clean("the head", &head);
}

#[test]
fn every_encoding_and_a_secret_named_header_are_redacted() {
    let s = setup();
    let (status, body, head) = s.get("/forms", &[]);
    assert_eq!(status, 200, "{head}");
    assert_eq!(body.matches("[postern:redacted]").count(), 10, "{body}");
    assert_clean("the forms body", &body);
    assert_clean("the forms head", &head.to_ascii_lowercase());
    let r = s.newest();
    let id = r["invocation_id"].as_str().unwrap().to_owned();
    assert_eq!(
        r["evidence"]["redactions"], 11,
        "ten forms and one header name: {r}"
    );
    assert_clean("the read-back views", &s.read_back(&id));
}

#[test]
fn a_compressed_event_stream_is_decoded_and_scanned_as_it_flows() {
    let s = setup();
    let (status, body, head) = s.get("/stream", &["-N", "--compressed"]);
    assert_eq!(status, 200, "{head}");
    assert_eq!(body.matches("[postern:redacted]").count(), 3, "{body:?}");
    assert!(
        body.starts_with("data: 0 Bearer [postern:redacted]\n\n"),
        "{body:?}"
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("postern-delivery: streamed"),
        "{head}"
    );
    assert_clean("the stream", &format!("{head}\n{body}"));
    let id = s.newest()["invocation_id"].as_str().unwrap().to_owned();
    let (_, stored) = s.stored_body(&id);
    assert_eq!(stored, body, "the stored copy is what the agent got");
}

/// An origin that escapes only some characters of the echo, streamed in chunks cut inside
/// the escapes and the secret: the agent gets the stream with each echo redacted, and no
/// form of the canary even once the escapes are undone; the stored copy is the same.
#[test]
fn a_partly_escaped_echo_split_across_stream_chunks_is_redacted() {
    let s = setup();
    let (status, body, head) = s.get("/escaped-stream", &["-N"]);
    assert_eq!(status, 200, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("postern-delivery: streamed"),
        "{head}"
    );
    assert_eq!(
        body,
        "data: {\"a\":\"[postern:redacted]\"}\n\ndata: [postern:redacted]\n\n\
         data: [postern:redacted]\n\ndata: Bearer [postern:redacted]\n\n"
    );
    assert_clean("the stream, unescaped", &unescaped(&body).to_lowercase());
    let r = s.newest();
    assert_eq!(r["evidence"]["redactions"], 4, "{r}");
    let id = r["invocation_id"].as_str().unwrap().to_owned();
    let (res, stored) = s.stored_body(&id);
    assert_eq!(res["body_stored"], true, "{res}");
    assert_eq!(stored, body, "the stored copy is what the agent got");
    assert_clean("the read-back views", &unescaped(&s.read_back(&id)));
}

/// The same in a buffered body: redacted where it was escaped, the rest delivered.
#[test]
fn a_partly_escaped_echo_in_a_buffered_body_is_redacted_not_withheld() {
    let s = setup();
    let (status, body, head) = s.get("/escaped", &[]);
    assert_eq!(status, 200, "{head}");
    assert_eq!(
        body,
        "{\"a\":\"[postern:redacted]\",\"b\":\"[postern:redacted]\"}"
    );
    assert!(
        !head.to_ascii_lowercase().contains("postern-body"),
        "{head}"
    );
    let r = s.newest();
    assert_eq!(r["evidence"]["redactions"], 2, "{r}");
    assert!(r["evidence"].get("body_withheld").is_none(), "{r}");
    let id = r["invocation_id"].as_str().unwrap().to_owned();
    assert_eq!(s.stored_body(&id).1, body);
    assert_clean("the read-back views", &unescaped(&s.read_back(&id)));
}

#[test]
fn undecodable_and_oversized_bodies_are_withheld_not_relayed() {
    let s = setup();
    for (path, reason) in [
        ("/echo?coding=compress", "unsupported_coding"),
        ("/bomb", "too_large"),
        ("/packed", "secret_in_compressed_body"),
    ] {
        let (status, body, head) = s.get(path, &[]);
        assert_eq!((status, body.as_str()), (200, ""), "{path}: {head}");
        assert!(
            head.to_ascii_lowercase()
                .contains(&format!("postern-body: withheld; reason={reason}")),
            "{head}"
        );
        let r = s.newest();
        assert_eq!(r["outcome"], "committed", "resolved from the status: {r}");
        assert_eq!(r["evidence"]["body_withheld"], reason, "{r}");
        let id = r["invocation_id"].as_str().unwrap().to_owned();
        let (res, _) = s.stored_body(&id);
        assert_eq!(
            (res["body_stored"].clone(), res["body_base64"].clone()),
            (Value::Bool(false), Value::Null),
            "only digest and length are kept: {res}"
        );
        assert_clean("the read-back views", &s.read_back(&id));
    }
}

/// A compressed file that holds no secret passes as it came, still compressed.
#[test]
fn a_compressed_body_without_the_secret_is_delivered_as_it_came() {
    let s = setup();
    let out = s.home.dir.path().join("packed.gz");
    let url = format!("http://origin.test:{}/packed-clean", s.port);
    let got = std::process::Command::new("curl")
        .args(["-sS", "-x", &s.daemon.proxy, "-o"])
        .arg(&out)
        .arg(&url)
        .output()
        .expect("curl");
    assert!(got.status.success(), "{got:?}");
    let bytes = std::fs::read(&out).unwrap_or_default();
    assert_eq!(bytes, compress("gzip", b"nothing secret in here"));
}

#[test]
fn python_requests_gets_the_echo_redacted() {
    if Command::new("python3")
        .args(["-c", "import requests"])
        .status()
        .map_or(true, |st| !st.success())
    {
        eprintln!("python3 requests not installed: skipped");
        return;
    }
    let s = setup();
    let script = format!(
        "import requests\nr = requests.get('http://origin.test:{}/echo', proxies={{'http': '{}'}})\nprint(r.status_code, r.reason)\nprint(dict(r.headers))\nprint(r.text)\n",
        s.port, s.daemon.proxy
    );
    let out = Command::new("python3")
        .args(["-c", &script])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.starts_with("200 OK"), "{text}");
    assert!(text.contains("[postern:redacted]"), "{text}");
    assert_clean("what requests saw", &text);
}

#[test]
fn no_output_of_the_daemon_holds_the_canary() {
    let mut s = setup();
    for path in ["/echo?coding=gzip", "/reason", "/forms", "/stream", "/bomb"] {
        s.get(path, &["--compressed"]);
    }
    // The admin API and CLI views are the journal decoded: clean there means clean
    // stored events and results, whatever fjall's block compression does to the files.
    let mut seen = String::new();
    let (_, list) = get_json(&s.daemon.url("/v1/invocations?limit=50"), &[]);
    for r in list["invocations"].as_array().unwrap() {
        seen.push_str(&s.read_back(r["invocation_id"].as_str().unwrap()));
    }
    seen.push_str(&curl(&[&s.daemon.url("/metrics")]).1);
    seen.push_str(&s.daemon.stdout.join("\n"));
    seen.push_str(&s.daemon.stderr());
    assert_clean("the daemon's views, metrics and logs", &seen);
    // Everything stored, raw and decoded: catches a form in the WAL or in any record.
    let stored = crate::support::stored_text(&mut s.daemon);
    assert_clean("the files and the journal's values", &stored);
}

/// An intermediary's `Proxy-Status` is origin-side text too: relayed and journaled guarded.
#[test]
fn an_intermediary_error_that_echoes_the_secret_is_guarded() {
    let s = setup();
    let (status, body, head) = s.get("/hop", &[]);
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("UPSTREAM_HOP_ERROR"), "{body}");
    assert_clean("the agent's head", &head);
    assert_clean("the agent's body", &body);
    let id = s.newest()["invocation_id"].as_str().unwrap().to_owned();
    assert_clean("the read-back views", &s.read_back(&id));
}

/// An agent reading an echo a range at a time would get pieces too short to know: postern
/// drops `Range` on a credentialed route, so every answer is the whole echo, guarded whole.
#[test]
fn ranges_of_an_echo_cannot_reassemble_the_secret() {
    let s = setup();
    let mut joined = String::new();
    for range in ["0-19", "20-29", "30-39", "40-49"] {
        let (status, body, head) = s.get("/range", &["-H", &format!("Range: bytes={range}")]);
        assert_eq!(status, 200, "{head}\n{body}");
        assert!(body.contains("[postern:redacted]"), "{body}");
        joined.push_str(&body);
    }
    assert_clean("ranges", &joined);
}
