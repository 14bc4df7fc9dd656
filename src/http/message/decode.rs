//! Content codings on credentialed routes. The reflection guard can only scan bytes it
//! can read, so on a route that injects a credential postern offers the origin only
//! the codings it decodes (those the agent offered too, else `identity`), decodes the
//! response before the guard scans it, and delivers it decoded. A body postern cannot
//! decode (unknown coding, corrupt data, over the size bound) is withheld, never relayed
//! unscanned: the agent gets the status and headers, `Postern-Body: withheld`, no body.

use std::io::{self, Write};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, header};

use crate::guard::{Carry, ReflectionGuard};

/// Marks a response whose body postern withheld.
pub const POSTERN_BODY: &str = "postern-body";

/// The codings postern decodes, in the order it offers them.
const DECODABLE: &[&str] = &["gzip", "deflate", "br", "zstd"];

/// Why a body was withheld (evidence `body_withheld`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Undecodable {
    /// A coding postern does not decode, or a stack of several.
    UnsupportedCoding,
    /// The coded data was corrupt.
    DecodeError,
    /// The decoded body would pass the size bound.
    TooLarge,
    /// The body is itself compressed (no `Content-Encoding` says so) and holds the secret.
    PackedEcho,
}

impl Undecodable {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UnsupportedCoding => "unsupported_coding",
            Self::DecodeError => "decode_error",
            Self::TooLarge => "too_large",
            Self::PackedEcho => "secret_in_compressed_body",
        }
    }
}

/// Rewrites `Accept-Encoding` to what both the agent and postern can take.
pub fn offer(headers: &mut HeaderMap) {
    let offered: Vec<&str> = DECODABLE
        .iter()
        .copied()
        .filter(|c| {
            headers
                .get_all(header::ACCEPT_ENCODING)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .any(|item| accepts(item, c))
        })
        .collect();
    let value = if offered.is_empty() {
        "identity".to_owned()
    } else {
        offered.join(", ")
    };
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.insert(header::ACCEPT_ENCODING, v);
    }
}

/// Whether one `Accept-Encoding` item names `coding` with a non-zero weight.
fn accepts(item: &str, coding: &str) -> bool {
    let mut parts = item.split(';').map(str::trim);
    let name = parts.next().unwrap_or_default();
    let named = name.eq_ignore_ascii_case(coding)
        || (coding == "gzip" && name.eq_ignore_ascii_case("x-gzip"));
    let zero = parts.any(|p| {
        p.strip_prefix("q=")
            .and_then(|q| q.parse::<f32>().ok())
            .is_some_and(|q| q <= 0.0)
    });
    named && !zero
}

/// The response's decoder: `Ok(None)` for an uncoded body.
pub fn decoder_for(headers: &HeaderMap, cap: usize) -> Result<Option<Decoder>, Undecodable> {
    let codings: Vec<String> = headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .map(|v| v.to_str().map_err(|_| Undecodable::UnsupportedCoding))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .flat_map(|v| v.split(','))
        .map(|c| c.trim().to_ascii_lowercase())
        .filter(|c| !c.is_empty() && c != "identity")
        .collect();
    match codings.as_slice() {
        [] => Ok(None),
        [one] => Decoder::new(one, cap).map(Some),
        _ => Err(Undecodable::UnsupportedCoding),
    }
}

/// Decodes a whole buffered body and fixes the head to describe the decoded one.
pub fn decode_whole(
    headers: &mut HeaderMap,
    body: &Bytes,
    cap: usize,
) -> Result<Bytes, Undecodable> {
    let Some(mut decoder) = decoder_for(headers, cap)? else {
        return Ok(body.clone());
    };
    let mut out = decoder.push(body)?.to_vec();
    out.extend_from_slice(&decoder.finish()?);
    headers.remove(header::CONTENT_ENCODING);
    Ok(Bytes::from(out))
}

/// A buffered body as the guard must see it: decoded on a credentialed route, or
/// withheld (the head then says so).
pub fn for_guard(
    guarded: bool,
    headers: &mut HeaderMap,
    body: &Bytes,
    cap: u64,
) -> Result<Bytes, Undecodable> {
    if !guarded {
        return Ok(body.clone());
    }
    let cap = usize::try_from(cap).unwrap_or(usize::MAX);
    decode_whole(headers, body, cap).inspect_err(|why| mark_withheld(headers, *why))
}

