//! What a client that ignored the proxy variables wants to reach: the TLS ClientHello's
//! SNI (only that extension is read; the jail terminates no TLS) or an HTTP/1 request's
//! `Host`. Pure functions over the bytes read so far.

/// The most a transparent listener reads before it knows the name.
pub const MAX_PEEK: usize = 64 * 1024;

#[derive(Debug, PartialEq, Eq)]
pub enum Sniffed {
    /// Not enough bytes yet.
    More,
    /// The host the client named (lower-case; an IPv6 literal keeps its brackets).
    Name(String),
    /// No name: not TLS/HTTP, no SNI or Host, or a malformed one.
    Nameless,
}

const HANDSHAKE: u8 = 22;
const CLIENT_HELLO: u8 = 1;
const EXT_SERVER_NAME: u16 = 0;

/// The SNI host name of the ClientHello at the start of `buf` (it may span records).
pub fn sni(buf: &[u8]) -> Sniffed {
    let mut handshake = Vec::new();
    let mut at = 0;
    loop {
        let Some(head) = buf.get(at..at + 5) else {
            return Sniffed::More;
        };
        if head[0] != HANDSHAKE {
            return Sniffed::Nameless;
        }
        let len = usize::from(u16::from_be_bytes([head[3], head[4]]));
        let Some(body) = buf.get(at + 5..at + 5 + len) else {
            return Sniffed::More;
        };
        handshake.extend_from_slice(body);
        at += 5 + len;
        if let Some(&kind) = handshake.first()
            && kind != CLIENT_HELLO
        {
            return Sniffed::Nameless;
        }
        if let Some(l) = handshake.get(1..4) {
            let need = (usize::from(l[0]) << 16) | (usize::from(l[1]) << 8) | usize::from(l[2]);
            if let Some(hello) = handshake.get(4..4 + need) {
                return server_name(hello).map_or(Sniffed::Nameless, Sniffed::Name);
            }
        }
    }
}

/// A cursor over length-prefixed fields.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = rest;
        Some(head)
    }
    fn u8_len(&mut self) -> Option<&'a [u8]> {
        let n = usize::from(*self.take(1)?.first()?);
        self.take(n)
    }
    fn u16(&mut self) -> Option<u16> {
        let b = self.take(2)?;
        Some(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u16_len(&mut self) -> Option<&'a [u8]> {
        let n = usize::from(self.u16()?);
        self.take(n)
    }
}

fn server_name(hello: &[u8]) -> Option<String> {
    let mut r = Reader(hello);
    r.take(2 + 32)?; // legacy_version, random
    r.u8_len()?; // session id
    r.u16_len()?; // cipher suites
    r.u8_len()?; // compression methods
    let mut exts = Reader(r.u16_len()?);
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let data = exts.u16_len()?;
        if kind != EXT_SERVER_NAME {
            continue;
        }
        let mut list = Reader(Reader(data).u16_len()?);
        while !list.0.is_empty() {
            let name_type = *list.take(1)?.first()?;
            let name = list.u16_len()?;
            if name_type == 0 {
                return host_name(name);
            }
        }
        return None;
    }
    None
}

fn host_name(raw: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(raw).ok()?.trim_end_matches('.');
    let ok = !text.is_empty()
        && text.len() <= 253
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b));
    ok.then(|| text.to_ascii_lowercase())
}

/// The `Host` of the HTTP/1 request head at the start of `buf`, without its port.
pub fn http_host(buf: &[u8]) -> Sniffed {
    let Some(end) = memchr::memmem::find(buf, b"\r\n\r\n") else {
        return match buf.len() >= MAX_PEEK {
            true => Sniffed::Nameless,
            false => Sniffed::More,
        };
    };
    let Ok(head) = std::str::from_utf8(&buf[..end]) else {
        return Sniffed::Nameless;
    };
    let host = head.split("\r\n").skip(1).find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("host")
            .then(|| value.trim())
    });
    host.and_then(authority_host)
        .map_or(Sniffed::Nameless, Sniffed::Name)
}

