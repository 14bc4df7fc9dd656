//! AWS SigV4 re-signed at the egress hop (SPEC §3.8). The agent's SDK signs with the
//! credential's placeholder as its access key id; postern signs the same request again with
//! the real key pair: the headers the agent signed (as they leave postern), the payload hash
//! it declared, a fresh `X-Amz-Date`, and the session token when the entry has one. The
//! signing is the AWS SDK for Rust's own (`aws-sigv4`).

use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    PercentEncodingMode, SignableBody, SignableRequest, SignatureLocation, SigningSettings,
    UriPathNormalizationMode, sign,
};
use aws_sigv4::sign::v4;
use http::{HeaderMap, HeaderValue, header};
use serde::Deserialize;

use crate::guard::pct_reserved;
use crate::policy::placeholder::query_values;
use crate::policy::placeholder::without_param;
use crate::policy::sigv4::{ALGORITHM, QUERY_PARAMS, Scope, Signed, query_scope};

/// The vault entry of an `aws_sigv4` credential.
#[derive(Deserialize)]
pub struct KeyPair {
    access_key_id: String,
    secret_access_key: String,
    session_token: Option<String>,
}

impl std::fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyPair([redacted])")
    }
}

impl KeyPair {
    /// `{"access_key_id", "secret_access_key", "session_token"?}`; `None` otherwise.
    pub fn parse(entry: &str) -> Option<Self> {
        let keys: Self = serde_json::from_str(entry).ok()?;
        let filled = |v: &str| !v.is_empty() && v.bytes().all(|b| b.is_ascii_graphic());
        let ok = filled(&keys.access_key_id)
            && filled(&keys.secret_access_key)
            && keys.session_token.as_deref().is_none_or(filled);
        ok.then_some(keys)
    }

    /// What the reflection guard keeps from coming back: the secret key, the session token
    /// (it travels in a header), and the signing key derived for `scope` on `date`.
    pub fn secrets(&self, scope: Option<&Scope>) -> Vec<Vec<u8>> {
        let mut out = vec![self.secret_access_key.as_bytes().to_vec()];
        out.extend(self.session_token.iter().map(|t| t.as_bytes().to_vec()));
        if let Some(s) = scope {
            let key = v4::generate_signing_key(
                &self.secret_access_key,
                SystemTime::now(),
                &s.region,
                &s.service,
            );
            out.push(key.as_ref().to_vec());
        }
        out
    }
}

/// One request as it leaves postern, to be signed.
pub struct Outgoing<'r> {
    pub method: &'r str,
    pub scheme: &'r str,
    /// The `Host` postern sends (the route's authority, default port left out).
    pub authority: &'r str,
    pub body: &'r [u8],
}

/// How the agent signed: in `Authorization`, or a presigned query valid for `expires`.
enum Form {
    Header,
    Query { expires: Duration },
}

/// Replaces the agent's signature — in `headers`, or in the query of `path_and_query` —
/// with one made with `keys`. `Err` says why the request cannot be signed (it is then not
/// sent).
pub fn resign(
    keys: &KeyPair,
    req: &Outgoing<'_>,
    path_and_query: &mut String,
    headers: &mut HeaderMap,
    now: SystemTime,
) -> Result<Scope, &'static str> {
    let (agent, form) = agent_signature(headers, path_and_query)
        .ok_or("the request carries no SigV4 signature to re-sign")?;
    for name in [
        header::AUTHORIZATION.as_str(),
        "x-amz-date",
        "x-amz-security-token",
    ] {
        headers.remove(name);
    }
    if matches!(form, Form::Query { .. }) {
        for param in QUERY_PARAMS {
            without_param(path_and_query, param);
        }
    }
    let signed = signed_pairs(&agent, headers, req.authority)?;
    let payload = match form {
        Form::Header => payload(headers, req.body)?,
        // A presigned request's payload is never signed.
        Form::Query { .. } => SignableBody::UnsignedPayload,
    };
    let uri = format!("{}://{}{path_and_query}", req.scheme, req.authority);
    let signable = SignableRequest::new(
        req.method,
        uri,
        signed.iter().map(|(n, v)| (n.as_str(), v.as_str())),
        payload,
    )
    .map_err(|_| "the request cannot be put in SigV4's canonical form")?;
    let identity = Credentials::new(
        keys.access_key_id.clone(),
        keys.secret_access_key.clone(),
        keys.session_token.clone(),
        None,
        "postern",
    )
    .into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(&agent.scope.region)
        .name(&agent.scope.service)
        .time(now)
        .settings(settings(&agent.scope.service, &form))
        .build()
        .map_err(|_| "the signing parameters are incomplete")?
        .into();
    let (instructions, _) = sign(signable, &params)
        .map_err(|_| "the request could not be signed")?
        .into_parts();
    for (name, value) in instructions.headers() {
        let mut v = HeaderValue::from_str(value).map_err(|_| "a signed value is not a header")?;
        v.set_sensitive(true);
        let name = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| "a signed name is not a header")?;
        headers.insert(name, v);
    }
    for (name, value) in instructions.params() {
        let sep = if path_and_query.contains('?') {
            '&'
        } else {
            '?'
        };
        path_and_query.push(sep);
        path_and_query.push_str(name);
        path_and_query.push('=');
        path_and_query.push_str(&pct_reserved(value.as_bytes(), b""));
    }
    Ok(agent.scope)
}

