//! The reflection guard (SPEC §1.8), shared by every transport: a remote that echoes what
//! it received must not hand the injected secret back. Every echoed form of the secret, or
//! of the value it was injected as (`Bearer <secret>`, `user:<secret>`, an SSH password or
//! the lines of a private key), is replaced with `[postern:redacted]` in HTTP headers and
//! bodies and in SSH stdout/stderr, across chunk boundaries, and counted.
//!
//! Two passes. The first: one Aho-Corasick automaton (leftmost-longest, ASCII
//! case-insensitive) holds every uniform form, each character encoded the same way.
//! Case-insensitive for all of them: hex, `%XX` and `\uXXXX` come in either case and
//! header names are lower-cased; a base64 form differing only in case is astronomically
//! unlikely, and redacting it anyway is the safe side. The second (`escaped`): what the
//! first let through is decoded (`unescape`) and scanned for the plain forms again,
//! which catches an echo with only some characters escaped (`C\u0041NARY`, `%43ANARY`),
//! base64 or hex printed in groups (`aGVs bG8g`), and hex or character dumps (`xxd`,
//! `hexdump -C`, `od -c`), whose lines decode to the bytes they show.
//!
//! Streams keep back, per pass, only the bytes that may still start a form, so an
//! interactive stream is not held; see `ReflectionGuard::redact_stream`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aho_corasick::{AhoCorasick, AhoCorasickKind, MatchKind};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use bytes::Bytes;

use crate::contract::SecretVersion;

use escaped::{Escaped, EscapedCarry};
use gate::Gate;

mod dump;
mod escaped;
mod gate;
mod paced;
mod unescape;

pub use paced::{PAUSE, Paced, RELEASE_AT_MOST};

pub const REDACTED: &[u8] = b"[postern:redacted]";

/// Shorter needles would redact ordinary text.
const MIN_NEEDLE: usize = 4;

/// A PEM body line shorter than this is not guarded on its own (`AAAA…==` tails).
const MIN_PEM_LINE: usize = 16;

/// Guards by credential id and version: the automaton is built once per secret value,
/// not per request (a rotation brings a new version, hence a new guard).
#[derive(Default)]
pub struct GuardCache {
    guards: Mutex<HashMap<(String, SecretVersion), Arc<ReflectionGuard>>>,
}

/// Credential versions kept at once; a full cache starts over.
const MAX_CACHED: usize = 256;

impl GuardCache {
    /// The guard for this credential version, built by `build` on first use.
    pub fn get(
        &self,
        id: &str,
        version: SecretVersion,
        build: impl FnOnce() -> Option<ReflectionGuard>,
    ) -> Option<Arc<ReflectionGuard>> {
        let key = (id.to_owned(), version);
        if let Some(hit) = self.guards.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Some(hit);
        }
        let guard = Arc::new(build()?);
        if let Ok(mut m) = self.guards.lock() {
            if m.len() >= MAX_CACHED {
                m.clear();
            }
            m.insert(key, guard.clone());
        }
        Some(guard)
    }
}

/// Replaces every echoed form of the injected secret with `[postern:redacted]`.
#[derive(Default)]
pub struct ReflectionGuard {
    automaton: Option<AhoCorasick>,
    /// Says when the first pass's automaton can find nothing (`None`: always run it).
    gate: Option<Gate>,
    needles: Needles,
    /// The second pass, over the decoded text.
    escaped: Option<Escaped>,
}

/// How a hit is replaced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Mask {
    /// With `[postern:redacted]`.
    #[default]
    Marker,
    /// Each byte with `*`: the stream keeps its length (WebSocket frames stay valid).
    SameLength,
}

impl Mask {
    fn put(self, out: &mut Vec<u8>, hit_len: usize) {
        match self {
            Self::Marker => out.extend_from_slice(REDACTED),
            Self::SameLength => out.resize(out.len() + hit_len, b'*'),
        }
    }
}

