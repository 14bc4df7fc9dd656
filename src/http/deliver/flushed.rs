//! Delivered means flushed (SPEC §2: `RESULT_DELIVERED` once the last byte is flushed to
//! the agent; h2: END_STREAM sent). hyper only says that it took a body's last bytes; they
//! may still wait in its write buffer (HTTP/1.1) or in the connection's frame queue (h2),
//! and a crash right then would leave a record of a delivery the agent never got. So the
//! agent's connection is wrapped in `Flushed`, and a response body's end (`DeliveryEnd::
//! Delivered`) is held until that connection's flush carried it:
//! - HTTP/1.1: the connection's task polls the body and flushes after it, and hyper empties
//!   its own buffer into the socket before it flushes the socket: the first flush entered
//!   after the end was handed over carries the whole response.
//! - h2: the body ends in its stream's task, while the connection's task writes the frames,
//!   a stream's in order, its last one (END_STREAM) queued after its body's end. The end
//!   waits for a frame that ends a stream, written whole after it, and a flush after that.
//!   (hyper does not say which stream a request is, so another stream ending meanwhile on
//!   the same connection counts too.)
//!
//! A connection that closes first drops what waits on it: the delivery counts as dropped.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;

use super::wire::WireView;

/// How delivery to the agent ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryEnd {
    /// The last byte was handed to the connection (toward the agent: and flushed, when
    /// the body knows the agent's connection).
    Delivered,
    /// A streamed body whose end never went out (the agent left, or its connection closed
    /// first) but whose data did, up to `handed` (the connection's flush count when its
    /// last data was handed over): whether the agent read them is `read_before_close`'s.
    Cut { handed: u64 },
    /// The agent's connection went away first.
    Dropped,
}

/// How long a cut delivery waits to learn how the agent closed: hyper drops a body once
/// its connection failed, so the close is known by then, save on a connection that stays
/// (a response to `HEAD`), where nothing more comes.
const CLOSE_KNOWN_WITHIN: Duration = Duration::from_secs(1);

/// One agent connection's flushes (and, h2, stream ends), shared by the bodies sent on it.
#[derive(Clone)]
pub struct FlushWatch(Arc<Mutex<Ledger>>);

#[derive(Default)]
struct Ledger {
    h2: bool,
    /// h2 frames ending a stream written whole so far.
    ends: u64,
    /// `poll_flush` calls entered so far.
    flushes: u64,
    /// The latest flush that completed (its entry number), and the bytes the agent's TCP
    /// connection had taken by then.
    flushed: u64,
    written_at_flush: u64,
    /// The agent's TCP connection (`None` where postern does not own it).
    wire: Option<Arc<WireView>>,
    closed: bool,
    waiting: Vec<Waiter>,
}

/// A body's end, and where the connection's counters stood when it was handed over.
struct Waiter {
    ends: u64,
    flushes: u64,
    /// A streamed body's data mark: if the connection closes first, that is a cut.
    cut: Option<u64>,
    done: oneshot::Sender<DeliveryEnd>,
}

impl FlushWatch {
    fn new(h2: bool, wire: Option<Arc<WireView>>) -> Self {
        Self(Arc::new(Mutex::new(Ledger {
            h2,
            wire,
            ..Ledger::default()
        })))
    }

    /// Reports `Delivered` on `done` once the connection flushed what was handed over by
    /// now (see the module note); if the connection closes first, `Cut` at `cut` (a
    /// streamed body's data mark) or else `Dropped`.
    pub fn deliver_when_flushed(&self, done: oneshot::Sender<DeliveryEnd>, cut: Option<u64>) {
        let Ok(mut ledger) = self.0.lock() else {
            let _ = done.send(DeliveryEnd::Delivered);
            return;
        };
        if ledger.closed {
            let _ =
                done.send(cut.map_or(DeliveryEnd::Dropped, |handed| DeliveryEnd::Cut { handed }));
            return;
        }
        let waiter = Waiter {
            ends: ledger.ends,
            flushes: ledger.flushes,
            cut,
            done,
        };
        ledger.waiting.push(waiter);
    }

    /// The connection's flush count now: a mark for bytes handed over from here on.
    pub fn mark(&self) -> u64 {
        self.0.lock().map_or(u64::MAX, |l| l.flushes)
    }

    /// The agent's TCP connection where it carries this one request at a time (HTTP/1):
    /// its close is this request's agent leaving. An h2 stream can be reset alone.
    pub fn own_wire(&self) -> Option<Arc<WireView>> {
        self.0
            .lock()
            .ok()
            .filter(|l| !l.h2)
            .and_then(|l| l.wire.clone())
    }

    /// The agent's TCP connection, where postern owns it.
    pub fn wire(&self) -> Option<Arc<WireView>> {
        self.0.lock().ok().and_then(|l| l.wire.clone())
    }

