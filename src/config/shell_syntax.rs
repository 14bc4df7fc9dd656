//! Shell syntax in SSH commands. `commands` patterns match the raw command string, but the
//! remote's login shell reads it: `^echo .*$` admits `echo x; whoami`. A target with patterns
//! refuses these characters unless it sets `shell_syntax = true`.

use regex_syntax::hir::{Class, Hir, HirKind, Look};

/// What a POSIX shell reads as a command list, pipe, background, expansion or redirection.
pub const SHELL_SYNTAX: [char; 8] = [';', '|', '&', '$', '`', '>', '<', '\n'];

/// The first shell-syntax character in `command`.
pub fn shell_syntax_in(command: &str) -> Option<char> {
    command.chars().find(|c| SHELL_SYNTAX.contains(c))
}

/// A shell-syntax character some command matched by `regex` may hold (an over-estimate: it
/// asks whether any literal or class of the pattern holds one). A pattern not anchored at
/// both ends (`^git-upload-pack `) admits anything around its match. `None` for an invalid
/// regex.
pub fn admitted_by(regex: &str) -> Option<char> {
    let hir = regex_syntax::parse(regex).ok()?;
    let props = hir.properties();
    let whole = props.look_set_prefix().contains(Look::Start)
        && props.look_set_suffix().contains(Look::End);
    if !whole {
        return Some(SHELL_SYNTAX[0]);
    }
    SHELL_SYNTAX.into_iter().find(|&c| can_match(&hir, c))
}

fn can_match(hir: &Hir, c: char) -> bool {
    match hir.kind() {
        HirKind::Empty | HirKind::Look(_) => false,
        HirKind::Literal(lit) => {
            let mut buf = [0u8; 4];
            let needle = c.encode_utf8(&mut buf).as_bytes();
            lit.0.windows(needle.len()).any(|w| w == needle)
        }
        HirKind::Class(Class::Unicode(class)) => class
            .ranges()
            .iter()
            .any(|r| r.start() <= c && c <= r.end()),
        HirKind::Class(Class::Bytes(class)) => {
            let b = u32::from(c);
            class
                .ranges()
                .iter()
                .any(|r| u32::from(r.start()) <= b && b <= u32::from(r.end()))
        }
        HirKind::Repetition(rep) => rep.max != Some(0) && can_match(&rep.sub, c),
        HirKind::Capture(cap) => can_match(&cap.sub, c),
        HirKind::Concat(all) | HirKind::Alternation(all) => all.iter().any(|h| can_match(h, c)),
    }
}

#[cfg(test)]
mod tests {
    use super::{admitted_by, shell_syntax_in};

    #[test]
    fn commands_with_shell_syntax_are_found() {
        for cmd in [
            "echo x; whoami",
            "a | b",
            "a && b",
            "echo $HOME",
            "echo `id`",
            "a > f",
        ] {
            assert!(shell_syntax_in(cmd).is_some(), "{cmd}");
        }
        assert_eq!(shell_syntax_in("echo a\nid"), Some('\n'));
        assert_eq!(shell_syntax_in("git-upload-pack 'repo.git'"), None);
        assert_eq!(shell_syntax_in("systemctl restart app"), None);
    }

    #[test]
    fn patterns_that_admit_shell_syntax_are_found() {
        assert_eq!(admitted_by("^echo .*$"), Some(';'));
        // Open at the end: anything may follow the match.
        assert_eq!(admitted_by("^git-(upload|receive)-pack "), Some(';'));
        assert_eq!(admitted_by("^git-(upload|receive)-pack [a-z/.']+$"), None);
        assert_eq!(
            admitted_by("^git-(upload|receive)-pack '[^']*'$"),
            Some(';')
        );
        assert_eq!(admitted_by("^systemctl restart app$"), None);
        assert_eq!(admitted_by("^ls( -l)?$"), None);
        assert_eq!(admitted_by("^echo [a-z0-9 ]+$"), None);
        assert_eq!(admitted_by("^make (a|b)\\|c$"), Some('|'));
        assert_eq!(admitted_by("^cost \\$[0-9]+$"), Some('$'));
        assert_eq!(admitted_by("^x(;){0}$"), None);
    }
}
