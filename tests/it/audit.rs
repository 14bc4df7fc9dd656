//! The hash chain: a tampered or missing event is reported with its seq.

use fjall::{Database, KeyspaceCreateOptions};
use serde_json::Value;

use crate::support::{Daemon, Home, TEST_CONFIG, get_json, journal_dir, stdout};

/// The journal (the daemon stopped) and its events keyspace.
fn open_events(home: &Home) -> (Database, fjall::Keyspace) {
    let db = Database::builder(journal_dir(&home.root()))
        .open()
        .expect("open journal");
    let events = db
        .keyspace("events", KeyspaceCreateOptions::default)
        .expect("events");
    (db, events)
}

/// The events keyspace with the value holding `seq` split into one stored event per seq
/// (a run holds several), so one of them can be edited or removed alone.
pub(crate) fn split_at(home: &Home, seq: u64) -> (Database, fjall::Keyspace) {
    let (db, events) = open_events(home);
    let (k, v) = events
        .range(..=seq.to_be_bytes())
        .next_back()
        .expect("a value at or before the seq")
        .into_inner()
        .expect("read");
    let key = u64::from_be_bytes(k.as_ref().try_into().expect("seq key"));
    let stored = postern::journal::decode_stored(key, &v).expect("stored events");
    events.remove(k).expect("remove");
    for event in stored {
        let json = serde_json::to_vec(&event).expect("event json");
        events.insert(event.seq.to_be_bytes(), json).expect("write");
    }
    (db, events)
}

/// Rewrites one stored event the way an attacker with disk access would.
fn tamper(home: &Home, seq: u64, edit: impl FnOnce(&mut Value)) {
    let (db, events) = split_at(home, seq);
    let raw = events
        .get(seq.to_be_bytes())
        .expect("read")
        .expect("event exists");
    let stored = postern::journal::decode_event(&raw).expect("stored event");
    let mut event: Value = serde_json::to_value(stored).expect("event json");
    edit(&mut event);
    events
        .insert(seq.to_be_bytes(), serde_json::to_vec(&event).unwrap())
        .expect("write");
    db.persist(fjall::PersistMode::SyncAll).expect("persist");
}

fn remove(home: &Home, seq: u64) {
    let (db, events) = split_at(home, seq);
    events.remove(seq.to_be_bytes()).expect("remove");
    db.persist(fjall::PersistMode::SyncAll).expect("persist");
}

