use super::*;

fn env(name: &str) -> Option<String> {
    match name {
        "CI_AGENT_TOKEN" => Some("ci-token-0123456789".into()),
        "POSTERN_ADMIN_TOKEN" => Some("admin-token-0123456789".into()),
        _ => None,
    }
}

fn paths(text: &str) -> Vec<String> {
    match parse(text, None, &env) {
        Ok(_) => Vec::new(),
        Err(e) => e.0.into_iter().map(|p| p.path).collect(),
    }
}

#[test]
fn the_embedded_default_is_valid_and_loopback() {
    let c = load(None, &env).map_err(|e| e.to_string());
    let c = c.as_ref().ok();
    assert!(c.is_some_and(|c| c.proxy.listen.ip().is_loopback() && c.routes.is_empty()));
    assert!(c.is_some_and(|c| c.admin.listen.port() == 3129 && c.admin.token.is_none()));
}

#[test]
fn the_example_config_is_valid() {
    let text = include_str!("../../config/postern.example.toml");
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/postern.example.toml");
    let c = parse(text, Some(&file), &env);
    assert!(
        c.is_ok(),
        "{}",
        c.err().map(|e| e.to_string()).unwrap_or_default()
    );
}

#[test]
fn route_defaults_follow_the_spec() {
    let text = r#"
[[routes]]
id = "r"
match = { host = "API.example.test" }
"#;
    let c = parse(text, None, &env).ok();
    let r = c.as_ref().and_then(|c| c.routes.first());
    assert!(r.is_some());
    let Some(r) = r else { return };
    assert_eq!(r.matcher.scheme, Scheme::Https);
    assert_eq!(r.matcher.port, 443);
    assert_eq!(r.matcher.host, "api.example.test");
    assert_eq!(r.matcher.path_prefix, "/");
    assert!(r.matcher.methods.is_empty() && r.agents.is_every() && r.credentials.is_empty());
    assert_eq!(r.approval, Approval::None);
    assert_eq!(r.approval_timeout, std::time::Duration::from_secs(300));
    assert_eq!(r.retry_budget, 3);
    assert_eq!(r.connect_timeout, std::time::Duration::from_secs(5));
    assert_eq!(r.response_timeout, std::time::Duration::from_secs(30));
    assert_eq!(r.idle_timeout, std::time::Duration::from_secs(60));
    assert_eq!(r.resend_window, std::time::Duration::from_secs(600));
    assert_eq!(r.delivery, Delivery::Auto);
    assert!(r.intercept && !r.allow_private);
    assert_eq!(
        r.idempotent_methods,
        ["GET", "HEAD", "OPTIONS", "PUT", "DELETE"]
    );
}

