//! Strict request paths, normalized before route matching and forwarded as matched.
//!
//! Origins disagree on how to read a path (Tomcat drops `;` parameters, IIS takes `\` as
//! `/`, some decode twice), so a prefix match is only sound on a path every origin reads
//! the same way. In the spirit of Envoy's path normalization (RFC 3986 §6.2.2):
//! - escapes of unreserved characters are decoded, other escapes get upper-case hex;
//! - repeated slashes are merged;
//! - refused: `\`, NUL, CR, LF and their escapes; an escaped `/`; dot segments, also with
//!   `;` parameters or escaped (`..;`, `%2e%2e`, `..%3B`); an escaped `%` (`%25`) that
//!   encodes a dot, slash, backslash, `;`, `%` or NUL (double decoding); escapes that do
//!   not decode to valid UTF-8 (overlong `%c0%ae`); malformed escapes.

/// Why a path is refused: it is not one path every origin reads the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathRefused;

/// The normalized form of an origin-form path (without its query).
pub fn normalize_path(path: &str) -> Result<String, PathRefused> {
    if !path.starts_with('/') {
        return Err(PathRefused);
    }
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut decoded = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b != b'%' {
            if forbidden(b) {
                return Err(PathRefused);
            }
            if !b.is_ascii() {
                // A raw UTF-8 byte is sent as its escape, which an origin reads as the same
                // character (a byte taken as a char would be re-encoded: é sent as Ã©).
                out.push_str(&format!("%{b:02X}"));
                decoded.push(b);
                i += 1;
                continue;
            }
            push_merged(&mut out, char::from(b));
            decoded.push(b);
            i += 1;
            continue;
        }
        let d = escape_at(bytes, i).ok_or(PathRefused)?;
        if forbidden(d) || d == b'/' || (d == b'%' && double_encoded(bytes, i + 3)) {
            return Err(PathRefused);
        }
        if is_unreserved(d) {
            out.push(char::from(d));
        } else {
            out.push_str(&format!("%{d:02X}"));
        }
        decoded.push(d);
        i += 3;
    }
    let decoded = String::from_utf8(decoded).map_err(|_| PathRefused)?;
    if decoded.split('/').any(is_dot_segment) {
        return Err(PathRefused);
    }
    Ok(out)
}

/// Appends `c`, merging a slash that follows a slash.
fn push_merged(out: &mut String, c: char) {
    if c == '/' && out.ends_with('/') {
        return;
    }
    out.push(c);
}

fn forbidden(b: u8) -> bool {
    matches!(b, b'\\' | 0 | b'\r' | b'\n')
}

/// `.` or `..`, alone or followed by `;` parameters.
fn is_dot_segment(segment: &str) -> bool {
    let name = segment.split(';').next().unwrap_or("");
    name == "." || name == ".."
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// The byte `%XY` at `i` encodes, if it is a well-formed escape.
fn escape_at(bytes: &[u8], i: usize) -> Option<u8> {
    let hex = bytes.get(i + 1..i + 3)?;
    let text = std::str::from_utf8(hex).ok()?;
    u8::from_str_radix(text, 16).ok()
}

/// `%25` followed by an escape that a second decoding would turn into something refused.
fn double_encoded(bytes: &[u8], next: usize) -> bool {
    let Some(hex) = bytes.get(next..next + 2) else {
        return false;
    };
    let Some(d) = std::str::from_utf8(hex)
        .ok()
        .and_then(|t| u8::from_str_radix(t, 16).ok())
    else {
        return false;
    };
    forbidden(d) || matches!(d, b'.' | b'/' | b';' | b'%')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_origins_read_differently_are_refused() {
        for p in [
            "/repos/..;/admin",
            "/repos/..%3B/admin",
            "/repos/..%3b/admin",
            "/repos/.;x/admin",
            "/repos/..\\admin",
            "/repos/%5c..%5cadmin",
            "/repos/%2e%2e%5cadmin",
            "/repos/%2e%2e/admin",
            "/repos/.%2E/admin",
            "/repos/%252e%252e/admin",
            "/repos/%252F/admin",
            "/repos/%255c",
            "/repos/%c0%ae%c0%ae/admin",
            "/repos/%ff",
            "/repos/%00/x",
            "/repos/%0d%0aX: y",
            "/repos/%2f",
            "/repos/%zz",
            "/repos/%4",
            "/repos/..",
            "relative",
        ] {
            assert_eq!(normalize_path(p), Err(PathRefused), "{p}");
        }
    }

    #[test]
    fn ordinary_paths_are_normalized_not_refused() {
        let ok = |p: &str| normalize_path(p).unwrap_or_else(|_| format!("refused {p}"));
        assert_eq!(ok("/repos/a/b"), "/repos/a/b");
        assert_eq!(ok("/"), "/");
        assert_eq!(ok("/%61dmin/deploy"), "/admin/deploy");
        assert_eq!(ok("//admin//deploy"), "/admin/deploy");
        assert_eq!(ok("/a%2db%7e"), "/a-b~");
        assert_eq!(ok("/file%20name%3f"), "/file%20name%3F");
        assert_eq!(ok("/caf%C3%A9"), "/caf%C3%A9");
        // Raw UTF-8 (an agent that did not escape it): the same character, escaped.
        assert_eq!(ok("/enc/é"), "/enc/%C3%A9");
        assert_eq!(ok("/a;v=1/b"), "/a;v=1/b");
        assert_eq!(ok("/v1.2/..x/.well-known"), "/v1.2/..x/.well-known");
        assert_eq!(ok("/100%2541"), "/100%2541");
    }
}
