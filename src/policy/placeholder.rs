//! Credential placeholders (SPEC §3.7): vendor SDKs refuse to start without an API key and
//! send it themselves. Where a route injects its secret, the agent may send the credential's
//! placeholder instead (`Bearer postern:openai`); postern replaces it with the secret. Any
//! other value there is the agent supplying a credential of its own: `FORBIDDEN_HEADER`.

use base64::Engine;
use http::HeaderMap;

use super::sigv4;
use crate::config::{Credential, Inject};

/// Where an inject mode puts the secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// A header, lower-case.
    Header(String),
    /// A query parameter.
    Query(String),
    /// An AWS SigV4 signature's key id, in `Authorization` or a presigned query's
    /// `X-Amz-Credential`, inside the pinned scope if any (SPEC §3.8).
    Sigv4 {
        region: Option<String>,
        service: Option<String>,
    },
}

impl Place {
    pub fn of(inject: &Inject) -> Option<Self> {
        match inject {
            Inject::Header { name, .. } => Some(Self::Header(name.to_ascii_lowercase())),
            Inject::Basic { .. } => Some(Self::Header("authorization".into())),
            Inject::Query { param } => Some(Self::Query(param.clone())),
            Inject::OAuth2(o) => Some(Self::Header(o.header.to_ascii_lowercase())),
            Inject::AwsSigv4 { region, service } => Some(Self::Sigv4 {
                region: region.clone(),
                service: service.clone(),
            }),
            Inject::SshKey | Inject::SshPassword => None,
        }
    }

    /// The envelope's `error.field` for a value the agent may not send here.
    pub fn field(&self) -> String {
        match self {
            Self::Header(name) => format!("headers.{name}"),
            Self::Query(param) => format!("query.{param}"),
            Self::Sigv4 { .. } => "headers.authorization".into(),
        }
    }
}

/// What the agent sent where the route's credentials go.
#[derive(Debug, PartialEq, Eq)]
pub enum Presented {
    /// Nothing there: postern injects as usual.
    Nothing,
    /// The used credential's placeholder, to be replaced by its secret.
    Placeholder,
}

/// Checks every place the route's `offered` credentials inject into against `used` (the one
/// this request injects). `Err` names the field holding a value the agent may not send.
pub fn presented(
    offered: &[&Credential],
    used: Option<&Credential>,
    headers: &HeaderMap,
    path_and_query: &str,
) -> Result<Presented, String> {
    let used_place = used.and_then(|c| Place::of(&c.inject));
    let mut found = Presented::Nothing;
    for cred in offered {
        let Some(place) = Place::of(&cred.inject) else {
            continue;
        };
        let values = values_at(&place, headers, path_and_query);
        if values.is_empty() {
            continue;
        }
        let ours = match (used, &used_place) {
            (Some(u), Some(p)) if *p == place => values
                .iter()
                .all(|v| is_placeholder(&place, v, &u.placeholder)),
            _ => false,
        };
        if !ours {
            return Err(place.field());
        }
        found = Presented::Placeholder;
    }
    Ok(found)
}

/// The agent's values at `place`: each header value, or each decoded query value.
fn values_at(place: &Place, headers: &HeaderMap, path_and_query: &str) -> Vec<Vec<u8>> {
    match place {
        Place::Header(name) => headers
            .get_all(name.as_str())
            .iter()
            .map(|v| v.as_bytes().to_vec())
            .collect(),
        Place::Query(param) => query_values(path_and_query, param),
        Place::Sigv4 { .. } => {
            let mut values = values_at(&Place::Header("authorization".into()), headers, "");
            values.extend(query_values(path_and_query, "X-Amz-Credential"));
            values
        }
    }
}

/// The values of `param` in the query, percent-decoded (a name may be encoded too).
pub fn query_values(path_and_query: &str, param: &str) -> Vec<Vec<u8>> {
    let Some((_, query)) = path_and_query.split_once('?') else {
        return Vec::new();
    };
    query
        .split('&')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            same_name(k, param).then(|| pct_decode(v))
        })
        .collect()
}

