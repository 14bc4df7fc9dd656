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
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(done) = self.done.take() {
            handed_over(done, self.watch.as_ref(), None);
        }
        match self.trailers.take() {
            // hyper ends the stream with them and polls no further.
            Some(t) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        // Never claim the end early: hyper must poll once more so we see it.
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
        false
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
