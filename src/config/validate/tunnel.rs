//! `intercept = false` (SPEC §3.6): a plain CONNECT tunnel matches scheme `https`, host and
//! port only, and carries nothing postern adds or checks, since it cannot read the bytes.

use super::Checker;
use crate::config::raw::RawRoute;

/// Why a key has no place on a tunnel route.
const UNSEEN: &str = "a tunnel (`intercept = false`) matches scheme, host and port only: \
                      postern never sees the requests inside it";
const NOTHING_INJECTED: &str = "nothing can be injected into a tunnel (`intercept = false`): \
                                postern cannot read or change its bytes";
const NOT_TERMINATED: &str = "postern does not terminate TLS in a tunnel (`intercept = false`): \
                              the client verifies the origin itself";

/// Reports every key of route `p` that a tunnel cannot honour.
pub(super) fn validate(c: &mut Checker<'_>, p: &str, r: &RawRoute) {
    if r.intercept != Some(false) {
        return;
    }
    let m = &r.matcher;
    if m.scheme.as_deref().is_some_and(|s| s != "https") {
        c.bad(
            format!("{p}.match.scheme"),
            "a tunnel (`intercept = false`) is a CONNECT to an https origin: the scheme is https",
        );
    }
    let keys = [
        ("match.methods", m.methods.is_some(), UNSEEN),
        ("match.path_prefix", m.path_prefix.is_some(), UNSEEN),
        ("credential", r.credential.is_some(), NOTHING_INJECTED),
        ("credentials", r.credentials.is_some(), NOTHING_INJECTED),
        ("idempotency", r.idempotency.is_some(), NOTHING_INJECTED),
        ("upstream_ca", r.upstream_ca.is_some(), NOT_TERMINATED),
    ];
    for (key, set, why) in keys {
        if set {
            c.bad(format!("{p}.{key}"), why);
        }
    }
}
