//! The agent's TCP connection as the kernel sees it: how many bytes postern wrote into it,
//! and how the agent closed it. That is what tells "the agent read the answer, then left"
//! from "the agent gave up with the answer unread" (SPEC §3.9):
//! - a socket closed with unread bytes in its receive buffer sends RST, not FIN; bytes that
//!   arrive after a close are answered with RST and never acknowledged;
//! - so an agent whose first close signal was a FIN (a read of EOF, or `EPIPE` once a later
//!   write met its RST), and whose kernel acknowledged every byte written up to some point,
//!   read every one of those bytes before it closed. A first `ECONNRESET` means it did not.
//!
//! The acknowledged count comes from `TCP_INFO` (`tcpi_bytes_acked`), read once, when the
//! close is first seen: a closed peer acknowledges nothing more.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// How the agent's side of the connection ended, as first seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentClose {
    /// The agent closed in order (FIN first); `acked` bytes of postern's were acknowledged
    /// by then (`None`: the kernel did not say).
    Fin { acked: Option<u64> },
    /// The agent's connection was reset (it closed with bytes unread, or aborted).
    Reset,
    /// postern ended the connection before the agent closed it.
    Postern,
}

impl AgentClose {
    /// The agent read every byte of the first `written` postern wrote into the connection.
    pub fn read_through(self, written: u64) -> bool {
        matches!(self, AgentClose::Fin { acked: Some(a) } if a >= written)
    }
}

/// What the connection's readers and writers share: the count written and the close.
#[derive(Default)]
pub struct WireView {
    written: AtomicU64,
    close: Mutex<Closing>,
}

#[derive(Default)]
struct Closing {
    seen: Option<AgentClose>,
    waiting: Vec<oneshot::Sender<AgentClose>>,
    /// The socket, while its `Wire` holds it open: `hung_up` asks the kernel under this lock.
    fd: Option<RawFd>,
}

impl WireView {
    /// Bytes postern wrote into the connection so far (TLS records, heads, bodies).
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    /// How the agent closed, now or once it does.
    pub fn closed(&self) -> oneshot::Receiver<AgentClose> {
        let (tx, rx) = oneshot::channel();
        let Ok(mut c) = self.close.lock() else {
            return rx;
        };
        match c.seen {
            Some(seen) => {
                let _ = tx.send(seen);
            }
            None => c.waiting.push(tx),
        }
        rx
    }

    /// Whether the agent closed or reset its side, as the kernel knows it now: a FIN it
    /// queued counts before any task of postern's has read it (no scheduler in between).
    pub fn hung_up(&self) -> bool {
        let Ok(c) = self.close.lock() else {
            return true;
        };
        match (c.seen, c.fd) {
            (Some(_), _) | (None, None) => true,
            (None, Some(fd)) => peer_hung_up(fd),
        }
    }

    /// The first close signal counts; later ones (a FIN's RST) say nothing more.
    fn saw(&self, close: impl FnOnce() -> AgentClose) {
        let Ok(mut c) = self.close.lock() else { return };
        if c.seen.is_some() {
            return;
        }
        let close = close();
        c.seen = Some(close);
        for w in c.waiting.drain(..) {
            let _ = w.send(close);
        }
    }
}

impl crate::lifecycle::twin::Line for WireView {
    fn hung_up(&self) -> bool {
        WireView::hung_up(self)
    }
}

/// The agent's TCP stream, reporting to its `WireView`.
pub struct Wire {
    stream: TcpStream,
    view: Arc<WireView>,
}

impl Wire {
    pub fn new(stream: TcpStream) -> (Self, Arc<WireView>) {
        let view = Arc::new(WireView::default());
        if let Ok(mut c) = view.close.lock() {
            c.fd = Some(stream.as_raw_fd());
        }
        let wire = Self {
            stream,
            view: view.clone(),
        };
        (wire, view)
    }

    fn fin(&self) {
        let fd = self.stream.as_fd();
        self.view.saw(|| AgentClose::Fin {
            acked: bytes_acked(fd),
        });
    }

    /// A read or write error, as a close signal (`EPIPE`: the agent's FIN came first).
    fn failed(&self, e: &io::Error) {
        match e.kind() {
            io::ErrorKind::BrokenPipe => self.fin(),
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => {}
            _ => self.view.saw(|| AgentClose::Reset),
        }
    }

    fn wrote(&self, r: &Poll<io::Result<usize>>) {
        match r {
            Poll::Ready(Ok(n)) => {
                self.view.written.fetch_add(*n as u64, Ordering::AcqRel);
            }
            Poll::Ready(Err(e)) => self.failed(e),
            Poll::Pending => {}
        }
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        // Before the stream closes its fd: no `hung_up` may poll a number reused since.
        if let Ok(mut c) = self.view.close.lock() {
            c.fd = None;
        }
        self.view.saw(|| AgentClose::Postern);
    }
}

