use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use proptest::prelude::*;

use super::*;

pub(super) const SECRET: &str = "s3cr/t+val~Z9?q";

fn guard() -> ReflectionGuard {
    ReflectionGuard::new(SECRET.as_bytes(), format!("Bearer {SECRET}").as_bytes()).unwrap()
}

fn clean(g: &ReflectionGuard, body: &[u8]) -> (String, usize) {
    let (out, hits) = g.redact(body);
    (String::from_utf8_lossy(&out).into_owned(), hits)
}

/// Each echo an origin might produce, by name.
fn echoes() -> Vec<(String, String)> {
    let s = SECRET.as_bytes();
    let bearer = format!("Bearer {SECRET}");
    let hex: String = s.iter().map(|b| format!("{b:02x}")).collect();
    let pct_all: String = s.iter().map(|b| format!("%{b:02x}")).collect();
    let mut v = vec![
        ("raw".into(), SECRET.to_owned()),
        ("hex lower".into(), hex.clone()),
        ("hex upper".into(), hex.to_uppercase()),
        ("pct every byte, lower".into(), pct_all.clone()),
        ("pct every byte, upper".into(), pct_all.to_uppercase()),
        ("pct reserved".into(), pct_reserved(s, b"")),
        (
            "pct of the value, form style".into(),
            pct_reserved(bearer.as_bytes(), b"").replace("%20", "+"),
        ),
        ("json \\u lower".into(), unicode_escaped(SECRET)),
        (
            "json \\u upper".into(),
            unicode_escaped(SECRET).to_uppercase().replace("\\U", "\\u"),
        ),
        ("json \\/".into(), SECRET.replace('/', "\\/")),
        ("value".into(), bearer.clone()),
        ("lower-cased".into(), SECRET.to_lowercase()),
    ];
    for (name, e) in [
        ("std", STANDARD),
        ("std nopad", STANDARD_NO_PAD),
        ("url", URL_SAFE),
        ("url nopad", URL_SAFE_NO_PAD),
    ] {
        v.push((format!("b64 {name} secret"), e.encode(s)));
        v.push((format!("b64 {name} value"), e.encode(&bearer)));
        v.push((format!("b64 {name} basic"), e.encode(format!("u:{SECRET}"))));
        v.push((
            format!("b64 {name} secret+nl"),
            e.encode(format!("{SECRET}\n")),
        ));
        for prefix in ["x", "xy", "xyz", "{\"token\":\""] {
            let text = format!("{prefix}{SECRET}\"}}");
            v.push((format!("b64 {name} at +{prefix}"), e.encode(text)));
        }
    }
    v
}

/// What is left after redaction must not decode to the secret by any of the echoes.
fn leaks(out: &str) -> Vec<String> {
    echoes()
        .into_iter()
        .filter(|(name, e)| !name.contains(" at +") && out.contains(e.as_str()))
        .map(|(name, _)| name)
        .collect()
}

#[test]
fn every_echoed_form_is_redacted_and_counted() {
    let g = ReflectionGuard::new(SECRET.as_bytes(), format!("u:{SECRET}").as_bytes()).unwrap();
    let g2 = guard();
    for (name, echo) in echoes() {
        for g in [&g, &g2] {
            let body = format!("before {echo} after");
            let (out, hits) = clean(g, body.as_bytes());
            assert!(hits >= 1, "{name}: {out}");
            assert!(
                out.starts_with("before ") && out.ends_with(" after"),
                "{name}: {out}"
            );
            assert!(leaks(&out).is_empty(), "{name}: {out} {:?}", leaks(&out));
        }
    }
}

#[test]
fn a_whole_encoding_is_redacted_as_one_hit_with_no_leftover() {
    let g = guard();
    for e in [STANDARD, URL_SAFE] {
        for x in [
            SECRET.to_owned(),
            format!("{SECRET}\n"),
            format!("Bearer {SECRET}"),
        ] {
            let body = format!("[{}]", e.encode(&x));
            assert_eq!(
                clean(&g, body.as_bytes()),
                ("[[postern:redacted]]".into(), 1),
                "{x:?}"
            );
        }
    }
}