/// Removes every `param=…` from the query (names compared decoded, as the placeholder
/// check reads them).
pub fn without_param(path_and_query: &mut String, param: &str) {
    let Some((path, query)) = path_and_query.split_once('?') else {
        return;
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|kv| {
            let name = kv.split_once('=').map_or(*kv, |(k, _)| k);
            !same_name(name, param)
        })
        .collect();
    *path_and_query = match kept.is_empty() {
        true => path.to_owned(),
        false => format!("{path}?{}", kept.join("&")),
    };
}

/// Whether a raw query name is `param` once decoded.
pub fn same_name(raw: &str, param: &str) -> bool {
    pct_decode(raw) == param.as_bytes()
}

/// One value in the forms SDKs send a key in: the placeholder itself, one auth-scheme word
/// and a space before it (`Bearer p`, `token p`), or Basic credentials with it as password.
fn is_placeholder(place: &Place, value: &[u8], placeholder: &str) -> bool {
    let p = placeholder.as_bytes();
    if let Place::Sigv4 { region, service } = place {
        return sigv4_names(value, placeholder, region.as_deref(), service.as_deref());
    }
    if value == p {
        return true;
    }
    if matches!(place, Place::Query(_)) {
        return false;
    }
    let Some(space) = value.iter().position(|b| *b == b' ') else {
        return false;
    };
    let (scheme, rest) = (&value[..space], &value[space + 1..]);
    if scheme.is_empty() || !scheme.iter().all(|b| is_tchar(*b)) {
        return false;
    }
    if rest == p {
        return true;
    }
    let is_basic = scheme.eq_ignore_ascii_case(b"basic");
    is_basic
        && base64::engine::general_purpose::STANDARD
            .decode(rest)
            .ok()
            .and_then(|decoded| {
                let colon = decoded.iter().position(|b| *b == b':')?;
                Some(decoded[colon + 1..] == *p)
            })
            .unwrap_or(false)
}

/// A SigV4 `Authorization` or `X-Amz-Credential` value signed with the placeholder as its
/// key id, inside the pinned scope.
fn sigv4_names(
    value: &[u8],
    placeholder: &str,
    region: Option<&str>,
    service: Option<&str>,
) -> bool {
    let scope = match value.starts_with(sigv4::ALGORITHM.as_bytes()) {
        true => sigv4::Signed::parse(value).map(|s| s.scope),
        false => sigv4::query_scope(value),
    };
    scope.is_some_and(|s| s.key_id == placeholder && s.within(region, service))
}

