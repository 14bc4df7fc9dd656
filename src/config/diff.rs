//! What a reload changes (SPEC §5.1 `postern reload`): the ids of routes, agents,
//! credentials and SSH targets added, removed or changed — never a value (an agent's
//! token counts as a change of the agent, not as text) — and the settings only a restart
//! applies (listeners, the journal, connection limits, resolvers, the audit export).

use serde::Serialize;

use super::Config;

#[derive(Debug, Default, Serialize, PartialEq, Eq)]
pub struct Changes {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
}

impl Changes {
    fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

#[derive(Debug, Default, Serialize, PartialEq, Eq)]
pub struct ConfigDiff {
    #[serde(skip_serializing_if = "Changes::is_empty")]
    pub routes: Changes,
    #[serde(skip_serializing_if = "Changes::is_empty")]
    pub agents: Changes,
    #[serde(skip_serializing_if = "Changes::is_empty")]
    pub credentials: Changes,
    #[serde(skip_serializing_if = "Changes::is_empty")]
    pub ssh_targets: Changes,
    /// Settings a reload applies that are no list of ids (`admin.token`: never its value).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changed: Vec<&'static str>,
    /// Sections whose change is kept for the next start (the running daemon keeps its own).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub restart_needed: Vec<&'static str>,
}

/// Compares by id; `same` says whether two entries of one id are alike.
fn by_id<T>(
    old: &[T],
    new: &[T],
    id: impl Fn(&T) -> &str,
    same: impl Fn(&T, &T) -> bool,
) -> Changes {
    let mut c = Changes::default();
    for n in new {
        match old.iter().find(|o| id(o) == id(n)) {
            None => c.added.push(id(n).to_owned()),
            Some(o) if !same(o, n) => c.changed.push(id(n).to_owned()),
            Some(_) => {}
        }
    }
    for o in old {
        if !new.iter().any(|n| id(n) == id(o)) {
            c.removed.push(id(o).to_owned());
        }
    }
    c
}

/// Debug output of config entries holds no secret value (tokens print redacted), so it
/// can stand for equality of everything else.
fn alike<T: std::fmt::Debug>(a: &T, b: &T) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

/// What changed from `last` (the config in force) to `new`; `restart_needed` is measured
/// against `started`, whose listeners and journal settings are the ones running: a reload
/// that changed them and a later one that did not still leave the restart pending.
pub fn diff_in_force(started: &Config, last: &Config, new: &Config) -> ConfigDiff {
    ConfigDiff {
        restart_needed: restart_needed(started, new),
        ..diff(last, new)
    }
}

pub fn diff(old: &Config, new: &Config) -> ConfigDiff {
    ConfigDiff {
        routes: by_id(&old.routes, &new.routes, |r| &r.id, alike),
        agents: by_id(
            &old.agents,
            &new.agents,
            |a| &a.id,
            |a, b| a.token.expose() == b.token.expose() && a.rate_limit == b.rate_limit,
        ),
        credentials: by_id(&old.credentials, &new.credentials, |c| &c.id, alike),
        ssh_targets: by_id(&old.ssh_targets, &new.ssh_targets, |t| &t.id, alike),
        changed: applied(old, new),
        restart_needed: restart_needed(old, new),
    }
}

/// Settings outside the id lists that a reload applies at once, that differ.
fn applied(old: &Config, new: &Config) -> Vec<&'static str> {
    let token = |c: &Config| c.admin.token.as_ref().map(|t| t.expose().to_owned());
    match token(old) == token(new) {
        true => Vec::new(),
        // A new token also ends the console's sessions.
        false => vec!["admin.token"],
    }
}

/// The sections a running daemon does not change, that differ.
fn restart_needed(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut restart_needed = Vec::new();
    let same_cluster = match (&old.cluster, &new.cluster) {
        (None, None) => true,
        (Some(a), Some(b)) => a.node == b.node && a.postgres.expose() == b.postgres.expose(),
        _ => false,
    };
    let sections: [(&'static str, bool); 8] = [
        ("proxy", alike(&old.proxy, &new.proxy)),
        ("ssh", alike(&old.ssh, &new.ssh)),
        ("admin.listen", old.admin.listen == new.admin.listen),
        (
            "admin.max_connections",
            old.admin.max_connections == new.admin.max_connections,
        ),
        ("journal", alike(&old.journal, &new.journal)),
        ("dns", alike(&old.dns, &new.dns)),
        ("cluster", same_cluster),
        ("audit", alike(&old.audit, &new.audit)),
    ];
    for (name, same) in sections {
        if !same {
            restart_needed.push(name);
        }
    }
    restart_needed
}

#[cfg(test)]
mod tests {
    use super::diff;

    fn parse(text: &str) -> crate::config::Config {
        crate::config::parse(text, None, &|_| None).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_new_admin_token_and_an_agents_rate_limit_are_reported_without_values() {
        let agent = |rate: &str| {
            format!(
                "[[agents]]\nid = \"ci\"\ntoken = \"ci-token-long-enough-1\"\nrate_limit = \"{rate}\"\n"
            )
        };
        let admin =
            |token: &str| format!("[admin]\nlisten = \"127.0.0.1:3129\"\ntoken = \"{token}\"\n");
        let old = parse(&format!(
            "{}{}",
            admin("admin-token-long-enough-1"),
            agent("3/m")
        ));
        let new = parse(&format!(
            "{}{}",
            admin("admin-token-long-enough-2"),
            agent("5/m")
        ));
        let d = diff(&old, &new);
        assert_eq!(d.changed, vec!["admin.token"]);
        assert_eq!(d.agents.changed, vec!["ci".to_owned()]);
        let shown = serde_json::to_string(&d).unwrap_or_default();
        assert!(!shown.contains("admin-token-long-enough"), "{shown}");
        assert!(diff(&old, &old).changed.is_empty());
    }
}
