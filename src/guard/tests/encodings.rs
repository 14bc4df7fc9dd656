//! The encodings a remote command prints a secret in (issue 22 §7): base64 in groups,
//! hex and character dumps, a private key encoded whole.

use std::io::Write;
use std::process::{Command, Stdio};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::super::{Carry, REDACTED, ReflectionGuard};

/// Secrets of several lengths, the shortest a password may be and the longest a token.
const SECRETS: [&str; 4] = [
    "pw-8x9Kq",
    "s3cr/t+val~Z9?q",
    "tok_4fQm9ZpR2xLw7cVb0nHs",
    "sk-live-Gx7P2qLm9ZrT4vWb8nKd1sYc6hJf3aRe",
];

fn guard(secret: &str) -> ReflectionGuard {
    match ReflectionGuard::new(secret.as_bytes(), format!("Bearer {secret}").as_bytes()) {
        Some(g) => g,
        None => panic!("no guard for a {}-character secret", secret.len()),
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Whether any `window` bytes of `secret` can be read back from what is left of `out`
/// (between the redaction markers, whitespace dropped) as raw text, base64 at each of
/// its four character alignments, or hex at both.
fn recovers(out: &[u8], secret: &[u8], window: usize) -> bool {
    let out = text(out);
    let pieces: Vec<String> = out
        .split(String::from_utf8_lossy(REDACTED).as_ref())
        .map(|p| p.split_whitespace().collect())
        .collect();
    let windows: Vec<&[u8]> = secret.windows(window.min(secret.len())).collect();
    let holds = |bytes: &[u8]| {
        windows
            .iter()
            .any(|w| bytes.windows(w.len()).any(|b| b == *w))
    };
    pieces.iter().any(|p| {
        let mut readings = vec![p.as_bytes().to_vec()];
        for skip in 0..4 {
            let chars: String = p.chars().skip(skip).filter(|c| !"=".contains(*c)).collect();
            let usable = chars.len() / 4 * 4;
            if let Ok(b) = base64::engine::general_purpose::STANDARD_NO_PAD.decode(&chars[..usable])
            {
                readings.push(b);
            }
        }
        for skip in 0..2 {
            let digits: Vec<u8> = p.bytes().skip(skip).collect();
            let hex: Vec<u8> = digits
                .chunks_exact(2)
                .map_while(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 16).ok())
                .collect();
            readings.push(hex);
        }
        readings.iter().any(|r| holds(r))
    })
}

/// `doc` in groups of `width` characters joined by `sep`.
fn grouped(doc: &str, width: usize, sep: &str) -> String {
    doc.as_bytes()
        .chunks(width)
        .map(text)
        .collect::<Vec<_>>()
        .join(sep)
}

/// Base64 printed in groups (`fold`, `sed 's/..../& /g'`, a pretty-printer): a
/// separator between groups must not let the secret through, and the prose around
/// it keeps its spaces.
#[test]
fn base64_in_groups_is_redacted_and_the_prose_around_it_kept() {
    let prose = "Here is the file you asked for, as the tool printed it:";
    for secret in SECRETS {
        let g = guard(secret);
        for prefix in ["", "a", "ab", "abc"] {
            let doc = STANDARD.encode(format!("{prefix}{secret}\n"));
            for (width, sep) in [
                (4, " "),
                (8, " "),
                (4, "\t"),
                (8, "  "),
                (76, "\n\n"),
                (64, "\r\n \r\n"),
                (4, " \n"),
                (16, "\n\t\n"),
            ] {
                let body = format!(
                    "{prose}\n{}\nThat is all. Bye now.\n",
                    grouped(&doc, width, sep)
                );
                let (out, hits) = g.redact(body.as_bytes());
                let shown = text(&out);
                assert!(hits >= 1, "{secret} {prefix:?} {width} {sep:?}: {shown}");
                assert!(
                    !recovers(&out, secret.as_bytes(), 6),
                    "{secret} {prefix:?} {width} {sep:?}: {shown}"
                );
                assert!(shown.starts_with(prose), "{shown}");
                assert!(shown.ends_with("\nThat is all. Bye now.\n"), "{shown}");
            }
        }
    }
}

/// Ordinary text with spaces is not read as base64: only a run that is an encoding of
/// the secret is, never the secret's own characters with a space put between them.
#[test]
fn text_with_spaces_is_not_redacted() {
    let g = guard("hunter2pw-Xq9");
    for body in [
        "the quick brown fox jumps over the lazy dog",
        "hunter2 pw-Xq9 is not the password",
        "61 62 63 64 65 66 67 68 69 70",
        "aGVs bG8g d29y bGQh",
        "key = value\n\nnext = line\n",
    ] {
        assert_eq!(
            g.redact(body.as_bytes()),
            (body.as_bytes().to_vec().into(), 0)
        );
    }
}

/// The dump tools' formats, built here byte for byte (and checked against the tools
/// themselves where they are installed).
#[derive(Clone, Copy, Debug)]
enum Dump {
    /// `xxd` (16 columns) or `xxd -c 8`.
    Xxd(usize),
    /// `hexdump -C`.
    Canonical,
    /// `od -c`.
    OdChars,
    /// `od -t x1`.
    OdHex,
}

impl Dump {
    const ALL: [Dump; 5] = [
        Dump::Xxd(16),
        Dump::Xxd(8),
        Dump::Canonical,
        Dump::OdChars,
        Dump::OdHex,
    ];

    /// Bytes shown per line.
    fn width(self) -> usize {
        match self {
            Dump::Xxd(c) => c,
            _ => 16,
        }
    }

    fn tool(self) -> (&'static str, Vec<String>) {
        match self {
            Dump::Xxd(16) => ("xxd", vec![]),
            Dump::Xxd(c) => ("xxd", vec!["-c".into(), c.to_string()]),
            Dump::Canonical => ("hexdump", vec!["-C".into()]),
            Dump::OdChars => ("od", vec!["-c".into()]),
            Dump::OdHex => ("od", vec!["-t".into(), "x1".into()]),
        }
    }

    /// The dump's lines, one per `width` bytes (the offset-only last line left out).
    fn lines(self, data: &[u8]) -> Vec<String> {
        data.chunks(self.width())
            .enumerate()
            .map(|(i, chunk)| self.line(i * self.width(), chunk))
            .collect()
    }

    fn line(self, offset: usize, chunk: &[u8]) -> String {
        let ascii: String = chunk
            .iter()
            .map(|&b| {
                if (0x20..0x7f).contains(&b) {
                    char::from(b)
                } else {
                    '.'
                }
            })
            .collect();
        match self {
            Dump::Xxd(cols) => {
                let mut hex = String::new();
                for group in chunk.chunks(2) {
                    group.iter().for_each(|b| hex.push_str(&format!("{b:02x}")));
                    hex.push(' ');
                }
                format!("{offset:08x}: {hex:<w$} {ascii}", w = cols / 2 * 5)
            }
            Dump::Canonical => {
                let mut hex = String::new();
                for i in 0..16 {
                    match chunk.get(i) {
                        Some(b) => hex.push_str(&format!("{b:02x} ")),
                        None => hex.push_str("   "),
                    }
                    if i == 7 {
                        hex.push(' ');
                    }
                }
                format!("{offset:08x}  {hex} |{ascii}|")
            }
            Dump::OdChars => {
                let fields: String = chunk.iter().map(|&b| od_char(b)).collect();
                format!("{offset:07o}{fields}")
            }
            Dump::OdHex => {
                let fields: String = chunk.iter().map(|b| format!(" {b:02x}")).collect();
                format!("{offset:07o}{fields}")
            }
        }
    }

    fn last_offset(self, len: usize) -> Option<String> {
        match self {
            Dump::Xxd(_) => None,
            Dump::Canonical => Some(format!("{len:08x}")),
            Dump::OdChars | Dump::OdHex => Some(format!("{len:07o}")),
        }
    }

    /// The whole dump, as the tool prints it.
    fn print(self, data: &[u8]) -> String {
        let mut lines = self.lines(data);
        lines.extend(self.last_offset(data.len()));
        let mut out = lines.join("\n");
        out.push('\n');
        out
    }
}

fn od_char(b: u8) -> String {
    match b {
        0 => "  \\0".into(),
        7 => "  \\a".into(),
        8 => "  \\b".into(),
        9 => "  \\t".into(),
        10 => "  \\n".into(),
        11 => "  \\v".into(),
        12 => "  \\f".into(),
        13 => "  \\r".into(),
        0x20..0x7f => format!("   {}", char::from(b)),
        _ => format!(" {b:03o}"),
    }
}

/// The tool's own output for `data`, if the tool is installed.
fn run_tool(dump: Dump, data: &[u8]) -> Option<String> {
    let (name, args) = dump.tool();
    let mut child = Command::new(name)
        .args(args)
        .env("LC_ALL", "C")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .ok()?;
    child.stdin.take()?.write_all(data).ok()?;
    let out = child.wait_with_output().ok()?;
    out.status.success().then(|| text(&out.stdout))
}

#[test]
fn the_dump_formats_built_here_are_the_tools_own() {
    let data = b"xx s3cr/t+val~Z9?q and more text here\n\x01\xff\x7f\t";
    for dump in Dump::ALL {
        match run_tool(dump, data) {
            Some(real) => assert_eq!(dump.print(data), real, "{dump:?}"),
            None => eprintln!("{dump:?}: the tool is not installed; its format is built by hand"),
        }
    }
}

/// A hex or character dump of a file holding the secret shows it in the hex columns
/// with offsets between and in the ASCII column split across lines: every line that
/// shows a byte of the secret is redacted, the others are kept.
#[test]
fn hex_and_character_dumps_of_the_secret_are_redacted() {
    for secret in SECRETS {
        let g = guard(secret);
        for lead in [0, 1, 5, 7, 9, 14] {
            let before: String = "ABCDEFGHIJKLMNOP".chars().take(lead).collect();
            let data = format!("{before}{secret}\nthe rest of the file, plain words\n");
            let (from, to) = (lead, lead + secret.len());
            for dump in Dump::ALL {
                let body = dump.print(data.as_bytes());
                let (out, hits) = g.redact(body.as_bytes());
                let shown = text(&out);
                let case = format!("{secret} +{lead} {dump:?}:\n{body}\n->\n{shown}");
                assert!(hits >= 1, "{case}");
                let w = dump.width();
                for (i, line) in dump.lines(data.as_bytes()).iter().enumerate() {
                    let shows_secret = i * w < to && from < (i + 1) * w;
                    assert_eq!(
                        !shown.contains(line.as_str()),
                        shows_secret,
                        "line {i}: {case}"
                    );
                }
            }
        }
    }
}

/// The key's PEM as `ssh-keygen` writes it (ed25519 and RSA).
fn keys() -> std::io::Result<Vec<String>> {
    let dir = tempfile::tempdir()?;
    let mut pems = Vec::new();
    for (kind, bits) in [("ed25519", None), ("rsa", Some("3072"))] {
        let path = dir.path().join(kind);
        let mut cmd = Command::new("ssh-keygen");
        cmd.args(["-q", "-N", "", "-C", "", "-t", kind, "-f"])
            .arg(&path);
        if let Some(b) = bits {
            cmd.args(["-b", b]);
        }
        let ok = cmd.status().map(|s| s.success()).unwrap_or(false);
        assert!(ok, "ssh-keygen -t {kind}");
        pems.push(std::fs::read_to_string(&path)?);
    }
    Ok(pems)
}

/// A remote command that prints the key file encoded whole (`base64 -w0 keyfile`,
/// `base64 keyfile`, `xxd -p keyfile`, `xxd keyfile`), alone or after other bytes
/// (the key at another alignment): no body line of the PEM can be read back.
#[test]
fn a_private_key_encoded_whole_is_redacted() -> std::io::Result<()> {
    for pem in keys()? {
        let Some(g) = ReflectionGuard::for_pem(&pem) else {
            panic!("no guard for a generated key");
        };
        let body_lines: Vec<&str> = pem
            .lines()
            .filter(|l| l.len() >= 16 && !l.starts_with("-----"))
            .collect();
        for lead in ["", "x", "xy"] {
            let file = format!("{lead}{pem}");
            let b64 = STANDARD.encode(&file);
            let hex: String = file.bytes().map(|b| format!("{b:02x}")).collect();
            for (name, printed) in [
                ("base64 -w0", b64.clone()),
                ("base64", grouped(&b64, 76, "\n")),
                ("xxd -p", grouped(&hex, 60, "\n")),
                ("xxd -p upper", grouped(&hex.to_uppercase(), 60, "\n")),
                ("xxd", Dump::Xxd(16).print(file.as_bytes())),
            ] {
                let (out, hits) = g.redact(printed.as_bytes());
                assert!(hits >= 1, "{name} +{lead:?}");
                for line in &body_lines {
                    assert!(
                        !recovers(&out, line.as_bytes(), 12),
                        "{name} +{lead:?}: {line} in {}",
                        text(&out)
                    );
                }
                if name == "xxd" {
                    assert!(!text(&out).contains(&body_lines[0][..16]), "{}", text(&out));
                }
            }
        }
    }
    Ok(())
}

/// The guard of `super::SECRET`, built once (a debug-build DFA takes a while).
static GUARD: std::sync::LazyLock<ReflectionGuard> =
    std::sync::LazyLock::new(|| guard(super::SECRET));

/// One printing of the secret after `lead` other bytes: grouped base64 or a dump.
fn printed(kind: usize, lead: usize) -> String {
    let before: String = "ABCDEFGHIJKLMNOP".chars().take(lead).collect();
    let data = format!("{before}{}\n", super::SECRET);
    let doc = STANDARD.encode(&data);
    match kind % 7 {
        0 => grouped(&doc, 4, " "),
        1 => grouped(&doc, 8, "\t"),
        2 => grouped(&doc, 4, "  "),
        k => Dump::ALL[k - 3].print(data.as_bytes()),
    }
}

/// A cut before a line's whole offset (6 digits): such a line does not wait for its end (it
/// could be git's `0000` flush, and waiting would stall the remote), so a dump cut there may
/// be missed.
fn inside_an_offset(body: &str, cut: usize) -> bool {
    let cut = cut.min(body.len());
    let line_at = cut - body[..cut].rfind('\n').map_or(0, |n| n + 1);
    (1..6).contains(&line_at)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]
    /// Grouped base64 and dumps streamed in any chunks (but for a cut right after a line
    /// break inside base64, where a stream does not wait) give the whole body's output.
    #[test]
    fn any_chunking_of_groups_and_dumps_redacts_like_the_whole_body(
        parts in proptest::collection::vec((0usize..7, 0usize..16, "[a-z ]{0,12}\n"), 1..6),
        mut cuts in proptest::collection::vec(0usize..2000, 0..24),
    ) {
        let mut body = String::new();
        for (kind, lead, filler) in &parts {
            body.push_str(filler);
            body.push_str(&printed(*kind, *lead));
        }
        cuts.sort_unstable();
        cuts.retain(|&c| !inside_an_offset(&body, c));
        let g = &*GUARD;
        let (whole, hits) = g.redact(body.as_bytes());
        let (streamed, shits) = super::stream(g, body.as_bytes(), &cuts);
        proptest::prop_assert_eq!(text(&streamed), text(&whole));
        proptest::prop_assert_eq!(shits, hits);
        proptest::prop_assert!(!recovers(&whole, super::SECRET.as_bytes(), 6), "{}", text(&whole));
    }
}

