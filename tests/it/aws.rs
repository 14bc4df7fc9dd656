//! AWS SigV4 re-signed at the egress hop (SPEC §3.8): boto3, unchanged and configured only by
//! what `postern env --agent` prints, signs with the placeholder; postern signs again with
//! the real key pair. The origin (`tests/sdk/aws_origin.py`) checks every signature with
//! botocore's own signer and the real keys, never with postern's code.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use crate::support::{Daemon, Home, secret_set};
use crate::tls_origin::mint_names;

const VAULT_KEY: &str = "vault-passphrase-for-aws-tests";
const KEY_ID: &str = "AKIAPOSTERNTESTKEY01";
const SECRET_KEY: &str = "aws-secret-canary/9f3e+Q1w2e3r4t5y6u7i8o9p";
const SESSION_TOKEN: &str = "aws-session-canary-IQoJb3JpZ2luX2VjEPT";
const BUCKET_HOST: &str = "agent-bucket.s3.amazonaws.com";
const BEDROCK_HOST: &str = "bedrock-runtime.us-east-1.amazonaws.com";

fn sdk_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk")
}

/// The stand-in for S3 and Bedrock, verifying with botocore.
struct AwsOrigin {
    port: u16,
    ca_file: PathBuf,
    ledger: PathBuf,
    child: Child,
    _dir: tempfile::TempDir,
}

impl AwsOrigin {
    fn start(mode: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let minted = mint_names(&[BUCKET_HOST, BEDROCK_HOST]);
        let (cert, key, ca_file) = (
            dir.path().join("leaf.pem"),
            dir.path().join("leaf.key"),
            dir.path().join("ca.pem"),
        );
        std::fs::write(&cert, minted.leaf.pem()).unwrap();
        std::fs::write(&key, minted.leaf_key.serialize_pem()).unwrap();
        std::fs::write(&ca_file, &minted.ca_pem).unwrap();
        let keys = dir.path().join("keys.json");
        std::fs::write(&keys, key_pair_json()).unwrap();
        let ledger = dir.path().join("ledger.jsonl");
        let mut child = Command::new("python3")
            .arg(sdk_dir().join("aws_origin.py"))
            .args([&cert, &key, &keys, &ledger])
            .arg(mode)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs the AWS stand-in");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().parse().expect("the stand-in prints its port");
        Self {
            port,
            ca_file,
            ledger,
            child,
            _dir: dir,
        }
    }

