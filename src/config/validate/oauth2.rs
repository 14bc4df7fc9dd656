//! `inject = { oauth2 = { … } }` (SPEC §3.8): the grant, the token endpoint and where the
//! minted token goes. The token endpoint needs a route (postern's own request goes through
//! it, with its `resolve`, `upstream_ca` and timeouts).

use super::Checker;
use crate::config::model::{Config, Grant, Inject, OAuth2};
use crate::config::raw::RawOAuth2;
use crate::policy::{match_token_route, token_target};

/// The credential's `oauth2` mode, every problem reported under `path` (`….inject`).
pub(super) fn inject(c: &mut Checker<'_>, path: &str, raw: &RawOAuth2) -> Option<OAuth2> {
    let p = format!("{path}.oauth2");
    let grant = Grant::ALL.into_iter().find(|g| g.as_str() == raw.grant);
    if grant.is_none() {
        let names: Vec<&str> = Grant::ALL.iter().map(|g| g.as_str()).collect();
        c.bad(
            format!("{p}.grant"),
            format!(
                "unknown grant `{}`: use one of {}",
                raw.grant,
                names.join(", ")
            ),
        );
    }
    if let Err(why) = token_target(&raw.token_url) {
        c.bad(format!("{p}.token_url"), why);
    }
    let header = raw.header.clone().unwrap_or_else(|| "Authorization".into());
    if http::HeaderName::from_bytes(header.as_bytes()).is_err() {
        c.bad(
            format!("{p}.header"),
            format!("`{header}` is not a header name"),
        );
    }
    let format = raw
        .format
        .clone()
        .unwrap_or_else(|| "Bearer {token}".into());
    if !format.contains("{token}") {
        c.bad(format!("{p}.format"), "must contain {token}");
    }
    for (name, value) in [("scope", &raw.scope), ("audience", &raw.audience)] {
        if value.as_ref().is_some_and(|v| v.is_empty()) {
            c.bad(
                format!("{p}.{name}"),
                "must not be empty (leave it out instead)",
            );
        }
    }
    if let Some(g) = grant {
        grant_fields(c, &p, g, raw);
    }
    Some(OAuth2 {
        grant: grant?,
        token_url: raw.token_url.clone(),
        scope: raw.scope.clone(),
        audience: raw.audience.clone(),
        header,
        format,
    })
}

/// What a grant needs or cannot use: a field the grant would silently ignore is refused.
fn grant_fields(c: &mut Checker<'_>, p: &str, grant: Grant, raw: &RawOAuth2) {
    let unused: &[(&str, &Option<String>)] = match grant {
        Grant::ClientCredentials | Grant::JwtBearer => &[],
        // RFC 6749 §6 has no audience: a refresh keeps the grant's.
        Grant::RefreshToken => &[("audience", &raw.audience)],
        // The installation's permissions apply; GitHub takes neither.
        Grant::GithubApp => &[("scope", &raw.scope), ("audience", &raw.audience)],
    };
    for (name, value) in unused {
        if value.is_some() {
            c.bad(
                format!("{p}.{name}"),
                format!("`{}` does not use {name}: leave it out", grant.as_str()),
            );
        }
    }
    // Google's token endpoint refuses an assertion without one (`invalid_scope`).
    if grant == Grant::JwtBearer && raw.scope.is_none() {
        c.bad(
            format!("{p}.scope"),
            "`jwt_bearer` needs a scope (e.g. https://www.googleapis.com/auth/devstorage.read_only)",
        );
    }
}

/// Every `token_url` is matched by a route (for a `POST`, whatever the route's agents).
pub(super) fn token_routes(c: &mut Checker<'_>, config: &Config) {
    for (i, cr) in config.credentials.iter().enumerate() {
        let Inject::OAuth2(o) = &cr.inject else {
            continue;
        };
        let stores = matches!(cr.secret, crate::config::SecretSource::Vault(_));
        if o.grant == Grant::RefreshToken && !stores {
            c.bad(
                format!("credentials[{i}].secret"),
                "a refresh_token grant's secret must be a vault entry: postern stores the token the endpoint rotates there",
            );
        }
        let Ok(target) = token_target(&o.token_url) else {
            continue;
        };
        if match_token_route(config, &target).is_none() {
            c.bad(
                format!("credentials[{i}].inject.oauth2.token_url"),
                format!(
                    "no route matches POST {}: the token endpoint needs a route (its `agents` may be `[]`)",
                    o.token_url
                ),
            );
        }
    }
}
