//! `[[ssh_targets]]`: defaults of SPEC §5.4, credential mode, known_hosts, `commands`.

use std::time::Duration;

use super::{Checker, Refs, approval};
use crate::config::model::{Credential, Inject, SshAction, SshTarget};
use crate::config::raw::RawSshTarget;

pub(super) fn validate(
    c: &mut Checker<'_>,
    refs: &Refs<'_>,
    credentials: &[Credential],
    i: usize,
    t: &RawSshTarget,
) -> SshTarget {
    let p = format!("ssh_targets[{i}]");
    let agents = crate::config::Agents::new(t.agents.clone());
    refs.check_agents(c, &p, agents.named());
    let credential = t.credential.clone().unwrap_or_default();
    check_credential(c, refs, credentials, &p, t.credential.as_deref());
    let secs = Duration::from_secs;
    SshTarget {
        id: t.id.clone(),
        host: host(c, &p, &t.host),
        port: port(c, &p, t.port),
        user: user(c, &p, &t.user),
        agents,
        credential,
        known_hosts: known_hosts(c, &p, t.known_hosts.as_deref()),
        resolve: t
            .resolve
            .as_deref()
            .map(|s| c.addr(&format!("{p}.resolve"), Some(s), "")),
        allow: allow(c, &p, t.allow.as_deref()),
        commands: commands(c, &p, t.commands.as_deref().unwrap_or(&[])),
        shell_syntax: t.shell_syntax.unwrap_or(false),
        approval: approval(c, &p, t.approval.as_deref()),
        approval_timeout: c.timeout(
            &format!("{p}.approval_timeout"),
            &t.approval_timeout,
            secs(300),
        ),
        retry_budget: t.retry_budget.unwrap_or(3),
        connect_timeout: c.timeout(&format!("{p}.connect_timeout"), &t.connect_timeout, secs(5)),
        response_timeout: c.timeout(
            &format!("{p}.response_timeout"),
            &t.response_timeout,
            secs(600),
        ),
        idle_timeout: c.timeout(&format!("{p}.idle_timeout"), &t.idle_timeout, secs(60)),
    }
}

/// The credential must exist and inject as an SSH login (a header cannot log in).
fn check_credential(
    c: &mut Checker<'_>,
    refs: &Refs<'_>,
    credentials: &[Credential],
    p: &str,
    id: Option<&str>,
) {
    let path = format!("{p}.credential");
    let Some(id) = id else {
        c.bad(
            path,
            "an SSH target needs a credential (inject ssh_key or ssh_password)",
        );
        return;
    };
    if !refs.credentials.contains(id) {
        refs.check_credential(c, path, id);
        return;
    }
    let mode = credentials
        .iter()
        .find(|cr| cr.id == id)
        .map(|cr| &cr.inject);
    if let Some(mode) = mode
        && !matches!(mode, Inject::SshKey | Inject::SshPassword)
    {
        c.bad(
            path,
            format!(
                "credential `{id}` injects as {}; an SSH target needs ssh_key or ssh_password",
                mode.mode()
            ),
        );
    }
}

fn host(c: &mut Checker<'_>, p: &str, host: &str) -> String {
    let ok = !host.is_empty()
        && host
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '.' | '-' | '_' | ':'));
    if !ok {
        c.bad(format!("{p}.host"), format!("`{host}` is not a host name"));
    }
    host.to_ascii_lowercase()
}

fn port(c: &mut Checker<'_>, p: &str, port: Option<u16>) -> u16 {
    if port == Some(0) {
        c.bad(format!("{p}.port"), "must be 1-65535");
    }
    port.unwrap_or(22)
}

/// The user goes into `ssh://user@host:port` and the preamble: no spaces or `@`.
fn user(c: &mut Checker<'_>, p: &str, user: &str) -> String {
    let ok = !user.is_empty() && user.chars().all(|ch| ch.is_ascii_graphic() && ch != '@');
    if !ok {
        c.bad(format!("{p}.user"), format!("`{user}` is not a login name"));
    }
    user.to_owned()
}

fn known_hosts(c: &mut Checker<'_>, p: &str, v: Option<&str>) -> std::path::PathBuf {
    let path = format!("{p}.known_hosts");
    let Some(v) = v else {
        c.bad(
            path,
            "an SSH target needs a known_hosts file (upstream host keys are checked strictly)",
        );
        return std::path::PathBuf::new();
    };
    let file = c.path(v);
    if !file.is_file() {
        c.bad(path, format!("no file at {}", file.display()));
    }
    file
}

fn allow(c: &mut Checker<'_>, p: &str, v: Option<&[String]>) -> Vec<SshAction> {
    let Some(list) = v else {
        return vec![SshAction::Exec];
    };
    let mut allowed = Vec::new();
    for (j, a) in list.iter().enumerate() {
        match SshAction::parse(a) {
            Some(action) if action.is_built() => allowed.push(action),
            // Accepted here, it would only be refused at run time (UNSUPPORTED_ACTION).
            Some(_) => c.bad(
                format!("{p}.allow[{j}]"),
                format!("`{a}` is not built yet: only \"exec\" is"),
            ),
            None => c.bad(
                format!("{p}.allow[{j}]"),
                format!("`{a}` is not an SSH action: only \"exec\" is built"),
            ),
        }
    }
    allowed
}

/// A pattern matches the whole command: one without anchors is anchored at both ends; one
/// that carries its own (`^…$`, or `^git-upload-pack ` to allow arguments, as SPEC §5.4's
/// example does) is used as written.
fn commands(c: &mut Checker<'_>, p: &str, patterns: &[String]) -> Vec<regex::Regex> {
    patterns
        .iter()
        .enumerate()
        .filter_map(
            |(j, pattern)| match regex::Regex::new(&whole_command(pattern)) {
                Ok(re) => Some(re),
                Err(e) => {
                    c.bad(
                        format!("{p}.commands[{j}]"),
                        format!("not a regular expression: {e}"),
                    );
                    None
                }
            },
        )
        .collect()
}

/// The regular expression a `commands` pattern stands for (see `commands`).
fn whole_command(pattern: &str) -> String {
    let anchored =
        pattern.starts_with('^') || (pattern.ends_with('$') && !pattern.ends_with("\\$"));
    if anchored {
        pattern.to_owned()
    } else {
        format!("^(?:{pattern})$")
    }
}

#[cfg(test)]
mod tests {
    use super::whole_command;

    fn permits(pattern: &str, command: &str) -> bool {
        regex::Regex::new(&whole_command(pattern)).is_ok_and(|r| r.is_match(command))
    }

    #[test]
    fn patterns_match_whole_commands_unless_they_carry_their_own_anchors() {
        assert!(permits("echo hi", "echo hi"));
        assert!(!permits("echo hi", "echo hi; rm -rf /"));
        assert!(!permits("echo hi", "sudo echo hi"));
        assert!(permits("^systemctl restart app$", "systemctl restart app"));
        assert!(!permits(
            "^systemctl restart app$",
            "systemctl restart app; reboot"
        ));
        // SPEC §5.4's example: the git pattern allows the repository argument.
        assert!(permits(
            "^git-(upload|receive)-pack ",
            "git-upload-pack '/srv/repo.git'"
        ));
        assert!(!permits(
            "^git-(upload|receive)-pack ",
            "sh -c 'git-upload-pack x'"
        ));
        assert!(!permits("cost \\$", "cost $5"));
    }
}
