//! What the request fingerprint covers (SPEC §3.4): under one key, a changed end-to-end
//! header or another selected credential is another request (`IDEMPOTENCY_MISMATCH`,
//! nothing sent); headers that differ between tries of one operation are not; and
//! `postern retry` resends exactly the headers the invocation bound.

use super::{CONTRACT, Cell, GENERATING, config, four, generations_of};
use crate::retry_origins::{Answer, KeyedOrigin, Policy, header};
use crate::support::{Daemon, Home, secret_set, stdout};

const BODY: &str = "{\"amount\":5}";

#[test]
fn another_header_value_under_a_key_is_a_mismatch_and_nothing_is_sent() {
    let origin = KeyedOrigin::start(Policy::Ignores, Answer::DropsFirst);
    let c = Cell::start(origin.port(), CONTRACT, &[]);
    let lost = c.post_with(
        "a",
        Some("k-acct"),
        &["Stripe-Account: acct_A", "X-Mode: live"],
        BODY,
    );
    assert_eq!(lost.error().3, "same_idempotency_key", "{}", lost.body);
    let id = lost.id();

    // The attack: the same key, another account. The journal would read one charge retried.
    let evil = c.post_with(
        "a",
        Some("k-acct"),
        &["Stripe-Account: acct_EVIL", "X-Mode: live"],
        BODY,
    );
    assert_eq!(evil.status, 422, "{}", evil.body);
    assert_eq!(
        evil.error(),
        four(
            "IDEMPOTENCY_MISMATCH",
            "validation",
            "not_attempted",
            "after_correction"
        )
    );
    let conflict = &evil.envelope()["evidence"]["idempotency_conflict"];
    assert_eq!(conflict["invocation_id"], id.as_str(), "{}", evil.body);
    assert_ne!(conflict["fingerprint"], conflict["recorded_fingerprint"]);
    // A header added, or one left out, is another request too.
    let added = c.post_with(
        "a",
        Some("k-acct"),
        &["Stripe-Account: acct_A", "X-Mode: live", "X-Extra: 1"],
        BODY,
    );
    assert_eq!(added.error().0, "IDEMPOTENCY_MISMATCH", "{}", added.body);
    let dropped = c.post_with("a", Some("k-acct"), &["X-Mode: live"], BODY);
    assert_eq!(
        dropped.error().0,
        "IDEMPOTENCY_MISMATCH",
        "{}",
        dropped.body
    );
    assert_eq!(origin.hits(), 1, "nothing sent");
    assert_eq!(c.record(&id)["generation"], 1, "no generation was leased");

    // The same request again, its names in another order and case: generation 2.
    let retried = c.post_with(
        "a",
        Some("k-acct"),
        &["x-mode: live", "stripe-account: acct_A"],
        BODY,
    );
    assert_eq!((retried.status, retried.id()), (201, id.clone()));
    let accounts: Vec<_> = origin
        .requests()
        .iter()
        .map(|r| header(r, "stripe-account"))
        .collect();
    assert_eq!(accounts, vec![Some("acct_A".into()), Some("acct_A".into())]);
    let kinds = c.kinds(&id);
    assert_eq!(generations_of(&kinds, "DISPATCH_STARTED"), vec![1, 2]);
}

#[test]
fn headers_that_differ_between_tries_of_one_operation_do_not_change_it() {
    let origin = KeyedOrigin::start(Policy::Honours, Answer::DropsFirst);
    let c = Cell::start(origin.port(), CONTRACT, &[]);
    let first_try = [
        "Stripe-Account: acct_A",
        "traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "X-Request-Id: try-1",
        "User-Agent: agent-sdk/1.0",
        "Date: Tue, 01 Dec 2026 10:00:00 GMT",
        "X-Stainless-Retry-Count: 0",
    ];
    let lost = c.post_with("a", Some("k-trace"), &first_try, BODY);
    assert_eq!(lost.error().3, "same_idempotency_key", "{}", lost.body);
    let second_try = [
        "X-Stainless-Retry-Count: 1",
        "Date: Tue, 01 Dec 2026 10:00:02 GMT",
        "User-Agent: agent-sdk/1.1",
        "X-Request-Id: try-2",
        "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "Stripe-Account: acct_A",
    ];
    let retried = c.post_with("a", Some("k-trace"), &second_try, BODY);
    assert_eq!(
        (retried.status, retried.id()),
        (201, lost.id()),
        "{}",
        retried.body
    );
    assert_eq!((origin.hits(), origin.effects()), (2, 1));
    let r = c.record(&lost.id());
    assert_eq!(r["generation"], 2);
}

