//! The second pass of the reflection guard: forms of the secret with only some characters
//! escaped (`C\u0041NARY`, `%43ANARY`, `CA\x4eARY`, `\u0043A%4EARY`, a .NET echo of
//! base64 with `+` as `\u002B`). No single pattern holds them, so the bytes the first
//! pass let through are decoded (`unescape`) and the decoded text is scanned for the
//! plain forms (raw, base64, hex); a hit is redacted over the original bytes it came
//! from. Hits made of no escape at all are the first pass's business and are ignored
//! here, which also lets text without a `\`, `%` or `&` skip decoding and scanning.
//!
//! A hit read across a separator (whitespace between groups of base64 or hex) counts
//! only for a spaced form (an encoding of the secret): prose whose words join into the
//! secret is not redacted.
//!
//! Among the hits, leftmost-longest wins, as in the first pass. A stream keeps back the
//! bytes that may still be the start of a hit: an escape cut off by the chunk's end,
//! and decoded text that is the start of a plain form, so every chunking gives the
//! output of the whole body. Both are bounded (`ReflectionGuard::redact_stream`).

use aho_corasick::{AhoCorasick, MatchKind};
use bytes::Bytes;

use super::gate::Gate;
use super::unescape::{Decoded, has_escape};
use super::{Mask, Needles};

/// How much of a whole body is decoded at once.
const PIECE: usize = 16 << 10;

/// The decoded plain forms of the secret.
pub(super) struct Escaped {
    automaton: AhoCorasick,
    /// Says when the automaton can find nothing in a decoded text.
    gate: Option<Gate>,
    needles: Needles,
    /// The forms that may be read across a separator: all that can still run past a
    /// decoded text ending in one.
    spaced_needles: Needles,
    /// By pattern: whether a hit may be read across a separator.
    spaced: Vec<bool>,
}

/// A stream's state: bytes kept back, and buffers reused from chunk to chunk.
#[derive(Default)]
pub(super) struct EscapedCarry {
    pub held: Vec<u8>,
    /// `held` starts in the middle of a line (no dump line can start there).
    mid_line: bool,
    decoded: Decoded,
    hits: Vec<(usize, usize)>,
}

impl Escaped {
    /// `plain` forms are read in the decoded text, `spaced` ones across separators too.
    /// `None` if the automaton cannot be built.
    pub fn new(plain: Vec<Vec<u8>>, spaced: Vec<Vec<u8>>) -> Option<Self> {
        let mut needles: Vec<Vec<u8>> = plain.into_iter().filter(|p| !spaced.contains(p)).collect();
        let mut kinds = vec![false; needles.len()];
        kinds.resize(needles.len() + spaced.len(), true);
        let spaced_needles = Needles::new(spaced.clone());
        needles.extend(spaced);
        // Standard semantics: every hit is seen (overlapping), so that one made of no
        // escape cannot hide an escaped one behind it.
        let automaton = AhoCorasick::builder()
            .kind(Some(super::automaton_kind(needles.len())))
            .match_kind(MatchKind::Standard)
            .ascii_case_insensitive(true)
            .build(&needles)
            .ok()?;
        Some(Self {
            automaton,
            gate: Gate::new(&needles),
            needles: Needles::new(needles),
            spaced_needles,
            spaced: kinds,
        })
    }

    /// Whether a hit of `pattern` over `text[start..end]` is one this pass redacts: made
    /// of an escape, and across no separator unless the form may be spaced.
    fn counts(&self, d: &Decoded, pattern: usize, start: usize, end: usize) -> bool {
        d.escaped(start, end)
            && (self.spaced.get(pattern).copied().unwrap_or(false) || !d.separated(start, end))
    }

    /// False only when no plain form occurs in `text`.
    fn may_hit(&self, text: &[u8]) -> bool {
        self.gate.as_ref().is_none_or(|g| g.may_hit(text))
    }

    #[cfg(test)]
    pub fn ungated(mut self) -> Self {
        self.gate = None;
        self
    }

    /// Whether `bytes` hold an escaped form.
    pub fn is_match(&self, bytes: &[u8]) -> bool {
        if !has_escape(bytes) {
            return false;
        }
        let mut decoded = Decoded::default();
        decoded.decode(bytes, true);
        self.may_hit(&decoded.text)
            && self
                .automaton
                .find_overlapping_iter(&decoded.text[..])
                .any(|m| self.counts(&decoded, m.pattern().as_usize(), m.start(), m.end()))
    }

    /// Redacts escaped forms in a whole body. A large one goes in pieces (any chunking
    /// gives the same output), so the decoded copy and its map stay the size of a piece;
    /// without a hit the body is returned as it is, not copied.
    pub fn whole(&self, bytes: Bytes) -> (Bytes, usize) {
        let mut carry = EscapedCarry::default();
        let mask = Mask::Marker;
        if bytes.len() <= PIECE || !has_escape(&bytes) {
            return self.pass(&mut carry, bytes, true, mask);
        }
        let (mut parts, mut hits) = (Vec::new(), 0);
        for piece in bytes.chunks(PIECE) {
            let (part, n) = self.pass(&mut carry, bytes.slice_ref(piece), false, mask);
            parts.push(part);
            hits += n;
        }
        let (part, n) = self.pass(&mut carry, Bytes::new(), true, mask);
        parts.push(part);
        match hits + n {
            0 => (bytes, 0),
            hits => (Bytes::from(parts.concat()), hits),
        }
    }

