//! A scripted upstream SSH server (russh's server API) on a loopback port, for the tests of
//! password logins, the reflection guard over output, DNS-named targets and kept sessions
//! that die. Built by what it does: `accepts_password`, `prints`, `drops_a_kept_session`.
//!
//! Its commands: `echo-password` prints the password it received at login (raw and split
//! across two messages, hex, and base64 on stderr); `echo-escaped` prints it partly
//! escaped (a `\u` escape cut across messages on stdout, `%XX` and `\xXX` on stderr);
//! `print` prints the scripted text in
//! 7-byte pieces; `ask` prints `ready: ` and the password's first three characters, then
//! waits for a line on stdin and prints `got <line>`; `refuse` is refused (channel failure,
//! nothing runs); anything else prints `ran <command>`. Every exec it runs exits 0; `execs`
//! and `ran` count the exec requests it received and the commands it ran.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine;
use russh::keys::ssh_key::{Algorithm, PrivateKey};
use russh::server::{Auth, Msg, Session};
use russh::{Channel, ChannelId};
use tokio::sync::Notify;

/// What the peer accepts and does.
#[derive(Clone, Default)]
struct Script {
    /// The one password accepted; `None`: any public key instead.
    password: Option<String>,
    /// A second channel on one connection drops that connection's TCP socket.
    one_channel_per_connection: bool,
    /// What `print` writes.
    print: String,
}

pub struct Peer {
    pub port: u16,
    /// Lists the peer's host key for `app1.internal` and the names given.
    pub known_hosts: PathBuf,
    connections: Arc<AtomicUsize>,
    tally: Arc<Tally>,
    _runtime: tokio::runtime::Runtime,
}

/// Exec requests received, and commands run (a refused exec runs nothing).
#[derive(Default)]
struct Tally {
    execs: AtomicUsize,
    ran: AtomicUsize,
}

impl Peer {
    /// Logs in only with `password`.
    pub fn accepts_password(password: &str, dir: &Path) -> Self {
        let script = Script {
            password: Some(password.to_owned()),
            ..Script::default()
        };
        Self::start(script, dir, &[])
    }

    /// Key login; the `print` command writes `text`.
    pub fn prints(text: &str, dir: &Path) -> Self {
        let script = Script {
            print: text.to_owned(),
            ..Script::default()
        };
        Self::start(script, dir, &[])
    }

    /// Key login; a session kept after its first exec dies when asked for a second channel
    /// (as one closed by the server, or expired while idle, does).
    pub fn drops_a_kept_session(dir: &Path) -> Self {
        let script = Script {
            one_channel_per_connection: true,
            ..Script::default()
        };
        Self::start(script, dir, &[])
    }

    /// Key login, known under `names` too (known_hosts form, `[host]:port` is added here).
    pub fn named(hosts: &[&str], dir: &Path) -> Self {
        Self::start(Script::default(), dir, hosts)
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// Exec requests received so far.
    pub fn execs(&self) -> usize {
        self.tally.execs.load(Ordering::SeqCst)
    }

    /// Commands run so far: the side effects.
    pub fn ran(&self) -> usize {
        self.tally.ran.load(Ordering::SeqCst)
    }

    fn start(script: Script, dir: &Path, hosts: &[&str]) -> Self {
        let host_key = PrivateKey::random(&mut rand::rng(), Algorithm::Ed25519).unwrap();
        let public = host_key.public_key().to_openssh().unwrap();
        let config = Arc::new(russh::server::Config {
            keys: vec![host_key],
            auth_rejection_time: Duration::ZERO,
            auth_rejection_time_initial: Some(Duration::ZERO),
            ..Default::default()
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut names = vec!["app1.internal".to_owned()];
        names.extend(hosts.iter().map(|h| format!("[{h}]:{port}")));
        let known_hosts = dir.join("peer_known_hosts");
        std::fs::write(&known_hosts, format!("{} {public}\n", names.join(","))).unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        let tally = Arc::new(Tally::default());
        let t = tally.clone();
        runtime.spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(tcp, config.clone(), script.clone(), t.clone()));
            }
        });
        Self {
            port,
            known_hosts,
            connections,
            tally,
            _runtime: runtime,
        }
    }
}

/// One connection: the session talks over a pipe so that `kill` can drop the TCP socket
/// under its feet.
async fn serve(
    mut tcp: tokio::net::TcpStream,
    config: Arc<russh::server::Config>,
    script: Script,
    tally: Arc<Tally>,
) {
    let kill = Arc::new(Notify::new());
    let (ours, mut theirs) = tokio::io::duplex(1 << 16);
    let k = kill.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut tcp, &mut theirs) => {}
            () = k.notified() => {}
        }
    });
    let handler = Scripted {
        script,
        tally,
        kill,
        channels: 0,
        login_password: String::new(),
        asking: None,
    };
    if let Ok(running) = russh::server::run_stream(config, ours, handler).await {
        let _ = running.await;
    }
}