/// A body that is itself gzip or zstd (by its magic bytes) though no `Content-Encoding`
/// says so: an echo packed that way would pass the guard unread, so what it unpacks to is
/// scanned too — also what unpacked before trailing bytes a decoder stops at (tools skip
/// them), and an archive packed again, a few layers deep. `Err(PackedEcho)` when that
/// holds the secret. It runs a slice at a time, holding one slice's output, never the
/// whole; the scan stops (the body passes) past `cap` unpacked bytes.
pub fn check_packed(guard: &ReflectionGuard, body: &[u8], cap: u64) -> Result<(), Undecodable> {
    if packing(body).is_none() {
        return Ok(());
    }
    let mut layers = Layers {
        decoders: Vec::new(),
        innermost_fresh: true,
        carry: Carry::default(),
        scanned: 0,
        cap: usize::try_from(cap).unwrap_or(usize::MAX),
    };
    for slice in body.chunks(SLICE) {
        layers.feed(guard, 0, slice)?;
    }
    layers.finish(guard)
}

/// How many archives inside archives are unpacked for the scan.
const PACKED_LAYERS: usize = 3;
/// Packed bytes fed at once; one slice's output is what the scan holds.
const SLICE: usize = 16 << 10;
/// The most one slice may unpack to (past it the layer is read as far as it got).
const SLICE_OUTPUT: usize = 4 << 20;

/// gzip or zstd, by the magic bytes.
fn packing(bytes: &[u8]) -> Option<&'static str> {
    match bytes {
        [0x1f, 0x8b, ..] => Some("gzip"),
        [0x28, 0xb5, 0x2f, 0xfd, ..] => Some("zstd"),
        _ => None,
    }
}

/// The decoders of the layers found so far, and the scan of the innermost output.
struct Layers {
    /// `None` once a layer stopped (trailing bytes, corrupt data): it yields no more.
    decoders: Vec<Option<Decoder>>,
    /// The innermost layer has produced nothing yet (so it may be an archive itself).
    innermost_fresh: bool,
    carry: Carry,
    scanned: usize,
    cap: usize,
}

impl Layers {
    fn feed(
        &mut self,
        guard: &ReflectionGuard,
        level: usize,
        bytes: &[u8],
    ) -> Result<(), Undecodable> {
        if bytes.is_empty() {
            return Ok(());
        }
        if level == self.decoders.len() {
            let coding = (level == 0 || self.innermost_fresh)
                .then(|| packing(bytes))
                .flatten()
                .filter(|_| level < PACKED_LAYERS);
            if let Some(coding) = coding {
                self.decoders.push(Decoder::new(coding, SLICE_OUTPUT).ok());
                self.innermost_fresh = true;
            } else {
                return self.scan(guard, bytes);
            }
        }
        let Some(Some(decoder)) = self.decoders.get_mut(level) else {
            return Ok(());
        };
        let out = match decoder.push(bytes) {
            Ok(out) => out,
            Err(_) => {
                // What decoded before the stop is what a tool shows; nothing after it.
                let out = decoder.take();
                self.decoders[level] = None;
                out
            }
        };
        self.feed(guard, level + 1, &out)
    }

    fn scan(&mut self, guard: &ReflectionGuard, bytes: &[u8]) -> Result<(), Undecodable> {
        self.innermost_fresh = false;
        if self.scanned >= self.cap {
            return Ok(());
        }
        self.scanned += bytes.len();
        match guard.redact_stream(&mut self.carry, bytes).1 {
            0 => Ok(()),
            _ => Err(Undecodable::PackedEcho),
        }
    }

    /// The ends of the layers, outermost first, then the scan's held-back tail.
    fn finish(mut self, guard: &ReflectionGuard) -> Result<(), Undecodable> {
        // A layer found while finishing the one around it is finished in turn.
        let mut level = 0;
        while level < self.decoders.len() {
            if let Some(Some(d)) = self.decoders.get_mut(level) {
                let rest = d.finish().unwrap_or_else(|_| d.take());
                self.feed(guard, level + 1, &rest)?;
            }
            level += 1;
        }
        match guard.finish(&mut self.carry).1 {
            0 => Ok(()),
            _ => Err(Undecodable::PackedEcho),
        }
    }
}