/// What a stream keeps back between chunks, for both passes.
#[derive(Default)]
pub struct Carry {
    plain: Vec<u8>,
    escaped: EscapedCarry,
    mask: Mask,
}

impl Carry {
    /// A stream whose hits are replaced as `mask` says.
    pub fn masked(mask: Mask) -> Self {
        Self {
            mask,
            ..Self::default()
        }
    }

    /// Nothing is kept back.
    pub fn is_empty(&self) -> bool {
        self.plain.is_empty() && self.escaped.held.is_empty()
    }

    pub fn mask(&self) -> Mask {
        self.mask
    }

    /// The bytes kept back, in stream order (the second pass holds the older ones).
    pub fn held(&self) -> Vec<u8> {
        let mut all = self.escaped.held.clone();
        all.extend_from_slice(&self.plain);
        all
    }

    /// Drops what was kept back (the rest of the stream is not relayed).
    pub fn clear(&mut self) {
        *self = Self::masked(self.mask);
    }
}

impl ReflectionGuard {
    /// The guard for `secret`, injected as `value`. `None` if the automaton cannot be
    /// built: the caller must then not relay the response at all.
    pub fn new(secret: &[u8], value: &[u8]) -> Option<Self> {
        Self::for_each(&[(secret, value)])
    }

    /// One guard for several secrets, each with the value it is injected as (a route's
    /// credential and its `via` hop's, both in one plaintext exchange).
    pub fn for_each(pairs: &[(&[u8], &[u8])]) -> Option<Self> {
        let mut needles: Vec<Vec<u8>> = pairs.iter().flat_map(|(s, v)| forms(s, v)).collect();
        needles.sort();
        needles.dedup();
        let mut plain = Plain::default();
        for (s, v) in pairs {
            plain.extend(plain_forms(s, v));
        }
        Self::build(needles, plain.sorted())
    }

    /// The guard for a PEM-armoured private key: each base64 body line (the body joined
    /// into one string holds them too), and each line's base64 at the three alignments
    /// and hex, as a remote command prints the key file encoded whole (`base64 -w0`,
    /// `xxd -p`). Short lines (the last one of a PEM often is) are left out: they would
    /// redact ordinary text.
    pub fn for_pem(pem: &str) -> Option<Self> {
        Self::for_each_and_pem(&[], Some(pem))
    }

    /// One guard for `pairs` (as `for_each`) and a private key's PEM (as `for_pem`): a
    /// minted credential's client secret, refresh token, token and signing key.
    pub fn for_each_and_pem(pairs: &[(&[u8], &[u8])], pem: Option<&str>) -> Option<Self> {
        let mut needles: Vec<Vec<u8>> = pairs.iter().flat_map(|(s, v)| forms(s, v)).collect();
        let mut plain = Plain::default();
        for (s, v) in pairs {
            plain.extend(plain_forms(s, v));
        }
        if let Some(pem) = pem {
            let (pem_needles, pem_plain) = pem_forms(pem);
            needles.extend(pem_needles);
            plain.extend(pem_plain);
        }
        needles.sort();
        needles.dedup();
        Self::build(needles, plain.sorted())
    }

