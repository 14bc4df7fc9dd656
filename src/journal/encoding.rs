//! How an event and a record are stored. The events of one write are one value, a group
//! (`encode_group`): a binary frame around each event's JSON `data`. The hash stays over
//! the canonical JSON (`Event::compute_hash`), so the chain, `audit verify` and the API see
//! the same event whichever way it was stored. What older journals hold still decodes: a
//! group with every event's digest, one value per append (a run), per event (the compact
//! frame below), or plain JSON.
//!
//! Frame: tag, seq (u64 LE), prev and own SHA-256 digests (32 bytes each), attempt and
//! generation (u32 LE), kind and source codes (one byte each), invocation id, hop and ts
//! (each one length byte and UTF-8), then `data` as JSON to the end.
//!
//! A record (settled state, result, kept request) is its JSON, LZ4-packed when that pays:
//! fjall compresses only journal values over 4 KiB, and these are written once each.

use super::bodies::{BODY_FILE_FROM, BodyRef};
use super::event::{Event, EventKind, Sealed, Source};
use super::request::StoredRequest;
use super::result::{HttpResult, Payload, SshResult, StoredResult, b64, unb64};

/// First byte of a compact frame (a JSON frame starts with `{`).
const COMPACT: u8 = 0xB1;
/// First byte of a run: consecutive events of one invocation stored as one value.
const RUN: u8 = 0xB3;
/// First byte of a group as first written: each event's own digest stored before it.
const GROUP: u8 = 0xB4;
/// First byte of a group: the events of one write, several invocations' runs. An event's
/// own digest is not stored (it is the hash of its canonical bytes, computed when read);
/// the last event's follows the events, so a changed event fails the audit there.
const CHAINED: u8 = 0xB6;
const HASH_PREFIX: &str = "sha256:";

/// First byte of an LZ4-packed record (a plain one is JSON and starts with `{`).
const PACKED: u8 = 0xB2;
/// The largest record `unpack` inflates: far above `max_result_bytes`, and a damaged
/// length cannot make it allocate without bound.
const MAX_UNPACKED: usize = 1 << 30;

/// Records shorter than this are stored as they are: LZ4 saves little on them and costs a
/// zeroed hash table per call (measured: most of the writer's LZ4 time).
const PACK_FROM: usize = 512;

/// A record's JSON as stored: LZ4-packed when that makes it smaller.
pub fn pack(json: Vec<u8>) -> Vec<u8> {
    let Ok(len) = u32::try_from(json.len()) else {
        return json;
    };
    if json.len() < PACK_FROM {
        return json;
    }
    let compressed = lz4_flex::block::compress(&json);
    if compressed.len() + 5 >= json.len() {
        return json;
    }
    let mut out = Vec::with_capacity(compressed.len() + 5);
    out.push(PACKED);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&compressed);
    out
}

/// A stored record's JSON, packed or plain.
pub fn unpack(bytes: &[u8]) -> Result<std::borrow::Cow<'_, [u8]>, DecodeError> {
    let Some((&PACKED, rest)) = bytes.split_first() else {
        return Ok(std::borrow::Cow::Borrowed(bytes));
    };
    let mut frame = Frame(rest);
    let len = u32::from_le_bytes(frame.array()?) as usize;
    if len > MAX_UNPACKED {
        return Err(DecodeError("packed record claims an impossible size"));
    }
    lz4_flex::block::decompress(frame.0, len)
        .map(std::borrow::Cow::Owned)
        .map_err(|_| DecodeError("packed record does not inflate"))
}

/// First byte of a result record whose body (HTTP) or output (SSH) follows its JSON as
/// raw bytes.
const RAW_BODY: u8 = 0xB5;
/// Bodies whose base64 is shorter than this (~768 bytes) stay inside the result's JSON.
const RAW_BODY_FROM: usize = 1024;

/// A result record as stored. An HTTP body or SSH output of some size leaves the JSON and
/// follows it as raw bytes: base64 is 4/3 of the bytes, and fjall writes a result twice
/// (its journal, then a blob file). Then packed when that pays, as every record.
///
/// Raw-body frame: tag, the JSON's length (varint), the JSON (with `body_base64` null, or
/// `stdout_base64` and `stderr_base64` empty), then each body (HTTP: the body; SSH: stdout,
/// stderr) as its length (varint) and its bytes.
pub fn encode_result(result: &StoredResult) -> Result<Vec<u8>, serde_json::Error> {
    match split_bodies(result) {
        Some((bare, bodies)) => raw_frame(&serde_json::to_vec(&bare)?, &bodies),
        None => serde_json::to_vec(result).map(pack),
    }
}

/// A kept request as stored: a body from `RAW_BODY_FROM` on as raw bytes, as a result's.
pub fn encode_request(request: &StoredRequest) -> Result<Vec<u8>, serde_json::Error> {
    let body = request.body_base64.as_deref();
    let Some(raw) = body.filter(|b| b.len() >= RAW_BODY_FROM).and_then(unb64) else {
        return serde_json::to_vec(request).map(pack);
    };
    let bare = StoredRequest {
        invocation_id: request.invocation_id.clone(),
        method: request.method.clone(),
        target: request.target.clone(),
        headers: request.headers.clone(),
        body_base64: None,
        body_bytes: request.body_bytes,
        headers_incomplete: request.headers_incomplete,
        expires_at_ms: request.expires_at_ms,
    };
    raw_frame(&serde_json::to_vec(&bare)?, &[raw])
}

/// A stored kept request, whichever way `encode_request` (or an older build) wrote it.
pub fn decode_request(bytes: &[u8]) -> Result<StoredRequest, DecodeError> {
    decode_framed(
        bytes,
        "request JSON does not parse",
        |request: &mut StoredRequest, frame| {
            if request.body_base64.is_some() {
                return Err(DecodeError(
                    "raw bytes beside a request that holds its body",
                ));
            }
            request.body_base64 = Some(b64(frame.body()?));
            Ok(())
        },
    )
}