    /// Whether the agent read every byte handed over before `handed` (a `Cut`'s mark),
    /// then closed (`wire`): a flush after the mark carried them into its TCP connection,
    /// and its kernel acknowledged them before the agent closed in order. Never on h2,
    /// whose streams end without a close: a reset stream says nothing of what was read.
    pub async fn read_before_close(&self, handed: u64) -> bool {
        let (wire, written) = {
            let Ok(l) = self.0.lock() else { return false };
            match (&l.wire, l.h2 || l.flushed <= handed) {
                (Some(wire), false) => (wire.clone(), l.written_at_flush),
                _ => return false,
            }
        };
        match tokio::time::timeout(CLOSE_KNOWN_WITHIN, wire.closed()).await {
            Ok(Ok(close)) => close.read_through(written),
            _ => false,
        }
    }

    fn ended(&self, streams: u64) {
        if let Ok(mut l) = self.0.lock() {
            l.ends += streams;
        }
    }

    /// The flush's entry number, and the stream ends written before it.
    fn enter_flush(&self) -> (u64, u64) {
        self.0.lock().map_or((0, 0), |mut l| {
            l.flushes += 1;
            (l.flushes, l.ends)
        })
    }

    fn flushed(&self, entry: u64, ends: u64) {
        let Ok(mut l) = self.0.lock() else { return };
        if entry > l.flushed {
            l.flushed = entry;
            l.written_at_flush = l.wire.as_ref().map_or(0, |w| w.written());
        }
        if l.waiting.is_empty() {
            return;
        }
        let h2 = l.h2;
        let carried = |w: &Waiter| entry > w.flushes && (!h2 || ends > w.ends);
        let (done, waiting): (Vec<Waiter>, Vec<Waiter>) = std::mem::take(&mut l.waiting)
            .into_iter()
            .partition(carried);
        l.waiting = waiting;
        drop(l);
        for w in done {
            let _ = w.done.send(DeliveryEnd::Delivered);
        }
    }

    fn close(&self) {
        let Ok(mut l) = self.0.lock() else { return };
        l.closed = true;
        // A dropped sender reports `Dropped` to those waiting.
        for w in l.waiting.drain(..) {
            if let Some(handed) = w.cut {
                let _ = w.done.send(DeliveryEnd::Cut { handed });
            }
        }
    }
}

/// Reads the frames an h2 server writes, for the ones that end a stream: DATA or HEADERS
/// with END_STREAM, and RST_STREAM (RFC 9113 §4.1: a 9-byte head, then `length` bytes).
#[derive(Default)]
struct FrameScan {
    head: Vec<u8>,
    /// Payload bytes of the current frame still to come.
    rest: usize,
    /// The current frame ends its stream.
    ends: bool,
}

impl FrameScan {
    /// How many stream-ending frames `bytes` completed.
    fn scan(&mut self, mut bytes: &[u8]) -> u64 {
        const HEAD: usize = 9;
        let mut ended = 0;
        while !bytes.is_empty() || (self.head.len() == HEAD && self.rest == 0) {
            if self.head.len() == HEAD {
                let n = self.rest.min(bytes.len());
                self.rest -= n;
                bytes = bytes.get(n..).unwrap_or_default();
                if self.rest == 0 {
                    ended += u64::from(self.ends);
                    self.head.clear();
                }
                continue;
            }
            let n = (HEAD - self.head.len()).min(bytes.len());
            let (taken, left) = bytes.split_at(n);
            self.head.extend_from_slice(taken);
            bytes = left;
            if let [l0, l1, l2, kind, flags, _, _, _, _] = self.head[..] {
                self.rest = usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2);
                self.ends = matches!((kind, flags & 1), (0 | 1, 1) | (3, _));
            }
        }
        ended
    }
}

/// The agent's connection as hyper sees it, reporting flushes (and h2 stream ends) to
/// its `FlushWatch`.
pub struct Flushed<T> {
    inner: T,
    watch: FlushWatch,
    /// h2 only.
    frames: Option<FrameScan>,
}

impl<T> Flushed<T> {
    /// `h2`: the connection speaks HTTP/2 (else HTTP/1.x).
    /// `wire`: the agent's TCP connection under it, where postern owns it.
    pub fn new(inner: T, h2: bool, wire: Option<Arc<WireView>>) -> (Self, FlushWatch) {
        let watch = FlushWatch::new(h2, wire);
        let frames = h2.then(FrameScan::default);
        let io = Self {
            inner,
            watch: watch.clone(),
            frames,
        };
        (io, watch)
    }

    /// Notes what a write took: the first `n` bytes of `bufs`.
    fn took(&mut self, bufs: &[&[u8]], mut n: usize) {
        let Some(frames) = self.frames.as_mut() else {
            return;
        };
        let mut ended = 0;
        for buf in bufs {
            let part = buf.get(..n.min(buf.len())).unwrap_or_default();
            n -= part.len();
            ended += frames.scan(part);
            if n == 0 {
                break;
            }
        }
        if ended > 0 {
            self.watch.ended(ended);
        }
    }
}

