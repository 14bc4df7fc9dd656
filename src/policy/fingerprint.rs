//! The request fingerprint: SHA-256 over method, normalized target, selected headers and body.

use sha2::{Digest, Sha256};

/// `sha256:<hex>`; headers are (lower-case name, value) pairs in a fixed order.
pub fn fingerprint(method: &str, url: &str, headers: &[(&str, &[u8])], body: &[u8]) -> String {
    let mut h = Sha256::new();
    for part in [method.as_bytes(), url.as_bytes()] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    for (name, value) in headers {
        h.update((name.len() as u64).to_be_bytes());
        h.update(name.as_bytes());
        h.update((value.len() as u64).to_be_bytes());
        h.update(value);
    }
    h.update((body.len() as u64).to_be_bytes());
    h.update(body);
    crate::journal::sha256_tagged_digest(&h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_separate_their_parts() {
        let a = fingerprint("POST", "https://x/a", &[], b"bc");
        let b = fingerprint("POST", "https://x/ab", &[], b"c");
        assert_ne!(a, b);
        assert_eq!(a, fingerprint("POST", "https://x/a", &[], b"bc"));
        assert!(a.starts_with("sha256:"));
    }
}