/// A record stored as JSON, plain or packed, or in a raw-body frame, whose bodies `fill`
/// puts back into it.
fn decode_framed<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    bad_json: &'static str,
    fill: impl FnOnce(&mut T, &mut Frame<'_>) -> Result<(), DecodeError>,
) -> Result<T, DecodeError> {
    let unpacked = unpack(bytes)?;
    let (json, frame) = match unpacked.split_first() {
        Some((&RAW_BODY, rest)) => {
            let mut frame = Frame(rest);
            (frame.body()?, Some(frame))
        }
        Some((b'{', _)) => (&unpacked[..], None),
        Some(_) => return Err(NEWER_FORMAT),
        None => return Err(DecodeError(bad_json)),
    };
    let mut record: T = serde_json::from_slice(json).map_err(|_| DecodeError(bad_json))?;
    if let Some(mut frame) = frame {
        fill(&mut record, &mut frame)?;
        frame.end()?;
    }
    Ok(record)
}

/// The raw-body frame around a record's JSON and its bodies, packed when that pays.
fn raw_frame(json: &[u8], bodies: &[Vec<u8>]) -> Result<Vec<u8>, serde_json::Error> {
    let size: usize = bodies.iter().map(Vec::len).sum();
    let mut out = Vec::with_capacity(20 + json.len() + size);
    out.push(RAW_BODY);
    for part in std::iter::once(json).chain(bodies.iter().map(Vec::as_slice)) {
        varint(&mut out, part.len() as u64);
        out.extend_from_slice(part);
    }
    Ok(pack(out))
}

/// The result without its base64 bodies, and those bodies as bytes; `None` when they are
/// small (or not base64), and the JSON is stored as it is.
fn split_bodies(result: &StoredResult) -> Option<(StoredResult, Vec<Vec<u8>>)> {
    let (payload, bodies) = match &result.payload {
        Payload::Http(http) => {
            let body = http.body_base64.as_deref();
            let raw = body.filter(|b| b.len() >= RAW_BODY_FROM).and_then(unb64)?;
            let bare = HttpResult {
                status: http.status,
                headers: http.headers.clone(),
                body_base64: None,
                body_stored: http.body_stored,
                digest: http.digest.clone(),
                bytes: http.bytes,
                grpc_status: http.grpc_status,
                trailers: http.trailers.clone(),
            };
            (Payload::Http(bare), vec![raw])
        }
        Payload::Ssh(ssh) if ssh.stdout_base64.len() + ssh.stderr_base64.len() >= RAW_BODY_FROM => {
            let raw = vec![unb64(&ssh.stdout_base64)?, unb64(&ssh.stderr_base64)?];
            let bare = SshResult {
                exit_status: ssh.exit_status,
                exit_signal: ssh.exit_signal.clone(),
                stdout_base64: String::new(),
                stderr_base64: String::new(),
                output_stored: ssh.output_stored,
            };
            (Payload::Ssh(bare), raw)
        }
        _ => return None,
    };
    let bare = StoredResult {
        invocation_id: result.invocation_id.clone(),
        outcome: result.outcome,
        payload,
        complete: result.complete,
        expires_at_ms: result.expires_at_ms,
    };
    Some((bare, bodies))
}

/// A stored result record, whichever way `encode_result` (or an older build) wrote it.
pub fn decode_result(bytes: &[u8]) -> Result<StoredResult, DecodeError> {
    decode_framed(
        bytes,
        "result JSON does not parse",
        |result: &mut StoredResult, frame| {
            match &mut result.payload {
                Payload::Http(http) if http.body_base64.is_none() => {
                    http.body_base64 = Some(b64(frame.body()?));
                }
                Payload::Ssh(ssh)
                    if ssh.stdout_base64.is_empty() && ssh.stderr_base64.is_empty() =>
                {
                    ssh.stdout_base64 = b64(frame.body()?);
                    ssh.stderr_base64 = b64(frame.body()?);
                }
                _ => {
                    return Err(DecodeError(
                        "raw bytes beside a result that holds its body or has none",
                    ));
                }
            }
            Ok(())
        },
    )
}

/// First byte of a result record whose body (HTTP) or output (SSH) is in a body file
/// (`bodies`): tag, the JSON's length (varint), the JSON (bodies left out as in the
/// raw-body frame), the `BodyRef`, then the length (varint) of each part but the last (SSH:
/// stdout's; the file holds stdout then stderr).
const BODY_IN_FILE: u8 = 0xB7;

/// The result without its bodies, and those bodies, when together they are large enough
/// for a body file.
pub fn body_for_file(result: &StoredResult) -> Option<(StoredResult, Vec<Vec<u8>>)> {
    let (bare, bodies) = split_bodies(result)?;
    let size: usize = bodies.iter().map(Vec::len).sum();
    (size >= BODY_FILE_FROM).then_some((bare, bodies))
}

/// The record of a result (from `body_for_file`) whose `bodies` are at `at`, one after
/// another.
pub fn encode_result_in_file(
    bare: &StoredResult,
    at: BodyRef,
    bodies: &[Vec<u8>],
) -> Result<Vec<u8>, serde_json::Error> {
    let json = serde_json::to_vec(bare)?;
    let mut out = Vec::with_capacity(json.len() + 20 + BodyRef::BYTES);
    out.push(BODY_IN_FILE);
    varint(&mut out, json.len() as u64);
    out.extend_from_slice(&json);
    out.extend_from_slice(&at.to_bytes());
    let but_last = bodies.split_last().map_or(&[][..], |(_, init)| init);
    for body in but_last {
        varint(&mut out, body.len() as u64);
    }
    Ok(out)
}

/// A stored result record: whole, or with its bodies in a body file (and where each but
/// the last ends).
#[derive(Debug)]
pub enum ResultRow {
    Whole(StoredResult),
    InFile(StoredResult, BodyRef, Vec<u64>),
}

