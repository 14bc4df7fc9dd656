//! `via` and `via_credential` (SPEC §3.6): the upstream proxy hop a route's traffic goes
//! through, and the Basic credential that hop (never the origin) receives.

use super::Checker;
use crate::config::raw::RawRoute;
use crate::config::{Credential, Inject, Via};

/// The hop of route `p`, every problem with `via`/`via_credential` reported.
pub(super) fn validate(
    c: &mut Checker<'_>,
    p: &str,
    r: &RawRoute,
    credentials: &[Credential],
) -> Option<Via> {
    let credential = r
        .via_credential
        .as_deref()
        .and_then(|id| basic_credential(c, p, id, credentials, r.via.is_some()));
    let text = r.via.as_deref()?;
    if r.resolve.is_some() {
        c.bad(
            format!("{p}.resolve"),
            "the `via` hop resolves the origin: there is no address of it for postern to pin",
        );
    }
    let (host, port) = match parse(text) {
        Ok(hp) => hp,
        Err(why) => {
            c.bad(format!("{p}.via"), why);
            return None;
        }
    };
    Some(Via {
        host,
        port,
        credential,
    })
}

/// `via_credential` names a defined credential of inject mode `basic`.
fn basic_credential(
    c: &mut Checker<'_>,
    p: &str,
    id: &str,
    credentials: &[Credential],
    has_via: bool,
) -> Option<String> {
    let path = format!("{p}.via_credential");
    if !has_via {
        c.bad(&path, "needs `via` (the hop it authenticates to)");
    }
    let Some(cred) = credentials.iter().find(|cr| cr.id == id) else {
        c.bad(path, format!("no credential with id `{id}`"));
        return None;
    };
    if !matches!(cred.inject, Inject::Basic { .. }) {
        c.bad(
            path,
            format!(
                "credential `{id}` has inject mode `{}`: the hop gets `Proxy-Authorization: Basic`, so name a credential with inject = {{ basic = {{ user = \"…\" }} }}",
                cred.inject.mode()
            ),
        );
        return None;
    }
    Some(id.to_owned())
}

/// `http://host[:port][/]`, nothing more: the hop's credential lives in the vault.
fn parse(text: &str) -> Result<(String, u16), String> {
    let uri: http::Uri = text
        .parse()
        .map_err(|_| format!("`{text}` is not a URL such as \"http://proxy.internal:3128\""))?;
    if uri.scheme_str() != Some("http") {
        return Err("must be an http:// proxy URL".into());
    }
    let Some(authority) = uri.authority() else {
        return Err("names no host".into());
    };
    if authority.as_str().contains('@') {
        return Err(
            "carries credentials: put the hop's password in the vault and name it with `via_credential`"
                .into(),
        );
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() || text.contains('#') {
        return Err("must be a proxy URL without path or query (\"http://host:port\")".into());
    }
    host_and_port(authority, 80)
}

/// An authority's host (lower case, IPv6 without brackets) and port, `default` without one.
pub(super) fn host_and_port(
    authority: &http::uri::Authority,
    default: u16,
) -> Result<(String, u16), String> {
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    if host.is_empty() {
        return Err("names no host".into());
    }
    // Read from the text: `http::Uri` takes `:99999` as a host without a port.
    let after_host = authority
        .as_str()
        .rsplit_once(']')
        .map_or(authority.as_str(), |(_, rest)| rest);
    let port = match after_host.rsplit_once(':') {
        None => default,
        Some((_, p)) => match p.parse::<u16>() {
            Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => return Err(format!("names port `{p}`, not 1..65535")),
        },
    };
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn a_hop_url_is_scheme_host_and_port() {
        assert_eq!(
            parse("http://127.0.0.1:3130"),
            Ok(("127.0.0.1".into(), 3130))
        );
        assert_eq!(
            parse("http://Proxy.Internal/"),
            Ok(("proxy.internal".into(), 80))
        );
        assert_eq!(parse("http://[::1]:8080"), Ok(("::1".into(), 8080)));
        for bad in [
            "https://p:1",
            "http://u:pw@p:1",
            "http://p:1/x",
            "http://p:1?q",
            "p:1",
            "http://p:99999",
            "http://p:0",
            "http://p:1#frag",
            "http://p:+3128",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
