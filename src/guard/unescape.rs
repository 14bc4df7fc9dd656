//! The normalizer under the escaped-form scan: undoes escapes in a byte stream, left to
//! right, and keeps where each decoded byte came from, so a hit in the decoded text is
//! redacted in the original bytes.
//!
//! Decoded, each escape as one unit:
//! - `\uXXXX` (a surrogate pair as one code point; a lone surrogate becomes U+FFFD),
//!   `\UXXXXXXXX` (a valid code point), `\xXX` (a byte), each also behind up to 8 backslashes (`\\u0041`:
//!   JSON inside JSON), and `%uXXXX`;
//! - the JSON escapes `\b \f \n \r \t`, and `\` before any ASCII punctuation or space
//!   (`\/`, `\"`, `\\`, and what regex quoting and shells write: `\+`, `\?`);
//! - `%XX`, also encoded again up to twice (`%2541`, `%252541`);
//! - HTML `&#NN;`, `&#xHH;`, `&amp; &lt; &gt; &quot; &apos;` (any ASCII case).
//!
//! - a line break (`\n`, `\r\n`, with the next line's indentation) between two base64
//!   characters decodes to nothing: base64 wrapped at 76 or 64 columns (MIME, PEM,
//!   `base64`, folded or indented) reads whole. At the end of the bytes
//!   it stays itself (a stream never waits on a line end).
//! - other whitespace between two base64 (or hex) characters — spaces or tabs between
//!   groups, blank lines, `\r\n \r\n` — is a separator: nothing, but a hit read across
//!   one counts only for an encoded form (`Value::Separator`), so prose whose words
//!   join into the secret is not redacted.
//! - a hex or character dump line (`dump`) decodes to the bytes it shows, and the line
//!   break after it to nothing: a dump reads as the file it shows. A dump line cut off
//!   by the end of the bytes waits, like an escape.
//!
//! `+` stays `+`: decoding it as a space would break every secret that holds a `+`.
//! An escape cut off by the end of the bytes waits for more (`Step::Wait`) unless the
//! stream is at its end, where it is plain text, as a whole-body decoder reads it.

use super::dump;

/// Backslashes allowed before a nested `\u` or `\x`.
const MAX_BACKSLASHES: usize = 8;
/// Times a percent-escape may itself be percent-encoded (`%25` prefixes).
const MAX_PCT_NEST: usize = 2;
/// Digits of an HTML numeric reference: `&#1114111;`, `&#x10FFFF;`.
const MAX_DEC_DIGITS: usize = 7;
const MAX_HEX_DIGITS: usize = 6;
const NAMED: [(&[u8], u8); 5] = [
    (b"amp;", b'&'),
    (b"lt;", b'<'),
    (b"gt;", b'>'),
    (b"quot;", b'"'),
    (b"apos;", b'\''),
];

/// Whether `bytes` hold anything that may start an escape, a separator or a dump line:
/// without, they decode to themselves and need no decoding at all.
pub(super) fn has_escape(bytes: &[u8]) -> bool {
    memchr::memchr3(b'\\', b'%', b'&', bytes).is_some()
        || memchr::memchr3(b'\n', b'\r', b' ', bytes).is_some()
        || memchr::memchr(b'\t', bytes).is_some()
}

/// The next position of one kind of byte at or after where it was last sought (`None`
/// inside: none left), so a body is not rescanned for each introducer of another kind.
#[derive(Default)]
struct Next(Option<Option<usize>>);

impl Next {
    fn at(
        &mut self,
        raw: &[u8],
        from: usize,
        find: impl Fn(&[u8]) -> Option<usize>,
    ) -> Option<usize> {
        match self.0 {
            Some(Some(at)) if at >= from => Some(at),
            Some(None) => None,
            _ => {
                let at = find(raw.get(from..).unwrap_or_default()).map(|t| from + t);
                self.0 = Some(at);
                at
            }
        }
    }
}

/// Finds the next byte that may start an escape, a line break or a separator.
#[derive(Default)]
struct Introducers {
    escape: Next,
    blank: Next,
    tab: Next,
}