/// A stored result record, whichever way it was written.
pub fn decode_result_row(bytes: &[u8]) -> Result<ResultRow, DecodeError> {
    let Some((&BODY_IN_FILE, rest)) = bytes.split_first() else {
        return decode_result(bytes).map(ResultRow::Whole);
    };
    let mut frame = Frame(rest);
    let json = frame.body()?;
    let result: StoredResult =
        serde_json::from_slice(json).map_err(|_| DecodeError("result JSON does not parse"))?;
    let at = BodyRef::from_bytes(frame.take(BodyRef::BYTES)?)
        .ok_or(DecodeError("result body reference is malformed"))?;
    let mut splits = Vec::new();
    while !frame.0.is_empty() && splits.len() < 2 {
        splits.push(frame.varint()?);
    }
    frame.end()?;
    let fits = match &result.payload {
        Payload::Http(http) => http.body_base64.is_none() && splits.is_empty(),
        Payload::Ssh(ssh) => {
            ssh.stdout_base64.is_empty() && ssh.stderr_base64.is_empty() && splits.len() == 1
        }
        Payload::Tunnel(_) => false,
    };
    match fits {
        true => Ok(ResultRow::InFile(result, at, splits)),
        false => Err(DecodeError(
            "a body file beside a result that holds its body or has none",
        )),
    }
}

/// Puts the bodies read from a body file back into their result.
pub fn fill_bodies(
    result: &mut StoredResult,
    bytes: &[u8],
    splits: &[u64],
) -> Result<(), DecodeError> {
    let cut = |at: u64| {
        usize::try_from(at)
            .ok()
            .and_then(|at| bytes.split_at_checked(at))
            .ok_or(DecodeError("a body file part runs past its body"))
    };
    match (&mut result.payload, splits) {
        (Payload::Http(http), []) => http.body_base64 = Some(b64(bytes)),
        (Payload::Ssh(ssh), [stdout]) => {
            let (out, err) = cut(*stdout)?;
            ssh.stdout_base64 = b64(out);
            ssh.stderr_base64 = b64(err);
        }
        _ => return Err(DecodeError("body file parts do not fit their result")),
    }
    Ok(())
}

/// A stored value in a form this build does not know: the tags above are all it reads.
const NEWER_FORMAT: DecodeError = DecodeError(
    "a storage format this postern does not know (written by a newer postern? run that one)",
);

/// Why stored bytes are not an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub &'static str);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// The stored bytes of a sealed event. An event the frame cannot hold (a field over 255
/// bytes, a hash not in `sha256:<hex>` form) is stored as JSON instead.
pub fn encode(event: &Event) -> Vec<u8> {
    compact(event).unwrap_or_else(|| serde_json::to_vec(event).unwrap_or_default())
}

/// A sealed event stored alone (what a group frame cannot hold): its `data` is the JSON
/// its hash was computed over, as the writer leaves `event.data` empty.
pub fn encode_sealed(sealed: &Sealed) -> Vec<u8> {
    let mut event = sealed.event.clone();
    event.data = serde_json::from_slice(&sealed.data_json).unwrap_or_default();
    encode(&event)
}

fn compact(event: &Event) -> Option<Vec<u8>> {
    let data = serde_json::to_vec(&event.data).ok()?;
    let mut out = Vec::with_capacity(96 + event.invocation_id.len() + data.len());
    out.push(COMPACT);
    out.extend_from_slice(&event.seq.to_le_bytes());
    out.extend_from_slice(&digest(&event.prev_hash)?);
    out.extend_from_slice(&digest(&event.hash)?);
    out.extend_from_slice(&event.attempt.to_le_bytes());
    out.extend_from_slice(&event.generation.to_le_bytes());
    out.push(kind_code(event.kind));
    out.push(source_code(event.source));
    for text in [&event.invocation_id, &event.hop, &event.ts] {
        out.push(u8::try_from(text.len()).ok()?);
        out.extend_from_slice(text.as_bytes());
    }
    out.extend_from_slice(&data);
    Some(out)
}

/// The events of one write (a commit group: consecutive seqs, several invocations) as one
/// stored value, keyed by its first seq. What the events share is stored once: the first
/// `prev_hash` (each later one is the hash before it), each run's invocation id, and a
/// `hop` or `ts` equal to the previous event's. One value a group instead of one a run: at
/// c=32 the value passes fjall's 4 KiB line and its journal compresses it (measured: 4.6 →
/// 3.4 KB written per small GET). `None` when the frame cannot hold one of them (see `encode`).
///
/// Group: tag, run count (varint), first prev digest (32 bytes); per run its invocation id
/// (length byte and UTF-8) and event count (varint); per event its attempt and generation
/// (varints), kind and source codes, a flags byte (1: hop as before, 2: ts as before), the
/// hop and ts that are new (length byte and UTF-8), and `data` as JSON behind its length
/// (varint); last the digest of the last event (32 bytes). The other digests are computed
/// when read (one SHA-256 over each event's canonical bytes), which saves 32 incompressible
/// bytes per event, written twice.
pub fn encode_group(events: &[Sealed]) -> Option<Vec<u8>> {
    frame_group(events, Digests::Last)
}

/// Which event digests a group stores.
#[derive(Clone, Copy, PartialEq)]
enum Digests {
    /// Each before its event (`GROUP`, and runs).
    Each,
    /// Only the last, after the events (`CHAINED`); the others are computed when read.
    Last,
}

fn frame_group(events: &[Sealed], digests: Digests) -> Option<Vec<u8>> {
    let first = &events.first()?.event;
    let runs: Vec<&[Sealed]> = events
        .chunk_by(|a, b| a.event.invocation_id == b.event.invocation_id)
        .collect();
    let mut out = Vec::with_capacity(64 + events.len() * 160);
    out.push(match digests {
        Digests::Each => GROUP,
        Digests::Last => CHAINED,
    });
    varint(&mut out, runs.len() as u64);
    out.extend_from_slice(&digest(&first.prev_hash)?);
    let mut previous: Option<&Event> = None;
    for run in runs {
        text(&mut out, &run[0].event.invocation_id)?;
        varint(&mut out, run.len() as u64);
        for sealed in run {
            write_event(
                &mut out,
                (&sealed.event, &sealed.data_json),
                previous,
                digests,
            )?;
            previous = Some(&sealed.event);
        }
    }
    if digests == Digests::Last {
        out.extend_from_slice(&digest(&previous?.hash)?);
    }
    Some(out)
}

