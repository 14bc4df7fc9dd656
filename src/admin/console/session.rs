//! Console sessions: the admin token, given once to the sign-in form, is exchanged for a
//! random session id in an `HttpOnly`, `SameSite=Strict` cookie. Kept in memory only: a
//! restart signs everyone out. Each session has its own CSRF token.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use subtle::ConstantTimeEq;

/// The cookie's name.
pub const COOKIE: &str = "postern_session";

/// How long a session lasts from sign-in.
pub const LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// Sessions kept at most; a new sign-in past it ends the oldest.
const MAX_SESSIONS: usize = 64;

/// Wrong tokens a sign-in answers (and logs) per `FAILURE_WINDOW` before it slows them.
const MAX_FAILURES: u32 = 10;
const FAILURE_WINDOW: Duration = Duration::from_secs(60);

/// Which admin token a session was opened with (a digest): a session opened under a
/// token the config no longer has ends.
pub type TokenTag = [u8; 32];

#[derive(Debug, Clone)]
struct Session {
    csrf: String,
    until: Instant,
    tag: TokenTag,
}

/// The signed-in sessions, by id, and the sign-in's recent wrong tokens.
#[derive(Debug, Default)]
pub struct Sessions {
    live: Mutex<HashMap<String, Session>>,
    failures: Mutex<Option<(Instant, u32)>>,
}

/// What a wrong token at sign-in counts as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failed {
    /// Within the window's allowance: logged.
    Counted,
    /// Past it: slowed for the rest of the window, not logged again.
    Throttled,
}

fn random_hex() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Sessions {
    /// A new session: its id (for the cookie) and its CSRF token.
    pub fn open(&self, tag: TokenTag) -> (String, String) {
        let (id, csrf) = (random_hex(), random_hex());
        if let Ok(mut live) = self.live.lock() {
            let now = Instant::now();
            live.retain(|_, s| s.until > now);
            if live.len() >= MAX_SESSIONS
                && let Some(oldest) = live
                    .iter()
                    .min_by_key(|(_, s)| s.until)
                    .map(|(k, _)| k.clone())
            {
                live.remove(&oldest);
            }
            let until = now + LIFETIME;
            live.insert(
                id.clone(),
                Session {
                    csrf: csrf.clone(),
                    until,
                    tag,
                },
            );
        }
        (id, csrf)
    }

    /// The CSRF token of a live session opened under the token tagged `tag`.
    pub fn csrf(&self, id: &str, tag: &TokenTag) -> Option<String> {
        let live = self.live.lock().ok()?;
        let s = live.get(id)?;
        (s.until > Instant::now() && s.tag == *tag).then(|| s.csrf.clone())
    }

    /// Counts a wrong token.
    pub fn failed(&self) -> Failed {
        let Ok(mut f) = self.failures.lock() else {
            return Failed::Throttled;
        };
        let now = Instant::now();
        let (since, n) = match *f {
            Some((since, n)) if now.duration_since(since) < FAILURE_WINDOW => (since, n + 1),
            _ => (now, 1),
        };
        *f = Some((since, n));
        match n <= MAX_FAILURES {
            true => Failed::Counted,
            false => Failed::Throttled,
        }
    }

    pub fn close(&self, id: &str) {
        if let Ok(mut live) = self.live.lock() {
            live.remove(id);
        }
    }
}

/// Whether a form's CSRF token is the session's (constant time).
pub fn csrf_matches(expected: &str, given: &str) -> bool {
    expected.len() == given.len() && bool::from(expected.as_bytes().ct_eq(given.as_bytes()))
}

/// The session id a request's `Cookie` header carries, if any.
pub fn cookie_of(headers: &http::HeaderMap) -> Option<String> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.trim().to_owned())
}

/// The `Set-Cookie` value of a session; an empty id clears the cookie.
pub fn set_cookie(id: &str) -> String {
    match id.is_empty() {
        true => format!("{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0"),
        false => format!(
            "{COOKIE}={id}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}",
            LIFETIME.as_secs()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_opens_checks_and_closes() {
        let sessions = Sessions::default();
        let (id, csrf) = sessions.open([1; 32]);
        assert_eq!(id.len(), 64);
        assert_eq!(sessions.csrf(&id, &[1; 32]).as_deref(), Some(csrf.as_str()));
        assert_eq!(
            sessions.csrf(&id, &[2; 32]),
            None,
            "another admin token now"
        );
        assert!(csrf_matches(&csrf, &csrf));
        assert!(!csrf_matches(&csrf, "x"));
        sessions.close(&id);
        assert_eq!(sessions.csrf(&id, &[1; 32]), None);
    }

    #[test]
    fn wrong_tokens_past_the_allowance_are_throttled() {
        let sessions = Sessions::default();
        for _ in 0..MAX_FAILURES {
            assert_eq!(sessions.failed(), Failed::Counted);
        }
        assert_eq!(sessions.failed(), Failed::Throttled);
    }

    #[test]
    fn the_cookie_is_found_among_others() {
        let mut h = http::HeaderMap::new();
        h.insert(
            http::header::COOKIE,
            "a=1; postern_session=abc; b=2"
                .parse()
                .unwrap_or(http::HeaderValue::from_static("")),
        );
        assert_eq!(cookie_of(&h).as_deref(), Some("abc"));
        assert!(set_cookie("abc").contains("HttpOnly; SameSite=Strict"));
    }
}
