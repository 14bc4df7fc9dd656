//! `inject = { oauth2 = { … } }` (SPEC §3.8): the grant, the token endpoint and where the
//! minted token goes. The token endpoint needs a route (postern's own request goes through
//! it, with its `resolve`, `upstream_ca` and timeouts).

use super::Checker;
use crate::config::model::{Config, Grant, Inject, OAuth2};
use crate::config::raw::RawOAuth2;
use crate::policy::{match_token_route, token_target};

/// Grants SPEC §3.8 names that postern does not mint yet: named apart from a typo.
const NOT_YET_BUILT: [&str; 3] = ["refresh_token", "jwt_bearer", "github_app"];

/// The credential's `oauth2` mode, every problem reported under `path` (`….inject`).
pub(super) fn inject(c: &mut Checker<'_>, path: &str, raw: &RawOAuth2) -> Option<OAuth2> {
    let p = format!("{path}.oauth2");
    let grant = match raw.grant.as_str() {
        "client_credentials" => Some(Grant::ClientCredentials),
        g if NOT_YET_BUILT.contains(&g) => {
            c.bad(
                format!("{p}.grant"),
                format!("`{g}` is not built yet: only `client_credentials` is minted so far"),
            );
            None
        }
        g => {
            c.bad(
                format!("{p}.grant"),
                format!("unknown grant `{g}`: use `client_credentials`"),
            );
            None
        }
    };
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
    Some(OAuth2 {
        grant: grant?,
        token_url: raw.token_url.clone(),
        scope: raw.scope.clone(),
        audience: raw.audience.clone(),
        header,
        format,
    })
}

/// Every `token_url` is matched by a route (for a `POST`, whatever the route's agents).
pub(super) fn token_routes(c: &mut Checker<'_>, config: &Config) {
    for (i, cr) in config.credentials.iter().enumerate() {
        let Inject::OAuth2(o) = &cr.inject else {
            continue;
        };
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
