//! An IO tap on the upstream socket: reports the first request byte written.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;

use super::upstream::Io;
use crate::http::deliver::flushed::DeliveryEnd;

pub struct Tap {
    inner: Box<dyn Io>,
    first_write: Option<oneshot::Sender<DeliveryEnd>>,
}

impl Tap {
    pub fn new(inner: Box<dyn Io>) -> (Self, oneshot::Receiver<DeliveryEnd>) {
        let (tx, rx) = oneshot::channel();
        (
            Self {
                inner,
                first_write: Some(tx),
            },
            rx,
        )
    }
}

impl Tap {
    fn saw_write(&mut self, r: &Poll<io::Result<usize>>) {
        if matches!(r, Poll::Ready(Ok(n)) if *n > 0)
            && let Some(tx) = self.first_write.take()
        {
            let _ = tx.send(DeliveryEnd::Delivered);
        }
    }
}

impl AsyncRead for Tap {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tap {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.saw_write(&r);
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.saw_write(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
