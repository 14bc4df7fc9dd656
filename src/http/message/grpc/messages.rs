//! gRPC's length-prefixed messages (PROTOCOL-HTTP2 "Length-Prefixed-Message"): a
//! compressed-flag byte, a 4-byte big-endian length, then the message. The guard cannot
//! read a compressed message, and an origin may compress whatever the call's
//! `grpc-accept-encoding` said, so on a credentialed route each compressed message is
//! decoded whole (by the response's `grpc-encoding`) and framed again uncompressed: flag
//! 0, its decoded length. An uncompressed message passes byte for byte as it comes. What
//! cannot be decoded is `Undecodable`, as for an HTTP body (`decode.rs`), and never
//! relayed.

use bytes::Bytes;
use http::HeaderMap;

use crate::http::message::decode::{Decoder, Undecodable};

const GRPC_ENCODING: &str = "grpc-encoding";
/// The flag byte and the length.
const PREFIX: usize = 5;

/// What the response's `grpc-encoding` says a compressed message was compressed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    /// None named, or `identity`: no message may be compressed.
    Identity,
    /// One postern decodes: grpc-core's `gzip` or `deflate` (zlib).
    Known(&'static str),
    /// Any other, or several: a compressed message is refused.
    Unknown,
}

impl Encoding {
    fn of(headers: &HeaderMap) -> Self {
        let values: Vec<_> = headers.get_all(GRPC_ENCODING).iter().collect();
        let one = match values.as_slice() {
            [] => return Self::Identity,
            [one] => one.to_str().map(|v| v.trim().to_ascii_lowercase()),
            _ => return Self::Unknown,
        };
        match one.as_deref() {
            Ok("identity") => Self::Identity,
            Ok("gzip") => Self::Known("gzip"),
            Ok("deflate") => Self::Known("deflate"),
            _ => Self::Unknown,
        }
    }
}

/// Where in the body the next byte falls.
enum At {
    /// A prefix: its bytes so far (fewer than 5).
    Prefix(Vec<u8>),
    /// An uncompressed message: how many of its bytes are still to come.
    Plain { left: usize },
    /// A compressed message, gathered until whole: its bytes so far and its length.
    Packed { message: Vec<u8>, len: usize },
    /// After a message that cannot be decoded: nothing more is read.
    Stopped(Undecodable),
}

/// Turns a gRPC response body into one whose messages are all uncompressed.
pub struct Messages {
    encoding: Encoding,
    at: At,
    /// The most a compressed message may be, before and after decoding.
    cap: usize,
}

impl Messages {
    /// For a response with this head. `grpc-encoding` leaves the head: every message the
    /// agent gets is uncompressed, which any gRPC client takes.
    pub fn for_head(headers: &mut HeaderMap, cap: usize) -> Self {
        let encoding = Encoding::of(headers);
        headers.remove(GRPC_ENCODING);
        Self {
            encoding,
            at: At::Prefix(Vec::new()),
            cap,
        }
    }

    /// A whole body.
    pub fn whole(&mut self, body: &[u8]) -> Result<Bytes, Undecodable> {
        match self.push(body, true) {
            (out, None) => Ok(out),
            (_, Some(why)) => Err(why),
        }
    }

    /// The next bytes of the body (`end`: the last): what can go on now, and why the body
    /// stops if a message cannot be decoded. The messages before that one come out whole
    /// (a client reads them); nothing after it does.
    pub fn push(&mut self, data: &[u8], end: bool) -> (Bytes, Option<Undecodable>) {
        let mut out = Vec::with_capacity(data.len());
        let taken = self.take(data, &mut out).and_then(|()| match end {
            true => self.finish(&mut out),
            false => Ok(()),
        });
        if let Err(why) = taken {
            self.at = At::Stopped(why);
        }
        (Bytes::from(out), taken.err())
    }

    fn take(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), Undecodable> {
        if let At::Stopped(why) = self.at {
            return Err(why);
        }
        let mut rest = data;
        while !rest.is_empty() {
            let used = self.step(rest, out)?;
            rest = &rest[used..];
        }
        Ok(())
    }

    /// The end of the body. A cut prefix goes on as it came (the agent sees the cut);
    /// a cut compressed message cannot be decoded.
    fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), Undecodable> {
        match std::mem::replace(&mut self.at, At::Prefix(Vec::new())) {
            At::Prefix(prefix) => out.extend_from_slice(&prefix),
            At::Plain { .. } => {}
            At::Packed { .. } => return Err(Undecodable::DecodeError),
            At::Stopped(why) => return Err(why),
        }
        Ok(())
    }

    /// Takes what it can of `data` where the body is; returns how many bytes it took.
    fn step(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<usize, Undecodable> {
        match &mut self.at {
            At::Prefix(prefix) => {
                let n = (PREFIX - prefix.len()).min(data.len());
                prefix.extend_from_slice(&data[..n]);
                if let Ok(whole) = <[u8; PREFIX]>::try_from(prefix.as_slice()) {
                    self.at = self.open(whole, out)?;
                }
                Ok(n)
            }
            At::Plain { left } => {
                let n = (*left).min(data.len());
                out.extend_from_slice(&data[..n]);
                *left -= n;
                if *left == 0 {
                    self.at = At::Prefix(Vec::new());
                }
                Ok(n)
            }
            At::Packed { message, len } => {
                let n = (*len - message.len()).min(data.len());
                message.extend_from_slice(&data[..n]);
                if message.len() == *len {
                    let message = std::mem::take(message);
                    self.unpack(&message, out)?;
                    self.at = At::Prefix(Vec::new());
                }
                Ok(n)
            }
            At::Stopped(why) => Err(*why),
        }
    }

    /// What a whole prefix opens.
    fn open(&self, prefix: [u8; PREFIX], out: &mut Vec<u8>) -> Result<At, Undecodable> {
        let [flag, a, b, c, d] = prefix;
        let len = usize::try_from(u32::from_be_bytes([a, b, c, d])).unwrap_or(usize::MAX);
        match flag {
            0 => {
                out.extend_from_slice(&prefix);
                Ok(match len {
                    0 => At::Prefix(Vec::new()),
                    left => At::Plain { left },
                })
            }
            1 if len > self.cap => Err(Undecodable::TooLarge),
            1 if len == 0 => self.unpack(&[], out).map(|()| At::Prefix(Vec::new())),
            1 => Ok(At::Packed {
                message: Vec::with_capacity(len.min(64 << 10)),
                len,
            }),
            // grpc-core fails a call on any other flag: it is no message a client reads.
            _ => Err(Undecodable::DecodeError),
        }
    }

    /// A whole compressed message, decoded and framed again uncompressed.
    fn unpack(&self, message: &[u8], out: &mut Vec<u8>) -> Result<(), Undecodable> {
        let Encoding::Known(coding) = self.encoding else {
            return Err(Undecodable::UnsupportedCoding);
        };
        let mut decoder = Decoder::new(coding, self.cap)?;
        let mut plain = decoder.push(message)?.to_vec();
        plain.extend_from_slice(&decoder.finish()?);
        if plain.len() > self.cap {
            return Err(Undecodable::TooLarge);
        }
        let len = u32::try_from(plain.len()).map_err(|_| Undecodable::TooLarge)?;
        out.push(0);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&plain);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
