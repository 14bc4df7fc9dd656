//! Body wrappers that observe the two delivery boundaries hyper has no callback for.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::oneshot;

use super::flushed::{DeliveryEnd, FlushWatch};

/// A complete body handed over once (to the agent, or to the origin); reports whether
/// all of it was taken.
pub struct DeliveryBody {
    data: Option<Bytes>,
    /// Sent after the data, as the body's end (a gRPC response's status).
    trailers: Option<http::HeaderMap>,
    len: u64,
    done: Option<oneshot::Sender<DeliveryEnd>>,
    /// The agent's connection: its end counts once that connection flushed it.
    watch: Option<FlushWatch>,
}

impl DeliveryBody {
    pub fn new(data: Bytes) -> (Self, oneshot::Receiver<DeliveryEnd>) {
        Self::to_agent(data, None)
    }

    /// A body toward the agent whose connection `watch` sees (`None`: not known).
    pub fn to_agent(
        data: Bytes,
        watch: Option<FlushWatch>,
    ) -> (Self, oneshot::Receiver<DeliveryEnd>) {
        let (tx, rx) = oneshot::channel();
        let len = data.len() as u64;
        (
            Self {
                data: Some(data).filter(|d| !d.is_empty()),
                trailers: None,
                len,
                done: Some(tx),
                watch,
            },
            rx,
        )
    }
}

impl DeliveryBody {
    /// The body ends with `trailers` instead of an empty end.
    pub fn with_trailers(mut self, trailers: http::HeaderMap) -> Self {
        self.trailers = Some(trailers);
        self
    }
}

/// The body's end was handed over: delivered now, or once the agent's connection flushed
/// it (`cut`: a streamed body's data mark, should the connection close first).
fn handed_over(done: oneshot::Sender<DeliveryEnd>, watch: Option<&FlushWatch>, cut: Option<u64>) {
    match watch {
        Some(w) => w.deliver_when_flushed(done, cut),
        None => {
            let _ = done.send(DeliveryEnd::Delivered);
        }
    }
}

impl DeliveryBody {
    /// Its end is handed over (the last data, or none, was taken).
    fn end(&mut self) {
        if let Some(done) = self.done.take() {
            handed_over(done, self.watch.as_ref(), None);
        }
    }

    /// The same bytes, untouched, with a fresh observer (for a request sent again).
    pub fn reissue(mut self) -> (Self, oneshot::Receiver<DeliveryEnd>) {
        let data = self.data.take().unwrap_or_default();
        self.done = None;
        Self::new(data)
    }
}

impl Body for DeliveryBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(data) = self.data.take() {
            if self.trailers.is_none() {
                self.end();
            }
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        self.end();
        match self.trailers.take() {
            // hyper ends the stream with them and polls no further.
            Some(t) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        // Ended once the end was handed over: with the last data, so h2 sends END_STREAM
        // on that DATA frame. An agent that has every byte may close at once, and an empty
        // END_STREAM frame still queued behind it would then never go out.
        self.done.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.len)
    }
}

impl Drop for DeliveryBody {
    /// hyper drops a body with a known length once it wrote the last byte, without
    /// polling for its end: a body whose data was all taken counts as delivered.
    fn drop(&mut self) {
        if let Some(done) = self.done.take() {
            if self.data.is_none() {
                handed_over(done, self.watch.as_ref(), None);
            } else {
                let _ = done.send(DeliveryEnd::Dropped);
            }
        }
    }
}

/// The agent's request body toward the origin: `Delivered` once hyper took all of it.
pub type RequestBody = DeliveryBody;

/// One piece of a streamed response on its way to the agent.
pub enum Chunk {
    Data(Bytes),
    /// The last data; the stream ends after it.
    Last(Bytes),
    /// The trailers (`Postern-Outcome`, after a gRPC response's own); the stream ends after them.
    Trailers(http::HeaderMap),
    /// The upstream broke: abort the agent's stream, never end it cleanly.
    Abort,
}

/// A streamed body fed by the exchange; reports whether the agent got its end, and if
/// not, up to where its data went out (`DeliveryEnd::Cut`).
pub struct ChannelBody {
    rx: tokio::sync::mpsc::Receiver<Chunk>,
    finished: bool,
    done: Option<oneshot::Sender<DeliveryEnd>>,
    /// The agent's connection: the end counts once that connection flushed it.
    watch: Option<FlushWatch>,
    /// The connection's flush mark when the last data was handed over (or the head).
    handed: u64,
}

impl ChannelBody {
    pub fn new(
        rx: tokio::sync::mpsc::Receiver<Chunk>,
        watch: Option<FlushWatch>,
    ) -> (Self, oneshot::Receiver<DeliveryEnd>) {
        let (tx, done) = oneshot::channel();
        let handed = watch.as_ref().map_or(0, FlushWatch::mark);
        (
            Self {
                rx,
                finished: false,
                done: Some(tx),
                watch,
                handed,
            },
            done,
        )
    }

    fn hand(&mut self, data: &Bytes) {
        if let (false, Some(w)) = (data.is_empty(), &self.watch) {
            self.handed = w.mark();
        }
    }