#[test]
fn every_problem_is_reported_with_its_path_in_one_run() {
    let text = r#"
[proxy]
listen = "nowhere"
[journal]
durability = "sometimes"
result_retention = "5 fortnights"
[[agents]]
id = "ci"
token = "env:MISSING_TOKEN"
[[routes]]
id = "a"
credential = "ghost"
agents = ["nobody"]
match = { host = "x.test", scheme = "gopher" }
status_outcomes = { "409" = "maybe", "abc" = "rejected" }
[[routes]]
id = "a"
match = { host = "y.test", hots = 1 }
[surprise]
x = 1
"#;
    let mut got = paths(text);
    got.sort();
    let mut want = vec![
        "proxy.listen",
        "journal.durability",
        "journal.result_retention",
        "agents[0].token",
        "routes[0].credential",
        "routes[0].agents[0]",
        "routes[0].match.scheme",
        "routes[0].status_outcomes.409",
        "routes[0].status_outcomes.abc",
        "routes[1].id",
        "routes[1].match.hots",
        "surprise",
    ];
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn unknown_keys_type_and_value_errors_of_one_table_come_in_one_report() {
    let text = r#"
[journal]
durability = "fsnc"
[[credentials]]
id = "gh"
secret = "github-token"
inject = { header = "Authorization", format = "Bearer {secret}" }
[[routes]]
id = "r"
credentail = "gh"
retry_budget = "three"
connect_timeout = "5 seconds"
match = { host = "x.test" }
"#;
    let Err(e) = parse(text, None, &env) else {
        panic!("a bad config was accepted");
    };
    let report = e.to_string();
    for line in [
        "journal.durability: ",
        "routes[0].credentail: unknown key (did you mean `credential`?)",
        "routes[0].retry_budget: expected a whole number, got \"three\"",
        "routes[0].connect_timeout: ",
    ] {
        assert!(report.contains(line), "{line} missing in:\n{report}");
    }
    assert_eq!(e.0.len(), 4, "{report}");
}

#[test]
fn unknown_keys_are_refused() {
    assert_eq!(
        paths("[proxy]\nlisten = \"127.0.0.1:1\"\nlisten_too = 1\n"),
        ["proxy.listen_too"]
    );
    let e = parse("[admin]\ntokn = \"x\"\n", None, &env)
        .err()
        .map(|e| e.to_string());
    assert!(e.is_some_and(|e| e.contains("tokn")));
}

#[test]
fn a_non_loopback_listener_needs_agents() {
    assert_eq!(
        paths("[proxy]\nlisten = \"0.0.0.0:3128\"\n"),
        ["proxy.listen"]
    );
    let with_agent = "[proxy]\nlisten = \"0.0.0.0:3128\"\n[[agents]]\nid = \"a\"\ntoken = \"t-0123456789abcdef\"\n";
    assert!(paths(with_agent).is_empty());
}

#[test]
fn credentials_name_exactly_one_mode() {
    let text = r#"
[[credentials]]
id = "two"
secret = "s"
inject = { header = "Authorization", query = "k" }
[[credentials]]
id = "none"
secret = "s"
inject = {}
[[credentials]]
id = "basic"
secret = "s"
inject = { basic = { user = "u" } }
"#;
    assert_eq!(
        paths(text),
        ["credentials[0].inject", "credentials[1].inject"]
    );
}

#[test]
fn an_oauth2_credential_names_a_grant_its_fields_and_a_routed_https_token_url() {
    let cred = |id: &str, o: &str| {
        format!(
            "[[credentials]]\nid = \"{id}\"\nsecret = \"s\"\ninject = {{ oauth2 = {{ {o} }} }}\n"
        )
    };
    let route = "[[routes]]\nid = \"idp\"\nagents = []\nmatch = { host = \"idp.test\" }\n";
    let good = cred(
        "ok",
        r#"grant = "client_credentials", token_url = "https://idp.test/oauth/token""#,
    );
    let c = parse(&format!("{good}{route}"), None, &env).map_err(|e| e.to_string());
    let c = c.unwrap_or_else(|e| panic!("{e}"));
    let Inject::OAuth2(o) = &c.credentials[0].inject else {
        panic!("oauth2 mode");
    };
    assert_eq!(
        (o.header.as_str(), o.format.as_str()),
        ("Authorization", "Bearer {token}")
    );
    assert!(paths(&good).contains(&"credentials[0].inject.oauth2.token_url".to_owned()));
    // Every grant SPEC §3.8 names, with the fields it takes.
    let all = [
        cred("cc", r#"grant = "client_credentials", token_url = "https://idp.test/t", audience = "api""#),
        cred("rt", r#"grant = "refresh_token", token_url = "https://idp.test/t", scope = "offline""#),
        cred("jb", r#"grant = "jwt_bearer", token_url = "https://idp.test/t", scope = "s", audience = "a""#),
        cred("gh", r#"grant = "github_app", token_url = "https://idp.test/app/installations/7/access_tokens""#),
    ]
    .concat();
    let c = parse(&format!("{all}{route}"), None, &env).map_err(|e| e.to_string());
    let grants: Vec<&str> = c
        .unwrap_or_else(|e| panic!("{e}"))
        .credentials
        .iter()
        .filter_map(|c| match &c.inject {
            Inject::OAuth2(o) => Some(o.grant.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        grants,
        [
            "client_credentials",
            "refresh_token",
            "jwt_bearer",
            "github_app"
        ]
    );
    let text = [
        cred(
            "a",
            r#"grant = "password", token_url = "https://idp.test/t""#,
        ),
        cred(
            "b",
            r#"grant = "jwt_bearer", token_url = "https://idp.test/t""#,
        ),
        cred(
            "c",
            r#"grant = "client_credentials", token_url = "http://idp.test/t""#,
        ),
        cred(
            "d",
            r#"grant = "client_credentials", token_url = "https://idp.test/t", format = "Bearer""#,
        ),
        cred(
            "e",
            r#"grant = "github_app", token_url = "https://idp.test/t", scope = "repo""#,
        ),
        cred(
            "f",
            r#"grant = "refresh_token", token_url = "https://idp.test/t", audience = "api""#,
        ),
    ]
    .concat();
    let problems = parse(&format!("{text}{route}"), None, &env)
        .err()
        .map(|e| e.0)
        .unwrap_or_default();
    let found: Vec<(&str, &str)> = problems
        .iter()
        .map(|p| (p.path.as_str(), p.message.as_str()))
        .collect();
    let paths: Vec<&str> = found.iter().map(|(p, _)| *p).collect();
    assert_eq!(
        paths,
        [
            "credentials[0].inject.oauth2.grant",
            "credentials[1].inject.oauth2.scope",
            "credentials[2].inject.oauth2.token_url",
            "credentials[3].inject.oauth2.format",
            "credentials[4].inject.oauth2.scope",
            "credentials[5].inject.oauth2.audience",
        ]
    );
    assert!(found[0].1.contains("jwt_bearer"), "{found:?}");
    assert!(found[1].1.contains("needs a scope"), "{found:?}");
}

#[test]
fn placeholders_are_long_distinct_and_their_variables_are_names() {
    let text = r#"
[[credentials]]
id = "a"
secret = "s"
inject = { header = "Authorization" }
placeholder = "short"
[[credentials]]
id = "b"
secret = "s"
inject = { header = "Authorization" }
placeholder = "postern:c"
placeholder_env = ["OPENAI_API_KEY", "1BAD", "A-B"]
[[credentials]]
id = "c"
secret = "s"
inject = { header = "X-Api-Key" }
"#;
    assert_eq!(
        paths(text),
        [
            "credentials[0].placeholder",
            "credentials[1].placeholder_env[1]",
            "credentials[1].placeholder_env[2]",
            "credentials[2].placeholder",
        ]
    );
    let ok = "[[credentials]]\nid = \"openai\"\nsecret = \"s\"\ninject = { header = \"Authorization\" }\n";
    let config = parse(ok, None, &env);
    let placeholder = config.ok().map(|c| c.credentials[0].placeholder.clone());
    assert_eq!(placeholder.as_deref(), Some("postern:openai"));
}

#[test]
fn secrets_never_show_in_debug_output() {
    let text = "[[agents]]\nid = \"a\"\ntoken = \"canary-5f3a-0123456789\"\n[admin]\ntoken = \"env:POSTERN_ADMIN_TOKEN\"\n";
    let c = parse(text, None, &env).ok();
    let dump = format!("{c:?}");
    assert!(c.is_some());
    assert!(!dump.contains("canary-5f3a-0123456789") && !dump.contains("admin-token-0123456789"));
    assert!(c.is_some_and(|c| {
        c.agents
            .first()
            .is_some_and(|a| a.token.matches("canary-5f3a-0123456789"))
    }));
}

#[test]
fn syntax_errors_are_reported() {
    let e = parse("[proxy\n", None, &env).err();
    assert!(e.is_some_and(|e| e.0.len() == 1 && e.0[0].path == "(file)"));
}

#[test]
fn limits_have_defaults_and_bad_values_name_their_keys() {
    let c = parse("", None, &env).ok();
    assert!(c.as_ref().is_some_and(|c| {
        let p = &c.proxy;
        p.max_connections.is_none()
            && p.header_read_timeout == std::time::Duration::from_secs(10)
            && p.tls_handshake_timeout == std::time::Duration::from_secs(10)
            && p.request_body_timeout == std::time::Duration::from_secs(30)
            && p.buffer_budget == 256 << 20
            && c.admin.max_connections == 32
    }));
    let mut got = paths(
        "[proxy]\nmax_connections = 0\nheader_read_timeout = \"0s\"\ntls_handshake_timeout = \"soon\"\n\
         request_body_timeout = \"1x\"\nmax_request_bytes = \"2MiB\"\nbuffer_budget = \"1MiB\"\n\
         [admin]\nmax_connections = 0\n",
    );
    got.sort();
    assert_eq!(
        got,
        [
            "admin.max_connections",
            "proxy.buffer_budget",
            "proxy.header_read_timeout",
            "proxy.max_connections",
            "proxy.request_body_timeout",
            "proxy.tls_handshake_timeout",
        ]
    );
}

fn ssh_target(extra: &str) -> Result<Config, ConfigErrors> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/postern.toml");
    let text = format!(
        "[[credentials]]\nid = \"k\"\nsecret = \"s\"\ninject = {{ ssh_key = true }}\n\
         [[credentials]]\nid = \"h\"\nsecret = \"s\"\ninject = {{ header = \"X-Key\" }}\n\
         [[ssh_targets]]\nid = \"t\"\nhost = \"App1.internal\"\nuser = \"deploy\"\n{extra}\n"
    );
    parse(&text, Some(&dir), &env)
}

#[test]
fn ssh_target_defaults_follow_the_spec() {
    let c = ssh_target("credential = \"k\"\nknown_hosts = \"known_hosts\"");
    let t = c.as_ref().ok().and_then(|c| c.ssh_targets.first());
    assert!(t.is_some(), "{:?}", c.err());
    let Some(t) = t else { return };
    let secs = std::time::Duration::from_secs;
    assert_eq!((t.host.as_str(), t.port), ("app1.internal", 22));
    assert_eq!(t.allow, vec![SshAction::Exec]);
    assert!(t.commands.is_empty() && t.agents.is_every() && t.permits_command("anything"));
    assert_eq!(t.approval, Approval::None);
    assert_eq!(t.approval_timeout, secs(300));
    assert_eq!(t.retry_budget, 3);
    assert_eq!(t.connect_timeout, secs(5));
    assert_eq!(t.response_timeout, secs(600));
    assert_eq!(t.idle_timeout, secs(60));
    assert!(t.known_hosts.ends_with("config/known_hosts"));
    assert_eq!(t.url(), "ssh://deploy@app1.internal:22");
}

#[test]
fn ssh_target_commands_match_whole_commands() {
    let c = ssh_target(
        "credential = \"k\"\nknown_hosts = \"known_hosts\"\ncommands = [\"systemctl restart app\", \"ls( -l)?\"]",
    );
    let t = c.as_ref().ok().and_then(|c| c.ssh_targets.first());
    assert!(t.is_some(), "{:?}", c.err());
    let Some(t) = t else { return };
    assert!(t.permits_command("systemctl restart app"));
    assert!(t.permits_command("ls -l") && t.permits_command("ls"));
    assert!(!t.permits_command("systemctl restart app; rm -rf /"));
    assert!(!t.permits_command("sudo systemctl restart app"));
    assert!(!t.permits_command("ls -la"));
}

#[test]
fn ssh_target_problems_name_their_keys() {
    let p = |extra: &str| match ssh_target(extra) {
        Ok(_) => Vec::new(),
        Err(e) => e.0.into_iter().map(|p| p.path).collect::<Vec<_>>(),
    };
    assert_eq!(
        p("credential = \"h\"\nknown_hosts = \"known_hosts\""),
        ["ssh_targets[0].credential"]
    );
    assert_eq!(
        p("known_hosts = \"known_hosts\""),
        ["ssh_targets[0].credential"]
    );
    assert_eq!(
        p("credential = \"nope\"\nknown_hosts = \"known_hosts\""),
        ["ssh_targets[0].credential"]
    );
    assert_eq!(
        p("credential = \"k\"\nknown_hosts = \"absent\""),
        ["ssh_targets[0].known_hosts"]
    );
    assert_eq!(p("credential = \"k\""), ["ssh_targets[0].known_hosts"]);
    assert_eq!(
        p("credential = \"k\"\nknown_hosts = \"known_hosts\"\ncommands = [\"ok\", \"(\"]"),
        ["ssh_targets[0].commands[1]"]
    );
    assert_eq!(
        p("credential = \"k\"\nknown_hosts = \"known_hosts\"\nallow = [\"exec\", \"x11\"]"),
        ["ssh_targets[0].allow[1]"]
    );
    assert_eq!(
        p(
            "credential = \"k\"\nknown_hosts = \"known_hosts\"\nallow = [\"shell\", \"exec\", \"subsystem\"]"
        ),
        ["ssh_targets[0].allow[0]", "ssh_targets[0].allow[2]"]
    );
    assert_eq!(
        p("credential = \"k\"\nknown_hosts = \"known_hosts\"\nconnect_timeout = \"0s\""),
        ["ssh_targets[0].connect_timeout"]
    );
}

#[test]
fn a_misspelt_method_is_refused_with_a_hint() {
    let text = "[[routes]]\nid = \"r\"\nmatch = { host = \"x.test\", methods = [\"PSOT\", \"propfind\"] }\n";
    let Err(e) = parse(text, None, &env) else {
        panic!("PSOT was accepted");
    };
    assert_eq!(e.0.len(), 1, "{e}");
    assert_eq!(e.0[0].path, "routes[0].match.methods[0]");
    assert!(e.0[0].message.contains("did you mean `POST`?"), "{e}");
}

#[test]
fn via_credential_is_a_known_key_that_needs_via_and_a_defined_credential() {
    let route =
        |extra: &str| format!("[[routes]]\nid = \"r\"\nmatch = {{ host = \"x.test\" }}\n{extra}\n");
    assert_eq!(
        paths(&route("via_credential = \"nope\"")),
        ["routes[0].via_credential", "routes[0].via_credential"]
    );
    let text = format!(
        "[[credentials]]\nid = \"hop\"\nsecret = \"s\"\ninject = {{ basic = {{ user = \"u\" }} }}\n{}",
        route("via = \"http://127.0.0.1:3130\"\nvia_credential = \"hop\"")
    );
    assert!(paths(&text).is_empty(), "{:?}", paths(&text));
}

#[test]
fn a_tunnel_route_matches_host_and_port_and_carries_nothing_postern_adds() {
    let cred =
        "[[credentials]]\nid = \"gh\"\nsecret = \"s\"\ninject = { header = \"Authorization\" }\n";
    let tunnel = |extra: &str, matcher: &str| {
        format!(
            "{cred}[[routes]]\nid = \"t\"\nintercept = false\nmatch = {{ host = \"x.test\", port = 8443{matcher} }}\n{extra}\n"
        )
    };
    assert!(
        paths(&tunnel("", "")).is_empty(),
        "{:?}",
        paths(&tunnel("", ""))
    );
    assert!(paths(&tunnel("", ", scheme = \"https\"")).is_empty());
    let cells = [
        ("", ", methods = [\"GET\"]", "routes[0].match.methods"),
        ("", ", path_prefix = \"/\"", "routes[0].match.path_prefix"),
        ("", ", scheme = \"http\"", "routes[0].match.scheme"),
        ("credential = \"gh\"", "", "routes[0].credential"),
        ("credentials = [\"gh\"]", "", "routes[0].credentials"),
        (
            "idempotency = { header = \"Idempotency-Key\", scope = \"s\", retention = \"1h\" }",
            "",
            "routes[0].idempotency",
        ),
        ("upstream_ca = \"ca.pem\"", "", "routes[0].upstream_ca"),
    ];
    for (extra, matcher, path) in cells {
        let text = tunnel(extra, matcher);
        let Err(e) = parse(&text, None, &env) else {
            panic!("{path} was accepted on a tunnel");
        };
        let problem = e.0.iter().find(|p| p.path == path);
        assert!(
            problem.is_some_and(|p| p.message.contains("intercept = false")),
            "{path}: {e}"
        );
        // The same keys are fine where postern intercepts.
        let intercepted = text.replace("intercept = false\n", "");
        assert!(
            !paths(&intercepted).iter().any(|p| p == path) || path.ends_with("upstream_ca"),
            "{path} refused on an intercepted route: {:?}",
            paths(&intercepted)
        );
    }
}

#[test]
fn a_via_hop_takes_a_basic_credential_no_pinned_address_and_no_password_in_its_url() {
    let creds = "[[credentials]]\nid = \"hdr\"\nsecret = \"s\"\ninject = { header = \"X-Key\" }\n";
    let route = |extra: &str| {
        format!("{creds}[[routes]]\nid = \"r\"\nmatch = {{ host = \"x.test\" }}\n{extra}\n")
    };
    assert_eq!(
        paths(&route(
            "via = \"http://127.0.0.1:3130\"\nvia_credential = \"hdr\""
        )),
        ["routes[0].via_credential"],
        "the hop gets Proxy-Authorization: Basic"
    );
    assert_eq!(
        paths(&route(
            "via = \"http://127.0.0.1:3130\"\nresolve = \"127.0.0.1:1\""
        )),
        ["routes[0].resolve"]
    );
    for bad in ["http://u:pw@p:1", "https://p:1", "http://p:1/path"] {
        assert_eq!(
            paths(&route(&format!("via = \"{bad}\""))),
            ["routes[0].via"],
            "{bad}"
        );
    }
}

#[test]
fn a_route_timeout_of_zero_is_an_error() {
    let route =
        |extra: &str| format!("[[routes]]\nid = \"r\"\nmatch = {{ host = \"x.test\" }}\n{extra}\n");
    for key in [
        "approval_timeout",
        "connect_timeout",
        "response_timeout",
        "idle_timeout",
        "max_relay_lifetime",
    ] {
        let text = route(&format!("{key} = \"0s\""));
        assert_eq!(paths(&text), [format!("routes[0].{key}")], "{key}");
    }
}

#[test]
fn a_token_under_16_characters_is_a_config_error_that_never_shows_it() {
    let agent = |token: &str| format!("[[agents]]\nid = \"a\"\ntoken = \"{token}\"\n");
    assert_eq!(paths(&agent("short-tok-15chr")), ["agents[0].token"]);
    assert!(paths(&agent("long-enough-16ch")).is_empty());
    let e = parse(&agent("short-tok-15chr"), None, &env)
        .err()
        .map(|e| e.to_string());
    assert!(
        e.as_deref()
            .is_some_and(|e| e.contains("16") && !e.contains("short-tok")),
        "{e:?}"
    );
    let short_env = |name: &str| (name == "POSTERN_ADMIN_TOKEN").then(|| "a".to_owned());
    let admin = "[admin]\ntoken = \"env:POSTERN_ADMIN_TOKEN\"\n";
    let e = parse(admin, None, &short_env).err();
    let paths: Vec<String> = e.into_iter().flat_map(|e| e.0).map(|p| p.path).collect();
    assert_eq!(paths, ["admin.token"]);
}

#[test]
fn events_are_kept_at_least_as_long_as_results() {
    let short = "[journal]\nresult_retention = \"7d\"\nevent_retention = \"1d\"\n";
    assert_eq!(paths(short), vec!["journal.event_retention"]);
    let long = "[journal]\nresult_retention = \"40d\"\n";
    let Ok(c) = parse(long, None, &env) else {
        panic!("a good config was refused");
    };
    assert_eq!(
        c.journal.event_retention,
        std::time::Duration::from_secs(40 * 86_400)
    );
}

#[test]
fn an_env_token_unset_in_the_callers_shell_still_gives_the_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("postern.toml");
    let text =
        "[admin]\nlisten = \"127.0.0.1:4129\"\n[[agents]]\nid = \"ci\"\ntoken = \"env:CI_TOKEN\"\n";
    std::fs::write(&path, text).unwrap();
    let config = super::load_addresses(Some(&path), &|_| None);
    assert_eq!(
        config.map(|c| c.admin.listen.to_string()).ok().as_deref(),
        Some("127.0.0.1:4129")
    );
}

#[test]
fn a_cluster_needs_a_node_id_the_fleet_can_tell_apart_and_a_postgres_url() {
    let ok = "[cluster]\npostgres = \"postgres://p@127.0.0.1:5432/db\"\nnode = \"node-1\"\n";
    let c = parse(ok, None, &env).ok();
    let cluster = c.as_ref().and_then(|c| c.cluster.as_ref());
    assert_eq!(cluster.map(|c| c.node.as_str()), Some("node-1"));
    assert_eq!(
        cluster.map(|c| c.postgres.expose()),
        Some("postgres://p@127.0.0.1:5432/db")
    );
    for bad_node in ["", "Node", "a_b", "seventeen-chars-x"] {
        let text = format!("[cluster]\npostgres = \"postgres://h/db\"\nnode = \"{bad_node}\"\n");
        assert_eq!(paths(&text), vec!["cluster.node"], "{bad_node:?}");
    }
    let unset = "[cluster]\npostgres = \"env:POSTERN_PG_URL_UNSET\"\nnode = \"a\"\n";
    assert_eq!(paths(unset), vec!["cluster.postgres"]);
    // The URL may hold a password: the error says what is wrong, never the value.
    let wrong = "[cluster]\npostgres = \"mysql://u:hunter2@h/db\"\nnode = \"a\"\n";
    let e = parse(wrong, None, &env)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("cluster.postgres") && !e.contains("hunter2"),
        "{e}"
    );
    let none = parse("", None, &env).ok();
    assert!(none.is_some_and(|c| c.cluster.is_none()));
}

#[test]
fn an_idempotency_key_header_postern_would_not_send_on_is_refused() {
    let route = |header: &str| {
        format!(
            "[[routes]]\nid = \"pay\"\nmatch = {{ host = \"pay.test\" }}\n\
             idempotency = {{ header = \"{header}\", scope = \"s\", retention = \"1h\" }}\n"
        )
    };
    for header in [
        "Keep-Alive",
        "TE",
        "Connection",
        "Postern-Key",
        "postern-resend",
    ] {
        assert_eq!(
            paths(&route(header)),
            ["routes[0].idempotency.header"],
            "{header}"
        );
    }
    assert!(paths(&route("X-Request-Key")).is_empty());
}

#[test]
fn an_idempotency_key_header_a_credential_of_the_route_injects_is_refused() {
    let text = "[[credentials]]\nid = \"k\"\nsecret = \"s\"\n\
                inject = { header = \"X-Request-Key\", format = \"{secret}\" }\n\
                [[routes]]\nid = \"pay\"\ncredential = \"k\"\nmatch = { host = \"pay.test\" }\n\
                idempotency = { header = \"x-request-key\", scope = \"s\", retention = \"1h\" }\n";
    assert_eq!(paths(text), ["routes[0].idempotency.header"]);
    let apart = text.replace("x-request-key\", scope", "Idempotency-Key\", scope");
    assert!(paths(&apart).is_empty(), "{:?}", paths(&apart));
}
