//! MCP through the proxy (SPEC §3.9): the official Python SDK's streamable HTTP client and
//! server, each in its own process, the server on loopback TLS behind a route that injects
//! its bearer token. Session after session must run every call: the SDK's client stops
//! reading an SSE answer once it has its JSON-RPC reply, and an `initialize` (or a repeated
//! call) is byte-identical from session to session, so a delivery wrongly recorded as failed
//! would answer the next session from the store (`tests/mcp/server.py`, `client.py`).

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{Daemon, Home, free_port, secret_set};
use crate::tls_origin::{Minted, mint};

const VAULT_KEY: &str = "vault-passphrase-for-mcp-tests";
/// The MCP server's bearer token: postern injects it, the client never holds it.
const TOKEN: &str = "mcp-server-token-canary-7d1f";
const AGENT: &str = "agent:tok-0123456789abcdef";

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp")
}

/// The SDK's server on loopback TLS for `mcp.test`, killed when dropped.
struct McpServer {
    child: Child,
    addr: SocketAddr,
    ca_file: PathBuf,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl McpServer {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let Minted {
            ca_pem,
            leaf,
            leaf_key,
        } = mint("mcp.test");
        let (ca_file, cert, key, log) = (
            dir.path().join("ca.pem"),
            dir.path().join("cert.pem"),
            dir.path().join("key.pem"),
            dir.path().join("seen.jsonl"),
        );
        std::fs::write(&ca_file, ca_pem).unwrap();
        std::fs::write(&cert, leaf.pem()).unwrap();
        std::fs::write(&key, leaf_key.serialize_pem()).unwrap();
        let port = free_port();
        let child = Command::new("python3")
            .arg(scripts().join("server.py"))
            .arg(port.to_string())
            .args([&cert, &key, &log])
            .arg(TOKEN)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3 with the mcp SDK (installed by tests/run)");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut server = Self {
            child,
            addr,
            ca_file,
            log,
            _dir: dir,
        };
        server.wait_listening();
        server
    }

    fn wait_listening(&mut self) {
        let until = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(self.addr).is_err() {
            if let Ok(Some(status)) = self.child.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = self.child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                panic!("the MCP server exited ({status}): {err}");
            }
            assert!(Instant::now() < until, "the MCP server never listened");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every line the server logged: requests as they arrived, and executions.
    fn seen(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

impl Drop for McpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn config(server: &McpServer) -> String {
    format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n\
         [[agents]]\nid = \"agent\"\ntoken = \"tok-0123456789abcdef\"\n\
         [[credentials]]\nid = \"mcp\"\nsecret = \"mcp-token\"\ninject = {{ header = \"Authorization\", format = \"Bearer {{secret}}\" }}\n\
         [[routes]]\nid = \"mcp\"\ncredential = \"mcp\"\nmatch = {{ host = \"mcp.test\", port = {}, path_prefix = \"/mcp\" }}\nresolve = \"{}\"\nupstream_ca = \"{}\"\n",
        server.addr.port(),
        server.addr,
        server.ca_file.display()
    )
}

/// Which SDK's client runs the sessions.
#[derive(Clone, Copy, Debug)]
enum Sdk {
    Python,
    TypeScript,
}

/// Runs the SDK's client for `sessions` sessions as the agent; one JSON line each.
fn run_client(sdk: Sdk, home: &Home, daemon: &Daemon, port: u16, sessions: usize) -> Vec<Value> {
    let proxy = daemon.proxy.replace("http://", &format!("http://{AGENT}@"));
    let url = format!("https://mcp.test:{port}/mcp");
    let mut cmd = match sdk {
        Sdk::Python => {
            let mut c = Command::new("python3");
            c.arg(scripts().join("client.py"));
            c
        }
        Sdk::TypeScript => {
            let dir = crate::support::node_sdk_dir("@modelcontextprotocol/sdk");
            let mut c = Command::new("node");
            c.current_dir(&dir).arg("mcp_client.mjs");
            c
        }
    };
    cmd.arg(url).arg(sessions.to_string());
    for var in [
        "NO_PROXY",
        "no_proxy",
        "ALL_PROXY",
        "all_proxy",
        "REQUESTS_CA_BUNDLE",
    ] {
        cmd.env_remove(var);
    }
    let out = cmd
        .env("HTTPS_PROXY", &proxy)
        .env("https_proxy", &proxy)
        .env("SSL_CERT_FILE", home.root().join("certs/bundle.pem"))
        .env("NODE_EXTRA_CA_CERTS", home.root().join("certs/ca.pem"))
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{sdk:?} client: {e} (tests/run installs it)"));
    json_lines(&out, sessions, &daemon.stderr())
}

/// The JSON lines a test client printed, exactly `count` of them (else its output and
/// postern's log, `log`, in the failure).
pub fn json_lines(out: &std::process::Output, count: usize, log: &str) -> Vec<Value> {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert_eq!(
        lines.len(),
        count,
        "client printed {text}\n{}\npostern: {log}",
        String::from_utf8_lossy(&out.stderr)
    );
    lines
}

#[test]
fn three_mcp_sessions_in_a_row_each_run_their_tool_call() {
    three_sessions(Sdk::Python);
}

#[test]
fn three_typescript_sdk_sessions_in_a_row_each_run_their_tool_call() {
    three_sessions(Sdk::TypeScript);
}

fn three_sessions(sdk: Sdk) {
    let server = McpServer::start();
    let home = Home::new();
    assert!(
        secret_set(&home, "mcp-token", TOKEN, Some(VAULT_KEY))
            .status
            .success()
    );
    let daemon = Daemon::start_with(
        &home,
        Some(&config(&server)),
        &[("POSTERN_VAULT_KEY", VAULT_KEY)],
    );
    let lines = run_client(sdk, &home, &daemon, server.addr.port(), 3);
    let seen = server.seen();
    let texts: Vec<&Value> = lines.iter().map(|l| &l["text"][0]).collect();
    assert_eq!(
        texts,
        ["exec-1-1", "exec-2-1", "exec-3-1"],
        "{sdk:?}: every session's call must run: {lines:?}\nserver saw {seen:#?}"
    );
    assert!(lines.iter().all(|l| l["is_error"] == false), "{lines:?}");
    eprintln!("SEEN {}", serde_json::to_string_pretty(&seen).unwrap());
    let executions = seen.iter().filter(|s| s.get("executed").is_some()).count();
    assert_eq!(executions, 3, "{seen:#?}");
    let requests: Vec<&Value> = seen.iter().filter(|s| s.get("method").is_some()).collect();
    assert!(
        requests.iter().all(|r| r["authorized"] == true),
        "postern injects the server's token into every request: {requests:#?}"
    );
    let mut sessions: Vec<&str> = requests
        .iter()
        .filter(|r| r["rpc"] == "tools/call")
        .filter_map(|r| r["session"].as_str())
        .collect();
    sessions.dedup();
    assert_eq!(
        sessions.len(),
        3,
        "three sessions, three ids: {requests:#?}"
    );
    let (_, list) = crate::support::get_json(&daemon.url("/v1/invocations?limit=100"), &[]);
    let records = list["invocations"].as_array().unwrap();
    let undelivered: Vec<&Value> = records
        .iter()
        .filter(|r| r["code"] == "RESULT_DELIVERY_FAILED")
        .collect();
    assert!(undelivered.is_empty(), "{undelivered:#?}");
    let everything = format!("{lines:?}{}", daemon.stderr());
    assert!(!everything.contains(TOKEN), "the token reached the agent");
}
