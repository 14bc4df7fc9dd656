//! Hex and character dumps read as the bytes they show (`xxd`, `xxd -c 8`, `hexdump -C`,
//! `od -c`, `od -t x1`): a secret split across dump lines, in the hex columns with
//! offsets between or in the ASCII column, then reads whole.
//!
//! A line is a dump line only if all of it parses: an offset, groups of hex digits and
//! either nothing more or an ASCII column that renders exactly those bytes (bare, `|…|`
//! or `>…<`); or `od -c` fields of four characters, after an offset or none. Lines are
//! short, so the backtracking over where the hex ends is bounded per line.

/// Longer lines are no dump's (`xxd -c 32` writes 140 characters).
pub(super) const MAX_LINE: usize = 200;
/// Digits of an offset: `od` writes 7, `xxd` and `hexdump` 8.
const MIN_OFFSET: usize = 6;
const MAX_OFFSET: usize = 16;
/// Hex digits in one group: `xxd -g 8` writes 16.
const MAX_GROUP: usize = 16;
/// Hex groups on a line at most (`MAX_LINE` holds no more).
const MAX_GROUPS: usize = MAX_LINE / 3;

/// The bytes `line` (without its line break) shows, appended to `out`, if it is a dump
/// line; `out` is left as it was otherwise.
pub(super) fn parse(line: &[u8], out: &mut Vec<u8>) -> bool {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.len() > MAX_LINE {
        return false;
    }
    let start = out.len();
    if hex_line(line, out) || chars_line(line, out) {
        return true;
    }
    out.truncate(start);
    false
}

/// Whether `partial`, a line cut off by the end of the bytes, may still become a dump
/// line: a stream waits for its end only then (a prompt does not start like one).
pub(super) fn may_start(partial: &[u8]) -> bool {
    if partial.is_empty() || partial.len() > MAX_LINE {
        return false;
    }
    hex_start(partial) || chars_start(partial)
}

/// A cheap first look at a line: a dump line starts with an offset (`MIN_OFFSET` hex
/// digits at least) or, for `od -An -c`, a space. Most lines are thus passed over at
/// their first byte.
pub(super) fn may_begin(line: &[u8]) -> bool {
    match line.first() {
        None => false,
        Some(b' ') => true,
        Some(_) => line.iter().take(MIN_OFFSET).all(u8::is_ascii_hexdigit),
    }
}

fn hex_digits(bytes: &[u8]) -> usize {
    bytes.iter().take_while(|b| b.is_ascii_hexdigit()).count()
}

fn spaces(bytes: &[u8]) -> usize {
    bytes.iter().take_while(|&&b| b == b' ').count()
}

/// Where the hex groups start: after the offset, its `:` and at least one space.
fn after_offset(line: &[u8]) -> Option<usize> {
    let digits = hex_digits(line);
    if !(MIN_OFFSET..=MAX_OFFSET).contains(&digits) {
        return None;
    }
    let colon = usize::from(line.get(digits) == Some(&b':'));
    Some(digits + colon)
}

/// `xxd`, `hexdump -C`, `od -t x1`: offset, hex groups, an optional ASCII column.
fn hex_line(line: &[u8], out: &mut Vec<u8>) -> bool {
    let Some(mut at) = after_offset(line) else {
        return false;
    };
    let start = out.len();
    // (where group k ends, bytes decoded up to it)
    let mut ends = [(0usize, 0usize); MAX_GROUPS];
    let mut groups = 0;
    while groups < MAX_GROUPS {
        let gap = spaces(&line[at..]);
        let digits = hex_digits(&line[at + gap..]);
        let end = at + gap + digits;
        let bounded = line.get(end).is_none_or(|&b| b == b' ');
        if !(1..=2).contains(&gap)
            || digits == 0
            || !digits.is_multiple_of(2)
            || digits > MAX_GROUP
            || !bounded
        {
            break;
        }
        for pair in line[at + gap..end].chunks_exact(2) {
            out.push((nibble(pair[0]) << 4) | nibble(pair[1]));
        }
        at = end;
        ends[groups] = (at, out.len() - start);
        groups += 1;
    }
    // An ASCII column may itself look like hex groups: the longest reading that renders
    // is taken.
    for &(end, n) in ends[..groups].iter().rev() {
        if ascii_column(&line[end..], &out[start..start + n]) {
            out.truncate(start + n);
            return true;
        }
    }
    groups > 0 && line[at..].iter().all(|&b| b == b' ')
}

/// A hex digit's value (the caller checked it is one).
fn nibble(d: u8) -> u8 {
    char::from(d)
        .to_digit(16)
        .and_then(|v| u8::try_from(v).ok())
        .unwrap_or(0)
}

/// Whether `rest` is spaces and then `bytes` as a dump's ASCII column shows them.
fn ascii_column(rest: &[u8], bytes: &[u8]) -> bool {
    for (open, close) in [(&b""[..], &b""[..]), (b"|", b"|"), (b">", b"<")] {
        let width = bytes.len() + open.len() + close.len();
        let Some(lead) = rest.len().checked_sub(width) else {
            continue;
        };
        let (pad, column) = rest.split_at(lead);
        let shown = &column[open.len()..column.len() - close.len()];
        if lead > 0
            && pad.iter().all(|&b| b == b' ')
            && column.starts_with(open)
            && column.ends_with(close)
            && shown.iter().zip(bytes).all(|(&s, &b)| s == printable(b))
        {
            return true;
        }
    }
    false
}

