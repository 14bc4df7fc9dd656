//! What a remote command prints, end to end through real `ssh` and a real sshd: the
//! reflection guard holds a possible start of the key across the remote's pauses, and
//! output over `max_result_bytes` reaches the agent whole but is stored as not kept.

use serde_json::Value;

use crate::ssh::{Front, TOKEN};
use crate::support::{stderr, stdout};

fn result(f: &Front, id: &str) -> Value {
    let out = f.daemon.cli(&["result", id, "--json"], &[]);
    serde_json::from_slice(&out.stdout).expect("result json")
}

fn first_record(f: &Front) -> Value {
    let list = f.daemon.cli(&["actions", "list", "--json"], &[]);
    let list: Value = serde_json::from_slice(&list.stdout).expect("list json");
    list["invocations"][0].clone()
}

/// A command that prints a line of the injected key in two parts with a pause between
/// them (longer than the guard waits for more) does not get the line out.
#[test]
fn a_key_line_printed_across_a_pause_is_still_redacted() {
    let f = Front::start("");
    // The first body line is the same in every ed25519 key; the second is this key's.
    let line = f
        .client_private
        .lines()
        .nth(2)
        .expect("a key line")
        .to_owned();
    assert!(line.len() > 40, "{line}");
    let mut command = String::new();
    for cut in [2, 4, 20, line.len() - 1] {
        let (head, tail) = line.split_at(cut);
        command.push_str(&format!(
            "printf '%s' '{head}'; sleep 0.3; printf '%s\\n' '{tail}'; "
        ));
    }
    let out = f.ssh(TOKEN, &["--", "", &command]);
    let seen = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        !seen.contains(&line),
        "the key line reached the agent: {seen}"
    );
    assert_eq!(seen.matches("[postern:redacted]").count(), 4, "{seen}");
    for (n, printed) in seen.lines().enumerate() {
        // What is left of each line is at most the few bytes released at a pause.
        let left = printed.replace("[postern:redacted]", "");
        assert!(left.len() <= 3, "line {n}: {printed}");
    }
    let r = first_record(&f);
    let id = r["invocation_id"].as_str().expect("id");
    let stored = result(&f, id);
    let text = stored["stdout_base64"]
        .as_str()
        .and_then(postern::journal::unb64)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .expect("stored stdout");
    assert_eq!(text, seen, "the stored result is what the agent saw");
    assert_eq!(r["evidence"]["redactions"], 4, "{r}");
}

#[test]
fn output_over_max_result_bytes_reaches_the_agent_and_is_stored_as_not_kept() {
    let journal = "[journal]\nmax_result_bytes = \"1MiB\"\n";
    let f = Front::start_with("", |text| text.replacen("[journal]\n", journal, 1), &[]);
    let out = f.ssh(
        TOKEN,
        &["--", "", "head -c 3000000 /dev/zero; echo done >&2; exit 4"],
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert_eq!(
        out.stdout.len(),
        3_000_000,
        "the agent got the whole output"
    );
    assert!(stderr(&out).contains("done"), "{}", stderr(&out));
    let r = first_record(&f);
    assert_eq!(r["outcome"], "committed", "{r}");
    assert_eq!(r["result"]["bytes"], 3_000_005, "{r}");
    assert_eq!(r["result"]["exit_status"], 4, "{r}");
    let id = r["invocation_id"].as_str().expect("id");
    let stored = result(&f, id);
    assert_eq!(stored["output_stored"], false, "{stored}");
    assert_eq!(stored["stdout_base64"], "", "{stored}");
    assert_eq!(stored["stderr_base64"], "", "{stored}");
    assert_eq!(stored["exit_status"], 4, "{stored}");
}

/// A remote command that prints the injected key file encoded whole (`base64 -w0`,
/// `xxd -p`, `xxd`) gets none of its body lines out, to the agent or into the stored
/// result (issue 22 §7).
#[test]
fn the_key_file_printed_encoded_whole_is_redacted() {
    let f = Front::start("");
    let body: Vec<&str> = f
        .client_private
        .lines()
        .filter(|l| !l.starts_with("-----") && l.len() >= 16)
        .collect();
    let file = format!("{}\n", f.client_private.trim_end());
    let args: Vec<String> = file.lines().map(|l| format!("'{l}'")).collect();
    let command = format!(
        "k=$(mktemp); printf '%s\\n' {} > $k; base64 -w0 $k; echo; xxd -p $k; xxd $k; rm -f $k",
        args.join(" ")
    );
    let out = f.ssh(TOKEN, &["--", "", &command]);
    let seen = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(seen.contains("[postern:redacted]"), "{seen}");
    let joined: String = seen.split_whitespace().collect();
    let b64 = postern::journal::b64(file.as_bytes());
    let hex: String = file.bytes().map(|b| format!("{b:02x}")).collect();
    let key_at = |from: usize, len: usize| {
        let start = file.find(body[0]).unwrap_or(0);
        from >= start && from + len <= start + body.iter().map(|l| l.len() + 1).sum::<usize>()
    };
    for at in (0..b64.len().saturating_sub(24)).step_by(4) {
        if key_at(at / 4 * 3, 18) {
            assert!(
                !joined.contains(&b64[at..at + 24]),
                "base64 at {at}: {seen}"
            );
        }
    }
    for at in (0..hex.len().saturating_sub(32)).step_by(2) {
        if key_at(at / 2, 16) {
            assert!(!joined.contains(&hex[at..at + 32]), "hex at {at}: {seen}");
        }
    }
    for (i, chunk) in file.as_bytes().chunks(16).enumerate() {
        let shown: String = chunk
            .iter()
            .map(|&b| {
                if (0x20..0x7f).contains(&b) {
                    char::from(b)
                } else {
                    '.'
                }
            })
            .collect();
        if key_at(i * 16, 16) {
            assert!(!seen.contains(&shown), "xxd line {i}: {seen}");
        }
    }
    let r = first_record(&f);
    let id = r["invocation_id"].as_str().expect("id");
    let stored = result(&f, id);
    let text = stored["stdout_base64"]
        .as_str()
        .and_then(postern::journal::unb64)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .expect("stored stdout");
    assert_eq!(text, seen, "the stored result is what the agent saw");
}