impl Introducers {
    fn next(&mut self, raw: &[u8], from: usize) -> Option<usize> {
        let escape = self
            .escape
            .at(raw, from, |r| memchr::memchr3(b'\\', b'%', b'&', r));
        let blank = self
            .blank
            .at(raw, from, |r| memchr::memchr3(b'\n', b'\r', b' ', r));
        let tab = self.tab.at(raw, from, |r| memchr::memchr(b'\t', r));
        let first = match (escape, blank) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match (first, tab) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Where the decoder is, beyond its position: what it remembers of the lines so far.
#[derive(Default)]
struct Scan {
    introducers: Introducers,
    /// Where the last dump line ended (its line break decodes to nothing).
    dump_end: Option<usize>,
    /// Where the whitespace run last looked at ends.
    blank_end: usize,
}

impl Scan {
    /// The first byte after the whitespace run at `raw[t]`.
    fn after_blank(&mut self, raw: &[u8], t: usize) -> Option<u8> {
        if t >= self.blank_end {
            let run = raw[t..]
                .iter()
                .take_while(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
                .count();
            self.blank_end = t + run;
        }
        raw.get(self.blank_end).copied()
    }
}

pub(super) fn is_base64(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'-' | b'_' | b'=')
}

/// A line break at `raw[t]`: nothing when it wraps base64 (base64 on both sides), else
/// itself.
fn line_break(raw: &[u8], t: usize) -> Step {
    let before = t.checked_sub(1).and_then(|i| raw.get(i));
    let mut len = match raw.get(t..t + 2) {
        Some(b"\r\n") => 2,
        _ => 1,
    };
    // A folded or indented line (email headers, YAML, pretty-printed JSON) goes on after
    // its indentation.
    while matches!(raw.get(t + len), Some(b' ' | b'\t')) {
        len += 1;
    }
    let after = raw.get(t + len);
    match (before, after) {
        (Some(&b), Some(&a)) if is_base64(b) && is_base64(a) => Step::Decoded(len, Value::Nothing),
        _ => Step::Literal,
    }
}

/// Decoded text and its map back to the raw bytes (reused across calls: no allocation
/// once warm).
#[derive(Default)]
pub(super) struct Decoded {
    pub text: Vec<u8>,
    /// Where each run of `text` starts, in `text` and in the raw bytes. A run is one
    /// escape, one dump line or literal bytes (one for one); a last entry marks the end
    /// of both.
    runs: Vec<Run>,
    /// The bytes of the dump line being read.
    line: Vec<u8>,
}

#[derive(Clone, Copy)]
struct Run {
    text: usize,
    raw: usize,
    escape: bool,
    /// A separator (`Value::Separator`).
    separator: bool,
}

impl Decoded {
    /// Decodes `raw`, which starts a line; returns how much of it was decoded (the rest
    /// is an escape or a dump line cut off by the end, only when not `at_end`).
    pub fn decode(&mut self, raw: &[u8], at_end: bool) -> usize {
        self.decode_lines(raw, at_end, true)
    }

    /// As `decode`; `line_start` says whether `raw` starts a line (a stream's bytes
    /// after what went out may start in the middle of one).
    pub fn decode_lines(&mut self, raw: &[u8], at_end: bool, line_start: bool) -> usize {
        self.text.clear();
        self.runs.clear();
        let mut scan = Scan::default();
        let mut i = 0;
        if line_start {
            match self.dump_at(raw, 0, at_end) {
                Parse::Yes(end) => {
                    self.push_dump(0, end, &mut scan);
                    i = end;
                }
                Parse::Short => return self.stop(0),
                Parse::No => {}
            }
        }
        while i < raw.len() {
            let Some(t) = scan.introducers.next(raw, i) else {
                self.literal(raw, i, raw.len());
                i = raw.len();
                break;
            };
            self.literal(raw, i, t);
            let step = match raw[t] {
                b'\n' | b'\r' => self.line_end(raw, t, at_end, &mut scan),
                b' ' | b'\t' => self.blank(raw, t, at_end, &mut scan),
                _ => self.wrapped(raw, t, escape(&raw[t..], at_end)),
            };
            match step {
                Step::Decoded(len, value) => {
                    self.escape(t, value);
                    i = t + len;
                }
                Step::Literal => {
                    self.literal(raw, t, t + 1);
                    i = t + 1;
                }
                Step::Read(next) => i = next,
                Step::Wait => {
                    i = t;
                    break;
                }
            }
        }
        self.stop(i)
    }

    /// Marks where decoding stopped; returns it.
    fn stop(&mut self, i: usize) -> usize {
        self.runs.push(Run {
            text: self.text.len(),
            raw: i,
            escape: false,
            separator: false,
        });
        i
    }

    /// A line break at `raw[t]`: before a dump line, after one, wrapping base64, a
    /// separator, or itself.
    #[inline(never)]
    fn line_end(&mut self, raw: &[u8], t: usize, at_end: bool, scan: &mut Scan) -> Step {
        let len = if raw.get(t..t + 2) == Some(&b"\r\n"[..]) {
            2
        } else {
            1
        };
        let after_dump = scan.dump_end == Some(t);
        match self.dump_at(raw, t + len, at_end) {
            Parse::Yes(end) => {
                if after_dump {
                    self.escape(t, Value::Nothing);
                } else {
                    self.literal(raw, t, t + len);
                }
                self.push_dump(t + len, end, scan);
                return Step::Read(end);
            }
            Parse::Short => return Step::Wait,
            Parse::No if after_dump => return Step::Decoded(len, Value::Nothing),
            Parse::No => {}
        }
        match line_break(raw, t) {
            Step::Literal => self.blank(raw, t, at_end, scan),
            step => step,
        }
    }

    /// Whitespace at `raw[t]` (a line break, or spaces and tabs): a separator between two
    /// base64 characters with nothing but whitespace between, else itself. Spaces cut off
    /// by the end of the bytes may still be one (the stream keeps back what before them
    /// may start a form); a line break there stays itself (a stream never waits on one).
    fn blank(&self, raw: &[u8], t: usize, at_end: bool, scan: &mut Scan) -> Step {
        // Checked first: a run of whitespace after anything but base64 is read one byte at
        // a time, and measuring the run at each of its bytes would be quadratic.
        if !self.text.last().is_some_and(|&b| is_base64(b)) {
            return Step::Literal;
        }
        let line_break = matches!(raw[t], b'\r' | b'\n');
        let len = match raw[t] {
            b'\r' if raw.get(t + 1) == Some(&b'\n') => 2,
            b'\r' | b'\n' => 1,
            _ => raw[t..]
                .iter()
                .take_while(|&&b| b == b' ' || b == b'\t')
                .count(),
        };
        match scan.after_blank(raw, t) {
            Some(b) if is_base64(b) => Step::Decoded(len, Value::Separator),
            None if !at_end && !line_break && t + len == raw.len() => {
                Step::Decoded(len, Value::Separator)
            }
            _ => Step::Literal,
        }
    }

    /// The dump line starting at `raw[s]`, read into `self.line`: where its text ends
    /// (before its line break), or that it is none, or cut off by the end of the bytes.
    #[inline(never)]
    fn dump_at(&mut self, raw: &[u8], s: usize, at_end: bool) -> Parse<usize> {
        self.line.clear();
        let rest = raw.get(s..).unwrap_or_default();
        if !dump::may_begin(rest) {
            return Parse::No;
        }
        let window = &rest[..rest.len().min(dump::MAX_LINE + 2)];
        let line = match memchr::memchr(b'\n', window) {
            Some(n) => &rest[..n],
            None if rest.len() > window.len() => return Parse::No,
            None if at_end => rest,
            None if dump::may_start(rest) => return Parse::Short,
            None => return Parse::No,
        };
        if !dump::parse(line, &mut self.line) {
            return Parse::No;
        }
        Parse::Yes(s + line.strip_suffix(b"\r").unwrap_or(line).len())
    }

    /// The dump line read into `self.line`, from `raw[s..end]`, as one unit.
    fn push_dump(&mut self, s: usize, end: usize, scan: &mut Scan) {
        self.runs.push(Run {
            text: self.text.len(),
            raw: s,
            escape: true,
            separator: false,
        });
        self.text.extend_from_slice(&self.line);
        scan.dump_end = Some(end);
    }

    /// An escaped line break (`\n` in a JSON string, `\u000a`, `&#10;`) right after base64
    /// decodes to nothing, with the next line's indentation: base64 wrapped inside a JSON
    /// or HTML string reads whole too.
    fn wrapped(&self, raw: &[u8], t: usize, step: Step) -> Step {
        let Step::Decoded(mut len, value) = step else {
            return step;
        };
        let breaks = matches!(value, Value::Byte(b'\n' | b'\r') | Value::Char('\n' | '\r'));
        if !breaks || !self.text.last().is_some_and(|&b| is_base64(b)) {
            return step;
        }
        while matches!(raw.get(t + len), Some(b' ' | b'\t')) {
            len += 1;
        }
        Step::Decoded(len, Value::Nothing)
    }

    fn literal(&mut self, raw: &[u8], from: usize, to: usize) {
        if from == to {
            return;
        }
        if self.runs.last().is_none_or(|r| r.escape) {
            self.runs.push(Run {
                text: self.text.len(),
                raw: from,
                escape: false,
                separator: false,
            });
        }
        self.text.extend_from_slice(&raw[from..to]);
    }

    fn escape(&mut self, at: usize, value: Value) {
        self.runs.push(Run {
            text: self.text.len(),
            raw: at,
            escape: true,
            separator: value == Value::Separator,
        });
        match value {
            Value::Nothing | Value::Separator => {}
            Value::Byte(b) => self.text.push(b),
            Value::Char(c) => {
                let mut buf = [0u8; 4];
                self.text
                    .extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }

    /// The run holding `text[pos]` (the end marker for `pos == text.len()`).
    fn run(&self, pos: usize) -> usize {
        self.runs
            .partition_point(|r| r.text <= pos)
            .saturating_sub(1)
    }

    /// Where the unit holding `text[pos]` starts in the raw bytes (`pos == text.len()`:
    /// where decoding stopped).
    pub fn raw_start(&self, pos: usize) -> usize {
        let i = self.run(pos);
        match self.runs.get(i) {
            Some(r) if r.escape => r.raw,
            Some(r) => r.raw + (pos - r.text),
            None => 0,
        }
    }

    /// Where the unit holding `text[end - 1]` ends in the raw bytes.
    pub fn raw_end(&self, end: usize) -> usize {
        let i = self.run(end.saturating_sub(1));
        match (self.runs.get(i), self.runs.get(i + 1)) {
            (Some(r), Some(next)) if r.escape => next.raw,
            (Some(r), _) => r.raw + (end - r.text),
            (None, _) => 0,
        }
    }

    /// Whether `text[start..end]` came from at least one escape.
    pub fn escaped(&self, start: usize, end: usize) -> bool {
        self.any_run(start, end, |r| r.escape)
    }

    /// Whether the text ends in a separator (cut off by the end of the bytes): what comes
    /// next is read across it.
    pub fn ends_in_separator(&self) -> bool {
        let len = self.text.len();
        self.runs
            .iter()
            .rev()
            .take_while(|r| r.text == len)
            .any(|r| r.separator)
    }

    /// Whether `text[start..end]` is read across a separator.
    pub fn separated(&self, start: usize, end: usize) -> bool {
        self.any_run(start, end, |r| r.separator)
    }

    fn any_run(&self, start: usize, end: usize, f: impl Fn(&Run) -> bool) -> bool {
        let (a, b) = (self.run(start), self.run(end.saturating_sub(1)));
        self.runs.get(a..=b).is_some_and(|runs| runs.iter().any(f))
    }
}

/// What one escape decodes to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Value {
    /// A line break inside base64, or after a dump line.
    Nothing,
    /// Whitespace between groups of base64 or hex: nothing, for encoded forms only.
    Separator,
    Byte(u8),
    Char(char),
}

/// At a byte that may start an escape: the escape and its length, a plain byte, or
/// not known until more bytes come.
#[derive(Debug, PartialEq)]
pub(super) enum Step {
    Decoded(usize, Value),
    Literal,
    /// Read up to here, runs already pushed (a dump line).
    Read(usize),
    Wait,
}

/// A parse that may run out of bytes (`Short`) before it can say.
enum Parse<T> {
    Yes(T),
    No,
    Short,
}

pub(super) fn escape(raw: &[u8], at_end: bool) -> Step {
    let parsed = match raw.first() {
        Some(b'\\') => backslash(raw, at_end),
        Some(b'%') => percent(raw, at_end),
        Some(b'&') => entity(raw, at_end),
        _ => Parse::No,
    };
    match parsed {
        Parse::Yes((len, value)) => Step::Decoded(len, value),
        Parse::No => Step::Literal,
        Parse::Short => Step::Wait,
    }
}

/// The byte at `i`; running out is `Short` while more bytes may come.
fn byte(raw: &[u8], i: usize, at_end: bool) -> Parse<u8> {
    match raw.get(i) {
        Some(&b) => Parse::Yes(b),
        None if at_end => Parse::No,
        None => Parse::Short,
    }
}

/// The value of `n` hex digits at `raw[i..]`.
fn hex(raw: &[u8], i: usize, n: usize, at_end: bool) -> Parse<u32> {
    let mut v = 0u32;
    for k in i..i + n {
        match byte(raw, k, at_end) {
            Parse::Yes(b) => match char::from(b).to_digit(16) {
                Some(d) => v = (v << 4) | d,
                None => return Parse::No,
            },
            Parse::No => return Parse::No,
            Parse::Short => return Parse::Short,
        }
    }
    Parse::Yes(v)
}

/// `\…`: a (nested) hex escape, a JSON escape, or an escaped punctuation character.
fn backslash(raw: &[u8], at_end: bool) -> Parse<(usize, Value)> {
    let run = raw.iter().take_while(|&&b| b == b'\\').count();
    if run <= MAX_BACKSLASHES {
        match hex_escape(raw, run, at_end) {
            Parse::No => {}
            other => return other,
        }
    }
    if run >= 2 {
        return Parse::Yes((2, Value::Byte(b'\\')));
    }
    let c = match byte(raw, 1, at_end) {
        Parse::Yes(c) => c,
        Parse::No => return Parse::No,
        Parse::Short => return Parse::Short,
    };
    let value = match c {
        b'b' => 0x08,
        b'f' => 0x0c,
        b'n' => b'\n',
        b'r' => b'\r',
        b't' => b'\t',
        c if c.is_ascii_punctuation() || c == b' ' => c,
        _ => return Parse::No,
    };
    Parse::Yes((2, Value::Byte(value)))
}

/// `u`, `U` or `x` and its hex digits after `run` backslashes.
fn hex_escape(raw: &[u8], run: usize, at_end: bool) -> Parse<(usize, Value)> {
    let kind = match byte(raw, run, at_end) {
        Parse::Yes(k) => k,
        Parse::No => return Parse::No,
        Parse::Short => return Parse::Short,
    };
    let digits = run + 1;
    match kind {
        b'u' => match hex(raw, digits, 4, at_end) {
            Parse::Yes(unit) => utf16(raw, digits + 4, unit, at_end),
            Parse::No => Parse::No,
            Parse::Short => Parse::Short,
        },
        b'U' => match hex(raw, digits, 8, at_end) {
            Parse::Yes(v) => match char::from_u32(v) {
                Some(c) => Parse::Yes((digits + 8, Value::Char(c))),
                None => Parse::No,
            },
            Parse::No => Parse::No,
            Parse::Short => Parse::Short,
        },
        b'x' => match hex(raw, digits, 2, at_end) {
            Parse::Yes(v) => Parse::Yes((digits + 2, Value::Byte(v as u8))),
            Parse::No => Parse::No,
            Parse::Short => Parse::Short,
        },
        _ => Parse::No,
    }
}

/// A UTF-16 unit read up to `len`: a high surrogate takes the low one that follows.
fn utf16(raw: &[u8], len: usize, unit: u32, at_end: bool) -> Parse<(usize, Value)> {
    if !(0xD800..0xDC00).contains(&unit) {
        return Parse::Yes((len, Value::Char(code_point(unit))));
    }
    match low_surrogate(&raw[len..], at_end) {
        Parse::Yes((n, low)) => {
            let c = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
            Parse::Yes((len + n, Value::Char(code_point(c))))
        }
        Parse::No => Parse::Yes((len, Value::Char(char::REPLACEMENT_CHARACTER))),
        Parse::Short => Parse::Short,
    }
}

/// `\uDCxx` (behind any backslashes) or `%uDCxx` at the start of `raw`.
fn low_surrogate(raw: &[u8], at_end: bool) -> Parse<(usize, u32)> {
    let lead = match byte(raw, 0, at_end) {
        Parse::Yes(b'\\') => raw.iter().take_while(|&&b| b == b'\\').count(),
        Parse::Yes(b'%') => 1,
        Parse::Yes(_) | Parse::No => return Parse::No,
        Parse::Short => return Parse::Short,
    };
    if lead > MAX_BACKSLASHES {
        return Parse::No;
    }
    match byte(raw, lead, at_end) {
        Parse::Yes(b'u') => {}
        Parse::Yes(b'U') if raw[0] == b'%' => {}
        Parse::Yes(_) | Parse::No => return Parse::No,
        Parse::Short => return Parse::Short,
    }
    match hex(raw, lead + 1, 4, at_end) {
        Parse::Yes(v) if (0xDC00..0xE000).contains(&v) => Parse::Yes((lead + 5, v)),
        Parse::Yes(_) | Parse::No => Parse::No,
        Parse::Short => Parse::Short,
    }
}

fn code_point(v: u32) -> char {
    char::from_u32(v).unwrap_or(char::REPLACEMENT_CHARACTER)
}

/// `%XX` (also `%25XX`, `%2525XX`) or `%uXXXX`.
fn percent(raw: &[u8], at_end: bool) -> Parse<(usize, Value)> {
    match byte(raw, 1, at_end) {
        Parse::Yes(b'u' | b'U') => {
            return match hex(raw, 2, 4, at_end) {
                Parse::Yes(unit) => utf16(raw, 6, unit, at_end),
                Parse::No => Parse::No,
                Parse::Short => Parse::Short,
            };
        }
        Parse::Short => return Parse::Short,
        _ => {}
    }
    let (mut at, mut nest) = (1, 0);
    loop {
        let v = match hex(raw, at, 2, at_end) {
            Parse::Yes(v) => v,
            Parse::No => return Parse::No,
            Parse::Short => return Parse::Short,
        };
        if v == 0x25 && nest < MAX_PCT_NEST {
            match hex(raw, at + 2, 2, at_end) {
                Parse::Yes(_) => {
                    at += 2;
                    nest += 1;
                    continue;
                }
                Parse::Short => return Parse::Short,
                Parse::No => {}
            }
        }
        return Parse::Yes((at + 2, Value::Byte(v as u8)));
    }
}

/// `&#NN;`, `&#xHH;` or one of the named references of `NAMED`.
fn entity(raw: &[u8], at_end: bool) -> Parse<(usize, Value)> {
    match byte(raw, 1, at_end) {
        Parse::Yes(b'#') => numeric(raw, at_end),
        Parse::Yes(_) => named(raw, at_end),
        Parse::No => Parse::No,
        Parse::Short => Parse::Short,
    }
}

fn numeric(raw: &[u8], at_end: bool) -> Parse<(usize, Value)> {
    let (start, radix, max) = match byte(raw, 2, at_end) {
        Parse::Yes(b'x' | b'X') => (3, 16, MAX_HEX_DIGITS),
        Parse::Yes(_) => (2, 10, MAX_DEC_DIGITS),
        Parse::No => return Parse::No,
        Parse::Short => return Parse::Short,
    };
    let mut v = 0u32;
    for i in start..=start + max {
        let b = match byte(raw, i, at_end) {
            Parse::Yes(b) => b,
            Parse::No => return Parse::No,
            Parse::Short => return Parse::Short,
        };
        if b == b';' && i > start {
            return Parse::Yes((i + 1, Value::Char(code_point(v))));
        }
        match char::from(b).to_digit(radix) {
            Some(d) if i < start + max => v = v * radix + d,
            _ => return Parse::No,
        }
    }
    Parse::No
}

fn named(raw: &[u8], at_end: bool) -> Parse<(usize, Value)> {
    let rest = &raw[1..];
    let mut short = false;
    for (name, value) in NAMED {
        let n = name.len().min(rest.len());
        if rest[..n].eq_ignore_ascii_case(&name[..n]) {
            if n == name.len() {
                return Parse::Yes((1 + n, Value::Byte(value)));
            }
            short = true;
        }
    }
    if short && !at_end {
        Parse::Short
    } else {
        Parse::No
    }
}

#[cfg(test)]
mod tests;
