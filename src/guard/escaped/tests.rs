//! The second pass through the whole guard: partly escaped echoes of the secret.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use proptest::prelude::*;

use bytes::Bytes;

use super::super::unescape::Decoded;
use super::super::{Carry, Mask, ReflectionGuard};
use super::{EscapedCarry, PIECE};

const SECRET: &str = "s3cr/t+val~Z9?q";

fn guard() -> ReflectionGuard {
    ReflectionGuard::new(SECRET.as_bytes(), format!("Bearer {SECRET}").as_bytes()).unwrap()
}

/// The ways an encoder may write one character.
const KINDS: usize = 12;

fn escape(c: char, kind: usize) -> String {
    let u = c as u32;
    match kind % KINDS {
        1 => format!("\\u{u:04x}"),
        2 => format!("\\u{u:04X}"),
        3 => format!("%{u:02X}"),
        4 => format!("%{u:02x}"),
        5 => format!("\\x{u:02x}"),
        6 => format!("&#{u};"),
        7 => format!("&#x{u:x};"),
        8 => format!("%25{u:02X}"),
        9 => format!("\\\\u{u:04x}"),
        10 => format!("%u{u:04X}"),
        11 if c.is_ascii_punctuation() => format!("\\{c}"),
        _ => c.to_string(),
    }
}

/// `secret` with character `i` written the way `kinds[i % len]` says.
fn mixed(secret: &str, kinds: &[usize]) -> String {
    secret
        .chars()
        .enumerate()
        .map(|(i, c)| escape(c, kinds.get(i % kinds.len().max(1)).copied().unwrap_or(0)))
        .collect()
}

fn decoded(bytes: &[u8]) -> String {
    let mut d = Decoded::default();
    d.decode(bytes, true);
    String::from_utf8_lossy(&d.text).to_lowercase()
}

fn redact(g: &ReflectionGuard, body: &str) -> (String, usize) {
    let (out, hits) = g.redact(body.as_bytes());
    (String::from_utf8_lossy(&out).into_owned(), hits)
}

/// The partly escaped forms of the tests: one kind at one, some or all characters, and
/// kinds mixed in one form.
fn forms() -> Vec<String> {
    let mut v = Vec::new();
    for kind in 1..KINDS {
        for pattern in [
            [kind, 0, 0, 0],
            [0, 0, 0, kind],
            [0, kind, 0, kind],
            [kind; 4],
        ] {
            v.push(mixed(SECRET, &pattern));
        }
        v.push(mixed(SECRET, &[0, kind + 1, kind, 0, kind + 5, 0]));
    }
    v.push(mixed(SECRET, &[1, 3, 5, 6, 8, 11, 0]));
    v
}

#[test]
fn every_partly_escaped_form_is_redacted_whole() {
    let g = guard();
    for form in forms() {
        let (out, hits) = redact(&g, &format!("before {form} after"));
        assert_eq!(out, "before [postern:redacted] after", "{form}");
        assert_eq!(hits, 1, "{form}");
    }
}

#[test]
fn partly_escaped_base64_and_non_ascii_secrets_are_redacted() {
    // .NET escapes `+` as `\u002B`, PHP `/` as `\/`: base64 of the value, partly escaped.
    let g = guard();
    let b64 = STANDARD.encode(format!("Bearer {SECRET}"));
    let dotnet = b64.replace('+', "\\u002B").replace('/', "\\/");
    let dotnet = format!(
        "{}\\u{:04x}{}",
        &dotnet[..3],
        dotnet.as_bytes()[3],
        &dotnet[4..]
    );
    assert_eq!(redact(&g, &format!("\"{dotnet}\"")).1, 1, "{dotnet}");
    // Python's json.dumps escapes only what is not ASCII; an emoji as a surrogate pair.
    let secret = "pässwörd-12€-😀";
    let g = ReflectionGuard::new(secret.as_bytes(), secret.as_bytes()).unwrap();
    let python = "p\\u00e4ssw\\u00f6rd-12\\u20ac-\\ud83d\\ude00";
    assert_eq!(redact(&g, python), ("[postern:redacted]".into(), 1));
    // `&auml;` is not decoded (only five named references are): what follows it is
    // still redacted as the rest of the secret.
    let html = "p&auml;ssw&#246;rd-12&#x20AC;-&#128512;";
    assert_eq!(redact(&g, html), ("p&auml;[postern:redacted]".into(), 1));
    let html = "p&#228;ssw&#246;rd-12&#x20AC;-&#128512;";
    assert_eq!(redact(&g, html).1, 1);
}

#[test]
fn a_secret_with_spaces_is_seen_form_encoded() {
    let secret = "correct horse!battery";
    let g = ReflectionGuard::new(secret.as_bytes(), secret.as_bytes()).unwrap();
    for echo in ["correct+h%6Frse%21battery", "correct%20horse!b\\u0061ttery"] {
        assert_eq!(redact(&g, echo), ("[postern:redacted]".into(), 1), "{echo}");
    }
}

#[test]
fn an_escape_that_swallows_the_first_characters_leaves_only_those() {
    // `\&` reads as an escaped `&`, so `&#115;` (the `s`) is not decoded.
    let (out, hits) = redact(&guard(), "\\&#115;3cr%2Ft+val~Z9?q");
    assert_eq!((out.as_str(), hits), ("\\&#115;[postern:redacted]", 1));
    // `%` before hex digits takes two of them.
    let hexy = "ab12cdef-9876";
    let g = ReflectionGuard::new(hexy.as_bytes(), hexy.as_bytes()).unwrap();
    let (out, hits) = redact(&g, "%ab12cd\\u0065f-9876");
    assert_eq!((out.as_str(), hits), ("%ab[postern:redacted]", 1));
}