/// What the agent signed and how: its `Authorization`, else a presigned query naming the
/// algorithm, the credential, the signed headers and how long it is valid.
fn agent_signature(headers: &HeaderMap, path_and_query: &str) -> Option<(Signed, Form)> {
    if let Some(v) = headers.get(header::AUTHORIZATION) {
        return Signed::parse(v.as_bytes()).map(|s| (s, Form::Header));
    }
    let one = |name: &str| {
        let mut values = query_values(path_and_query, name);
        (values.len() == 1).then(|| values.pop()).flatten()
    };
    if one("X-Amz-Algorithm")? != ALGORITHM.as_bytes() {
        return None;
    }
    let scope = query_scope(&one("X-Amz-Credential")?)?;
    let signed = String::from_utf8(one("X-Amz-SignedHeaders")?).ok()?;
    let signed_headers: Vec<String> = signed.split(';').map(str::to_ascii_lowercase).collect();
    let expires: u64 = std::str::from_utf8(&one("X-Amz-Expires")?)
        .ok()?
        .parse()
        .ok()?;
    // SigV4 caps a presigned request at seven days.
    if expires == 0 || expires > 604_800 || signed_headers.iter().any(String::is_empty) {
        return None;
    }
    let form = Form::Query {
        expires: Duration::from_secs(expires),
    };
    Some((
        Signed {
            scope,
            signed_headers,
        },
        form,
    ))
}

/// The headers the agent signed, as postern sends them (one it removed is no longer
/// signed); `host` is the authority postern sends.
fn signed_pairs(
    agent: &Signed,
    headers: &HeaderMap,
    authority: &str,
) -> Result<Vec<(String, String)>, &'static str> {
    let mut pairs = vec![("host".to_owned(), authority.to_owned())];
    for name in &agent.signed_headers {
        if matches!(
            name.as_str(),
            "host" | "x-amz-date" | "x-amz-security-token"
        ) {
            continue;
        }
        for value in headers.get_all(name.as_str()) {
            let v = value
                .to_str()
                .map_err(|_| "a signed header is not visible ASCII")?;
            pairs.push((name.clone(), v.to_owned()));
        }
    }
    Ok(pairs)
}

/// The payload hash the agent declared (`x-amz-content-sha256`), else the body's own.
fn payload<'b>(headers: &HeaderMap, body: &'b [u8]) -> Result<SignableBody<'b>, &'static str> {
    let Some(declared) = headers.get("x-amz-content-sha256") else {
        return Ok(SignableBody::Bytes(body));
    };
    let declared = declared
        .to_str()
        .map_err(|_| "x-amz-content-sha256 is not ASCII")?;
    match declared {
        "UNSIGNED-PAYLOAD" => Ok(SignableBody::UnsignedPayload),
        "STREAMING-UNSIGNED-PAYLOAD-TRAILER" => Ok(SignableBody::StreamingUnsignedPayloadTrailer),
        hex if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Ok(SignableBody::Precomputed(hex.to_ascii_lowercase()))
        }
        _ => Err(
            "a signed streaming upload (STREAMING-AWS4-HMAC-SHA256-PAYLOAD) is not re-signed yet",
        ),
    }
}

/// Whether `resign` can sign this request: a signature in either form, over a payload hash
/// it takes.
pub fn signable(headers: &HeaderMap, path_and_query: &str) -> bool {
    match agent_signature(headers, path_and_query) {
        Some((_, Form::Header)) => payload(headers, &[]).is_ok(),
        Some((_, Form::Query { .. })) => true,
        None => false,
    }
}

/// S3 signs the path as sent; every other service normalizes it and encodes it twice.
fn settings(service: &str, form: &Form) -> SigningSettings {
    let mut s = SigningSettings::default();
    s.excluded_headers = None;
    if let Form::Query { expires } = form {
        s.signature_location = SignatureLocation::QueryParams;
        s.expires_in = Some(*expires);
    }
    if service == "s3" {
        s.percent_encoding_mode = PercentEncodingMode::Single;
        s.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    }
    s
}
