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
            |a, b| a.token.expose() == b.token.expose(),
        ),
        credentials: by_id(&old.credentials, &new.credentials, |c| &c.id, alike),
        ssh_targets: by_id(&old.ssh_targets, &new.ssh_targets, |t| &t.id, alike),
        restart_needed: restart_needed(old, new),
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