#[test]
fn base64_at_every_alignment_leaves_only_boundary_characters() {
    let g = guard();
    for prefix in ["", "a", "ab", "abc", "abcd"] {
        for suffix in ["", "!", "!!", "!!!"] {
            let enc = STANDARD.encode(format!("{prefix}{SECRET}{suffix}"));
            let (out, hits) = clean(&g, enc.as_bytes());
            assert_eq!(hits, 1, "{prefix:?} {suffix:?}: {out}");
            // At most the characters mixing prefix/secret or secret/suffix bits remain.
            let left = out.replace("[postern:redacted]", "");
            assert!(left.len() <= enc.len() - 14, "{prefix:?} {suffix:?}: {out}");
        }
    }
}

/// `doc` in lines of `width` characters joined by `eol`.
fn wrap(doc: &str, width: usize, eol: &str) -> String {
    doc.as_bytes()
        .chunks(width)
        .map(|l| String::from_utf8_lossy(l).into_owned())
        .collect::<Vec<_>>()
        .join(eol)
}

/// MIME, PEM and `base64` wrap their output: a line break may fall inside the secret's
/// base64, at any column.
#[test]
fn base64_wrapped_at_any_width_is_redacted() {
    let g = guard();
    let doc = STANDARD.encode(format!("xx{SECRET}yy Bearer {SECRET}"));
    for width in [4, 16, 64, 76] {
        for eol in ["\n", "\r\n", "\n  ", "\r\n\t"] {
            let wrapped = wrap(&doc, width, eol);
            let (out, hits) = clean(&g, wrapped.as_bytes());
            assert!(hits >= 2, "{width}: {out}");
            assert!(
                !leaks(&out.replace(eol, ""))
                    .iter()
                    .any(|n| n.contains("base64")),
                "{width}: {out}"
            );
        }
    }
}

/// Base64 wrapped inside a JSON or HTML string: the line breaks are escapes.
#[test]
fn base64_wrapped_with_escaped_line_breaks_is_redacted() {
    let g = guard();
    let doc = STANDARD.encode(format!("{}{SECRET}", "Z".repeat(40)));
    for eol in ["\\n", "\\r\\n", "\\n    ", "\\u000a", "&#10;"] {
        for width in [64, 76] {
            let wrapped = wrap(&doc, width, eol);
            let (out, hits) = clean(&g, format!("{{\"pem\":\"{wrapped}\"}}").as_bytes());
            assert!(hits >= 1, "{eol} {width}: {out}");
        }
    }
}

#[test]
fn a_line_break_outside_base64_is_kept_and_an_sse_stream_not_held() {
    let g = guard();
    assert_eq!(
        clean(&g, b"line one\nline two\r\n").0,
        "line one\nline two\r\n"
    );
    let mut carry = Carry::default();
    let (out, _) = g.redact_stream(&mut carry, b"data: hello\n\n");
    assert_eq!(&out[..], b"data: hello\n\n");
}

#[test]
fn a_secret_split_across_chunks_is_still_redacted() {
    let g = guard();
    let mut carry = Carry::default();
    let (a, _) = g.redact_stream(&mut carry, b"data: s3cr/");
    assert_eq!(&a[..], b"data: ");
    let (b, hits) = g.redact_stream(&mut carry, b"t+val~Z9?q\n\n");
    assert_eq!((&b[..], hits), (&b"[postern:redacted]\n\n"[..], 1));
    let (c, _) = g.redact_stream(&mut carry, b"event ends\n\n");
    assert_eq!(
        &c[..],
        b"event ends\n\n",
        "nothing held when no form could start"
    );
    assert!(carry.is_empty());
}

#[test]
fn an_sse_event_without_a_secret_prefix_is_not_held_back() {
    let g = guard();
    let mut carry = Carry::default();
    let (out, _) = g.redact_stream(&mut carry, b"data: {\"delta\":\"hello\"}\n\n");
    assert_eq!(out.len(), 25);
    assert!(carry.is_empty());
}

/// Built once: a debug-build DFA takes a while.
static GUARD: std::sync::LazyLock<ReflectionGuard> = std::sync::LazyLock::new(guard);

