//! `ssh_exec`'s exec, sent the way `postern ssh-connect` and OpenSSH would send the agent's:
//! the preamble naming agent, token and target to postern's SSH front, then SSH with the
//! front's host key checked, `none` auth, one `exec`. The front tells the invocation id
//! when asked (`REPORT_INVOCATION_ENV`); nothing here decides an outcome.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use russh::ChannelMsg;
use russh::client;
use russh::keys::{PublicKey, PublicKeyOrCertificate};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::ssh::dispatch::{INVOCATION_DATA_TYPE, REPORT_INVOCATION_ENV};
use crate::ssh::preamble::{MAX_LINE, Preamble};

use super::agent::{KEPT_BYTES, Unsent};

/// postern's SSH front, as the agent reaches it.
pub struct Front {
    pub addr: SocketAddr,
    pub agent: Option<String>,
    pub token: Option<String>,
    /// The front's host key; `None`: it could not be read, and no exec is sent.
    pub host_key: Option<PublicKey>,
}

/// What the exec gave back.
#[derive(Default)]
pub struct Ran {
    pub invocation_id: Option<String>,
    /// Up to `KEPT_BYTES` of it.
    pub stdout: Bytes,
    /// All of it.
    pub stdout_bytes: u64,
    pub stderr: Bytes,
    pub exit_status: Option<u32>,
    pub exit_signal: Option<String>,
    /// The front refused before SSH: its envelope (JSON).
    pub refused: Option<String>,
}

struct FrontKey(PublicKey);

impl client::Handler for FrontKey {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        Ok(
            matches!(key, PublicKeyOrCertificate::PublicKey { key, .. } if key.key_data() == self.0.key_data()),
        )
    }
}

impl Front {
    /// Runs `command` as `user@host:port`; `Err` says whether the exec can have gone out.
    pub async fn exec(
        &self,
        (user, host, port): (&str, &str, u16),
        command: &str,
        stdin: Option<Bytes>,
    ) -> Result<Ran, Unsent> {
        let not_sent = Unsent::NotSent;
        let Some(key) = self.host_key.clone() else {
            return Err(not_sent(
                "postern's SSH host key could not be read (POSTERN_HOME/ssh)".into(),
            ));
        };
        let tcp = TcpStream::connect(self.addr).await.map_err(|e| {
            not_sent(format!(
                "cannot reach postern's SSH front at {}: {e}",
                self.addr
            ))
        })?;
        let _ = tcp.set_nodelay(true);
        let mut stream = BufReader::new(tcp);
        let preamble = Preamble {
            agent: self.agent.clone(),
            token: self.token.clone(),
            user: user.to_owned(),
            host: host.to_owned(),
            port,
        };
        let lost = |e: std::io::Error| not_sent(format!("postern's SSH front: {e}"));
        stream
            .write_all(preamble.encode().as_bytes())
            .await
            .map_err(lost)?;
        let mut line = String::new();
        let mut limited = (&mut stream).take(MAX_LINE as u64 * 4);
        limited.read_line(&mut line).await.map_err(lost)?;
        if line.trim_end() != "OK" {
            let envelope = line
                .trim_end()
                .strip_prefix("ERR ")
                .unwrap_or(line.trim_end());
            return Ok(Ran {
                refused: Some(envelope.to_owned()),
                ..Ran::default()
            });
        }
        let ssh = |e: russh::Error| not_sent(format!("SSH with postern's front: {e}"));
        let config = Arc::new(client::Config::default());
        let mut handle = client::connect_stream(config, stream, FrontKey(key))
            .await
            .map_err(ssh)?;
        let auth = handle.authenticate_none(user).await.map_err(ssh)?;
        if !auth.success() {
            return Err(not_sent("postern's SSH front refused the session".into()));
        }
        let mut channel = handle.channel_open_session().await.map_err(ssh)?;
        channel
            .set_env(true, REPORT_INVOCATION_ENV, "1")
            .await
            .map_err(ssh)?;
        // From the exec request on, the command may run whatever breaks.
        let gone = |e: russh::Error| Unsent::Unanswered(format!("SSH with postern's front: {e}"));
        channel.exec(true, command).await.map_err(gone)?;
        if let Some(input) = stdin {
            channel.data(&input[..]).await.map_err(gone)?;
        }
        channel.eof().await.map_err(gone)?;
        let mut ran = Ran::default();
        let (mut out, mut err) = (BytesMut::new(), BytesMut::new());
        let keep = |buf: &mut BytesMut, data: &[u8]| {
            let room = KEPT_BYTES.saturating_sub(buf.len());
            buf.extend_from_slice(data.get(..room.min(data.len())).unwrap_or_default());
        };
        while let Some(msg) = channel.wait().await {
            match msg {
                ChannelMsg::Data { data } => {
                    ran.stdout_bytes += data.len() as u64;
                    keep(&mut out, &data);
                }
                ChannelMsg::ExtendedData { data, ext: 1 } => keep(&mut err, &data),
                ChannelMsg::ExtendedData { data, ext } if ext == INVOCATION_DATA_TYPE => {
                    ran.invocation_id = Some(String::from_utf8_lossy(&data).into_owned());
                }
                ChannelMsg::ExitStatus { exit_status } => ran.exit_status = Some(exit_status),
                ChannelMsg::ExitSignal { signal_name, .. } => {
                    ran.exit_signal = Some(format!("{signal_name:?}"));
                }
                ChannelMsg::Close => break,
                _ => {}
            }
        }
        let _ = handle
            .disconnect(russh::Disconnect::ByApplication, "", "en")
            .await;
        ran.stdout = out.freeze();
        ran.stderr = err.freeze();
        Ok(ran)
    }
}