    /// `needles` for the first pass, `plain` (what escapes decode to) for the second.
    fn build(needles: Vec<Vec<u8>>, plain: Plain) -> Option<Self> {
        if needles.is_empty() {
            return Some(Self::default());
        }
        let automaton = AhoCorasick::builder()
            .kind(Some(automaton_kind(needles.len())))
            .match_kind(MatchKind::LeftmostLongest)
            .ascii_case_insensitive(true)
            .build(&needles)
            .ok()?;
        let escaped = if plain.forms.is_empty() && plain.spaced.is_empty() {
            None
        } else {
            Some(Escaped::new(plain.forms, plain.spaced)?)
        };
        Some(Self {
            automaton: Some(automaton),
            gate: Gate::new(&needles),
            needles: Needles::new(needles),
            escaped,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.automaton.is_none()
    }

    /// False only when no first-pass form occurs in `bytes`.
    fn may_hit(&self, bytes: &[u8]) -> bool {
        self.gate.as_ref().is_none_or(|g| g.may_hit(bytes))
    }

    /// The same guard with both passes' gates off: every scan runs its automaton.
    #[cfg(test)]
    fn ungated(mut self) -> Self {
        self.gate = None;
        self.escaped = self.escaped.map(Escaped::ungated);
        self
    }

    /// The guard of an exchange with no secret in it, shared: building one allocates
    /// its empty start table (measured ~1 % of postern's CPU per uncredentialed request).
    pub fn none() -> Arc<Self> {
        static NONE: std::sync::LazyLock<Arc<ReflectionGuard>> =
            std::sync::LazyLock::new(|| Arc::new(ReflectionGuard::default()));
        NONE.clone()
    }

    /// Returns the redacted bytes and how many hits were replaced.
    pub fn redact(&self, bytes: &[u8]) -> (Bytes, usize) {
        let (out, hits) = self.redact_uniform(bytes, Mask::Marker);
        let (out, more) = match &self.escaped {
            Some(escaped) => escaped.whole(out),
            None => (out, 0),
        };
        (out, hits + more)
    }

    /// The whole of `bytes` with each hit masked byte for byte, so lengths inside stay
    /// true (gRPC messages, a protobuf in gRPC binary metadata).
    pub fn redact_same_length(&self, bytes: &[u8]) -> (Bytes, usize) {
        let mut carry = Carry::masked(Mask::SameLength);
        let (head, hits) = self.redact_stream(&mut carry, bytes);
        let (tail, more) = self.finish(&mut carry);
        let mut out = head.to_vec();
        out.extend_from_slice(&tail);
        (Bytes::from(out), hits + more)
    }

    /// Redacts a streamed chunk. Each pass keeps back only bytes that could still start
    /// a form: the first at most the longest form − 1 bytes, the second an escape cut
    /// off by the chunk's end (under 26 bytes) and decoded text that starts a plain form
    /// (under the longest plain form, each decoded byte from at most 13 bytes). An SSE
    /// event is not held back unless it ends in what may be the start of a secret.
    /// `finish` drains the carry.
    pub fn redact_stream(&self, carry: &mut Carry, chunk: &[u8]) -> (Bytes, usize) {
        let mask = carry.mask;
        let (out, hits) = self.uniform_stream(&mut carry.plain, chunk, mask);
        let (out, more) = self.second_pass(&mut carry.escaped, out, false, mask);
        (out, hits + more)
    }

    /// The end of a stream: whatever was held back is decided now.
    pub fn finish(&self, carry: &mut Carry) -> (Bytes, usize) {
        let tail = std::mem::take(&mut carry.plain);
        let (out, hits) = self.redact_uniform(&tail, carry.mask);
        let (out, more) = self.second_pass(&mut carry.escaped, out, true, carry.mask);
        (out, hits + more)
    }

    fn second_pass(
        &self,
        carry: &mut EscapedCarry,
        bytes: Bytes,
        at_end: bool,
        mask: Mask,
    ) -> (Bytes, usize) {
        match &self.escaped {
            Some(escaped) => escaped.pass(carry, bytes, at_end, mask),
            None => (bytes, 0),
        }
    }

    /// The first pass over a whole body.
    fn redact_uniform(&self, bytes: &[u8], mask: Mask) -> (Bytes, usize) {
        let Some(ac) = self.automaton.as_ref().filter(|_| self.may_hit(bytes)) else {
            return (Bytes::copy_from_slice(bytes), 0);
        };
        let mut out = Vec::with_capacity(bytes.len());
        let (mut end, mut hits) = (0, 0);
        for m in ac.find_iter(bytes) {
            out.extend_from_slice(&bytes[end..m.start()]);
            mask.put(&mut out, m.len());
            end = m.end();
            hits += 1;
        }
        out.extend_from_slice(&bytes[end..]);
        (Bytes::from(out), hits)
    }

    /// The first pass over a streamed chunk: bytes that could still start a match stay
    /// in `carry`.
    fn uniform_stream(&self, carry: &mut Vec<u8>, chunk: &[u8], mask: Mask) -> (Bytes, usize) {
        let Some(ac) = &self.automaton else {
            return (Bytes::copy_from_slice(chunk), 0);
        };
        // Without a kept-back tail the chunk is scanned where it is, not copied first.
        let joined;
        let data = if carry.is_empty() {
            chunk
        } else {
            carry.extend_from_slice(chunk);
            joined = std::mem::take(carry);
            &joined[..]
        };
        // Every needle starting before `decided` is whole in `data`. After it, a match
        // is taken only if no needle could still start at or before it and run past
        // the data: then the whole body would have made the same choice.
        let decided = self.needles.decided(data.len());
        let mut out = Vec::with_capacity(data.len());
        let (mut end, mut hits, mut held) = (0, 0, None);
        let found = self.may_hit(data).then(|| ac.find_iter(data));
        for m in found.into_iter().flatten() {
            held = self
                .needles
                .first_pending(data, end.max(decided), m.start() + 1);
            if held.is_some() {
                break;
            }
            out.extend_from_slice(&data[end..m.start()]);
            mask.put(&mut out, m.len());
            end = m.end();
            hits += 1;
        }
        let hold = held
            .or_else(|| {
                self.needles
                    .first_pending(data, end.max(decided), data.len())
            })
            .unwrap_or(data.len());
        out.extend_from_slice(&data[end..hold]);
        carry.extend_from_slice(&data[hold..]);
        (Bytes::from(out), hits)
    }

    /// Whether `bytes` hold a form of the secret (for names that cannot be rewritten).
    pub fn is_match(&self, bytes: &[u8]) -> bool {
        self.automaton
            .as_ref()
            .is_some_and(|ac| self.may_hit(bytes) && ac.is_match(bytes))
            || self.escaped.as_ref().is_some_and(|e| e.is_match(bytes))
    }
}

/// Forms up to which an automaton is a DFA (aho-corasick's own rule: more make its
/// transition table too large).
const DFA_AT_MOST: usize = 100;

/// Built once per credential version (`GuardCache`). Measured (bench/http.rs, release):
/// for a token's forms a DFA builds in ~0.66 ms and scans ~3.7 ms/MiB, a contiguous NFA
/// ~0.19 ms and ~8 ms/MiB; cached, the faster scan wins. A key's hundreds of forms (each
/// PEM line, its base64 at three alignments, its hex) would make a DFA of megabytes
/// that takes a quarter of a second to build: those get the NFA.
fn automaton_kind(forms: usize) -> AhoCorasickKind {
    if forms <= DFA_AT_MOST {
        AhoCorasickKind::DFA
    } else {
        AhoCorasickKind::ContiguousNFA
    }
}

/// A pass's forms as a stream's end sees them: where one may start and run past it.
struct Needles {
    list: Vec<Vec<u8>>,
    /// By first byte (ASCII lower-cased): the forms that start with it. Most positions
    /// start none, and a key's hundreds of forms are not all tried at each.
    by_start: Vec<Vec<usize>>,
    longest: usize,
}

impl Default for Needles {
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl Needles {
    fn new(list: Vec<Vec<u8>>) -> Self {
        let mut by_start = vec![Vec::new(); 256];
        for (i, n) in list.iter().enumerate() {
            if let Some(b) = n.first() {
                by_start[usize::from(b.to_ascii_lowercase())].push(i);
            }
        }
        let longest = list.iter().map(Vec::len).max().unwrap_or(0);
        Self {
            list,
            by_start,
            longest,
        }
    }

    /// Every form starting before this position is whole in `len` bytes.
    fn decided(&self, len: usize) -> usize {
        (len + 1).saturating_sub(self.longest)
    }

    /// The first position in `from..to` where a form could start and end past the data.
    fn first_pending(&self, data: &[u8], from: usize, to: usize) -> Option<usize> {
        (from..to.min(data.len())).find(|&p| {
            let rest = &data[p..];
            self.by_start[usize::from(rest[0].to_ascii_lowercase())]
                .iter()
                .filter_map(|&i| self.list.get(i))
                .any(|n| n.len() > rest.len() && n[..rest.len()].eq_ignore_ascii_case(rest))
        })
    }
}

/// Leading characters of the secret that an escape introducer put right before it can
/// swallow (`\u` takes four hex digits, `%` two, `\` one); the rest is still a form.
const MAX_SWALLOWED: usize = 4;

/// The shortest rest of the secret guarded on its own.
const MIN_REST: usize = 8;

/// The second pass's forms: `forms` as the decoded text holds them, `spaced` also read
/// across separators (encodings, whose groups a printer may space out).
#[derive(Default)]
struct Plain {
    forms: Vec<Vec<u8>>,
    spaced: Vec<Vec<u8>>,
}

impl Plain {
    fn extend(&mut self, other: Plain) {
        self.forms.extend(other.forms);
        self.spaced.extend(other.spaced);
    }

    /// Short forms dropped, each list sorted and without repeats.
    fn sorted(mut self) -> Self {
        for list in [&mut self.forms, &mut self.spaced] {
            list.retain(|n| n.len() >= MIN_NEEDLE);
            list.sort();
            list.dedup();
        }
        self
    }
}

/// A PEM's needles and plain forms (see `ReflectionGuard::for_pem`).
fn pem_forms(pem: &str) -> (Vec<Vec<u8>>, Plain) {
    let lines: Vec<Vec<u8>> = pem
        .lines()
        .map(str::trim)
        .filter(|l| l.len() >= MIN_PEM_LINE && !l.starts_with("-----"))
        .map(|l| l.as_bytes().to_vec())
        .collect();
    let mut needles = lines.clone();
    // A JSON encoder may write `/` as `\/`.
    let escaped: Vec<Vec<u8>> = needles
        .iter()
        .filter(|n| n.contains(&b'/'))
        .map(|n| String::from_utf8_lossy(n).replace('/', "\\/").into_bytes())
        .collect();
    needles.extend(escaped);
    let encoded: Vec<Vec<u8>> = lines
        .iter()
        .flat_map(|l| {
            let mut e = base64_cores(l);
            e.push(hex(l));
            e
        })
        .collect();
    needles.extend(encoded.iter().cloned());
    let plain = Plain {
        forms: lines,
        spaced: encoded,
    };
    (needles, plain)
}

/// What escapes in an echo decode to: the secret raw (with `+` for each space too, as a
/// form encoder writes it, and without its first few characters, which an escape just
/// before it may have swallowed), base64 of it at any offset and of the value, and hex.
/// The secret's own spaces between base64 characters read as separators: it is also
/// a spaced form without them.
fn plain_forms(secret: &[u8], value: &[u8]) -> Plain {
    let mut spaced = base64_cores(secret);
    spaced.extend(base64s(secret));
    spaced.extend(base64s(value));
    spaced.push(hex(secret));
    let mut forms = vec![secret.to_vec()];
    if secret.contains(&b' ') {
        forms.push(
            secret
                .iter()
                .map(|&b| if b == b' ' { b'+' } else { b })
                .collect(),
        );
    }
    forms.extend(
        (1..=MAX_SWALLOWED)
            .filter_map(|k| secret.get(k..))
            .filter(|rest| rest.len() >= MIN_REST)
            .map(<[u8]>::to_vec),
    );
    spaced.extend(forms.iter().filter_map(|f| unspaced(f)));
    Plain { forms, spaced }.sorted()
}

/// `x` without its whitespace between base64 characters, if it has any.
fn unspaced(x: &[u8]) -> Option<Vec<u8>> {
    let blank = |b: &u8| matches!(b, b' ' | b'\t' | b'\r' | b'\n');
    let mut out = Vec::with_capacity(x.len());
    let mut i = 0;
    while i < x.len() {
        let run = x[i..].iter().take_while(|b| blank(b)).count();
        let between = run > 0
            && out.last().is_some_and(|&b| unescape::is_base64(b))
            && x.get(i + run).is_some_and(|&b| unescape::is_base64(b));
        if between {
            i += run;
        } else {
            out.push(x[i]);
            i += 1;
        }
    }
    (out.len() < x.len()).then_some(out)
}

/// Every form an echo might take, of the secret and of the injected value.
fn forms(secret: &[u8], value: &[u8]) -> Vec<Vec<u8>> {
    let mut needles = base64_cores(secret);
    needles.extend(encodings(secret));
    // Other encodings of the value contain the secret's own; base64 does not.
    needles.extend(base64s(value));
    needles.retain(|n| n.len() >= MIN_NEEDLE);
    needles.sort();
    needles.dedup();
    needles
}

/// Raw, base64 (also of `x` + newline, as `echo | base64` makes it), hex, JSON escapes and percent-encodings of `x`.
fn encodings(x: &[u8]) -> Vec<Vec<u8>> {
    let mut out = vec![x.to_vec()];
    out.extend(base64s(x));
    out.push(hex(x));
    out.push(pct_all(x));
    let reserved = pct_reserved(x, b"");
    out.push(reserved.replace("%20", "+").into_bytes());
    out.push(reserved.into_bytes());
    out.push(pct_reserved(x, b"/").into_bytes());
    if let Ok(s) = std::str::from_utf8(x) {
        out.push(unicode_escaped(s).into_bytes());
        if let Ok(json) = serde_json::to_string(s) {
            let inner = json.trim_matches('"');
            out.push(inner.replace('/', "\\/").into_bytes());
            out.push(inner.as_bytes().to_vec());
        }
    }
    out
}

/// Lower-case hex of every byte.
fn hex(x: &[u8]) -> Vec<u8> {
    x.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()
        .into_bytes()
}

/// `x` and `x` + newline in both alphabets, padded or not.
fn base64s(x: &[u8]) -> Vec<Vec<u8>> {
    let mut nl = x.to_vec();
    nl.push(b'\n');
    let mut out = Vec::new();
    for engine in [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD] {
        out.push(engine.encode(x).into_bytes());
        out.push(engine.encode(&nl).into_bytes());
    }
    out
}

/// The base64 characters fixed by the secret's bytes alone, at each of the three byte
/// alignments the secret can have inside a longer encoded string.
fn base64_cores(secret: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for shift in 0..3usize {
        let mut padded = vec![0u8; shift];
        padded.extend_from_slice(secret);
        let first = (shift * 8).div_ceil(6);
        let last = (padded.len() * 8) / 6;
        for engine in [STANDARD_NO_PAD, URL_SAFE_NO_PAD] {
            let text = engine.encode(&padded).into_bytes();
            if let Some(core) = text.get(first..last) {
                out.push(core.to_vec());
            }
        }
    }
    out
}

/// `\uXXXX` for every UTF-16 unit, as a JSON encoder escaping everything writes it.
fn unicode_escaped(s: &str) -> String {
    s.encode_utf16().map(|u| format!("\\u{u:04x}")).collect()
}

/// `%XX` for every byte.
fn pct_all(x: &[u8]) -> Vec<u8> {
    x.iter()
        .map(|b| format!("%{b:02X}"))
        .collect::<String>()
        .into_bytes()
}

/// Percent-encodes everything but unreserved characters (RFC 3986) and `keep`.
pub fn pct_reserved(x: &[u8], keep: &[u8]) -> String {
    let mut out = String::with_capacity(x.len());
    for &b in x {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) || keep.contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests;
