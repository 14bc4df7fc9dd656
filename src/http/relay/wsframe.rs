//! A WebSocket origin's bytes, read as RFC 6455 frames (SPEC §3.6), framing only. Frame
//! headers pass as they came; the payload of one message, across all its fragments, runs
//! through one guarded stream with same-length masks, so a secret split between fragments
//! is still caught and every declared length stays true. A control frame (at most 125
//! bytes) is scanned on its own once whole. A frame the origin may not send ends the relay:
//! none of its bytes go out, a close `1002` does.
//!
//! Order: the guard holds back a possible start of the secret, so a header (or a control
//! frame between fragments) waits in `Out` behind the payload bytes still held; they leave
//! once decided, byte for byte in their place.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Arc;

use super::pump::Downstream;
use crate::contract::FrameError;
use crate::guard::{Mask, Paced, ReflectionGuard};

/// Close, 2 bytes of payload: status 1002 (protocol error).
pub const CLOSE_PROTOCOL_ERROR: [u8; 4] = [0x88, 0x02, 0x03, 0xEA];

const FIN: u8 = 0x80;
const RSV: u8 = 0x70;
const MASKED: u8 = 0x80;
const CONTINUATION: u8 = 0x0;
const MAX_CONTROL: usize = 125;

/// Where in the origin's stream the next byte falls.
enum At {
    /// A frame header, its bytes so far (at most 10: no mask key is ever accepted).
    Head(Vec<u8>),
    /// A data frame's payload: how much is left, and whether it ends the message.
    Data { left: u64, fin: bool },
    /// A control frame, kept whole (header then payload) until its payload is in.
    Control { frame: Vec<u8>, head: usize },
    /// After a protocol error: nothing more is read.
    Stopped,
}

/// The origin→agent side of a WebSocket relay.
pub struct Frames {
    guard: Arc<ReflectionGuard>,
    at: At,
    /// The open data message's payload stream, across its fragments.
    message: Option<Paced>,
    out: Out,
    pub hits: u64,
    pub error: Option<FrameError>,
}

impl Frames {
    pub fn new(guard: Arc<ReflectionGuard>) -> Self {
        Self {
            guard,
            at: At::Head(Vec::new()),
            message: None,
            out: Out::default(),
            hits: 0,
            error: None,
        }
    }

    /// Reads `chunk` through, leaving what can go out now in `self.out`.
    fn read(&mut self, mut chunk: &[u8]) {
        while !chunk.is_empty() {
            let taken = match &mut self.at {
                At::Stopped => return,
                At::Head(head) => {
                    let want = head_len(head).saturating_sub(head.len());
                    let n = want.min(chunk.len());
                    head.extend_from_slice(chunk.get(..n).unwrap_or_default());
                    n
                }
                At::Data { left, .. } => {
                    let n = usize::try_from(*left)
                        .unwrap_or(usize::MAX)
                        .min(chunk.len());
                    *left -= n as u64;
                    let bytes = chunk.get(..n).unwrap_or_default();
                    self.payload(bytes);
                    n
                }
                At::Control { frame, head } => {
                    let want = (*head + control_len(frame)).saturating_sub(frame.len());
                    let n = want.min(chunk.len());
                    frame.extend_from_slice(chunk.get(..n).unwrap_or_default());
                    n
                }
            };
            chunk = chunk.get(taken..).unwrap_or_default();
            self.step();
        }
    }

    /// Moves on once the current header, payload or control frame is complete.
    fn step(&mut self) {
        match &self.at {
            At::Head(head) => match check(head, self.message.is_some()) {
                Err(e) => self.fail(e),
                Ok(()) if head.len() == head_len(head) => self.begin(),
                Ok(()) => {}
            },
            At::Data { left: 0, fin } => {
                if *fin {
                    self.end_message();
                }
                self.at = At::Head(Vec::new());
            }
            At::Control { frame, head } if frame.len() == head + control_len(frame) => {
                let At::Control { frame, head } = std::mem::replace(&mut self.at, At::Head(vec![]))
                else {
                    return;
                };
                let (head, payload) = frame.split_at(head);
                let mut whole = head.to_vec();
                whole.extend_from_slice(&self.scan_alone(payload));
                self.out.raw(&whole);
            }
            _ => {}
        }
    }