#[test]
fn an_untouched_chain_verifies() {
    let home = Home::new();
    home.drill("POST", "RESULT_DELIVERED", None);
    home.drill("GET", "RESULT_DELIVERED", None);
    let out = home.cli(&["audit", "verify"], &[]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout(&out).starts_with("ok: 18 events"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_tampered_event_breaks_the_chain_at_its_seq() {
    let home = Home::new();
    home.drill("POST", "RESULT_DELIVERED", None);
    home.drill("POST", "RESULT_DELIVERED", None);
    tamper(&home, 4, |e| {
        e["data"]["reused_connection"] = Value::Bool(true)
    });
    let out = home.cli(&["audit", "verify"], &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = stdout(&out);
    assert!(
        text.contains("BROKEN at seq 4") && text.contains("hash does not match"),
        "{text}"
    );

    let daemon = Daemon::start(&home, Some(TEST_CONFIG));
    let (status, report) = get_json(&daemon.url("/v1/audit/verify"), &[]);
    assert_eq!(status, 200);
    assert_eq!(report["ok"], false);
    assert_eq!(report["break"]["seq"], 4);
    assert_eq!(report["events"], 3);
    let via_daemon = daemon.cli(&["audit", "verify", "--json"], &[]);
    assert_eq!(via_daemon.status.code(), Some(1));
    let json: Value = serde_json::from_slice(&via_daemon.stdout).unwrap();
    assert_eq!(json["break"]["seq"], 4);
}

/// Replaces `from` with `to` (as long) in the first stored group, in place.
fn change_first_group(home: &Home, from: &[u8], to: &[u8]) {
    let (db, events) = open_events(home);
    let (k, v) = events
        .first_key_value()
        .expect("a stored group")
        .into_inner()
        .expect("read");
    let at = v
        .windows(from.len())
        .position(|w| w == from)
        .expect("the bytes in the group");
    let mut changed = v.to_vec();
    changed[at..at + to.len()].copy_from_slice(to);
    events.insert(k, changed).expect("write");
    db.persist(fjall::PersistMode::SyncAll).expect("persist");
}

/// An attacker who edits a stored group in place (without splitting it) changes events
/// whose digests are computed when read: the group's last event no longer hashes to the
/// digest stored for it, and the audit breaks there.
#[test]
fn a_byte_changed_inside_a_stored_group_breaks_the_chain_there() {
    let home = Home::new();
    home.drill("POST", "RESULT_DELIVERED", None);
    change_first_group(&home, b"\"POST\"", b"\"PAST\"");
    let out = home.cli(&["audit", "verify"], &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = stdout(&out);
    assert!(
        text.contains("BROKEN at seq") && text.contains("hash does not match"),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_rehashed_event_still_breaks_the_link_to_its_successor() {
    let home = Home::new();
    home.drill("POST", "RESULT_DELIVERED", None);
    // Recompute nothing but swap the hash: the next event's prev_hash no longer links.
    tamper(&home, 2, |e| {
        e["hash"] = Value::String(format!("sha256:{}", "ab".repeat(32)))
    });
    let out = home.cli(&["audit", "verify"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("BROKEN at seq 2"), "{}", stdout(&out));
}

#[test]
fn a_deleted_event_is_a_gap() {
    let home = Home::new();
    home.drill("POST", "RESULT_DELIVERED", None);
    remove(&home, 5);
    let out = home.cli(&["audit", "verify"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("BROKEN at seq 5: missing event"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn events_past_their_retention_are_pruned_behind_a_checkpoint_the_audit_starts_from() {
    let home = Home::new();
    home.drill("POST", "RESULT_DELIVERED", None);
    home.drill("GET", "RESULT_DELIVERED", None);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let config = format!("{TEST_CONFIG}event_retention = \"1s\"\nresult_retention = \"1s\"\n");
    let daemon = Daemon::start(&home, Some(&config));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let report = loop {
        let (status, report) = get_json(&daemon.url("/v1/audit/verify"), &[]);
        assert_eq!(status, 200);
        if report["from_seq"] != 1 || std::time::Instant::now() > deadline {
            break report;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    // Both settled invocations (seq 1..=18) went; the JOURNAL_PRUNED note vouches for them.
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["from_seq"], 19, "{report}");
    assert_eq!(report["checkpoint"]["seq"], 18);
    assert_eq!(report["checkpoint"]["records"], 2);
    let out = daemon.cli(&["audit", "verify"], &[]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout(&out).starts_with("ok: 1 events from seq 19 (checkpoint at seq 18, hash sha256:"),
        "{}",
        stdout(&out)
    );
    let (_, list) = get_json(&daemon.url("/v1/invocations"), &[]);
    assert_eq!(
        list["invocations"].as_array().map(Vec::len),
        Some(0),
        "{list}"
    );
}

/// Issue 40 (high 4, medium 2): retention took the events of an `unknown` record waiting for
/// reconciliation, and stopped for everyone at a live one. Now the cut passes both and keeps
/// their events aside: `/events` still shows them, and `audit verify` checks them.
#[test]
fn retention_passes_unknown_and_live_records_and_keeps_their_evidence() {
    use crate::origins;
    use std::time::{Duration, Instant};
    let (slow, lost, fine) = (
        origins::slow_head(Duration::from_secs(6), "slow"),
        origins::closes_without_response(),
        origins::responds("200 OK", &[], "fine"),
    );
    let route = |id: &str, port: u16| {
        format!(
            "[[routes]]\nid = \"{id}\"\nmatch = {{ scheme = \"http\", host = \"{id}.test\", port = {port} }}\nresolve = \"127.0.0.1:{port}\"\n"
        )
    };
    let config = format!(
        "{TEST_CONFIG}event_retention = \"1s\"\nresult_retention = \"1s\"\n{}{}{}",
        route("slow", slow.port()),
        route("lost", lost.port()),
        route("fine", fine.port()),
    );
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&config));
    let (_, head, _) = crate::support::curl(&[
        "-x",
        &daemon.proxy,
        "-D",
        "-",
        "-d",
        "charge",
        &format!("http://lost.test:{}/charge", lost.port()),
    ]);
    let id = invocation_id(&head);
    // A settled POST: its events go, its record stays while its resend twin lives.
    let (_, posted, _) = crate::support::curl(&[
        "-x",
        &daemon.proxy,
        "-D",
        "-",
        "-d",
        "once",
        &format!("http://fine.test:{}/once", fine.port()),
    ]);
    let settled = invocation_id(&posted);
    let proxy = daemon.proxy.clone();
    let url = format!("http://slow.test:{}/", slow.port());
    let live = std::thread::spawn(move || crate::support::curl(&["-x", &proxy, &url]));
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let (status, _, _) = crate::support::curl(&[
            "-x",
            &daemon.proxy,
            &format!("http://fine.test:{}/", fine.port()),
        ]);
        assert_eq!(status, 200);
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, report) = get_json(&daemon.url("/v1/audit/verify"), &[]);
    assert_eq!(status, 200);
    assert_eq!(report["ok"], true, "{report}");
    assert!(
        report["from_seq"].as_u64().is_some_and(|s| s > 30),
        "the cut went past the unknown and the live record: {report}"
    );
    assert!(
        report["islands"].as_u64().is_some_and(|n| n >= 5),
        "{report}"
    );
    let (status, record) = get_json(&daemon.url(&format!("/v1/invocations/{id}")), &[]);
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["outcome"], "unknown", "{record}");
    let (status, events) = get_json(&daemon.url(&format!("/v1/invocations/{id}/events")), &[]);
    assert_eq!(status, 200, "{events}");
    let kinds: Vec<&str> = events["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    assert!(kinds.contains(&"DISPATCH_STARTED"), "{events}");
    let (status, _, _) = live.join().unwrap();
    assert_eq!(status, 200);
    // Issue 40 medium 6: `actions show` of a record whose events retention took shows it.
    let out = daemon.cli(&["actions", "show", &settled], &[]);
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert!(
        text.contains(&settled) && text.contains("pruned by retention"),
        "{text}"
    );
}

/// The `Postern-Invocation` of a response head.
fn invocation_id(head: &str) -> String {
    head.lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("postern-invocation")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no invocation id: {head}"))
}

/// SPEC §5.8: `postern audit export --since SEQ` prints every event from SEQ as a JSON line
/// with its hash and its invocation's facts; from the journal itself with no daemon, and the
/// same through a running one.
#[test]
fn the_export_prints_every_event_from_a_seq_with_its_hash_and_its_invocations_facts() {
    let home = Home::new();
    home.drill("POST", "RESULT_DELIVERED", None);
    home.drill("GET", "RESULT_DELIVERED", None);
    let lines = |out: std::process::Output| -> Vec<Value> {
        assert!(out.status.success(), "{out:?}");
        stdout(&out)
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    };
    let all = lines(home.cli(&["audit", "export"], &[]));
    assert_eq!(all.len(), 18, "{all:?}");
    for (i, e) in all.iter().enumerate() {
        assert_eq!(e["seq"], i as u64 + 1, "{e}");
        assert!(
            e["hash"].as_str().is_some_and(|h| h.starts_with("sha256:")),
            "{e}"
        );
        if i > 0 {
            assert_eq!(e["prev_hash"], all[i - 1]["hash"], "the chain: {e}");
        }
        assert!(e["agent"].is_string() && e["kind"].is_string(), "{e}");
        assert!(e.get("data").is_none(), "no event data leaves: {e}");
    }
    assert_eq!(all[0]["kind"], "ACTION_ACCEPTED");
    assert_eq!(all[17]["outcome"], "committed", "{}", all[17]);
    let from = lines(home.cli(&["audit", "export", "--since", "10"], &[]));
    assert_eq!(from.len(), 9);
    assert_eq!(from[0], all[9]);
    let daemon = Daemon::start(&home, Some(TEST_CONFIG));
    let via = lines(daemon.cli(&["audit", "export"], &[]));
    assert_eq!(via[..18], all[..], "the daemon exports the same events");
}
