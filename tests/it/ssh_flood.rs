//! A hostile SSH session that floods postern with refused requests: the journal grows by a
//! bounded number of records, the rest are counted, and the session is closed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use russh::client;
use russh::keys::PublicKeyOrCertificate;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::ssh::{Front, TOKEN};
use crate::support::curl;

struct AnyHost;

impl client::Handler for AnyHost {
    type Error = russh::Error;

    async fn check_server_key(&mut self, _: &PublicKeyOrCertificate) -> Result<bool, Self::Error> {
        Ok(true)
    }
}

/// An SSH session through the front, as `postern ssh-connect` would open it.
async fn session(f: &Front) -> client::Handle<AnyHost> {
    let stream = TcpStream::connect(&f.ssh_addr).await.unwrap();
    let mut stream = BufReader::new(stream);
    let line = format!(
        "POSTERN-SSH/1 agent=ci token={TOKEN} user={} host=app1.internal port=22\n",
        f.user
    );
    stream.write_all(line.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_line(&mut answer).await.unwrap();
    assert_eq!(answer, "OK\n", "the preamble is admitted");
    let config = Arc::new(client::Config::default());
    let mut handle = client::connect_stream(config, stream, AnyHost)
        .await
        .unwrap();
    let auth = handle.authenticate_none(f.user.clone()).await.unwrap();
    assert!(auth.success(), "postern accepts the agent's own auth");
    handle
}

/// Refused port-forward opens until postern closes the session (or `limit` is reached).
async fn flood(handle: &client::Handle<AnyHost>, limit: u32) -> u32 {
    let mut refused = 0;
    for i in 0..limit {
        let open = handle.channel_open_direct_tcpip("10.0.0.1", 22, "127.0.0.1", 40000 + i);
        match tokio::time::timeout(Duration::from_secs(5), open).await {
            Ok(Err(russh::Error::ChannelOpenFailure(_))) => refused += 1,
            Ok(Ok(_)) => panic!("a port forward was opened"),
            Ok(Err(_)) | Err(_) => break,
        }
    }
    refused
}

fn metric(f: &Front, name: &str) -> u64 {
    let (_, text, _) = curl(&[&f.daemon.url("/metrics")]);
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0)
}

fn records(f: &Front) -> usize {
    let out = f
        .daemon
        .cli(&["actions", "list", "--json", "--limit", "1000"], &[]);
    let list: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    list["invocations"].as_array().map_or(0, Vec::len)
}

#[test]
fn a_session_flooding_refused_requests_is_closed_and_journals_a_bounded_number() {
    let f = Front::start("");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let started = Instant::now();
    let mut total = 0;
    for _ in 0..3 {
        let refused = rt.block_on(async {
            let handle = session(&f).await;
            let refused = flood(&handle, 2000).await;
            // Closed by postern, not by this client.
            tokio::time::timeout(Duration::from_secs(5), async {
                while !handle.is_closed() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await
            .is_ok()
            .then_some(refused)
        });
        let refused = refused.expect("postern closed the flooding session");
        assert!(
            (31..=32).contains(&refused),
            "closed after 32 refusals: {refused}"
        );
        total += refused;
    }
    assert!(started.elapsed() < Duration::from_secs(60));
    // Journaling settles after the answers: wait for the records to stop growing.
    std::thread::sleep(Duration::from_millis(500));
    let journaled = records(&f);
    let unjournaled = metric(&f, "postern_ssh_refusals_unjournaled_total");
    assert!(
        journaled <= 40,
        "journaled at a bounded rate: {journaled} of {total}"
    );
    // postern refused 32 per session; the client may miss the answer to the last one, which
    // races the close.
    let seen = journaled as u64 + unjournaled;
    assert_eq!(
        seen,
        3 * 32,
        "every refusal journaled or counted ({total} answered)"
    );
    // The agent still works: a real exec in a fresh session.
    let out = f.ssh(TOKEN, &["--", "", "echo still-here"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "still-here\n");
}

#[test]
fn unused_session_channels_are_capped_and_a_closed_one_gives_its_place_back() {
    let f = Front::start("");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let handle = session(&f).await;
        let mut open = Vec::new();
        for _ in 0..10 {
            open.push(handle.channel_open_session().await.expect("within the cap"));
        }
        let refused = handle.channel_open_session().await;
        assert!(
            matches!(refused, Err(russh::Error::ChannelOpenFailure(_))),
            "the 11th unused channel is refused"
        );
        // Closing one frees its place.
        let first = open.remove(0);
        first.close().await.unwrap();
        let reopened = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match handle.channel_open_session().await {
                    Ok(c) => return c,
                    Err(russh::Error::ChannelOpenFailure(_)) => {
                        tokio::time::sleep(Duration::from_millis(20)).await
                    }
                    Err(e) => panic!("session broke: {e}"),
                }
            }
        })
        .await
        .expect("a closed channel gives its place back");
        open.push(reopened);
        // An agent that keeps opening is refused and then closed, like any other flood.
        let mut refusals = 0;
        for _ in 0..1000 {
            let open = handle.channel_open_session();
            match tokio::time::timeout(Duration::from_secs(5), open).await {
                Ok(Err(russh::Error::ChannelOpenFailure(_))) => refusals += 1,
                Ok(Ok(_)) => panic!("an 11th unused channel was opened"),
                Ok(Err(_)) | Err(_) => break,
            }
        }
        assert!(refusals <= 32, "closed after 32 refusals: {refusals}");
        tokio::time::timeout(Duration::from_secs(5), async {
            while !handle.is_closed() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("postern closed the session");
    });
    assert!(records(&f) <= 40, "refusals journaled at a bounded rate");
}

/// The SSH front and the proxy share one connection cap (an SSH session holds an upstream
/// too), and an SSH session makes room from the proxy's idle connections.
#[test]
fn ssh_sessions_count_against_the_proxy_cap_and_make_room_from_idle_proxy_connections() {
    let caps = "[proxy]\nmax_connections = 3\nmax_busy_per_agent = 3\n";
    let f = Front::start_with("", |t| t.replacen("[proxy]\n", caps, 1), &[]);
    let proxy = f.daemon.proxy.trim_start_matches("http://").to_owned();
    let idle: Vec<std::net::TcpStream> = (0..3)
        .map(|_| std::net::TcpStream::connect(&proxy).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let through_proxy = || curl(&["-x", &f.daemon.proxy, "http://elsewhere.test/"]).0;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sessions: Vec<_> = rt.block_on(async {
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(session(&f).await);
        }
        held
    });
    assert_eq!(through_proxy(), 503, "SSH sessions fill the shared cap");
    drop(sessions);
    let freed = (0..50).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        through_proxy() != 503
    });
    assert!(freed, "closed sessions give their places back");
    drop(idle);
}