impl AsyncRead for Wire {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let room = buf.remaining() > 0;
        let r = Pin::new(&mut self.stream).poll_read(cx, buf);
        match &r {
            Poll::Ready(Ok(())) if room && buf.filled().len() == before => self.fin(),
            Poll::Ready(Err(e)) => self.failed(e),
            _ => {}
        }
        r
    }
}

impl AsyncWrite for Wire {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.wrote(&r);
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.wrote(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// A poll that does not wait: the peer shut its sending side (`POLLRDHUP`), or the
/// connection is gone (`POLLHUP`, `POLLERR`).
#[allow(unsafe_code)]
fn peer_hung_up(fd: RawFd) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, timeout 0; the caller holds the lock that keeps `fd` open.
    let rc = unsafe { libc::poll(&mut pfd, 1, 0) };
    rc > 0 && pfd.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// `tcpi_bytes_acked` of a TCP socket (Linux 4.1 and later).
#[allow(unsafe_code)]
fn bytes_acked(fd: BorrowedFd<'_>) -> Option<u64> {
    let mut info = std::mem::MaybeUninit::<libc::tcp_info>::zeroed();
    let size = std::mem::size_of::<libc::tcp_info>();
    let mut len = libc::socklen_t::try_from(size).ok()?;
    // SAFETY: the fd is borrowed, so open for the call; getsockopt writes at most `len`
    // bytes into `info`, which has that size.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    let filled = usize::try_from(len).ok()?;
    if rc != 0 || filled < std::mem::offset_of!(libc::tcp_info, tcpi_bytes_received) {
        return None;
    }
    // SAFETY: `tcp_info` holds integers only, so the zeroed bytes the kernel did not
    // overwrite are valid values too.
    let info = unsafe { info.assume_init() };
    Some(info.tcpi_bytes_acked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn pair() -> io::Result<(Wire, Arc<WireView>, TcpStream)> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let agent = TcpStream::connect(listener.local_addr()?).await?;
        let (ours, _) = listener.accept().await?;
        let (wire, view) = Wire::new(ours);
        Ok((wire, view, agent))
    }

    #[tokio::test]
    async fn a_close_shows_as_hung_up_before_postern_reads_it() -> io::Result<()> {
        let (wire, view, agent) = pair().await?;
        assert!(!view.hung_up(), "connected, nothing sent");
        drop(agent);
        // The kernel knows at once on loopback; nothing of postern's has read the FIN.
        assert!(view.hung_up());
        drop(wire);
        assert!(view.hung_up(), "a closed wire is gone");
        Ok(())
    }

    #[tokio::test]
    async fn a_request_in_the_buffer_is_not_a_hang_up() -> io::Result<()> {
        let (_wire, view, mut agent) = pair().await?;
        agent.write_all(b"GET / HTTP/1.1\r\n").await?;
        agent.flush().await?;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!view.hung_up());
        Ok(())
    }

    #[tokio::test]
    async fn an_agent_that_read_everything_and_closed_read_it_through() -> io::Result<()> {
        let (mut wire, view, mut agent) = pair().await?;
        wire.write_all(&[7u8; 5000]).await?;
        wire.flush().await?;
        let mut got = vec![0u8; 5000];
        agent.read_exact(&mut got).await?;
        drop(agent);
        let mut buf = [0u8; 16];
        assert_eq!(wire.read(&mut buf).await?, 0);
        let close = view.closed().await.map_err(io::Error::other)?;
        assert_eq!(close, AgentClose::Fin { acked: Some(5000) });
        assert!(close.read_through(view.written()));
        Ok(())
    }

    #[tokio::test]
    async fn an_agent_that_closed_with_bytes_unread_reset_the_connection() -> io::Result<()> {
        let (mut wire, view, mut agent) = pair().await?;
        wire.write_all(b"first").await?;
        let mut got = [0u8; 5];
        agent.read_exact(&mut got).await?;
        wire.write_all(b"second").await?;
        // The second write sits unread in the agent's socket when it closes.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        drop(agent);
        let mut buf = [0u8; 16];
        assert!(wire.read(&mut buf).await.is_err());
        let close = view.closed().await.map_err(io::Error::other)?;
        assert_eq!(close, AgentClose::Reset);
        assert!(!close.read_through(5));
        Ok(())
    }

    #[tokio::test]
    async fn bytes_written_after_the_agent_closed_were_not_read() -> io::Result<()> {
        let (mut wire, view, mut agent) = pair().await?;
        wire.write_all(b"first").await?;
        let mut got = [0u8; 5];
        agent.read_exact(&mut got).await?;
        drop(agent);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        // postern has not noticed yet, and writes more: never acknowledged.
        wire.write_all(b"second").await?;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let mut buf = [0u8; 16];
        let _ = wire.read(&mut buf).await;
        let close = view.closed().await.map_err(io::Error::other)?;
        assert!(close.read_through(5), "{close:?}");
        assert!(!close.read_through(view.written()), "{close:?}");
        Ok(())
    }
}
