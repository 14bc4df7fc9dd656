//! Request framing the HTTP parser hides: hyper silently drops `Content-Length` when
//! `Transfer-Encoding` is also present. This reader notes such heads on the raw bytes.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const MAX_LINE: usize = 8192;

/// Wraps the agent's connection; sets `conflict` once a request head carried both headers.
pub struct FramingSniffer<T> {
    inner: T,
    line: Vec<u8>,
    in_head: bool,
    saw_length: bool,
    saw_chunked: bool,
    pub conflict: Arc<AtomicBool>,
}

impl<T> FramingSniffer<T> {
    pub fn new(inner: T) -> Self {
        Self {
            inner,
            line: Vec::with_capacity(256),
            in_head: false,
            saw_length: false,
            saw_chunked: false,
            conflict: Arc::new(AtomicBool::new(false)),
        }
    }

    fn scan(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b != b'\n' {
                if self.line.len() < MAX_LINE {
                    self.line.push(b);
                }
                continue;
            }
            self.end_line();
            self.line.clear();
        }
    }

    fn end_line(&mut self) {
        let line = self.line.strip_suffix(b"\r").unwrap_or(&self.line);
        if line.is_empty() {
            if self.in_head && self.saw_length && self.saw_chunked {
                self.conflict.store(true, Ordering::SeqCst);
            }
            self.in_head = false;
            return;
        }
        if is_request_line(line) {
            self.in_head = true;
            self.saw_length = false;
            self.saw_chunked = false;
        } else if self.in_head {
            let lower = line.to_ascii_lowercase();
            self.saw_length |= lower.starts_with(b"content-length:");
            self.saw_chunked |= lower.starts_with(b"transfer-encoding:");
        }
    }
}

/// A request line, possibly glued to the end of the previous message's body.
fn is_request_line(line: &[u8]) -> bool {
    line.ends_with(b" HTTP/1.1") || line.ends_with(b" HTTP/1.0")
}

impl<T: AsyncRead + Unpin> AsyncRead for FramingSniffer<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            let fresh = buf.filled()[before..].to_vec();
            self.scan(&fresh);
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for FramingSniffer<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_framing_headers_in_one_head_are_noticed() {
        let mut s = FramingSniffer::new(());
        s.scan(b"POST http://x/ HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello");
        assert!(!s.conflict.load(Ordering::SeqCst));
        s.scan(b"POST http://x/ HTTP/1.1\r\ncontent-length: 5\r\nTransfer-");
        s.scan(b"Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
        assert!(s.conflict.load(Ordering::SeqCst));
    }
}
