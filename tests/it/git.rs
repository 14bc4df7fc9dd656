//! Real git through postern: clone and push against `git http-backend` behind a loopback
//! HTTPS origin (a small Python CGI bridge; `tests/run` installs python3 and git).

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use serde_json::Value;

use crate::support::{Daemon, Home, get_json, secret_set};
use crate::tls_origin::mint;

/// Serves `git http-backend` for the repositories under argv[1] over TLS; prints its port.
const BRIDGE: &str = r#"
import http.server, ssl, subprocess, os, sys
root, cert, key = sys.argv[1], sys.argv[2], sys.argv[3]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                n = int(self.rfile.readline().split(b";")[0], 16)
                if n == 0:
                    while self.rfile.readline() not in (b"\r\n", b""):
                        pass
                    return out
                out += self.rfile.read(n)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))
    def run(self):
        path, _, query = self.path.partition("?")
        data = self.body()
        env = dict(os.environ, GIT_PROJECT_ROOT=root, GIT_HTTP_EXPORT_ALL="1", PATH_INFO=path,
                   QUERY_STRING=query, REQUEST_METHOD=self.command, REMOTE_USER="agent",
                   CONTENT_TYPE=self.headers.get("Content-Type", ""), CONTENT_LENGTH=str(len(data)),
                   HTTP_CONTENT_ENCODING=self.headers.get("Content-Encoding", ""),
                   GIT_PROTOCOL=self.headers.get("Git-Protocol", ""))
        out = subprocess.run(["git", "http-backend"], input=data, env=env, capture_output=True).stdout
        head, _, rest = out.partition(b"\r\n\r\n")
        status, headers = 200, []
        for line in head.split(b"\r\n"):
            k, _, v = line.decode().partition(":")
            if k.lower() == "status":
                status = int(v.split()[0])
            elif k:
                headers.append((k, v.strip()))
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(rest)))
        self.end_headers()
        self.wfile.write(rest)
    do_GET = run
    do_POST = run
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
c.load_cert_chain(cert, key)
s.socket = c.wrap_socket(s.socket, server_side=True)
print(s.server_address[1], flush=True)
s.serve_forever()
"#;

pub struct Bridge {
    child: Child,
    pub port: u16,
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn git(dir: &Path, args: &[&str], envs: &[(&str, &str)]) -> Output {
    run_git(Command::new("git"), dir, args, envs)
}

/// git, ended after `secs` with its helpers: a hung push's `git-remote-https` and
/// `send-pack` wait on each other for good, and `timeout` signals its whole process group.
fn git_within(secs: u64, dir: &Path, args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new("timeout");
    cmd.args(["-k", "5", &secs.to_string(), "git"]);
    run_git(cmd, dir, args, envs)
}

fn run_git(mut cmd: Command, dir: &Path, args: &[&str], envs: &[(&str, &str)]) -> Output {
    cmd.current_dir(dir)
        .args(["-c", "user.name=agent", "-c", "user.email=agent@test"])
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env_remove("NO_PROXY")
        .env_remove("no_proxy");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output()
        .expect("git must be installed (tests/run installs it)")
}

pub fn ok(out: &Output, what: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what}: {err}");
}

/// A bare repository `team/app.git` with one commit on `main`.
pub fn seed(dir: &Path) {
    let work = dir.join("seed");
    std::fs::create_dir_all(&work).unwrap();
    ok(&git(&work, &["init", "-q", "-b", "main"], &[]), "init");
    std::fs::write(work.join("README"), "first\n").unwrap();
    ok(&git(&work, &["add", "README"], &[]), "add");
    ok(&git(&work, &["commit", "-qm", "first"], &[]), "commit");
    let bare = dir.join("repos/team/app.git");
    std::fs::create_dir_all(&bare).unwrap();
    ok(
        &git(&bare, &["init", "-q", "--bare", "-b", "main"], &[]),
        "init --bare",
    );
    ok(
        &git(&bare, &["config", "http.receivepack", "true"], &[]),
        "receivepack",
    );
    let target = bare.display().to_string();
    ok(
        &git(&work, &["push", "-q", &target, "main"], &[]),
        "seed push",
    );
}