/// Says in the head that the body is withheld, and why.
pub fn mark_withheld(headers: &mut HeaderMap, why: Undecodable) {
    headers.remove(header::CONTENT_ENCODING);
    headers.remove(header::CONTENT_LENGTH);
    let value = format!("withheld; reason={}", why.as_str());
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.insert(POSTERN_BODY, v);
    }
}

/// A push decoder for one response body. What one push decodes to is bounded by `cap`
/// (the buffered limit), so a decompression bomb is refused, never held in memory.
pub struct Decoder {
    inner: Inner,
}

enum Inner {
    Gzip(flate2::write::MultiGzDecoder<Sink>),
    Deflate(flate2::write::ZlibDecoder<Sink>),
    Br(Box<brotli::DecompressorWriter<Sink>>),
    Zstd(zstd::stream::write::Decoder<'static, Sink>),
}

impl Decoder {
    pub(in crate::http) fn new(coding: &str, cap: usize) -> Result<Self, Undecodable> {
        let sink = Sink {
            buf: Vec::new(),
            cap,
            over: false,
        };
        let inner = match coding {
            "gzip" | "x-gzip" => Inner::Gzip(flate2::write::MultiGzDecoder::new(sink)),
            "deflate" => Inner::Deflate(flate2::write::ZlibDecoder::new(sink)),
            "br" => Inner::Br(Box::new(brotli::DecompressorWriter::new(sink, 4096))),
            "zstd" => Inner::Zstd(
                zstd::stream::write::Decoder::new(sink).map_err(|_| Undecodable::DecodeError)?,
            ),
            _ => return Err(Undecodable::UnsupportedCoding),
        };
        Ok(Self { inner })
    }

    /// Decodes the next coded bytes; returns what they decoded to so far.
    pub fn push(&mut self, coded: &[u8]) -> Result<Bytes, Undecodable> {
        // Flushed each time so a streamed event reaches the agent without waiting.
        let written = match &mut self.inner {
            Inner::Gzip(w) => w.write_all(coded).and_then(|()| w.flush()),
            Inner::Deflate(w) => w.write_all(coded).and_then(|()| w.flush()),
            Inner::Br(w) => w.write_all(coded).and_then(|()| w.flush()),
            Inner::Zstd(w) => w.write_all(coded).and_then(|()| w.flush()),
        };
        self.check(written)?;
        Ok(self.take())
    }

    /// The end of the coded body: whatever the decoder still held.
    pub fn finish(&mut self) -> Result<Bytes, Undecodable> {
        let done = match &mut self.inner {
            Inner::Gzip(w) => w.try_finish(),
            Inner::Deflate(w) => w.try_finish(),
            Inner::Br(w) => w.close().map_err(io::Error::other),
            Inner::Zstd(w) => w.flush(),
        };
        self.check(done)?;
        Ok(self.take())
    }

    fn sink(&mut self) -> &mut Sink {
        match &mut self.inner {
            Inner::Gzip(w) => w.get_mut(),
            Inner::Deflate(w) => w.get_mut(),
            Inner::Br(w) => w.get_mut(),
            Inner::Zstd(w) => w.get_mut(),
        }
    }

    fn check(&mut self, r: io::Result<()>) -> Result<(), Undecodable> {
        match r {
            Ok(()) => Ok(()),
            Err(_) if self.sink().over => Err(Undecodable::TooLarge),
            Err(_) => Err(Undecodable::DecodeError),
        }
    }

