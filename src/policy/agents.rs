//! Agent identity from `Proxy-Authorization: Basic base64(id:token)`.

use base64::Engine;

use crate::config::Config;

/// The agent postern acts for, or why it cannot tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentAuth {
    /// No agents are configured: the loopback-only `anonymous` agent.
    Anonymous,
    Agent(String),
    /// No `Proxy-Authorization` at all: challenge, do not journal.
    Missing,
    /// Credentials that do not match: journaled. `claimed` is the id, never the token.
    Wrong {
        claimed: Option<String>,
    },
}

impl AgentAuth {
    pub fn agent_id(&self) -> Option<&str> {
        match self {
            Self::Anonymous => Some("anonymous"),
            Self::Agent(id) => Some(id),
            _ => None,
        }
    }
}

/// Checks the header against `[[agents]]`.
pub fn authenticate(config: &Config, header: Option<&[u8]>) -> AgentAuth {
    if config.agents.is_empty() {
        return AgentAuth::Anonymous;
    }
    let Some(raw) = header else {
        return AgentAuth::Missing;
    };
    let Some((id, token)) = parse_basic(raw) else {
        return AgentAuth::Wrong { claimed: None };
    };
    authenticate_pair(config, &id, &token)
}

/// Checks an agent id and token against `[[agents]]` (the SSH preamble carries them
/// as such). With no agents configured: `Anonymous`.
pub fn authenticate_pair(config: &Config, id: &str, token: &str) -> AgentAuth {
    if config.agents.is_empty() {
        return AgentAuth::Anonymous;
    }
    let agent = config.agents.iter().find(|a| a.id == id);
    match agent {
        Some(a) if a.token.matches(token) => AgentAuth::Agent(id.to_owned()),
        _ => AgentAuth::Wrong {
            claimed: Some(id.to_owned())
                .filter(|i| i.len() <= 64 && i.chars().all(|c| c.is_ascii_graphic())),
        },
    }
}

/// Whether `id` is an agent postern acts for under `config` now: a configured agent, or
/// `anonymous` while none are configured. A retry binds the agent of its invocation.
pub fn acts_now(config: &Config, id: &str) -> bool {
    match config.agents.is_empty() {
        true => id == "anonymous",
        false => config.agents.iter().any(|a| a.id == id),
    }
}

fn parse_basic(raw: &[u8]) -> Option<(String, String)> {
    let text = std::str::from_utf8(raw).ok()?.trim();
    let (scheme, b64) = text.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .ok()?;
    let pair = String::from_utf8(decoded).ok()?;
    let (id, token) = pair.split_once(':')?;
    Some((id.to_owned(), token.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(agents: bool) -> Config {
        let text = if agents {
            "[[agents]]\nid = \"ci\"\ntoken = \"s3cret-0123456789ab\"\n"
        } else {
            ""
        };
        crate::config::parse(text, None, &|_| None).unwrap()
    }

    fn basic(s: &str) -> Vec<u8> {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(s)
        )
        .into_bytes()
    }

    #[test]
    fn agents_authenticate_with_basic() {
        let c = config(true);
        assert_eq!(
            authenticate(&c, Some(&basic("ci:s3cret-0123456789ab"))),
            AgentAuth::Agent("ci".into())
        );
        assert_eq!(authenticate(&c, None), AgentAuth::Missing);
        assert_eq!(
            authenticate(&c, Some(&basic("ci:nope"))),
            AgentAuth::Wrong {
                claimed: Some("ci".into())
            }
        );
        assert_eq!(
            authenticate(&c, Some(b"Bearer x")),
            AgentAuth::Wrong { claimed: None }
        );
        assert_eq!(
            authenticate(&c, Some(&basic("ghost:s3cret"))).agent_id(),
            None
        );
        assert_eq!(authenticate(&config(false), None), AgentAuth::Anonymous);
    }
}