fn authority_host(value: &str) -> Option<String> {
    if let Some(rest) = value.strip_prefix('[') {
        let (inner, _) = rest.split_once(']')?;
        let ok = !inner.is_empty() && inner.bytes().all(|b| b.is_ascii_hexdigit() || b == b':');
        return ok.then(|| format!("[{}]", inner.to_ascii_lowercase()));
    }
    let name = match value.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => value,
    };
    host_name(name.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello as rustls sends it for `name`, split into records of `record` bytes.
    fn client_hello(name: &str, record: usize) -> Vec<u8> {
        let mut sni = vec![0u8];
        sni.extend_from_slice(&(name.len() as u16).to_be_bytes());
        sni.extend_from_slice(name.as_bytes());
        let mut sni_ext = (sni.len() as u16).to_be_bytes().to_vec();
        sni_ext.extend_from_slice(&sni);
        let mut exts = Vec::new();
        // a padding-like extension first, so the parser must skip one
        exts.extend_from_slice(&[0x00, 0x15, 0x00, 0x03, 0, 0, 0]);
        exts.extend_from_slice(&EXT_SERVER_NAME.to_be_bytes());
        exts.extend_from_slice(&(sni_ext.len() as u16).to_be_bytes());
        exts.extend_from_slice(&sni_ext);
        let mut hello = vec![3, 3];
        hello.extend_from_slice(&[7; 32]);
        hello.extend_from_slice(&[4, 1, 2, 3, 4]); // session id
        hello.extend_from_slice(&[0, 2, 0x13, 0x01]); // one suite
        hello.extend_from_slice(&[1, 0]); // null compression
        hello.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        hello.extend_from_slice(&exts);
        let mut hs = vec![CLIENT_HELLO, 0];
        hs.extend_from_slice(&(hello.len() as u16).to_be_bytes());
        hs.extend_from_slice(&hello);
        let mut out = Vec::new();
        for chunk in hs.chunks(record) {
            out.extend_from_slice(&[HANDSHAKE, 3, 1]);
            out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
            out.extend_from_slice(chunk);
        }
        out
    }

    #[test]
    fn the_sni_is_found_in_one_record_or_across_several_and_needs_the_whole_hello() {
        let one = client_hello("Origin.Test", 16 * 1024);
        assert_eq!(sni(&one), Sniffed::Name("origin.test".into()));
        for cut in [0, 3, 5, 20, one.len() - 1] {
            assert_eq!(sni(&one[..cut]), Sniffed::More, "cut at {cut}");
        }
        let split = client_hello("api.example.com", 17);
        assert_eq!(sni(&split), Sniffed::Name("api.example.com".into()));
        assert_eq!(sni(&split[..split.len() - 2]), Sniffed::More);
    }

    #[test]
    fn no_tls_or_no_usable_name_is_nameless() {
        assert_eq!(sni(b"GET / HTTP/1.1\r\n\r\n"), Sniffed::Nameless);
        assert_eq!(sni(&client_hello("bad name", 1024)), Sniffed::Nameless);
        let mut not_hello = client_hello("a.test", 1024);
        not_hello[5] = 2;
        assert_eq!(sni(&not_hello), Sniffed::Nameless);
    }

    #[test]
    fn the_host_header_names_the_target_without_its_port() {
        let req = b"GET /x HTTP/1.1\r\nUser-Agent: t\r\nhost: Origin.Test:80\r\n\r\nbody";
        assert_eq!(http_host(req), Sniffed::Name("origin.test".into()));
        assert_eq!(http_host(b"GET / HTTP/1.1\r\nHost: a.test"), Sniffed::More);
        assert_eq!(
            http_host(b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n"),
            Sniffed::Name("[::1]".into())
        );
        assert_eq!(http_host(b"GET / HTTP/1.1\r\n\r\n"), Sniffed::Nameless);
        assert_eq!(
            http_host(b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n"),
            Sniffed::Nameless
        );
        assert_eq!(http_host(&vec![b'a'; MAX_PEEK]), Sniffed::Nameless);
    }
}