pub fn bridge(dir: &Path) -> Bridge {
    let minted = mint("git.test");
    std::fs::write(dir.join("ca.pem"), &minted.ca_pem).unwrap();
    std::fs::write(dir.join("leaf.pem"), minted.leaf.pem()).unwrap();
    std::fs::write(dir.join("leaf.key"), minted.leaf_key.serialize_pem()).unwrap();
    std::fs::write(dir.join("bridge.py"), BRIDGE).unwrap();
    let mut child = Command::new("python3")
        .arg(dir.join("bridge.py"))
        .arg(dir.join("repos"))
        .arg(dir.join("leaf.pem"))
        .arg(dir.join("leaf.key"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 must be installed (tests/run installs it)");
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    let port = line.trim().parse().unwrap_or(0);
    assert_ne!(port, 0, "the git bridge did not start");
    Bridge { child, port }
}

#[test]
fn git_clones_and_pushes_through_postern() {
    let work = tempfile::tempdir().unwrap();
    seed(work.path());
    let origin = bridge(work.path());
    let home = Home::new();
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n\
         [[agents]]\nid = \"ci\"\ntoken = \"tok-0123456789abcdef\"\n\
         [[routes]]\nid = \"git\"\nmatch = {{ host = \"git.test\", port = {port}, path_prefix = \"/team/\" }}\n\
         resolve = \"127.0.0.1:{port}\"\nupstream_ca = \"{ca}\"\n",
        port = origin.port,
        ca = work.path().join("ca.pem").display()
    );
    let daemon = Daemon::start(&home, Some(&config));
    let proxy = daemon
        .proxy
        .replace("http://", "http://ci:tok-0123456789abcdef@");
    let bundle = home.root().join("certs/bundle.pem").display().to_string();
    let envs = [
        ("https_proxy", proxy.as_str()),
        ("HTTPS_PROXY", proxy.as_str()),
        ("GIT_SSL_CAINFO", bundle.as_str()),
    ];
    let url = format!("https://git.test:{}/team/app.git", origin.port);
    ok(
        &git(work.path(), &["clone", "-q", &url, "clone"], &envs),
        "clone",
    );
    let clone = work.path().join("clone");
    assert_eq!(
        std::fs::read_to_string(clone.join("README")).unwrap_or_default(),
        "first\n"
    );
    std::fs::write(clone.join("NOTES"), "from the agent\n").unwrap();
    ok(&git(&clone, &["add", "NOTES"], &[]), "add");
    ok(&git(&clone, &["commit", "-qm", "second"], &[]), "commit");
    ok(
        &git(&clone, &["push", "-q", "origin", "main"], &envs),
        "push",
    );
    let bare = work.path().join("repos/team/app.git");
    let log = git(&bare, &["log", "--format=%s", "main"], &[]);
    assert_eq!(String::from_utf8_lossy(&log.stdout), "second\nfirst\n");
    let (_, list) = get_json(&daemon.url("/v1/invocations?limit=50"), &[]);
    let records = list["invocations"].as_array().cloned().unwrap_or_default();
    let push = records
        .iter()
        .find(|r| {
            r["target"]
                .as_str()
                .is_some_and(|t| t.ends_with("/git-receive-pack"))
        })
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(
        (push["outcome"].as_str(), push["agent"].as_str()),
        (Some("committed"), Some("ci")),
        "{list}"
    );
}

/// Issue 40 medium 7. git (libcurl 7.88) pushing over h2 hangs for good when its send window
/// runs out at the body's last bytes: it asks git for more after the end, and git blocks. A
/// 2 MiB incompressible pack just overruns two of hyper's default 1 MiB windows, so each push
/// raced postern's `WINDOW_UPDATE`; with a whole body's credit granted up front it never waits.
#[test]
fn large_pushes_over_h2_never_wait_for_flow_control() {
    const PUSHES: usize = 15;
    const VAULT_KEY: &str = "vault-passphrase-for-tests";
    let work = tempfile::tempdir().unwrap();
    seed(work.path());
    let origin = bridge(work.path());
    let home = Home::new();
    let stored = secret_set(&home, "git-token", "git-token-value-1", Some(VAULT_KEY));
    assert!(stored.status.success());
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n\
         [[agents]]\nid = \"ci\"\ntoken = \"tok-0123456789abcdef\"\n\
         [[credentials]]\nid = \"git\"\nsecret = \"git-token\"\ninject = {{ basic = {{ user = \"agent\" }} }}\n\
         [[routes]]\nid = \"git\"\ncredential = \"git\"\n\
         match = {{ host = \"git.test\", port = {port}, path_prefix = \"/team/\" }}\n\
         resolve = \"127.0.0.1:{port}\"\nupstream_ca = \"{ca}\"\n",
        port = origin.port,
        ca = work.path().join("ca.pem").display()
    );
    let daemon = Daemon::start_with(&home, Some(&config), &[("POSTERN_VAULT_KEY", VAULT_KEY)]);
    let proxy = daemon
        .proxy
        .replace("http://", "http://ci:tok-0123456789abcdef@");
    let bundle = home.root().join("certs/bundle.pem").display().to_string();
    let trace = work.path().join("curl-trace").display().to_string();
    let envs = [
        ("https_proxy", proxy.as_str()),
        ("HTTPS_PROXY", proxy.as_str()),
        ("GIT_SSL_CAINFO", bundle.as_str()),
    ];
    let url = format!("https://git.test:{}/team/app.git", origin.port);
    ok(
        &git(work.path(), &["clone", "-q", &url, "clone"], &envs),
        "clone",
    );
    let clone = work.path().join("clone");
    let mut blob = vec![0u8; 2 << 20];
    let mut random = std::fs::File::open("/dev/urandom").unwrap();
    for i in 0..PUSHES {
        random.read_exact(&mut blob).unwrap();
        std::fs::write(clone.join("blob"), &blob).unwrap();
        ok(&git(&clone, &["add", "blob"], &[]), "add");
        ok(
            &git(&clone, &["commit", "-qm", &format!("blob {i}")], &[]),
            "commit",
        );
        let mut push_envs = envs.to_vec();
        if i == 0 {
            push_envs.extend([
                ("GIT_TRACE_CURL", trace.as_str()),
                ("GIT_TRACE_CURL_NO_DATA", "1"),
            ]);
        }
        let out = git_within(15, &clone, &["push", "-q", "origin", "main"], &push_envs);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "push {} of {PUSHES} hung or failed ({}): {err}",
            i + 1,
            out.status
        );
    }
    // The pushes went over h2, where the window is what could run out.
    let traced = std::fs::read_to_string(&trace).unwrap_or_default();
    assert!(
        traced.contains("POST /team/app.git/git-receive-pack HTTP/2"),
        "git did not push over h2"
    );
    let bare = work.path().join("repos/team/app.git");
    let count = git(&bare, &["rev-list", "--count", "main"], &[]);
    assert_eq!(
        String::from_utf8_lossy(&count.stdout).trim(),
        (PUSHES + 1).to_string()
    );
}