#[test]
fn innocent_text_with_escapes_is_untouched() {
    let g = guard();
    for body in [
        "{\"msg\":\"caf\\u00e9 \\\"quoted\\\" \\/path\",\"q\":\"a%20b%2Fc\",\"h\":\"&amp;&#65;\"}",
        "s3cr\\/t+val~Z9 (one character short) and s\\u0033cr/t+val~Z",
        "C:\\\\Users\\\\x41 100% \\ud800 &#xZZ; %zz \\u{41}",
    ] {
        assert_eq!(redact(&g, body), (body.to_owned(), 0), "{body}");
    }
}

#[test]
fn an_escape_and_the_secret_split_across_chunks_are_redacted() {
    let g = guard();
    let mut carry = Carry::default();
    let mut out = Vec::new();
    for chunk in ["data: s3cr\\", "/t+v\\u00", "61l~Z9?q\n\n"] {
        out.extend_from_slice(&g.redact_stream(&mut carry, chunk.as_bytes()).0);
    }
    assert_eq!(out, b"data: [postern:redacted]\n\n");
    assert!(carry.is_empty());
}

#[test]
fn an_event_with_escapes_but_no_start_of_the_secret_is_not_held() {
    let g = guard();
    let mut carry = Carry::default();
    let event = b"data: {\"t\":\"caf\\u00e9 %41 &amp;\"}\n\n";
    let (out, hits) = g.redact_stream(&mut carry, event);
    assert_eq!((&out[..], hits), (&event[..], 0));
    assert!(carry.is_empty());
    let (out, _) = g.redact_stream(&mut carry, b"data: tail \\u00");
    assert_eq!(&out[..], b"data: tail ", "a cut-off escape waits");
    let (out, _) = g.finish(&mut carry);
    assert_eq!(&out[..], b"\\u00", "and goes out as it is at the end");
}

#[test]
fn a_large_body_is_decoded_in_pieces_with_the_result_of_one_pass() {
    let g = guard();
    let form = mixed(SECRET, &[1, 0, 3, 0, 9]);
    let mut body = String::from("caf\\u00e9 ");
    for k in 1..=3 {
        // Each form straddles the end of a piece, cut inside an escape or not.
        while body.len() < k * PIECE - 2 * k {
            body.push('x');
        }
        body.push_str(&form);
    }
    let bytes = Bytes::from(body);
    let escaped = g.escaped.as_ref().unwrap();
    let (whole, hits) = escaped.whole(bytes.clone());
    let (one, n) = escaped.pass(&mut EscapedCarry::default(), bytes, true, Mask::Marker);
    assert_eq!((whole, hits), (one, n));
    assert_eq!(hits, 3);
}

#[test]
fn a_header_name_with_an_escaped_secret_is_seen() {
    assert!(guard().is_match(b"s3cr%2ft+val~z9%3fq"));
    assert!(!guard().is_match(b"x-s3cr%2ft"));
}

/// Built once: a debug-build DFA takes a while.
static GUARD: std::sync::LazyLock<ReflectionGuard> = std::sync::LazyLock::new(guard);

fn stream(g: &ReflectionGuard, body: &[u8], cuts: &[usize]) -> (Vec<u8>, usize) {
    let (mut carry, mut out, mut hits, mut at) = (Carry::default(), Vec::new(), 0, 0);
    for &cut in cuts.iter().chain([&body.len()]) {
        let cut = cut.clamp(at, body.len());
        let (o, h) = g.redact_stream(&mut carry, &body[at..cut]);
        out.extend_from_slice(&o);
        hits += h;
        at = cut;
    }
    let (t, h) = g.finish(&mut carry);
    out.extend_from_slice(&t);
    (out, hits + h)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn any_chunking_of_partly_escaped_echoes_redacts_like_the_whole_body(
        parts in prop::collection::vec(
            ("[a-z0-9%\\\\&#;xu/+ \n]{0,10}", prop::collection::vec(0usize..KINDS, 1..6), 0u8..4),
            0..8,
        ),
        mut cuts in prop::collection::vec(0usize..900, 0..24),
    ) {
        let mut body = String::new();
        for (filler, kinds, shape) in &parts {
            body.push_str(filler);
            let form = mixed(SECRET, kinds);
            match shape {
                // Half a form must pass through as it is, whole or streamed.
                0 => body.push_str(&form[..form.len() / 2]),
                _ => body.push_str(&form),
            }
        }
        cuts.sort_unstable();
        let g = &*GUARD;
        let (whole, hits) = g.redact(body.as_bytes());
        let (streamed, shits) = stream(g, body.as_bytes(), &cuts);
        prop_assert_eq!(String::from_utf8_lossy(&streamed), String::from_utf8_lossy(&whole));
        prop_assert_eq!(shits, hits);
        let wholes = parts.iter().filter(|p| p.2 != 0).count();
        prop_assert!(hits >= wholes, "{} hits for {} forms: {}", hits, wholes, body);
        prop_assert!(!decoded(&whole).contains(&SECRET.to_lowercase()), "{}", body);
    }
}