/// One event of a run or group, after the one before it (`None` for the first).
/// `data` is the event's `data` as JSON.
fn write_event(
    out: &mut Vec<u8>,
    (event, data): (&Event, &[u8]),
    previous: Option<&Event>,
    digests: Digests,
) -> Option<()> {
    if previous.is_some_and(|p| p.hash != event.prev_hash || p.seq + 1 != event.seq) {
        return None;
    }
    if digests == Digests::Each {
        out.extend_from_slice(&digest(&event.hash)?);
    }
    varint(out, u64::from(event.attempt));
    varint(out, u64::from(event.generation));
    out.push(kind_code(event.kind));
    out.push(source_code(event.source));
    let same_hop = previous.is_some_and(|p| p.hop == event.hop);
    let same_ts = previous.is_some_and(|p| p.ts == event.ts);
    out.push(u8::from(same_hop) | u8::from(same_ts) << 1);
    if !same_hop {
        text(out, &event.hop)?;
    }
    if !same_ts {
        text(out, &event.ts)?;
    }
    varint(out, data.len() as u64);
    out.extend_from_slice(data);
    Some(())
}

/// A run of consecutive events of one invocation: how one append was stored before
/// groups (tag, count, first prev digest, invocation id, then the events as in a group).
#[cfg(test)]
pub fn encode_run(events: &[Event]) -> Option<Vec<u8>> {
    let first = events.first()?;
    let mut out = vec![RUN];
    varint(&mut out, events.len() as u64);
    out.extend_from_slice(&digest(&first.prev_hash)?);
    text(&mut out, &first.invocation_id)?;
    let mut previous: Option<&Event> = None;
    for event in events {
        if event.invocation_id != first.invocation_id {
            return None;
        }
        let data = serde_json::to_vec(&event.data).ok()?;
        write_event(&mut out, (event, &data), previous, Digests::Each)?;
        previous = Some(event);
    }
    Some(out)
}

/// The events of one stored value under key `key`: a group, a run, or one event of either
/// single-event format.
pub fn decode_stored(key: u64, bytes: &[u8]) -> Result<Vec<Event>, DecodeError> {
    decode_stored_within(key, bytes, 0..u64::MAX)
}

/// `decode_stored`, keeping only the events whose seq is in `seqs`: the `data` of the
/// others is skipped, not parsed (a group holds many invocations' events).
pub fn decode_stored_within(
    key: u64,
    bytes: &[u8],
    seqs: std::ops::Range<u64>,
) -> Result<Vec<Event>, DecodeError> {
    decode_stored_hashing(key, bytes, seqs, Hashes::Computed)
}

/// Whether a decoder gives each event its hash. A group stores only its last event's
/// digest, so every other event's is computed, those skipped over included: a projection,
/// which never reads them, asks for none (a group read for one invocation is otherwise
/// mostly SHA-256 over the other invocations' events).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hashes {
    Computed,
    /// `hash` and `prev_hash` are left empty where they are not stored.
    Skipped,
}

/// `decode_stored_within`, with or without the hashes a group does not store.
pub fn decode_stored_hashing(
    key: u64,
    bytes: &[u8],
    seqs: std::ops::Range<u64>,
    hashes: Hashes,
) -> Result<Vec<Event>, DecodeError> {
    let mut events = match bytes.split_first() {
        Some((&GROUP, rest)) => return Frame(rest).group(key, &seqs, (Digests::Each, hashes)),
        Some((&CHAINED, rest)) => return Frame(rest).group(key, &seqs, (Digests::Last, hashes)),
        Some((&RUN, rest)) => Frame(rest).run(key)?,
        _ => vec![decode(bytes)?],
    };
    events.retain(|e| seqs.contains(&e.seq));
    Ok(events)
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn text(out: &mut Vec<u8>, t: &str) -> Option<()> {
    out.push(u8::try_from(t.len()).ok()?);
    out.extend_from_slice(t.as_bytes());
    Some(())
}

/// The event in stored bytes of either single-event format.
pub fn decode(bytes: &[u8]) -> Result<Event, DecodeError> {
    match bytes.first() {
        Some(&COMPACT) => Frame(&bytes[1..]).event(),
        Some(b'{') => {
            serde_json::from_slice(bytes).map_err(|_| DecodeError("event JSON does not parse"))
        }
        Some(_) => Err(NEWER_FORMAT),
        None => Err(DecodeError("empty event")),
    }
}

/// The unread rest of a compact frame.
struct Frame<'a>(&'a [u8]);

/// What a run or group's next event takes from the one before it.
struct Chain {
    seq: u64,
    prev_hash: String,
    hop: String,
    ts: String,
}

