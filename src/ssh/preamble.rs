//! The one-line preamble `postern ssh-connect` sends before the SSH bytes, and the one-line
//! answer:
//!
//! ```text
//! POSTERN-SSH/1 agent=<pct> token=<pct> user=<pct> host=<pct> port=<n>\n   (agent, token optional)
//! OK\n                       → SSH follows, both ways
//! ERR <envelope JSON>\n      → refused; the bridge prints the envelope and exits 255
//! ```
//! Values are percent-encoded (every byte outside `A-Za-z0-9-._~`).

/// Longest preamble line accepted (bytes, newline included).
pub const MAX_LINE: usize = 4096;

const MAGIC: &str = "POSTERN-SSH/1";

/// What the agent's ssh asked for, and who the agent says it is.
#[derive(Clone, PartialEq, Eq)]
pub struct Preamble {
    pub agent: Option<String>,
    pub token: Option<String>,
    pub user: String,
    pub host: String,
    pub port: u16,
}

impl std::fmt::Debug for Preamble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Preamble")
            .field("agent", &self.agent)
            .field("token", &self.token.as_ref().map(|_| "[redacted]"))
            .field("user", &self.user)
            .field("host", &self.host)
            .field("port", &self.port)
            .finish()
    }
}

/// Why a preamble line is not one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

impl Preamble {
    /// The line, newline included.
    pub fn encode(&self) -> String {
        let mut line = MAGIC.to_owned();
        for (key, value) in [("agent", &self.agent), ("token", &self.token)] {
            if let Some(v) = value {
                line.push_str(&format!(" {key}={}", pct(v)));
            }
        }
        line.push_str(&format!(
            " user={} host={} port={}\n",
            pct(&self.user),
            pct(&self.host),
            self.port
        ));
        line
    }

    /// Parses one line (without its newline).
    pub fn parse(line: &str) -> Result<Self, Malformed> {
        let mut words = line.trim_end_matches('\r').split(' ');
        if words.next() != Some(MAGIC) {
            return Err(Malformed("preamble"));
        }
        let mut p = Preamble {
            agent: None,
            token: None,
            user: String::new(),
            host: String::new(),
            port: 0,
        };
        for word in words {
            let (key, raw) = word.split_once('=').ok_or(Malformed("preamble"))?;
            let value = unpct(raw).ok_or(Malformed("preamble"))?;
            match key {
                "agent" => p.agent = Some(value).filter(|v| !v.is_empty()),
                "token" => p.token = Some(value).filter(|v| !v.is_empty()),
                "user" => p.user = value,
                "host" => p.host = value.to_ascii_lowercase(),
                "port" => p.port = value.parse().map_err(|_| Malformed("target.port"))?,
                _ => {} // later versions may add keys
            }
        }
        // Control characters would reach the journal, the log and the operator's terminal
        // (`postern actions list`) as escape sequences and forged lines.
        let unprintable = |s: &str| s.chars().any(char::is_control);
        if p.user.is_empty() || unprintable(&p.user) {
            return Err(Malformed("user"));
        }
        if p.host.is_empty() || unprintable(&p.host) || p.host.contains(char::is_whitespace) {
            return Err(Malformed("target.host"));
        }
        if p.agent.as_deref().is_some_and(unprintable) {
            return Err(Malformed("agent"));
        }
        if p.port == 0 {
            return Err(Malformed("target.port"));
        }
        Ok(p)
    }
}

pub(crate) fn pct(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn unpct(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_preamble_round_trips_with_odd_bytes() {
        let p = Preamble {
            agent: Some("ci".into()),
            token: Some("t k=n%\u{e9}".into()),
            user: "deploy".into(),
            host: "app1.internal".into(),
            port: 2222,
        };
        let line = p.encode();
        assert_eq!(
            line,
            "POSTERN-SSH/1 agent=ci token=t%20k%3Dn%25%C3%A9 user=deploy host=app1.internal port=2222\n"
        );
        assert_eq!(Preamble::parse(line.trim_end()), Ok(p));
        assert!(!format!("{:?}", Preamble::parse(line.trim_end())).contains("t%20k"));
    }

    #[test]
    fn malformed_preambles_name_the_field() {
        assert_eq!(
            Preamble::parse("SSH-2.0-OpenSSH"),
            Err(Malformed("preamble"))
        );
        assert_eq!(
            Preamble::parse("POSTERN-SSH/1 user=u host=h port=x"),
            Err(Malformed("target.port"))
        );
        assert_eq!(
            Preamble::parse("POSTERN-SSH/1 host=h port=22"),
            Err(Malformed("user"))
        );
        assert_eq!(
            Preamble::parse("POSTERN-SSH/1 user=u host=h port=22 agent=%zz"),
            Err(Malformed("preamble"))
        );
        for (line, field) in [
            ("POSTERN-SSH/1 user=u%1B%5B2J host=h port=22", "user"),
            (
                "POSTERN-SSH/1 user=u host=h%0D%0Aforged port=22",
                "target.host",
            ),
            ("POSTERN-SSH/1 user=u host=h%20h port=22", "target.host"),
            ("POSTERN-SSH/1 agent=a%07 user=u host=h port=22", "agent"),
        ] {
            assert_eq!(Preamble::parse(line), Err(Malformed(field)), "{line}");
        }
        let anon = Preamble::parse("POSTERN-SSH/1 user=u host=H port=22").unwrap();
        assert_eq!((anon.agent, anon.host.as_str()), (None, "h"));
    }
}