#[test]
fn another_selected_credential_under_a_key_is_a_mismatch() {
    const VAULT_KEY: &str = "fingerprint-vault-key";
    let origin = KeyedOrigin::start(Policy::Ignores, Answer::DropsFirst);
    let home = Home::new();
    for (name, value) in [("acct-a", "tok-a"), ("acct-b", "tok-b")] {
        assert!(
            secret_set(&home, name, value, Some(VAULT_KEY))
                .status
                .success()
        );
    }
    let extra = format!(
        "{CONTRACT}\ncredentials = [\"a\", \"b\"]\n\
         [[credentials]]\nid = \"a\"\nsecret = \"acct-a\"\ninject = {{ header = \"Authorization\", format = \"Bearer {{secret}}\" }}\n\
         [[credentials]]\nid = \"b\"\nsecret = \"acct-b\"\ninject = {{ header = \"Authorization\", format = \"Bearer {{secret}}\" }}"
    );
    let port = origin.port();
    let daemon = Daemon::start_with(
        &home,
        Some(&config(port, &extra)),
        &[("POSTERN_VAULT_KEY", VAULT_KEY)],
    );
    let c = Cell { home, daemon, port };
    let lost = c.post_with("a", Some("k-cred"), &["Postern-Credential: a"], BODY);
    assert_eq!(lost.error().3, "same_idempotency_key", "{}", lost.body);
    let other = c.post_with("a", Some("k-cred"), &["Postern-Credential: b"], BODY);
    assert_eq!(other.status, 422, "{}", other.body);
    assert_eq!(other.error().0, "IDEMPOTENCY_MISMATCH");
    assert_eq!(origin.hits(), 1, "nothing sent as the other account");
    let retried = c.post_with("a", Some("k-cred"), &["Postern-Credential: a"], BODY);
    assert_eq!((retried.status, retried.id()), (201, lost.id()));
    let sent: Vec<_> = origin
        .requests()
        .iter()
        .map(|r| header(r, "authorization"))
        .collect();
    assert_eq!(
        sent,
        vec![Some("Bearer tok-a".into()), Some("Bearer tok-a".into())]
    );
}

#[test]
fn postern_retry_resends_the_bound_headers_with_the_generated_key() {
    let origin = KeyedOrigin::start(Policy::Honours, Answer::DropsFirst);
    let c = Cell::start(origin.port(), GENERATING, &[]);
    let lost = c.post_with(
        "a",
        None,
        &["Stripe-Account: acct_A", "Accept: application/json"],
        BODY,
    );
    assert_eq!(lost.error().3, "same_idempotency_key", "{}", lost.body);
    let key = lost
        .header("idempotency-key")
        .unwrap_or_default()
        .to_owned();
    assert!(key.starts_with("pk_"), "{}", lost.head);
    let id = lost.id();
    assert_eq!(c.decide(&id), "RETRY_SAME_KEY");

    let out = c.daemon.cli(&["retry", &id], &[]);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout(&out).contains("generation 2"), "{}", stdout(&out));
    let r = c.record_when(&id, |r| r["outcome"] == "committed");
    assert_eq!(
        (r["generation"].as_u64(), r["outcome"].as_str()),
        (Some(2), Some("committed")),
        "{r}"
    );
    let requests = origin.requests();
    assert_eq!(requests.len(), 2);
    for (name, value) in [
        ("stripe-account", "acct_A"),
        ("accept", "application/json"),
        ("idempotency-key", key.as_str()),
    ] {
        let sent: Vec<_> = requests.iter().map(|q| header(q, name)).collect();
        assert_eq!(sent, vec![Some(value.to_owned()); 2], "{name}");
    }
    assert_eq!(origin.effects(), 1, "the origin deduplicated the key");
}