impl<'a> Frame<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError("event frame cut short"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn text(&mut self) -> Result<String, DecodeError> {
        let [len] = self.array::<1>()?;
        let bytes = self.take(usize::from(len))?;
        String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError("event text is not UTF-8"))
    }

    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let [b] = self.array::<1>()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(DecodeError("varint too long"))
    }

    /// A length (varint) and that many bytes.
    fn body(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = usize::try_from(self.varint()?).map_err(|_| DecodeError("body too long"))?;
        self.take(len)
    }

    fn small(&mut self) -> Result<u32, DecodeError> {
        u32::try_from(self.varint()?).map_err(|_| DecodeError("counter out of range"))
    }

    fn digest(&mut self) -> Result<String, DecodeError> {
        Ok(super::event::sha256_tagged_digest(&self.array::<32>()?))
    }

    fn run(mut self, key: u64) -> Result<Vec<Event>, DecodeError> {
        let count = self.count(Digests::Each)?;
        let mut chain = self.chain_from(key)?;
        let invocation_id = self.text()?;
        let mut out = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let how = (true, Digests::Each, Hashes::Computed);
            out.extend(self.next_event(&mut chain, &invocation_id, how)?);
        }
        self.end()?;
        Ok(out)
    }

    fn group(
        mut self,
        key: u64,
        seqs: &std::ops::Range<u64>,
        (digests, hashes): (Digests, Hashes),
    ) -> Result<Vec<Event>, DecodeError> {
        let runs = self.count(digests)?;
        let mut chain = self.chain_from(key)?;
        let mut out = Vec::new();
        for _ in 0..runs {
            let invocation_id = self.text()?;
            for _ in 0..self.count(digests)? {
                let wanted = seqs.contains(&chain.seq);
                let how = (wanted, digests, hashes);
                out.extend(self.next_event(&mut chain, &invocation_id, how)?);
            }
        }
        if digests == Digests::Last {
            // The last event carries the stored digest, not the computed one: the chain goes
            // on from it, and a changed event anywhere in the group fails that event's hash.
            let stored = self.digest()?;
            let last_seq = chain.seq.saturating_sub(1);
            if let Some(last) = out.last_mut().filter(|e| e.seq == last_seq) {
                last.hash = stored;
            }
        }
        self.end()?;
        Ok(out)
    }

    /// The chain state before the first event of a run or group stored under `key`.
    fn chain_from(&mut self, key: u64) -> Result<Chain, DecodeError> {
        Ok(Chain {
            seq: key,
            prev_hash: self.digest()?,
            hop: String::new(),
            ts: String::new(),
        })
    }

    /// A count of events or runs: each takes at least 37 bytes (6 in a group storing only
    /// the last digest), so a damaged count cannot make a decoder allocate or loop far.
    fn count(&mut self, digests: Digests) -> Result<u64, DecodeError> {
        let least = match digests {
            Digests::Each => 37,
            Digests::Last => 6,
        };
        let count = self.varint()?;
        if count == 0 || count > (self.0.len() / least) as u64 {
            return Err(DecodeError("run count does not fit its bytes"));
        }
        Ok(count)
    }

    fn end(&self) -> Result<(), DecodeError> {
        match self.0.is_empty() {
            true => Ok(()),
            false => Err(DecodeError("bytes after the end of the frame")),
        }
    }

    /// The next event of a run or group; its `data` is parsed only if `wanted`. Where its
    /// digest is not stored, it is computed: the next event's `prev_hash` needs it.
    fn next_event(
        &mut self,
        chain: &mut Chain,
        invocation_id: &str,
        (wanted, digests, hashes): (bool, Digests, Hashes),
    ) -> Result<Option<Event>, DecodeError> {
        let stored = match digests {
            Digests::Each => Some(self.digest()?),
            Digests::Last => None,
        };
        let attempt = self.small()?;
        let generation = self.small()?;
        let [kind, source, flags] = self.array::<3>()?;
        let kind = kind_of(kind).ok_or(DecodeError("unknown event kind code"))?;
        let source = source_of(source).ok_or(DecodeError("unknown event source code"))?;
        if flags & 1 == 0 {
            chain.hop = self.text()?;
        }
        if flags & 2 == 0 {
            chain.ts = self.text()?;
        }
        let len = usize::try_from(self.varint()?).map_err(|_| DecodeError("data too long"))?;
        let data = self.take(len)?;
        let seq = chain.seq;
        chain.seq = seq.saturating_add(1);
        let unhashed = stored.is_none() && hashes == Hashes::Skipped;
        if let Some(hash) = stored.as_ref().filter(|_| !wanted) {
            chain.prev_hash.clone_from(hash);
            return Ok(None);
        }
        if unhashed && !wanted {
            return Ok(None);
        }
        let mut event = Event {
            seq,
            invocation_id: invocation_id.to_owned(),
            attempt,
            generation,
            ts: chain.ts.clone(),
            kind,
            source,
            hop: chain.hop.clone(),
            data: serde_json::Value::Null,
            prev_hash: chain.prev_hash.clone(),
            hash: String::new(),
        };
        match (stored, unhashed) {
            (_, true) => event.prev_hash.clear(),
            (Some(hash), false) => event.hash = hash,
            (None, false) => event.hash = event.hash_over(data),
        }
        chain.prev_hash.clone_from(&event.hash);
        if !wanted {
            return Ok(None);
        }
        event.data =
            serde_json::from_slice(data).map_err(|_| DecodeError("event data does not parse"))?;
        Ok(Some(event))
    }

    fn event(mut self) -> Result<Event, DecodeError> {
        let seq = u64::from_le_bytes(self.array()?);
        let prev_hash = super::event::sha256_tagged_digest(&self.array::<32>()?);
        let hash = super::event::sha256_tagged_digest(&self.array::<32>()?);
        let attempt = u32::from_le_bytes(self.array()?);
        let generation = u32::from_le_bytes(self.array()?);
        let [kind] = self.array::<1>()?;
        let kind = kind_of(kind).ok_or(DecodeError("unknown event kind code"))?;
        let [source] = self.array::<1>()?;
        let source = source_of(source).ok_or(DecodeError("unknown event source code"))?;
        let invocation_id = self.text()?;
        let hop = self.text()?;
        let ts = self.text()?;
        let data =
            serde_json::from_slice(self.0).map_err(|_| DecodeError("event data does not parse"))?;
        Ok(Event {
            seq,
            invocation_id,
            attempt,
            generation,
            ts,
            kind,
            source,
            hop,
            data,
            prev_hash,
            hash,
        })
    }
}