pub(super) fn stream(g: &ReflectionGuard, body: &[u8], cuts: &[usize]) -> (Vec<u8>, usize) {
    let (mut carry, mut out, mut hits) = (Carry::default(), Vec::new(), 0);
    let mut at = 0;
    for &cut in cuts {
        let cut = cut.clamp(at, body.len());
        let (o, h) = g.redact_stream(&mut carry, &body[at..cut]);
        out.extend_from_slice(&o);
        hits += h;
        at = cut;
    }
    let (o, h) = g.redact_stream(&mut carry, &body[at..]);
    out.extend_from_slice(&o);
    let (t, h2) = g.finish(&mut carry);
    out.extend_from_slice(&t);
    (out, hits + h + h2)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn any_chunking_redacts_like_the_whole_body(
        parts in prop::collection::vec((0usize..40, "[a-zA-Z0-9+/=%\\\\ \n]{0,12}"), 0..12),
        mut cuts in prop::collection::vec(0usize..600, 0..20),
    ) {
        let echoes = echoes();
        let mut body = Vec::new();
        for (i, filler) in &parts {
            body.extend_from_slice(filler.as_bytes());
            if let Some((_, e)) = echoes.get(*i) {
                // Also half a form: it must pass through unchanged either way.
                let e = if i % 7 == 3 { &e[..e.len() / 2] } else { e.as_str() };
                body.extend_from_slice(e.as_bytes());
            }
        }
        cuts.sort_unstable();
        let g = &*GUARD;
        let (whole, hits) = g.redact(&body);
        let (streamed, shits) = stream(g, &body, &cuts);
        prop_assert_eq!(String::from_utf8_lossy(&streamed), String::from_utf8_lossy(&whole));
        prop_assert_eq!(shits, hits);
        prop_assert!(!String::from_utf8_lossy(&whole).contains(SECRET));
    }
}

/// The guard with both gates off: what the gates may never change.
static UNGATED: std::sync::LazyLock<ReflectionGuard> =
    std::sync::LazyLock::new(|| guard().ungated());

/// `form` with its letters' case flipped and some characters escaped (`%XX`, `\u00XX`),
/// as `bits` says.
fn mangled(form: &str, bits: u64) -> String {
    form.chars()
        .enumerate()
        .map(|(i, c)| {
            match (
                (bits >> (i % 64)) & 1 == 1,
                (bits >> (63 - i % 64)) & 1 == 1,
            ) {
                (true, false) if c.is_ascii_alphabetic() => c.to_ascii_uppercase().to_string(),
                (true, true) if c.is_ascii() => format!("%{:02X}", c as u32),
                (false, true) if c.is_ascii() && i % 3 == 0 => format!("\\u{:04x}", c as u32),
                _ => c.to_string(),
            }
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn the_gates_change_nothing_the_passes_would_do(
        pad in 0usize..40_000,
        parts in prop::collection::vec(
            (0usize..44, "[a-zA-Z0-9+/=%&#;\\\\ \n]{0,12}", any::<u64>()),
            0..10,
        ),
        mut cuts in prop::collection::vec(0usize..41_000, 0..12),
    ) {
        let echoes = echoes();
        let mut body = vec![b'.'; pad];
        for (i, filler, bits) in &parts {
            body.extend_from_slice(filler.as_bytes());
            if let Some((_, e)) = echoes.get(*i) {
                let e = if i % 5 == 2 { &e[..e.len() / 2] } else { e.as_str() };
                body.extend_from_slice(mangled(e, *bits).as_bytes());
            }
        }
        cuts.sort_unstable();
        let (g, u) = (&*GUARD, &*UNGATED);
        prop_assert_eq!(g.redact(&body), u.redact(&body));
        prop_assert_eq!(stream(g, &body, &cuts), stream(u, &body, &cuts));
        prop_assert_eq!(g.redact_same_length(&body), u.redact_same_length(&body));
        prop_assert_eq!(g.is_match(&body), u.is_match(&body));
    }
}

#[test]
fn a_guard_is_built_once_per_credential_version() {
    let cache = GuardCache::default();
    let mut builds = 0;
    let mut get = |version: u64| {
        cache.get("gh", version.into(), || {
            builds += 1;
            ReflectionGuard::new(b"tok-abcdef", b"Bearer tok-abcdef")
        })
    };
    let (a, b, c) = (get(1), get(1), get(2));
    assert!(a.zip(b).is_some_and(|(a, b)| Arc::ptr_eq(&a, &b)));
    assert!(c.is_some());
    assert_eq!(builds, 2, "a rotation (new version) builds a new guard");
}

mod encodings;