/// RFC 9110 token characters (an auth-scheme is a token).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn pct_decode(s: &str) -> Vec<u8> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn cred(id: &str, inject: Inject) -> Credential {
        Credential {
            id: id.into(),
            secret: crate::config::SecretSource::Vault(id.into()),
            inject,
            placeholder: format!("postern:{id}"),
            placeholder_env: Vec::new(),
        }
    }

    fn bearer(id: &str) -> Credential {
        cred(
            id,
            Inject::Header {
                name: "Authorization".into(),
                format: "Bearer {secret}".into(),
            },
        )
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            if let Ok(v) = HeaderValue::from_str(v) {
                m.append(*k, v);
            }
        }
        m
    }

    fn check(
        c: &Credential,
        pairs: &[(&'static str, &str)],
        pq: &str,
    ) -> Result<Presented, String> {
        presented(&[c], Some(c), &headers(pairs), pq)
    }

    #[test]
    fn the_placeholder_bare_or_after_one_scheme_word_is_taken() {
        let c = bearer("openai");
        for v in [
            "postern:openai",
            "Bearer postern:openai",
            "token postern:openai",
        ] {
            assert_eq!(
                check(&c, &[("authorization", v)], "/"),
                Ok(Presented::Placeholder),
                "{v}"
            );
        }
        assert_eq!(check(&c, &[], "/"), Ok(Presented::Nothing));
    }

    #[test]
    fn any_other_value_there_is_forbidden_with_its_field() {
        let c = bearer("openai");
        let field = Err("headers.authorization".to_owned());
        for v in [
            "Bearer sk-live-123",
            "Bearer postern:other",
            "Bearer  postern:openai",
            "Bearer postern:openai x",
            "a b postern:openai",
            "postern:openaix",
            "",
        ] {
            assert_eq!(check(&c, &[("authorization", v)], "/"), field, "{v:?}");
        }
        let twice = [
            ("authorization", "Bearer postern:openai"),
            ("authorization", "Bearer sk-live"),
        ];
        assert_eq!(check(&c, &twice, "/"), field);
    }

    #[test]
    fn basic_takes_any_user_with_the_placeholder_as_password() {
        let c = cred("gh", Inject::Basic { user: "x".into() });
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let ok = format!("Basic {}", b64("anyone:postern:gh"));
        assert_eq!(
            check(&c, &[("authorization", &ok)], "/"),
            Ok(Presented::Placeholder)
        );
        let bad = format!("Basic {}", b64("postern:gh:real"));
        assert!(check(&c, &[("authorization", &bad)], "/").is_err());
        assert!(check(&c, &[("authorization", "Basic !!!")], "/").is_err());
    }

    #[test]
    fn a_query_parameter_takes_the_bare_placeholder_even_encoded() {
        let c = cred(
            "maps",
            Inject::Query {
                param: "key".into(),
            },
        );
        for pq in [
            "/a?key=postern:maps",
            "/a?x=1&key=postern%3Amaps",
            "/a?k%65y=postern:maps",
        ] {
            assert_eq!(check(&c, &[], pq), Ok(Presented::Placeholder), "{pq}");
        }
        assert_eq!(check(&c, &[], "/a?key=real"), Err("query.key".into()));
        assert_eq!(
            check(&c, &[], "/a?key=postern:maps&key=real"),
            Err("query.key".into())
        );
        assert_eq!(check(&c, &[], "/a?keys=real"), Ok(Presented::Nothing));
    }

    #[test]
    fn another_offered_credential_s_place_or_placeholder_is_forbidden() {
        let (a, b) = (
            bearer("a"),
            cred(
                "b",
                Inject::Header {
                    name: "X-Api-Key".into(),
                    format: "{secret}".into(),
                },
            ),
        );
        let both = [&a, &b];
        let h = headers(&[("x-api-key", "postern:a")]);
        assert_eq!(
            presented(&both, Some(&a), &h, "/"),
            Err("headers.x-api-key".into())
        );
        let h = headers(&[("authorization", "Bearer postern:b")]);
        assert_eq!(
            presented(&both, Some(&b), &h, "/"),
            Err("headers.authorization".into())
        );
        let h = headers(&[("x-api-key", "postern:b")]);
        assert_eq!(
            presented(&both, Some(&b), &h, "/"),
            Ok(Presented::Placeholder)
        );
    }

    #[test]
    fn a_sigv4_signature_with_the_placeholder_inside_the_pinned_scope_is_taken() {
        let pinned = Inject::AwsSigv4 {
            region: Some("us-east-1".into()),
            service: None,
        };
        let c = cred("aws", pinned);
        let auth = |key: &str, region: &str| {
            format!(
                "AWS4-HMAC-SHA256 Credential={key}/20261206/{region}/s3/aws4_request, \
                 SignedHeaders=host;x-amz-date, Signature=abc"
            )
        };
        let ok = auth("postern:aws", "us-east-1");
        assert_eq!(
            check(&c, &[("authorization", &ok)], "/"),
            Ok(Presented::Placeholder)
        );
        let query = "/k?X-Amz-Credential=postern%3Aaws%2F20261206%2Fus-east-1%2Fs3%2Faws4_request";
        assert_eq!(check(&c, &[], query), Ok(Presented::Placeholder));
        let field = Err("headers.authorization".to_owned());
        for (key, region) in [
            ("AKIAREALKEY000000001", "us-east-1"),
            ("postern:aws", "eu-west-1"),
        ] {
            let value = auth(key, region);
            assert_eq!(
                check(&c, &[("authorization", &value)], "/"),
                field,
                "{value}"
            );
        }
        assert_eq!(
            check(&c, &[("authorization", "Bearer postern:aws")], "/"),
            field
        );
        assert_eq!(check(&c, &[], "/"), Ok(Presented::Nothing));
    }
}