    /// A whole, allowed header: a data frame's goes out (behind held payload), a control
    /// frame's waits for its payload.
    fn begin(&mut self) {
        let At::Head(head) = std::mem::replace(&mut self.at, At::Stopped) else {
            return;
        };
        let (first, len) = (head.first().copied().unwrap_or(0), payload_len(&head));
        if first & 0x08 != 0 {
            let at = head.len();
            self.at = At::Control {
                frame: head,
                head: at,
            };
            return self.step();
        }
        self.out.raw(&head);
        self.message
            .get_or_insert_with(|| Paced::masked(Mask::SameLength));
        self.at = At::Data {
            left: len,
            fin: first & FIN != 0,
        };
        self.step();
    }

    /// Data payload bytes into the message's guarded stream.
    fn payload(&mut self, bytes: &[u8]) {
        let Some(paced) = self.message.as_mut() else {
            return;
        };
        self.out.payload(bytes.len());
        let (scanned, hits) = paced.pass(&self.guard, bytes);
        self.hits += hits as u64;
        self.out.fill(&scanned);
    }

    fn end_message(&mut self) {
        if let Some(mut paced) = self.message.take() {
            let (scanned, hits) = paced.finish(&self.guard);
            self.hits += hits as u64;
            self.out.fill(&scanned);
        }
    }

    /// A control frame's payload, scanned on its own.
    fn scan_alone(&mut self, payload: &[u8]) -> Vec<u8> {
        let mut paced = Paced::masked(Mask::SameLength);
        let (scanned, hits) = paced.pass(&self.guard, payload);
        let (tail, more) = paced.finish(&self.guard);
        self.hits += (hits + more) as u64;
        let mut all = scanned.to_vec();
        all.extend_from_slice(&tail);
        all
    }

    /// The frame in `head` may not be sent. Frames before it are whole, so the agent is at
    /// a frame boundary once the payload still held is out: it goes as `*`s (it may be the
    /// start of a secret whose rest never comes), then the close `1002`, then nothing.
    fn fail(&mut self, e: FrameError) {
        self.error = Some(e);
        self.at = At::Stopped;
        self.message = None;
        let _ = self.out.mask_pending();
        self.out.raw(&CLOSE_PROTOCOL_ERROR);
    }
}

impl Downstream for Frames {
    fn pass<'a>(&mut self, chunk: &'a [u8]) -> Cow<'a, [u8]> {
        self.read(chunk);
        Cow::Owned(self.out.take())
    }

    /// The origin ended mid-message or mid-frame: the held payload goes as `*`s (what
    /// would follow it never comes); a partial header passed `check` and goes as it is,
    /// a partial control frame's payload as `*`s. Every byte read keeps its place.
    fn finish(&mut self) -> Vec<u8> {
        self.message = None;
        let _ = self.out.mask_pending();
        match std::mem::replace(&mut self.at, At::Stopped) {
            At::Head(head) => self.out.raw(&head),
            At::Control { frame, head } => {
                let mut masked = frame;
                masked.iter_mut().skip(head).for_each(|b| *b = b'*');
                self.out.raw(&masked);
            }
            At::Data { .. } | At::Stopped => {}
        }
        self.out.take()
    }

    fn release(&mut self) -> Option<Vec<u8>> {
        if let Some(paced) = self.message.as_mut() {
            let fresh = paced.release();
            self.out.fill(&fresh);
        }
        Some(self.out.take())
    }

    fn holds_releasable(&self) -> bool {
        self.message.as_ref().is_some_and(Paced::releasable)
    }

    fn stopped(&self) -> bool {
        self.error.is_some()
    }
}

/// How long the header in `head` is, once its second byte says (no mask key: a masked
/// frame is refused on its second byte).
fn head_len(head: &[u8]) -> usize {
    match head.get(1).map(|b| b & 0x7F) {
        None => 2,
        Some(126) => 4,
        Some(127) => 10,
        Some(_) => 2,
    }
}

/// The declared payload length of a whole header.
fn payload_len(head: &[u8]) -> u64 {
    let be = |bytes: &[u8]| bytes.iter().fold(0u64, |n, b| (n << 8) | u64::from(*b));
    match head.get(1).map(|b| b & 0x7F) {
        Some(126) => be(head.get(2..4).unwrap_or_default()),
        Some(127) => be(head.get(2..10).unwrap_or_default()),
        Some(n) => u64::from(n),
        None => 0,
    }
}

/// A control frame's payload length (at most 125: `check` refused longer).
fn control_len(frame: &[u8]) -> usize {
    usize::from(frame.get(1).map_or(0, |b| b & 0x7F))
}