/// The 32 bytes of a `sha256:<hex>` hash.
fn digest(tagged: &str) -> Option<[u8; 32]> {
    let hex = tagged.strip_prefix(HASH_PREFIX)?.as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; 32];
    for (i, pair) in hex.chunks_exact(2).enumerate() {
        out[i] = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

// Codes are stored: never renumber one, add new kinds at the end.
fn kind_code(kind: EventKind) -> u8 {
    use EventKind::*;
    match kind {
        ActionAccepted => 1,
        PreflightValidated => 2,
        CredentialAuthorized => 3,
        ApprovalRequested => 4,
        ApprovalGranted => 5,
        ApprovalDenied => 6,
        ConnectAttempt => 7,
        DispatchStarted => 8,
        RequestSent => 9,
        RemoteResponseStarted => 10,
        RemoteResponseComplete => 11,
        ResultCommitted => 12,
        ResultDelivered => 13,
        Failed => 14,
        Reconciled => 15,
        RetryLeased => 16,
        ConfigReloaded => 17,
        JournalPruned => 18,
        AgentSuspended => 19,
        AgentResumed => 20,
        InvocationAdopted => 21,
    }
}

fn kind_of(code: u8) -> Option<EventKind> {
    EventKind::ALL
        .iter()
        .copied()
        .find(|k| kind_code(*k) == code)
}

fn source_code(source: Source) -> u8 {
    match source {
        Source::TransportObserved => 1,
        Source::RemoteResponse => 2,
        Source::RemoteQuery => 3,
        Source::OperatorAttested => 4,
        Source::Recovery => 5,
    }
}

fn source_of(code: u8) -> Option<Source> {
    [
        Source::TransportObserved,
        Source::RemoteResponse,
        Source::RemoteQuery,
        Source::OperatorAttested,
        Source::Recovery,
    ]
    .into_iter()
    .find(|s| source_code(*s) == code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealed(kind: EventKind, data: serde_json::Value) -> Event {
        let mut e = Event {
            seq: 42,
            invocation_id: "act_01M91EVH0GQJG1K8Y6ECDTQ52H".into(),
            attempt: 1,
            generation: 2,
            ts: "2026-12-04T21:20:08.209Z".into(),
            kind,
            source: Source::TransportObserved,
            hop: "origin".into(),
            data,
            prev_hash: super::super::event::sha256_tagged(b"prev"),
            hash: String::new(),
        };
        e.seal();
        e
    }

    #[test]
    fn every_kind_and_source_round_trips_and_keeps_its_hash() {
        for kind in EventKind::ALL {
            for source in [
                Source::TransportObserved,
                Source::RemoteResponse,
                Source::RemoteQuery,
                Source::OperatorAttested,
                Source::Recovery,
            ] {
                let mut e = sealed(*kind, serde_json::json!({"n": 1, "s": "é\"x"}));
                e.source = source;
                e.seal();
                let bytes = encode(&e);
                assert_eq!(bytes[0], COMPACT);
                let back = decode(&bytes).unwrap_or_else(|err| panic!("{kind:?}: {err}"));
                assert_eq!(back, e);
                assert_eq!(back.compute_hash(), back.hash);
            }
        }
    }

    #[test]
    fn the_frame_is_smaller_than_the_json_and_old_json_frames_still_decode() {
        let e = sealed(
            EventKind::ConnectAttempt,
            serde_json::json!({"stage": "tcp_connect", "ok": true}),
        );
        let json = serde_json::to_vec(&e).unwrap_or_default();
        let frame = encode(&e);
        assert!(
            frame.len() * 3 < json.len() * 2,
            "{} vs {}",
            frame.len(),
            json.len()
        );
        assert_eq!(decode(&json), Ok(e));
    }

    #[test]
    fn what_the_frame_cannot_hold_is_stored_as_json() {
        let mut e = sealed(EventKind::Failed, serde_json::Value::Null);
        e.hop = "h".repeat(300);
        let bytes = encode(&e);
        assert_eq!(bytes[0], b'{');
        assert_eq!(decode(&bytes), Ok(e));
    }

    #[test]
    fn records_are_packed_when_it_pays_and_always_unpack_to_their_json() {
        let state =
            serde_json::to_vec(&serde_json::json!({"record": {"evidence": "x".repeat(600)}}))
                .unwrap_or_default();
        let packed = pack(state.clone());
        assert_eq!(packed[0], PACKED);
        assert!(packed.len() < state.len() / 4);
        assert_eq!(unpack(&packed).as_deref(), Ok(state.as_slice()));
        let small = b"{}".to_vec();
        assert_eq!(pack(small.clone()), small, "not worth packing");
        assert_eq!(unpack(&small).as_deref(), Ok(&b"{}"[..]));
        let mut lying = packed.clone();
        lying[1..5].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(unpack(&lying).is_err());
        for n in 0..packed.len() {
            let _ = unpack(&packed[..n]);
        }
    }

    fn http_result(body: &[u8]) -> StoredResult {
        StoredResult {
            invocation_id: "act_01M91EVH0GQJG1K8Y6ECDTQ52H".into(),
            outcome: crate::contract::Outcome::Committed,
            payload: Payload::Http(HttpResult {
                status: 200,
                headers: vec![("content-type".into(), "application/octet-stream".into())],
                body_base64: Some(b64(body)),
                body_stored: true,
                digest: super::super::event::sha256_tagged(body),
                bytes: body.len() as u64,
                grpc_status: None,
                trailers: Vec::new(),
            }),
            complete: true,
            expires_at_ms: 1_800_000_000_000,
        }
    }

    #[test]
    fn a_large_http_body_is_stored_raw_beside_its_json_and_reads_back_whole() {
        // Bytes LZ4 cannot shrink, so the raw frame's size shows.
        let body: Vec<u8> = (0u32..65_536)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let result = http_result(&body);
        let Ok(stored) = encode_result(&result) else {
            panic!("encodes");
        };
        let json = serde_json::to_vec(&result).unwrap_or_default();
        assert!(
            stored.len() < body.len() + 1024,
            "{} vs body {}",
            stored.len(),
            body.len()
        );
        assert!(json.len() > body.len() * 4 / 3);
        assert_eq!(decode_result(&stored), Ok(result));
        // A small body stays in the JSON; what older builds wrote (plain or packed) still reads.
        let small = http_result(b"{\"ok\":true}");
        let Ok(stored) = encode_result(&small) else {
            panic!("encodes");
        };
        assert_eq!(stored.first(), Some(&b'{'));
        assert_eq!(decode_result(&stored), Ok(small.clone()));
        let old = pack(serde_json::to_vec(&http_result(&[b'a'; 4000])).unwrap_or_default());
        assert_eq!(old.first(), Some(&PACKED));
        assert_eq!(decode_result(&old), Ok(http_result(&[b'a'; 4000])));
    }

    #[test]
    fn large_ssh_output_is_stored_raw_and_reads_back_whole() {
        let stdout: Vec<u8> = (0u32..5000).map(|i| (i * 13 % 256) as u8).collect();
        let ssh = |out: &[u8], err: &[u8]| StoredResult {
            payload: Payload::Ssh(SshResult {
                exit_status: Some(3),
                exit_signal: None,
                stdout_base64: b64(out),
                stderr_base64: b64(err),
                output_stored: true,
            }),
            ..http_result(b"")
        };
        let big = ssh(&stdout, b"warning\n");
        round_trip(encode_result, decode_result, big, ssh(b"ok\n", b""));
    }

    /// `big` is stored in a raw-body frame and `small` as JSON, and both read back; the
    /// big one's frame, unpacked.
    fn round_trip<T: PartialEq + std::fmt::Debug>(
        encode: impl Fn(&T) -> Result<Vec<u8>, serde_json::Error>,
        decode: impl Fn(&[u8]) -> Result<T, DecodeError>,
        big: T,
        small: T,
    ) -> Vec<u8> {
        let (Ok(stored), Ok(plain)) = (encode(&big), encode(&small)) else {
            panic!("encodes");
        };
        let inner = unpack(&stored).map(|c| c.into_owned()).unwrap_or_default();
        assert_eq!(inner.first(), Some(&RAW_BODY));
        assert_eq!(decode(&stored), Ok(big));
        assert_eq!(plain.first(), Some(&b'{'));
        assert_eq!(decode(&plain), Ok(small));
        inner
    }

    #[test]
    fn a_kept_request_s_body_is_stored_raw_and_reads_back_whole() {
        let request = |body: &[u8]| StoredRequest {
            invocation_id: "act_01M91EVH0GQJG1K8Y6ECDTQ52H".into(),
            method: "POST".into(),
            target: "https://api.example.test/v1/charges".into(),
            headers: vec![("content-type".into(), "application/json".into())],
            body_base64: Some(b64(body)),
            body_bytes: body.len() as u64,
            headers_incomplete: false,
            expires_at_ms: 1_800_000_000_000,
        };
        let body: Vec<u8> = (0u32..2048).map(|i| (i * 31 % 253) as u8).collect();
        let inner = round_trip(
            encode_request,
            decode_request,
            request(&body),
            request(b"{}"),
        );
        assert!(inner.len() < body.len() + 300, "{}", inner.len());
        for n in 0..inner.len() {
            assert!(decode_request(&inner[..n]).is_err(), "cut at {n}");
        }
    }

    #[test]
    fn a_cut_or_damaged_raw_body_frame_is_an_error_not_a_panic() {
        let body: Vec<u8> = (0u32..4096).map(|i| (i * 7 % 251) as u8).collect();
        let Ok(stored) = encode_result(&http_result(&body)) else {
            panic!("encodes");
        };
        let Some(inner) = unpack(&stored).ok().map(|c| c.into_owned()) else {
            panic!("unpacks");
        };
        assert_eq!(inner.first(), Some(&RAW_BODY));
        for n in 0..inner.len() {
            assert!(decode_result(&inner[..n]).is_err(), "cut at {n}");
        }
        let mut lying = inner.clone();
        lying[1] = 0xff;
        assert!(decode_result(&lying).is_err());
        // A raw body beside JSON that carries one too is refused, not merged.
        let json = serde_json::to_vec(&http_result(b"x")).unwrap_or_default();
        let mut both = vec![RAW_BODY];
        varint(&mut both, json.len() as u64);
        both.extend_from_slice(&json);
        varint(&mut both, 4);
        both.extend_from_slice(b"more");
        assert!(decode_result(&both).is_err());
    }

    /// Three chained events of one invocation, the last with another hop and ts.
    fn chained() -> Vec<Event> {
        let mut run = vec![sealed(
            EventKind::ActionAccepted,
            serde_json::json!({"m": "GET"}),
        )];
        for (kind, hop, ts) in [
            (
                EventKind::PreflightValidated,
                "origin",
                "2026-12-04T21:20:08.209Z",
            ),
            (
                EventKind::DispatchStarted,
                "postern",
                "2026-12-04T21:20:09.001Z",
            ),
        ] {
            let Some(before) = run.last() else { break };
            let mut e = before.clone();
            (e.seq, e.kind, e.hop, e.ts) = (before.seq + 1, kind, hop.into(), ts.into());
            (e.prev_hash, e.generation) = (before.hash.clone(), 300);
            e.seal();
            run.push(e);
        }
        run
    }

    #[test]
    fn a_run_round_trips_every_event_and_its_hash_and_is_smaller_than_its_frames() {
        let run = chained();
        let Some(bytes) = encode_run(&run) else {
            panic!("the run frame holds these");
        };
        assert_eq!(bytes[0], RUN);
        let frames: usize = run.iter().map(|e| encode(e).len()).sum();
        assert!(bytes.len() + 150 < frames, "{} vs {frames}", bytes.len());
        let back = decode_stored(42, &bytes).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, run);
        assert!(back.iter().all(|e| e.compute_hash() == e.hash));
        // A single event's value decodes as a run of one.
        assert_eq!(
            decode_stored(42, &encode(&run[0])),
            Ok(vec![run[0].clone()])
        );
    }

    /// Two invocations' runs chained one after the other, as one commit group writes them.
    fn grouped() -> Vec<Event> {
        let mut events = chained();
        let Some(last) = events.last().cloned() else {
            return events;
        };
        let mut other = last.clone();
        (other.seq, other.invocation_id) = (last.seq + 1, "act_01M91EVH0GQJG1K8Y6ECDTQ99Z".into());
        (other.kind, other.prev_hash) = (EventKind::ResultDelivered, last.hash.clone());
        other.data = serde_json::json!({"bytes": 3});
        other.seal();
        events.push(other);
        events
    }

    fn sealed_all(events: &[Event]) -> Vec<Sealed> {
        events.iter().cloned().map(Event::sealed).collect()
    }

    #[test]
    fn a_group_read_for_a_projection_skips_the_hashes_it_does_not_store() {
        let events = grouped();
        let Some(bytes) = encode_group(&sealed_all(&events)) else {
            panic!("the group frame holds these");
        };
        let read = |seqs| decode_stored_hashing(42, &bytes, seqs, Hashes::Skipped);
        let all = read(0..u64::MAX).unwrap_or_else(|e| panic!("{e}"));
        let unhashed = |e: &Event| {
            let mut e = e.clone();
            e.prev_hash.clear();
            e.hash.clear();
            e
        };
        let last = events.len() - 1;
        assert_eq!(
            all[..last],
            events[..last].iter().map(unhashed).collect::<Vec<_>>()[..]
        );
        // The last event's digest is stored: it keeps it.
        assert_eq!(all[last].hash, events[last].hash);
        // (These events do not project to a record: `journal::tests::a_settled_record_read_from_
        // memory_is_what_its_events_replay_to` checks a projection read this way.)
        let second = read(45..46).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            second.iter().map(|e| (e.seq, e.kind)).collect::<Vec<_>>(),
            [(45, events[3].kind)]
        );
    }

    #[test]
    fn a_group_round_trips_every_run_and_hash_and_keeps_only_the_seqs_asked_for() {
        let events = grouped();
        let Some(bytes) = encode_group(&sealed_all(&events)) else {
            panic!("the group frame holds these");
        };
        assert_eq!(bytes[0], CHAINED);
        let runs: usize = [&events[..3], &events[3..]]
            .iter()
            .filter_map(|r| encode_run(r))
            .map(|b| b.len())
            .sum();
        assert!(bytes.len() + 32 < runs, "{} vs {runs}", bytes.len());
        let back = decode_stored(42, &bytes).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, events);
        assert!(back.iter().all(|e| e.compute_hash() == e.hash));
        let second = decode_stored_within(42, &bytes, 45..46).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(second, events[3..].to_vec());
        // A group with every digest, and a run, both written by earlier builds, decode.
        let Some(each) = frame_group(&sealed_all(&events), Digests::Each) else {
            panic!("group with digests");
        };
        assert_eq!(each[0], GROUP);
        assert_eq!(bytes.len() + 32 * (events.len() - 1), each.len());
        assert_eq!(decode_stored(42, &each), Ok(events.clone()));
        let Some(run) = encode_run(&events[..3]) else {
            panic!("run");
        };
        assert_eq!(
            decode_stored_within(42, &run, 43..44),
            Ok(events[1..2].to_vec())
        );
    }

    #[test]
    fn a_group_with_a_broken_link_is_not_framed_and_a_damaged_one_is_an_error() {
        let mut events = grouped();
        events[3].prev_hash = events[0].hash.clone();
        assert_eq!(encode_group(&sealed_all(&events)), None);
        let Some(bytes) = encode_group(&sealed_all(&grouped())) else {
            panic!("group");
        };
        cut_or_inflated_is_an_error(&bytes);
        // A changed byte of an earlier event's data: every event still reads, and the last
        // one, carrying the stored digest, no longer hashes to it.
        let at = bytes
            .windows(3)
            .position(|w| w == b"GET")
            .unwrap_or_else(|| panic!("data in the frame"));
        let mut changed = bytes.clone();
        changed[at] = b'P';
        let back = decode_stored(42, &changed).unwrap_or_else(|e| panic!("{e}"));
        let Some((last, before)) = back.split_last() else {
            panic!("events")
        };
        assert!(before.iter().all(|e| e.compute_hash() == e.hash));
        assert_ne!(last.compute_hash(), last.hash);
        assert_eq!(last.hash, grouped()[3].hash);
    }

    /// Every cut prefix of a stored value, and one whose count claims more than its bytes
    /// hold, is an error (not a panic, not a huge allocation).
    fn cut_or_inflated_is_an_error(bytes: &[u8]) {
        for n in 0..bytes.len() {
            assert!(decode_stored(42, &bytes[..n]).is_err(), "cut at {n}");
        }
        let mut huge = bytes.to_vec();
        huge[1] = 0x7f;
        assert!(decode_stored(42, &huge).is_err());
    }

    #[test]
    fn a_run_of_unlinked_events_or_with_a_long_field_is_not_framed() {
        let mut run = chained();
        run[2].prev_hash = run[0].hash.clone();
        assert_eq!(encode_run(&run), None);
        let mut run = chained();
        run[1].hop = "h".repeat(300);
        assert_eq!(encode_run(&run), None);
        assert_eq!(encode_run(&[]), None);
    }

    #[test]
    fn cut_or_damaged_runs_are_errors_not_panics() {
        let Some(bytes) = encode_run(&chained()) else {
            panic!("run");
        };
        cut_or_inflated_is_an_error(&bytes);
        let mut longer = bytes;
        longer.push(0);
        assert!(decode_stored(42, &longer).is_err());
    }

    #[test]
    fn a_format_tag_this_build_does_not_know_says_so() {
        for bytes in [&[0xB9, 1, 2][..], &[0x00][..]] {
            assert_eq!(decode_stored(1, bytes), Err(NEWER_FORMAT));
            assert_eq!(decode_result(bytes), Err(NEWER_FORMAT));
            assert_eq!(decode_request(bytes), Err(NEWER_FORMAT));
        }
    }

    #[test]
    fn cut_or_damaged_frames_are_errors_not_panics() {
        let bytes = encode(&sealed(EventKind::DispatchStarted, serde_json::json!({})));
        for n in 0..bytes.len() {
            let _ = decode(&bytes[..n]);
        }
        let mut bad = bytes.clone();
        bad[81] = 0xEE;
        assert_eq!(decode(&bad), Err(DecodeError("unknown event kind code")));
    }
}
