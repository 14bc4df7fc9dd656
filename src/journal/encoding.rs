//! How an event and a record are stored. An event: a compact binary frame around its JSON `data`. The hash stays
//! over the canonical JSON (`Event::compute_hash`), so the chain, `audit verify` and the API
//! see the same event whichever way it was stored; frames written before this format (plain
//! JSON) still decode.
//!
//! Frame: tag, seq (u64 LE), prev and own SHA-256 digests (32 bytes each), attempt and
//! generation (u32 LE), kind and source codes (one byte each), invocation id, hop and ts
//! (each one length byte and UTF-8), then `data` as JSON to the end.
//!
//! A record (settled state, result, kept request) is its JSON, LZ4-packed when that pays:
//! fjall compresses only journal values over 4 KiB, and these are written once each.

use super::event::{Event, EventKind, Source};

/// First byte of a compact frame (a JSON frame starts with `{`).
const COMPACT: u8 = 0xB1;
const HASH_PREFIX: &str = "sha256:";

/// First byte of an LZ4-packed record (a plain one is JSON and starts with `{`).
const PACKED: u8 = 0xB2;
/// The largest record `unpack` inflates: far above `max_result_bytes`, and a damaged
/// length cannot make it allocate without bound.
const MAX_UNPACKED: usize = 1 << 30;

/// A record's JSON as stored: LZ4-packed when that makes it smaller.
pub fn pack(json: Vec<u8>) -> Vec<u8> {
    let Ok(len) = u32::try_from(json.len()) else {
        return json;
    };
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

/// The event in stored bytes of either format.
pub fn decode(bytes: &[u8]) -> Result<Event, DecodeError> {
    match bytes.first() {
        Some(&COMPACT) => Frame(&bytes[1..]).event(),
        Some(_) => {
            serde_json::from_slice(bytes).map_err(|_| DecodeError("event JSON does not parse"))
        }
        None => Err(DecodeError("empty event")),
    }
}

/// The unread rest of a compact frame.
struct Frame<'a>(&'a [u8]);

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