/// Whether what is known of a header is a frame the origin may send; `open`: a data
/// message is unfinished.
fn check(head: &[u8], open: bool) -> Result<(), FrameError> {
    let Some(&first) = head.first() else {
        return Ok(());
    };
    let (fin, opcode) = (first & FIN != 0, first & 0x0F);
    if first & RSV != 0 {
        return Err(FrameError::ReservedBit);
    }
    match opcode {
        CONTINUATION if !open => return Err(FrameError::ContinuationWithoutMessage),
        0x1 | 0x2 if open => return Err(FrameError::MessageInsideMessage),
        0x0..=0x2 => {}
        0x8..=0xA if !fin => return Err(FrameError::FragmentedControl),
        0x8..=0xA => {}
        _ => return Err(FrameError::UnknownOpcode),
    }
    let Some(&second) = head.get(1) else {
        return Ok(());
    };
    if second & MASKED != 0 {
        return Err(FrameError::Masked);
    }
    if opcode >= 0x8 && usize::from(second & 0x7F) > MAX_CONTROL {
        return Err(FrameError::ControlTooLong);
    }
    // A 64-bit length with the top bit set: a client may read it as negative.
    if second & 0x7F == 127 && head.get(2).is_some_and(|b| b & 0x80 != 0) {
        return Err(FrameError::LengthTooLarge);
    }
    Ok(())
}

/// What goes to the agent, in order: bytes ready now, then items waiting behind payload
/// bytes the guard still holds.
#[derive(Default)]
struct Out {
    ready: Vec<u8>,
    waiting: VecDeque<Item>,
    /// Raw bytes in `waiting`.
    waiting_raw: usize,
    /// Payload bytes the guard has yet to give that already went as `*`s.
    skip: usize,
}

/// Raw bytes that may wait behind held payload. A held start of the secret followed by
/// frame after frame (empty fragments, pings) would otherwise grow without end: past
/// this, the held payload goes as `*`s now.
const MAX_WAITING: usize = 16 * 1024;

enum Item {
    /// Bytes that go as they are, once everything before them went.
    Raw(Vec<u8>),
    /// This many payload bytes, still to come from the guard in stream order.
    Payload(usize),
}

impl Out {
    fn raw(&mut self, bytes: &[u8]) {
        match self.waiting.back_mut() {
            None => self.ready.extend_from_slice(bytes),
            Some(Item::Raw(queued)) => queued.extend_from_slice(bytes),
            Some(Item::Payload(_)) => self.waiting.push_back(Item::Raw(bytes.to_vec())),
        }
        if !self.waiting.is_empty() {
            self.waiting_raw += bytes.len();
        }
        if self.waiting_raw > MAX_WAITING {
            self.skip += self.mask_pending();
        }
    }

    fn payload(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        match self.waiting.back_mut() {
            Some(Item::Payload(queued)) => *queued += n,
            _ => self.waiting.push_back(Item::Payload(n)),
        }
    }

    /// Payload bytes the guard let go (same length, so each fills its own place).
    fn fill(&mut self, scanned: &[u8]) {
        let skipped = self.skip.min(scanned.len());
        self.skip -= skipped;
        let mut scanned = scanned.get(skipped..).unwrap_or_default();
        while let Some(front) = self.waiting.front_mut() {
            match front {
                Item::Raw(bytes) => {
                    self.waiting_raw -= bytes.len();
                    self.ready.append(bytes);
                }
                Item::Payload(n) => {
                    if scanned.is_empty() {
                        return;
                    }
                    let k = (*n).min(scanned.len());
                    let (now, rest) = scanned.split_at(k);
                    self.ready.extend_from_slice(now);
                    scanned = rest;
                    *n -= k;
                    if *n > 0 {
                        return;
                    }
                }
            }
            self.waiting.pop_front();
        }
        // The guard never gives more than it was given; if it did, keep the bytes.
        self.ready.extend_from_slice(scanned);
    }

    /// Every payload byte still held goes as `*`; how many did.
    fn mask_pending(&mut self) -> usize {
        let mut masked = 0;
        for item in std::mem::take(&mut self.waiting) {
            match item {
                Item::Raw(bytes) => self.ready.extend_from_slice(&bytes),
                Item::Payload(n) => {
                    self.ready.resize(self.ready.len() + n, b'*');
                    masked += n;
                }
            }
        }
        self.waiting_raw = 0;
        masked
    }

    fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.ready)
    }
}

#[cfg(test)]
mod tests;