    fn finish(&mut self) {
        self.finished = true;
        if let Some(done) = self.done.take() {
            handed_over(done, self.watch.as_ref(), Some(self.handed));
        }
    }
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.finished {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Chunk::Data(d))) => {
                self.hand(&d);
                Poll::Ready(Some(Ok(Frame::data(d))))
            }
            Poll::Ready(Some(Chunk::Last(d))) => {
                self.hand(&d);
                self.finish();
                Poll::Ready(Some(Ok(Frame::data(d))))
            }
            Poll::Ready(Some(Chunk::Trailers(t))) => {
                self.finish();
                Poll::Ready(Some(Ok(Frame::trailers(t))))
            }
            Poll::Ready(Some(Chunk::Abort)) | Poll::Ready(None) => {
                Poll::Ready(Some(Err(std::io::Error::other("upstream stream broke"))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // The last data carries the end (see `DeliveryBody::is_end_stream`).
        self.finished
    }
}

impl Drop for ChannelBody {
    /// Dropped before its end: a cut, unless data the exchange sent never went out.
    fn drop(&mut self) {
        let Some(done) = self.done.take() else { return };
        let unsent = std::iter::from_fn(|| self.rx.try_recv().ok()).any(|c| match c {
            Chunk::Data(d) | Chunk::Last(d) => !d.is_empty(),
            Chunk::Trailers(_) | Chunk::Abort => false,
        });
        let end = match (unsent, &self.watch) {
            (false, Some(_)) => DeliveryEnd::Cut {
                handed: self.handed,
            },
            _ => DeliveryEnd::Dropped,
        };
        let _ = done.send(end);
    }
}

pub(in crate::http) fn body_error(e: &hyper::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The request body toward the origin.
pub enum UpBody {
    Empty,
    Full(RequestBody),
}

impl http_body::Body for UpBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            Self::Empty => std::task::Poll::Ready(None),
            Self::Full(b) => std::pin::Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Empty => true,
            Self::Full(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            Self::Empty => http_body::SizeHint::with_exact(0),
            Self::Full(b) => b.size_hint(),
        }
    }
}

/// Puts the agent's body on the upstream request; `None` for an empty body.
pub(in crate::http) fn attach_body(
    req: &mut http::Request<UpBody>,
    body: Bytes,
) -> Option<oneshot::Receiver<DeliveryEnd>> {
    if body.is_empty() {
        return None;
    }
    let (b, rx) = RequestBody::new(body);
    *req.body_mut() = UpBody::Full(b);
    Some(rx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

    type Fallible = Result<(), Box<dyn std::error::Error>>;

    /// The server's side of a connection, keeping a copy of what it writes.
    struct Recorded<T> {
        inner: T,
        wrote: Arc<Mutex<Vec<u8>>>,
    }

    impl<T: AsyncRead + Unpin> AsyncRead for Recorded<T> {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_read(cx, buf)
        }
    }

    impl<T: AsyncWrite + Unpin> AsyncWrite for Recorded<T> {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let r = Pin::new(&mut self.inner).poll_write(cx, buf);
            if let (Poll::Ready(Ok(n)), Ok(mut wrote)) = (&r, self.wrote.lock()) {
                wrote.extend_from_slice(&buf[..*n]);
            }
            r
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_flush(cx)
        }

        fn poll_shutdown(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    /// Stream 1's DATA frames in what an h2 server wrote: (payload length, END_STREAM).
    fn data_frames(bytes: &[u8]) -> Vec<(usize, bool)> {
        let mut out = Vec::new();
        let mut at = 0;
        while let Some(&[l0, l1, l2, kind, flags, s0, s1, s2, s3]) = bytes.get(at..at + 9) {
            let len = usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2);
            let stream = u32::from_be_bytes([s0 & 0x7f, s1, s2, s3]);
            if kind == 0 && stream == 1 {
                out.push((len, flags & 1 == 1));
            }
            at += 9 + len;
        }
        out
    }

    /// An agent that has every byte may close at once: the end must not wait in a frame of
    /// its own behind the data (seen as a delivery judged failed that curl had read whole).
    #[tokio::test]
    async fn over_h2_a_whole_body_ends_its_stream_on_its_last_data_frame() -> Fallible {
        let (agent, ours) = tokio::io::duplex(1 << 16);
        let wrote = Arc::new(Mutex::new(Vec::new()));
        let ours = Recorded {
            inner: ours,
            wrote: wrote.clone(),
        };
        let service = hyper::service::service_fn(|_| async {
            let (body, _) = DeliveryBody::new(Bytes::from_static(b"all of it"));
            Ok::<_, std::convert::Infallible>(http::Response::new(body))
        });
        let server = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .serve_connection(hyper_util::rt::TokioIo::new(ours), service);
        tokio::spawn(server);
        let (mut client, connection) = h2::client::handshake(agent).await?;
        tokio::spawn(connection);
        let request = http::Request::get("https://origin.test/").body(())?;
        let (response, _) = client.send_request(request, true)?;
        let mut body = response.await?.into_body();
        let mut got = Vec::new();
        while let Some(chunk) = body.data().await {
            got.extend_from_slice(&chunk?);
        }
        assert_eq!(got, b"all of it");
        let frames = wrote.lock().map(|w| data_frames(&w)).unwrap_or_default();
        assert_eq!(frames, vec![(9, true)]);
        Ok(())
    }

    #[test]
    fn a_streamed_body_claims_its_end_with_its_last_data() {
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        let (mut body, _) = ChannelBody::new(rx, None);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(tx.try_send(Chunk::Data(Bytes::from_static(b"a"))).is_ok());
        assert!(tx.try_send(Chunk::Last(Bytes::from_static(b"b"))).is_ok());
        assert!(Pin::new(&mut body).poll_frame(&mut cx).is_ready());
        assert!(!body.is_end_stream(), "more is coming");
        assert!(Pin::new(&mut body).poll_frame(&mut cx).is_ready());
        assert!(body.is_end_stream(), "the last data carries the end");
    }
}
