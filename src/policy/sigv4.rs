//! What an AWS SDK signed (SPEC §3.8): the `AWS4-HMAC-SHA256` `Authorization` header or the
//! presigned query (`X-Amz-Credential`, …). postern reads which key id and scope the agent
//! signed with and which headers it covered; the signature itself is never checked (the
//! agent only holds the placeholder) and is replaced at the egress hop.

/// The algorithm every SigV4 signature names.
pub const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// The query parameters of a presigned request; `X-Amz-Signature` is the agent's signature.
pub const QUERY_PARAMS: &[&str] = &[
    "X-Amz-Algorithm",
    "X-Amz-Credential",
    "X-Amz-Date",
    "X-Amz-Expires",
    "X-Amz-SignedHeaders",
    "X-Amz-Signature",
    "X-Amz-Security-Token",
];

/// Headers an AWS SDK changes between its own tries of one call (measured for boto3 and the
/// AWS SDK for JavaScript v3): the signature, its time, and the SDK's attempt counter.
pub const CHANGED_BETWEEN_TRIES: &[&str] = &["authorization", "x-amz-date", "amz-sdk-request"];

/// The credential scope a signature names: `<key id>/<date>/<region>/<service>/aws4_request`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    pub key_id: String,
    pub date: String,
    pub region: String,
    pub service: String,
}

impl Scope {
    fn parse(credential: &str) -> Option<Self> {
        // The key id is everything before the last four parts (a placeholder may hold '/').
        let mut parts = credential.rsplitn(5, '/');
        let terminator = parts.next()?;
        let service = parts.next()?;
        let region = parts.next()?;
        let date = parts.next()?;
        let key_id = parts.next()?;
        let ok = terminator == "aws4_request"
            && date.len() == 8
            && date.bytes().all(|b| b.is_ascii_digit())
            && !region.is_empty()
            && !service.is_empty()
            && !key_id.is_empty();
        ok.then(|| Self {
            key_id: key_id.to_owned(),
            date: date.to_owned(),
            region: region.to_owned(),
            service: service.to_owned(),
        })
    }

    /// Whether the scope stays inside a pinned `region` / `service` (unpinned: any).
    pub fn within(&self, region: Option<&str>, service: Option<&str>) -> bool {
        region.is_none_or(|r| r == self.region) && service.is_none_or(|s| s == self.service)
    }
}

/// A header-form signature: its scope and the headers it covers (lower-case, as listed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    pub scope: Scope,
    pub signed_headers: Vec<String>,
}

impl Signed {
    /// `AWS4-HMAC-SHA256 Credential=…, SignedHeaders=…, Signature=…` (any order, spaces
    /// optional); `None` for anything else.
    pub fn parse(authorization: &[u8]) -> Option<Self> {
        let value = std::str::from_utf8(authorization).ok()?;
        let rest = value.strip_prefix(ALGORITHM)?;
        if !rest.starts_with(' ') {
            return None;
        }
        let (mut credential, mut signed, mut signature) = (None, None, None);
        for field in rest.split(',') {
            let (name, v) = field.trim().split_once('=')?;
            let slot = match name {
                "Credential" => &mut credential,
                "SignedHeaders" => &mut signed,
                "Signature" => &mut signature,
                _ => return None,
            };
            if slot.replace(v).is_some() {
                return None;
            }
        }
        signature?;
        let signed_headers: Vec<String> = signed?.split(';').map(str::to_owned).collect();
        if signed_headers.iter().any(String::is_empty) {
            return None;
        }
        Some(Self {
            scope: Scope::parse(credential?)?,
            signed_headers,
        })
    }
}

/// The scope of a presigned query's `X-Amz-Credential` (decoded), if it has one.
pub fn query_scope(credential: &[u8]) -> Option<Scope> {
    Scope::parse(std::str::from_utf8(credential).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOTO: &str = "AWS4-HMAC-SHA256 Credential=postern:aws/20261206/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature=0f3a";

    #[test]
    fn a_boto3_authorization_names_its_scope_and_headers() {
        let s = Signed::parse(BOTO.as_bytes()).unwrap();
        assert_eq!(s.scope.key_id, "postern:aws");
        assert_eq!(
            (
                s.scope.date.as_str(),
                s.scope.region.as_str(),
                s.scope.service.as_str()
            ),
            ("20261206", "us-east-1", "s3")
        );
        assert_eq!(
            s.signed_headers,
            ["host", "x-amz-content-sha256", "x-amz-date"]
        );
        assert!(s.scope.within(Some("us-east-1"), None));
        assert!(!s.scope.within(None, Some("bedrock")));
    }

    #[test]
    fn anything_else_is_no_signature() {
        for bad in [
            "Bearer postern:aws",
            "AWS4-HMAC-SHA256Credential=a/20261206/r/s/aws4_request, SignedHeaders=host, Signature=1",
            "AWS4-HMAC-SHA256 Credential=a/2026120/r/s/aws4_request, SignedHeaders=host, Signature=1",
            "AWS4-HMAC-SHA256 Credential=a/20261206/r/s/aws4_request, SignedHeaders=host",
            "AWS4-HMAC-SHA256 Credential=a/20261206/r/s/x, SignedHeaders=host, Signature=1",
            "AWS4-HMAC-SHA256 Credential=a/20261206/r/s/aws4_request, Credential=b/20261206/r/s/aws4_request, SignedHeaders=host, Signature=1",
            "AWS4-HMAC-SHA256 Credential=a/20261206/r/s/aws4_request, SignedHeaders=host;;x, Signature=1",
        ] {
            assert_eq!(Signed::parse(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn a_key_id_may_hold_slashes() {
        let s = query_scope(b"team/aws/20261206/eu-west-1/sqs/aws4_request").unwrap();
        assert_eq!(s.key_id, "team/aws");
        assert_eq!(s.service, "sqs");
    }
}