    /// Redacts escaped forms in `input` after what `carry` kept back; keeps back what may
    /// still start one unless `at_end`. Returns the bytes that can go out and the hits.
    pub fn pass(
        &self,
        carry: &mut EscapedCarry,
        input: Bytes,
        at_end: bool,
        mask: Mask,
    ) -> (Bytes, usize) {
        let data = if carry.held.is_empty() {
            input
        } else {
            carry.held.extend_from_slice(&input);
            Bytes::from(std::mem::take(&mut carry.held))
        };
        // A line's start may begin a dump even without an introducer (`000000` alone).
        let may_be_dump = !carry.mid_line && super::dump::may_begin(&data);
        if !has_escape(&data) && !may_be_dump {
            // Decodes to itself: no escaped hit, only a possible start to keep back.
            let hold = self.hold(&self.needles, &data, 0, at_end, None);
            return (keep_back(carry, &data, hold), 0);
        }
        carry.decoded.decode_lines(&data, at_end, !carry.mid_line);
        self.find(carry);
        if carry.hits.is_empty() {
            let d = &carry.decoded;
            let hold = d.raw_start(self.hold(self.tail(d), &d.text, 0, at_end, None));
            return (keep_back(carry, &data, hold), 0);
        }
        let (out, count) = self.redact_hits(carry, &data, at_end, mask);
        (Bytes::from(out), count)
    }

    /// Replaces the hits, leftmost-longest, up to one that a hit not yet whole may still
    /// displace; keeps back the rest.
    fn redact_hits(
        &self,
        carry: &mut EscapedCarry,
        data: &[u8],
        at_end: bool,
        mask: Mask,
    ) -> (Vec<u8>, usize) {
        let d = &carry.decoded;
        let needles = self.tail(d);
        let decided = needles.decided(d.text.len());
        let mut out = Vec::with_capacity(data.len());
        let (mut end, mut emitted, mut count, mut pending) = (0, 0, 0, None);
        for &(start, stop) in &carry.hits {
            if start < end {
                continue;
            }
            if !at_end {
                pending = needles.first_pending(&d.text, end.max(decided), start + 1);
                if pending.is_some() {
                    break;
                }
            }
            let (from, to) = (d.raw_start(start).max(emitted), d.raw_end(stop));
            out.extend_from_slice(&data[emitted..from]);
            mask.put(&mut out, to.saturating_sub(from));
            (end, emitted, count) = (stop, to.max(emitted), count + 1);
        }
        let hold = d
            .raw_start(self.hold(needles, &d.text, end, at_end, pending))
            .max(emitted);
        out.extend_from_slice(&data[emitted..hold]);
        carry.held.extend_from_slice(&data[hold..]);
        mark_line(&mut carry.mid_line, data, hold);
        (out, count)
    }

    /// Every hit that came from an escape, leftmost first, the longest of a start first.
    fn find(&self, carry: &mut EscapedCarry) {
        let d = &carry.decoded;
        carry.hits.clear();
        if !self.may_hit(&d.text) {
            return;
        }
        carry.hits.extend(
            self.automaton
                .find_overlapping_iter(&d.text[..])
                .filter(|m| self.counts(d, m.pattern().as_usize(), m.start(), m.end()))
                .map(|m| (m.start(), m.end())),
        );
        carry
            .hits
            .sort_unstable_by_key(|&(start, end)| (start, std::cmp::Reverse(end)));
    }

    /// The forms that may still run past the end of `d`: after a separator cut off by
    /// the end, only those that may be read across one.
    fn tail(&self, d: &Decoded) -> &Needles {
        if d.ends_in_separator() {
            &self.spaced_needles
        } else {
            &self.needles
        }
    }

    /// Where to keep back `text` from: the first position at or after `end` (or
    /// `pending`) where one of `needles` may start and run past the end.
    fn hold(
        &self,
        needles: &Needles,
        text: &[u8],
        end: usize,
        at_end: bool,
        pending: Option<usize>,
    ) -> usize {
        if at_end {
            return text.len();
        }
        let from = end.max(needles.decided(text.len()));
        pending
            .or_else(|| needles.first_pending(text, from, text.len()))
            .unwrap_or(text.len())
    }
}

/// `data` up to `hold` goes out as it is (a slice, not a copy); the rest is kept back.
fn keep_back(carry: &mut EscapedCarry, data: &Bytes, hold: usize) -> Bytes {
    carry.held.extend_from_slice(&data[hold..]);
    mark_line(&mut carry.mid_line, data, hold);
    data.slice(..hold)
}

/// Whether what is kept back from `hold` on starts in the middle of a line.
fn mark_line(mid_line: &mut bool, data: &[u8], hold: usize) {
    if let Some(i) = hold.checked_sub(1) {
        *mid_line = data[i] != b'\n';
    }
}

#[cfg(test)]
mod tests;