    /// Every request the stand-in received, in order.
    fn seen(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.ledger)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Drop for AwsOrigin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn key_pair_json() -> String {
    serde_json::json!({
        "access_key_id": KEY_ID,
        "secret_access_key": SECRET_KEY,
        "session_token": SESSION_TOKEN,
    })
    .to_string()
}

struct Setup {
    home: Home,
    daemon: Daemon,
    origin: AwsOrigin,
}

fn setup(mode: &str) -> Setup {
    setup_logging(mode, None)
}

/// `setup`, the daemon logging at `rust_log`.
fn setup_logging(mode: &str, rust_log: Option<&str>) -> Setup {
    let origin = AwsOrigin::start(mode);
    let home = Home::new();
    assert!(
        secret_set(&home, "aws-keys", &key_pair_json(), Some(VAULT_KEY))
            .status
            .success()
    );
    let mut config = String::from(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n\
         [[agents]]\nid = \"agent\"\ntoken = \"tok-0123456789abcdef\"\n\
         [[credentials]]\nid = \"aws\"\nsecret = \"aws-keys\"\ninject = { aws_sigv4 = {} }\n",
    );
    for (id, host) in [("s3", BUCKET_HOST), ("bedrock", BEDROCK_HOST)] {
        config.push_str(&format!(
            "[[routes]]\nid = \"{id}\"\ncredential = \"aws\"\nmatch = {{ host = \"{host}\" }}\nresolve = \"127.0.0.1:{}\"\nupstream_ca = \"{}\"\nresponse_timeout = \"10s\"\n",
            origin.port,
            origin.ca_file.display()
        ));
    }
    let mut envs = vec![("POSTERN_VAULT_KEY", VAULT_KEY)];
    envs.extend(rust_log.map(|l| ("RUST_LOG", l)));
    let daemon = Daemon::start_with(&home, Some(&config), &envs);
    Setup {
        home,
        daemon,
        origin,
    }
}

/// What boto3 printed, and everything it wrote.
struct Run {
    out: Value,
    all: String,
}

impl Setup {
    /// `export NAME=value` lines of `postern env --agent agent`, as pairs.
    fn agent_env(&self) -> Vec<(String, String)> {
        let config = self.home.dir.path().join("postern.toml");
        let out = self.daemon.cli(
            &[
                "env",
                "--agent",
                "agent",
                "--config",
                config.to_str().unwrap(),
            ],
            &[],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("export "))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.trim_matches('\'').to_owned()))
            .collect()
    }

    /// boto3 with only `postern env`'s environment (plus a region, as any AWS user sets),
    /// and `overrides` on top.
    fn boto3(&self, call: &str, overrides: &[(&str, &str)]) -> Run {
        let mut cmd = Command::new("python3");
        cmd.arg(sdk_dir().join("aws_agent.py"))
            .arg(call)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", self.home.dir.path())
            .env("AWS_DEFAULT_REGION", "us-east-1")
            .env("AWS_EC2_METADATA_DISABLED", "true");
        for (k, v) in self.agent_env() {
            cmd.env(k, v);
        }
        // The config listens on port 0; the daemon's real address replaces it.
        let proxy = self
            .daemon
            .proxy
            .replace("http://", "http://agent:tok-0123456789abcdef@");
        for name in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"] {
            cmd.env(name, &proxy);
        }
        for (k, v) in overrides {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("python3 runs boto3");
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let out: Value =
            serde_json::from_str(line.lines().last().unwrap_or("")).unwrap_or_else(|_| {
                panic!(
                    "boto3 printed no result: {all}\npostern: {}",
                    self.daemon.stderr()
                )
            });
        Run { out, all }
    }

    /// No secret of the key pair anywhere an agent or operator reads.
    fn assert_no_secret(&self, run: &Run) {
        let journal = read_tree(&self.home.root().join("journal"));
        for (what, text) in [
            ("boto3's output", run.all.as_str()),
            ("postern's log", &self.daemon.stderr()),
        ] {
            for secret in [SECRET_KEY, SESSION_TOKEN] {
                assert!(!text.contains(secret), "{what} holds a secret");
            }
        }
        for secret in [SECRET_KEY, SESSION_TOKEN] {
            assert!(
                !journal
                    .windows(secret.len())
                    .any(|w| w == secret.as_bytes()),
                "the journal holds a secret"
            );
        }
    }
}

fn read_tree(dir: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(read_tree(&p));
            } else if let Ok(b) = std::fs::read(&p) {
                out.extend(b);
            }
        }
    }
    out
}