fn printable(b: u8) -> u8 {
    if (0x20..0x7f).contains(&b) { b } else { b'.' }
}

/// `od -c`: an offset (or none, `-An`) and then four characters per byte.
fn chars_line(line: &[u8], out: &mut Vec<u8>) -> bool {
    let digits = line.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits != 0 && !(MIN_OFFSET..=MAX_OFFSET).contains(&digits) {
        return false;
    }
    let fields = &line[digits..];
    if fields.is_empty() || !fields.len().is_multiple_of(4) {
        return false;
    }
    let start = out.len();
    for field in fields.chunks_exact(4) {
        match char_field(field) {
            Some(b) => out.push(b),
            None => return false,
        }
    }
    // Without an offset, a line of spaces is indentation, not a dump.
    digits > 0 || out[start..].iter().any(|&b| b != b' ')
}

/// One `od -c` field: `   c`, `  \n` or ` 377`.
fn char_field(f: &[u8]) -> Option<u8> {
    match f {
        [b' ', b' ', b' ', c] if (0x20..0x7f).contains(c) => Some(*c),
        [b' ', b' ', b'\\', e] => Some(match e {
            b'0' => 0,
            b'a' => 7,
            b'b' => 8,
            b't' => 9,
            b'n' => 10,
            b'v' => 11,
            b'f' => 12,
            b'r' => 13,
            _ => return None,
        }),
        [b' ', a, b, c] if [a, b, c].iter().all(|d| (b'0'..=b'7').contains(d)) => {
            let v = u32::from(a - b'0') * 64 + u32::from(b - b'0') * 8 + u32::from(c - b'0');
            u8::try_from(v).ok()
        }
        _ => None,
    }
}

/// An offset so far, or an offset and the start of the first hex group.
fn hex_start(partial: &[u8]) -> bool {
    let digits = hex_digits(partial);
    if digits == partial.len() {
        // Short of a whole offset nothing waits: `0000` ends git's ref advertisement, and
        // holding it back would stall the remote waiting for the agent's answer.
        return (MIN_OFFSET..=MAX_OFFSET).contains(&digits);
    }
    let Some(at) = after_offset(partial) else {
        return false;
    };
    let rest = &partial[at..];
    let gap = spaces(rest);
    if gap == rest.len() {
        return gap <= 2;
    }
    (1..=2).contains(&gap) && rest[gap].is_ascii_hexdigit()
}

/// `od -c` fields so far, whole ones valid and the last one a valid start.
fn chars_start(partial: &[u8]) -> bool {
    let digits = partial.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == partial.len() {
        return (MIN_OFFSET..=MAX_OFFSET).contains(&digits);
    }
    if digits != 0 && !(MIN_OFFSET..=MAX_OFFSET).contains(&digits) {
        return false;
    }
    let fields = &partial[digits..];
    if digits == 0 && fields.iter().all(|&b| b == b' ') {
        // An indent is not yet a dump (`od -An -c`): waiting on it could stall a prompt.
        return false;
    }
    let whole = fields.len() / 4 * 4;
    let valid = fields[..whole]
        .chunks_exact(4)
        .all(|f| char_field(f).is_some());
    valid && fields.get(whole).is_none_or(|&b| b == b' ')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(line: &str) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        parse(line.as_bytes(), &mut out).then_some(out)
    }

    #[test]
    fn each_tool_line_reads_as_its_bytes() {
        for (line, shown) in [
            (
                "00000000: 7878 2073 3363 722f 742b 7661 6c7e 5a39  xx s3cr/t+val~Z9",
                &b"xx s3cr/t+val~Z9"[..],
            ),
            (
                "00000020: 2068 6572 650a 01ff   here...",
                b" here\n\x01\xff",
            ),
            ("00000000: 6465 6164 6265 6566  deadbeef", b"deadbeef"),
            (
                "00000010  3f 71 20 61 6e 64 20 6d  6f 72 65 20 74 65 78 74  |?q and more text|",
                b"?q and more text",
            ),
            (
                "00000020  0a 01                                             |..|",
                b"\n\x01",
            ),
            ("0000000   x  \\t   y 177 200    ", b"x\ty\x7f\x80 "),
            ("   a   b  \\n", b"ab\n"),
            ("0000020 3f 71 20 61", b"?q a"),
            ("0000000 78 78 20 73  >xx s<", b"xx s"),
        ] {
            assert_eq!(bytes(line).as_deref(), Some(shown), "{line}");
        }
    }

    #[test]
    fn ordinary_lines_are_no_dump() {
        for line in [
            "00000028",
            "2024-12-04 18:07:11 started",
            "cafe babe",
            "000000: 7878 2073  xx s!",
            "        ",
            "    foo",
            "0000000 hello world",
            "",
        ] {
            assert_eq!(bytes(line), None, "{line}");
        }
    }

    #[test]
    fn only_a_line_that_starts_like_a_dump_waits() {
        for partial in ["000000", "00000010:", "00000010: 3f", "0000020   x", "   a"] {
            assert!(may_start(partial.as_bytes()), "{partial}");
        }
        let git_flush = "0000";
        for partial in [
            "$ ",
            "user@host:~$ ",
            "db> ",
            "Password: ",
            "",
            "0000 x",
            git_flush,
            "   ",
        ] {
            assert!(!may_start(partial.as_bytes()), "{partial}");
        }
    }
}