struct Scripted {
    script: Script,
    tally: Arc<Tally>,
    kill: Arc<Notify>,
    channels: usize,
    /// The password this connection logged in with.
    login_password: String,
    /// The channel whose `ask` waits for its answer.
    asking: Option<ChannelId>,
}

impl russh::server::Handler for Scripted {
    type Error = russh::Error;

    async fn auth_password(&mut self, _: &str, password: &str) -> Result<Auth, Self::Error> {
        if self.script.password.as_deref() == Some(password) {
            self.login_password = password.to_owned();
            return Ok(Auth::Accept);
        }
        Ok(Auth::reject())
    }

    async fn auth_publickey(
        &mut self,
        _: &str,
        _: russh::server::VerifiedPublicKey<'_>,
    ) -> Result<Auth, Self::Error> {
        Ok(if self.script.password.is_none() {
            Auth::Accept
        } else {
            Auth::reject()
        })
    }

    async fn channel_open_session(
        &mut self,
        mut channel: Channel<Msg>,
        reply: russh::server::ChannelOpenHandle,
        _: &mut Session,
    ) -> Result<(), Self::Error> {
        self.channels += 1;
        if self.script.one_channel_per_connection && self.channels > 1 {
            self.kill.notify_one();
            return Ok(());
        }
        reply.accept().await;
        // Drained, so the session never stalls on a full channel buffer.
        tokio::spawn(async move { while channel.wait().await.is_some() {} });
        Ok(())
    }

    async fn exec_request(
        &mut self,
        id: ChannelId,
        command: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.tally.execs.fetch_add(1, Ordering::SeqCst);
        if command == b"refuse" {
            return session.channel_failure(id);
        }
        self.tally.ran.fetch_add(1, Ordering::SeqCst);
        session.channel_success(id)?;
        match command {
            b"ask" => {
                let start = self.login_password.get(..3).unwrap_or("");
                session.data(id, format!("ready: {start}").into_bytes())?;
                self.asking = Some(id);
                return Ok(());
            }
            b"echo-password" => self.echo_password(id, session)?,
            b"echo-escaped" => self.echo_escaped(id, session)?,
            b"print" => {
                for piece in self.script.print.as_bytes().chunks(7) {
                    session.data(id, piece.to_vec())?;
                }
            }
            other => {
                let line = format!("ran {}\n", String::from_utf8_lossy(other));
                session.data(id, line.into_bytes())?;
            }
        }
        exit(id, session)
    }

    async fn data(
        &mut self,
        id: ChannelId,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        if self.asking == Some(id) {
            self.asking = None;
            let line = format!("\ngot {}", String::from_utf8_lossy(data));
            session.data(id, line.into_bytes())?;
            exit(id, session)?;
        }
        Ok(())
    }
}

fn exit(id: ChannelId, session: &mut Session) -> Result<(), russh::Error> {
    session.exit_status_request(id, 0)?;
    session.eof(id)?;
    session.close(id)
}

impl Scripted {
    fn echo_password(&self, id: ChannelId, session: &mut Session) -> Result<(), russh::Error> {
        let pw = self.login_password.as_bytes();
        let (a, b) = pw.split_at(pw.len() / 2);
        session.data(id, [&b"you said: "[..], a].concat())?;
        session.data(id, [b, &b"\n"[..]].concat())?;
        let hex: String = pw.iter().map(|c| format!("{c:02x}")).collect();
        session.data(id, format!("hex: {hex}\ndone\n").into_bytes())?;
        let b64 = base64::engine::general_purpose::STANDARD.encode(pw);
        session.extended_data(id, 1, format!("b64: {b64}\n").into_bytes())?;
        Ok(())
    }

    /// `p\u0077-canary…` in three messages (`p\u0`, `077-cana`, the rest), and on stderr
    /// the password with one character as `%XX` and one as `\xXX`.
    fn echo_escaped(&self, id: ChannelId, session: &mut Session) -> Result<(), russh::Error> {
        let pw = &self.login_password;
        let json = pw.replacen('w', "\\u0077", 1);
        let (a, rest) = json.split_at(4.min(json.len()));
        let (b, c) = rest.split_at(8.min(rest.len()));
        session.data(id, format!("json: {a}").into_bytes())?;
        session.data(id, b.as_bytes().to_vec())?;
        session.data(id, format!("{c}\n").into_bytes())?;
        let mixed = pw.replacen('c', "%63", 1).replacen('S', "\\x53", 1);
        session.extended_data(id, 1, format!("mixed: {mixed}\n").into_bytes())?;
        Ok(())
    }
}