    fn take(&mut self) -> Bytes {
        Bytes::from(std::mem::take(&mut self.sink().buf))
    }
}

/// Collects decoded bytes and refuses to hold more than `cap` at once.
struct Sink {
    buf: Vec<u8>,
    cap: usize,
    over: bool,
}

impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        if self.buf.len().saturating_add(b.len()) > self.cap {
            self.over = true;
            return Err(io::Error::other("decoded body over the bound"));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packed_echo_is_found_behind_trailing_bytes_and_inside_another_archive() {
        let secret = b"OrigSecret-ABCdef1234567890xyz";
        let Some(guard) = ReflectionGuard::new(secret, secret) else {
            panic!("guard");
        };
        let mut plain = vec![b'a'; 6000];
        plain.extend_from_slice(b"hello OrigSecret-ABCdef1234567890xyz bye");
        let mut trailing = coded("gzip", &plain);
        trailing.extend_from_slice(b"TRAILINGJUNK");
        let twice = coded("gzip", &coded("gzip", &plain));
        let mut zstd_trailing = coded("zstd", &plain);
        zstd_trailing.extend_from_slice(b"JUNKJUNK");
        for body in [trailing, twice, zstd_trailing] {
            assert_eq!(
                check_packed(&guard, &body, 1 << 20),
                Err(Undecodable::PackedEcho)
            );
        }
        // Packed bytes over several slices, the echo at the end.
        let mut x = 0x2545_f491_u32;
        let mut noise: Vec<u8> = (0..60_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        noise.extend_from_slice(b"hello OrigSecret-ABCdef1234567890xyz bye");
        let long = coded("gzip", &noise);
        assert!(long.len() > 2 * SLICE, "{}", long.len());
        assert_eq!(
            check_packed(&guard, &long, 1 << 20),
            Err(Undecodable::PackedEcho)
        );
        let clean = coded("gzip", b"nothing to see");
        assert_eq!(check_packed(&guard, &clean, 1 << 20), Ok(()));
    }

    fn coded(coding: &str, plain: &[u8]) -> Vec<u8> {
        use std::io::Read;
        let mut out = Vec::new();
        let fast = flate2::Compression::fast();
        let params = brotli::enc::BrotliEncoderParams {
            quality: 5,
            ..Default::default()
        };
        match coding {
            "gzip" => flate2::read::GzEncoder::new(plain, fast).read_to_end(&mut out),
            "deflate" => flate2::read::ZlibEncoder::new(plain, fast).read_to_end(&mut out),
            "br" => brotli::BrotliCompress(&mut &plain[..], &mut out, &params),
            _ => zstd::stream::copy_encode(plain, &mut out, 3).map(|()| 0),
        }
        .unwrap();
        out
    }

    fn headers(coding: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_ENCODING, coding.parse().unwrap());
        h
    }

    #[test]
    fn every_offered_coding_round_trips_in_any_chunking() {
        let plain: Vec<u8> = (0..200_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        for coding in DECODABLE {
            let body = coded(coding, &plain);
            let mut h = headers(coding);
            let whole = decode_whole(&mut h, &Bytes::from(body.clone()), 1 << 24).unwrap();
            assert_eq!(whole, plain, "{coding}");
            assert!(h.get(header::CONTENT_ENCODING).is_none());
            let mut d = decoder_for(&headers(coding), 1 << 24).unwrap().unwrap();
            let mut out = Vec::new();
            for piece in body.chunks(777) {
                out.extend_from_slice(&d.push(piece).unwrap());
            }
            out.extend_from_slice(&d.finish().unwrap());
            assert_eq!(out, plain, "{coding} chunked");
        }
    }

    #[test]
    fn a_bomb_is_refused_not_buffered() {
        let zeros = vec![0u8; 16 << 20];
        for coding in DECODABLE {
            let body = coded(coding, &zeros);
            let got = decode_whole(&mut headers(coding), &Bytes::from(body), 1 << 20);
            assert_eq!(got, Err(Undecodable::TooLarge), "{coding}");
        }
    }

    #[test]
    fn unknown_stacked_and_corrupt_codings_are_undecodable() {
        let body = Bytes::from_static(b"not compressed at all");
        for (coding, why) in [
            ("compress", Undecodable::UnsupportedCoding),
            ("gzip, br", Undecodable::UnsupportedCoding),
            ("gzip", Undecodable::DecodeError),
            ("br", Undecodable::DecodeError),
            ("zstd", Undecodable::DecodeError),
        ] {
            let got = decode_whole(&mut headers(coding), &body, 1 << 20);
            assert_eq!(got, Err(why), "{coding}");
        }
        let mut h = headers("identity");
        assert_eq!(decode_whole(&mut h, &body, 1 << 20).unwrap(), body);
    }

    #[test]
    fn the_origin_is_offered_only_what_both_sides_decode() {
        for (agent, sent) in [
            (Some("gzip, deflate, br, zstd"), "gzip, deflate, br, zstd"),
            (Some("br;q=1.0, gzip;q=0, compress, x-gzip"), "gzip, br"),
            (Some("compress, snappy"), "identity"),
            (None, "identity"),
        ] {
            let mut h = HeaderMap::new();
            if let Some(a) = agent {
                h.insert(header::ACCEPT_ENCODING, a.parse().unwrap());
            }
            offer(&mut h);
            assert_eq!(h[header::ACCEPT_ENCODING], sent, "{agent:?}");
        }
    }
}