/// A stream cut anywhere in grouped base64 or a dump, even right after a separator or a
/// dump line, redacts as the whole body does.
#[test]
fn grouped_base64_and_dumps_cut_anywhere_are_redacted() {
    let g = &*GUARD;
    for kind in 0..7 {
        let body = format!("got:\n{}done\n", printed(kind, 3));
        let (whole, hits) = g.redact(body.as_bytes());
        assert!(hits >= 1, "{kind}: {}", text(&whole));
        for cut in 0..body.len() {
            if inside_an_offset(&body, cut) {
                continue;
            }
            let (streamed, shits) = super::stream(g, body.as_bytes(), &[cut]);
            assert_eq!(
                (text(&streamed), shits),
                (text(&whole), hits),
                "{kind} cut at {cut}"
            );
        }
    }
}

/// Padding an origin may send: long runs of whitespace pass unchanged. Each byte of a run is
/// looked at a bounded number of times (measuring the run at each of its bytes made 64 KiB
/// of spaces cost 32 s in a debug build).
#[test]
fn long_whitespace_runs_pass_unchanged() {
    let secret = b"sk_live_SuperSecret123";
    let Some(guard) = ReflectionGuard::new(secret, secret) else {
        panic!("guard");
    };
    for pad in [&b" "[..], b"\t", b"\n", b"\r\n", b"A   "] {
        let body: Vec<u8> = pad.iter().copied().cycle().take(512 * 1024).collect();
        let (out, hits) = guard.redact(&body);
        assert_eq!((out.len(), hits), (body.len(), 0));
        let mut carry = Carry::default();
        let (streamed, _) = guard.redact_stream(&mut carry, &body);
        let (tail, _) = guard.finish(&mut carry);
        assert_eq!(streamed.len() + tail.len(), body.len());
    }
}