#[test]
fn boto3_reaches_s3_and_bedrock_with_a_placeholder_and_the_origin_sees_the_real_signature() {
    let s = setup("ok");
    let env = s.agent_env();
    let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    assert_eq!(get("AWS_ACCESS_KEY_ID").as_deref(), Some("postern:aws"));
    assert!(get("AWS_SECRET_ACCESS_KEY").is_some_and(|v| v != SECRET_KEY));
    assert!(get("AWS_CA_BUNDLE").is_some());

    let put_get = s.boto3("s3", &[]);
    assert_eq!(put_get.out["ok"], true, "{}", put_get.all);
    assert_eq!(put_get.out["body"], "written through postern");
    let invoke = s.boto3("bedrock", &[]);
    assert_eq!(invoke.out["ok"], true, "{}", invoke.all);
    assert_eq!(invoke.out["body"], r#"{"completion":"signed by postern"}"#);

    let seen = s.origin.seen();
    assert_eq!(seen.len(), 3, "{seen:?}");
    for r in &seen {
        assert_eq!(r["key_id"], KEY_ID, "the origin sees the real key id: {r}");
        assert_eq!(
            r["verified"], true,
            "botocore verifies postern's signature: {r}"
        );
    }
    s.assert_no_secret(&put_get);
    s.assert_no_secret(&invoke);
}

#[test]
fn a_lost_invoke_model_runs_once_despite_botocores_retries_and_names_posterns_code() {
    let s = setup("close");
    let run = s.boto3("bedrock", &[]);
    assert_eq!(run.out["ok"], false, "{}", run.all);
    let applied = s
        .origin
        .seen()
        .iter()
        .filter(|r| r["applied"] == true)
        .count();
    assert_eq!(
        applied,
        1,
        "one execution at the origin: {:?}",
        s.origin.seen()
    );
    // botocore's retry changed the signature, X-Amz-Date and amz-sdk-request: still the
    // same operation, so the resend guard answers it and botocore stops there.
    assert_eq!(
        run.out["code"], "RESEND_REFUSED",
        "botocore's ClientError names postern's code: {}",
        run.out
    );
    s.assert_no_secret(&run);
}

#[test]
fn an_agents_own_key_pair_on_a_sigv4_route_is_forbidden_and_nothing_is_sent() {
    let s = setup("ok");
    let run = s.boto3(
        "bedrock",
        &[
            ("AWS_ACCESS_KEY_ID", "AKIAAGENTSOWNKEY0001"),
            ("AWS_SECRET_ACCESS_KEY", "agents-own-secret-key"),
        ],
    );
    assert_eq!(run.out["ok"], false, "{}", run.all);
    assert_eq!(run.out["code"], "FORBIDDEN_HEADER", "{}", run.out);
    assert!(s.origin.seen().is_empty(), "nothing reached the origin");
}

#[test]
fn what_postern_cannot_re_sign_yet_is_refused_before_anything_is_sent() {
    let s = setup("ok");
    let proxy = s
        .daemon
        .proxy
        .replace("http://", "http://agent:tok-0123456789abcdef@");
    let bundle = s.home.root().join("certs/bundle.pem");
    let url = format!("https://{BEDROCK_HOST}/model/m/invoke");
    let signed_by = |key: &str| {
        format!(
            "Authorization: AWS4-HMAC-SHA256 Credential={key}/20261206/us-east-1/bedrock/aws4_request, \
             SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature=00"
        )
    };
    let post = |headers: &[String]| {
        let mut args = vec!["--proxy", &proxy, "--cacert", bundle.to_str().unwrap()];
        args.extend(["-X", "POST", "-d", "{}"]);
        for h in headers {
            args.extend(["-H", h.as_str()]);
        }
        args.push(&url);
        crate::support::curl(&args)
    };
    let chunked = "x-amz-content-sha256: STREAMING-AWS4-HMAC-SHA256-PAYLOAD".to_owned();
    for (headers, status, code) in [
        (vec![], 400, "MALFORMED_REQUEST"),
        (
            vec![signed_by("postern:aws"), chunked],
            500,
            "INJECTION_MODE_UNSUPPORTED",
        ),
        (
            vec![signed_by("AKIAAGENTSOWNKEY0001")],
            403,
            "FORBIDDEN_HEADER",
        ),
    ] {
        let (got, body, head) = post(&headers);
        assert_eq!(got, status, "{code}: {body}");
        assert!(body.contains(code), "{code}: {body}");
        let named = format!("x-amzn-errortype: {}", code.to_ascii_lowercase());
        assert!(head.to_ascii_lowercase().contains(&named), "{code}: {head}");
    }
    assert!(s.origin.seen().is_empty(), "nothing reached the origin");
}

#[test]
fn a_presigned_url_made_with_the_placeholder_is_re_signed_in_its_query() {
    let s = setup("ok");
    // boto3 presigns S3 URLs with SigV2 unless told SigV4 (an ordinary AWS config setting).
    let aws_config = s.home.dir.path().join("aws-config");
    std::fs::write(
        &aws_config,
        "[default]\ns3 =\n    signature_version = s3v4\n",
    )
    .unwrap();
    let run = s.boto3(
        "presigned",
        &[("AWS_CONFIG_FILE", aws_config.to_str().unwrap())],
    );
    assert_eq!(run.out["ok"], true, "{}", run.all);
    assert_eq!(
        run.out["url_key"], true,
        "the agent signed with the placeholder"
    );
    assert_eq!(run.out["body"], "fetched by a presigned URL");
    let seen = s.origin.seen();
    let get = seen.last().unwrap();
    assert!(
        get["path"].as_str().unwrap().contains("X-Amz-Signature="),
        "{get}"
    );
    assert_eq!(get["key_id"], KEY_ID, "{get}");
    assert_eq!(
        get["verified"], true,
        "botocore verifies the query signature: {get}"
    );
    s.assert_no_secret(&run);
}

/// The AWS signer traces what it signs: even with `RUST_LOG` asking for its trace, postern's log never holds
/// the key pair, the session token, or even the real key id.
#[test]
fn a_trace_log_holds_no_part_of_the_key_pair() {
    let s = setup_logging("ok", Some("trace,aws_sigv4=trace"));
    let run = s.boto3("bedrock", &[]);
    assert_eq!(run.out["ok"], true, "{}", run.all);
    let log = s.daemon.stderr();
    assert!(log.contains("TRACE"), "the log is at trace level");
    for secret in [KEY_ID, SECRET_KEY, SESSION_TOKEN] {
        assert!(!log.contains(secret), "{secret} in a trace log");
    }
}