impl<T> Drop for Flushed<T> {
    fn drop(&mut self) {
        self.watch.close();
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Flushed<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Flushed<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.took(&[buf], n);
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = r {
            let slices: Vec<&[u8]> = bufs.iter().map(|b| &b[..]).collect();
            self.took(&slices, n);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let (entry, ends) = self.watch.enter_flush();
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        if matches!(r, Poll::Ready(Ok(()))) {
            self.watch.flushed(entry, ends);
        }
        r
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // A shutdown flushes first (TLS: and sends close_notify).
        let (entry, ends) = self.watch.enter_flush();
        let r = Pin::new(&mut self.inner).poll_shutdown(cx);
        if matches!(r, Poll::Ready(Ok(()))) {
            self.watch.flushed(entry, ends);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A writer that accepts nothing until opened, as a socket whose reader is idle.
    struct Gate {
        open: bool,
    }

    impl AsyncRead for Gate {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Pending
        }
    }

    impl AsyncWrite for Gate {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            match self.open {
                true => Poll::Ready(Ok(buf.len())),
                false => Poll::Pending,
            }
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            match self.open {
                true => Poll::Ready(Ok(())),
                false => Poll::Pending,
            }
        }

        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.poll_flush(cx)
        }
    }

    fn now<T>(rx: &mut oneshot::Receiver<T>) -> Option<T> {
        rx.try_recv().ok()
    }

    #[tokio::test]
    async fn http1_an_end_is_delivered_by_the_first_flush_after_it() -> std::io::Result<()> {
        let (mut io, watch) = Flushed::new(Gate { open: true }, false, None);
        io.write_all(b"head and body").await?;
        let (tx, mut rx) = oneshot::channel();
        watch.deliver_when_flushed(tx, None);
        assert_eq!(now(&mut rx), None, "handed over is not flushed");
        io.flush().await?;
        assert_eq!(now(&mut rx), Some(DeliveryEnd::Delivered));
        Ok(())
    }

    /// An h2 frame head: length, type, flags, stream id.
    fn frame(kind: u8, flags: u8, stream: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![0, (len >> 8) as u8, len as u8, kind, flags, 0, 0, 0, stream];
        f.extend_from_slice(payload);
        f
    }

    #[tokio::test]
    async fn h2_an_end_needs_a_stream_ending_frame_written_whole_then_a_flush()
    -> std::io::Result<()> {
        let (mut io, watch) = Flushed::new(Gate { open: true }, true, None);
        let (tx, mut rx) = oneshot::channel();
        watch.deliver_when_flushed(tx, None);
        // Data still on its way (no END_STREAM), flushed: not the end.
        io.write_all(&frame(0, 0, 1, b"part")).await?;
        io.flush().await?;
        assert_eq!(now(&mut rx), None);
        // The END_STREAM frame, its payload cut across writes.
        let last = frame(0, 1, 1, b"rest");
        io.write_all(&last[..11]).await?;
        io.flush().await?;
        assert_eq!(now(&mut rx), None, "half a frame is not its end");
        io.write_all(&last[11..]).await?;
        assert_eq!(now(&mut rx), None, "written, not yet flushed");
        io.flush().await?;
        assert_eq!(now(&mut rx), Some(DeliveryEnd::Delivered));
        Ok(())
    }

    #[test]
    fn stream_ends_are_found_in_any_cut_of_the_bytes() {
        let mut bytes = frame(4, 0, 0, b"settings");
        bytes.extend(frame(1, 4, 1, b"head"));
        bytes.extend(frame(0, 1, 1, b""));
        bytes.extend(frame(1, 5, 3, b"head+end"));
        bytes.extend(frame(3, 0, 5, &[0, 0, 0, 8]));
        bytes.extend(frame(0, 0, 7, b"more"));
        for cut in 1..bytes.len() {
            let mut scan = FrameScan::default();
            let (a, b) = bytes.split_at(cut);
            assert_eq!(scan.scan(a) + scan.scan(b), 3, "cut at {cut}");
        }
    }

    #[tokio::test]
    async fn a_connection_that_cannot_flush_delivers_nothing_and_closing_drops_it() {
        let (io, watch) = Flushed::new(Gate { open: false }, false, None);
        let mut io = Box::pin(io);
        let (tx, mut rx) = oneshot::channel();
        watch.deliver_when_flushed(tx, None);
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(io.as_mut().poll_write(&mut cx, b"x").is_pending());
        assert!(io.as_mut().poll_flush(&mut cx).is_pending());
        assert_eq!(now(&mut rx), None);
        drop(io);
        assert!(rx.await.is_err(), "dropped, never delivered");
        let (tx, mut rx) = oneshot::channel();
        watch.deliver_when_flushed(tx, None);
        assert_eq!(now(&mut rx), Some(DeliveryEnd::Dropped));
    }
}
