//! A quick "no form here" before a pass's automaton runs. An ASCII case-insensitive
//! automaton gets no prefilter from aho-corasick and steps its DFA byte by byte (~4 ms per
//! MiB); almost every body holds no form at all. The gate folds the bytes to lower case,
//! a window at a time, and asks a packed (SIMD) searcher over the lower-cased forms,
//! which is exact: when it finds none, the automaton would find none either, and the pass
//! skips it. A hit, or a guard with too many forms for the searcher (a key's), takes the
//! automaton as before.

use aho_corasick::packed::{Config, MatchKind, Searcher};

/// Bytes folded and searched at once (the forms' longest − 1 more, so a form across a
/// window's end is whole in one of them).
const WINDOW: usize = 16 << 10;

pub(super) struct Gate {
    searcher: Searcher,
    longest: usize,
}

impl Gate {
    /// `None` when the searcher cannot hold these forms: then every scan takes the
    /// automaton.
    pub fn new(forms: &[Vec<u8>]) -> Option<Self> {
        let longest = forms.iter().map(Vec::len).max()?;
        let searcher = Config::new()
            .match_kind(MatchKind::LeftmostFirst)
            .builder()
            .extend(forms.iter().map(|f| f.to_ascii_lowercase()))
            .build()?;
        Some(Self { searcher, longest })
    }

    /// Whether any form may occur in `bytes`, ASCII case ignored. False only when none
    /// does.
    pub fn may_hit(&self, bytes: &[u8]) -> bool {
        let mut folded = Vec::with_capacity(bytes.len().min(WINDOW) + self.longest);
        let mut from = 0;
        while from < bytes.len() {
            let to = bytes.len().min(from + WINDOW + self.longest - 1);
            folded.clear();
            folded.extend(bytes[from..to].iter().map(u8::to_ascii_lowercase));
            if self.searcher.find(&folded).is_some() {
                return true;
            }
            if to == bytes.len() {
                break;
            }
            from += WINDOW;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_form_in_any_case_across_any_window_end_is_seen() {
        let Some(gate) = Gate::new(&[b"Secret-Token".to_vec(), b"c2VjcmV0".to_vec()]) else {
            panic!("no packed searcher on this machine");
        };
        assert!(!gate.may_hit(b""));
        assert!(!gate.may_hit(&vec![b'x'; 3 * WINDOW]));
        for form in [&b"sECRET-tOKEN"[..], b"C2vJCMv0"] {
            for at in [0, 1, WINDOW - 5, WINDOW - 1, WINDOW, 2 * WINDOW - 3] {
                let mut body = vec![b'x'; 3 * WINDOW];
                body[at..at + form.len()].copy_from_slice(form);
                assert!(gate.may_hit(&body), "form at {at}");
            }
        }
        assert!(!gate.may_hit(b"Secret-Toke"));
    }
}
