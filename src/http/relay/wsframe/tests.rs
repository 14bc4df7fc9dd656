use super::*;
use crate::guard::RELEASE_AT_MOST;

const SECRET: &[u8] = b"ws-canary-3f9a1c7e5b2d";

fn guard() -> Arc<ReflectionGuard> {
    match ReflectionGuard::new(SECRET, b"Bearer ws-canary-3f9a1c7e5b2d") {
        Some(g) => Arc::new(g),
        None => Arc::default(),
    }
}

/// One unmasked frame, its length encoded minimally.
fn frame(first: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![first];
    match payload.len() {
        n @ 0..=125 => f.push(n as u8),
        n @ 126..=0xFFFF => {
            f.push(126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    f.extend_from_slice(payload);
    f
}

/// Every kind of frame the origin may send, no secret in any.
fn clean_stream() -> Vec<u8> {
    let mut s = frame(0x81, b"hello");
    s.extend(frame(0x82, &[7u8; 200]));
    s.extend(frame(0x82, &[9u8; 65_536]));
    s.extend(frame(0x01, b"frag"));
    s.extend(frame(0x89, b"ping?"));
    s.extend(frame(0x00, b""));
    s.extend(frame(0x80, b"ment"));
    s.extend(frame(0x8A, b""));
    s.extend(frame(0x81, b""));
    s.extend(frame(0x88, &[0x03, 0xE8]));
    s
}

/// `key=<secret> end` in fragments cut inside the secret at `cuts`, a ping after the first.
fn split_secret(secret: &[u8], cuts: &[usize]) -> Vec<u8> {
    let mut payload = b"key=".to_vec();
    payload.extend_from_slice(secret);
    payload.extend_from_slice(b" end");
    let mut bounds = vec![0];
    bounds.extend(cuts.iter().map(|c| 4 + c));
    bounds.push(payload.len());
    let mut out = Vec::new();
    for (i, w) in bounds.windows(2).enumerate() {
        let last = i + 2 == bounds.len();
        let op = match (i == 0, last) {
            (true, _) => 0x01,
            (false, false) => 0x00,
            (false, true) => 0x80,
        };
        out.extend(frame(op, &payload[w[0]..w[1]]));
        if i == 0 {
            out.extend(frame(0x89, b"between"));
        }
    }
    out
}

/// `stream` through `Frames`, in chunks cut at `cuts`, a pause release after each chunk.
fn through(stream: &[u8], cuts: &[usize], release: bool) -> (Vec<u8>, Frames) {
    let mut f = Frames::new(guard());
    let mut out = Vec::new();
    let mut from = 0;
    for &cut in cuts.iter().chain(std::iter::once(&stream.len())) {
        out.extend_from_slice(&f.pass(&stream[from..cut]));
        if release && f.holds_releasable() {
            out.extend(f.release().unwrap_or_default());
        }
        from = cut;
        if f.stopped() {
            return (out, f);
        }
    }
    out.extend(f.finish());
    (out, f)
}

#[test]
fn frames_pass_byte_for_byte_however_the_stream_is_cut() {
    let stream = clean_stream();
    let (whole, f) = through(&stream, &[], false);
    assert_eq!(whole, stream);
    assert_eq!((f.hits, f.error), (0, None));
    // Every cut in the frames' headers and around them (the big payload's middle once).
    let mut cuts: Vec<usize> = (1..230).collect();
    cuts.extend(stream.len() - 100..stream.len());
    cuts.push(35_000);
    for &cut in &cuts {
        let (out, f) = through(&stream, &[cut], false);
        assert_eq!(out, stream, "cut at {cut}");
        assert_eq!(f.error, None, "cut at {cut}");
    }
    let tail = stream.len() - 60;
    let bytewise: Vec<usize> = (1..300).chain(tail..stream.len()).collect();
    let (out, _) = through(&stream, &bytewise, true);
    assert_eq!(out, stream, "byte by byte, released on pauses");
}

#[test]
fn a_secret_split_across_fragments_is_masked_at_every_cut() {
    for cuts in [vec![8], vec![5, 14], vec![1, 2, 21]] {
        let stream = split_secret(SECRET, &cuts);
        let want = split_secret(&[b'*'; 22], &cuts);
        for chunk_cut in 0..stream.len() {
            for release in [false, true] {
                let (out, f) = through(&stream, &[chunk_cut], release);
                assert_eq!(out.len(), want.len(), "{cuts:?} at {chunk_cut}");
                // A pause may let a short held start go out (`Paced`), never more.
                let early = out.iter().zip(&want).filter(|(o, w)| o != w).count();
                let only_stars = out.iter().zip(&want).all(|(o, w)| o == w || *w == b'*');
                let allowed = if release { RELEASE_AT_MOST } else { 0 };
                assert!(
                    only_stars && early <= allowed,
                    "{cuts:?} at {chunk_cut}: {out:?}"
                );
                let shown = String::from_utf8_lossy(&out).into_owned();
                assert!(
                    !shown.contains("canary"),
                    "{cuts:?} at {chunk_cut}: {shown}"
                );
                assert_eq!((f.hits, f.error), (1, None), "{cuts:?} at {chunk_cut}");
            }
        }
    }
}

#[test]
fn a_secret_in_a_control_frame_is_masked() {
    let stream = frame(0x89, SECRET);
    let (out, f) = through(&stream, &[3], false);
    assert_eq!(out, frame(0x89, &[b'*'; 22]));
    assert_eq!(f.hits, 1);
}

/// Each frame the origin may not send, after a good one: the good one, then close 1002.
#[test]
fn a_forbidden_frame_is_refused_however_its_header_is_cut() {
    let mut masked_frame = vec![0x81, 0x80 | 22, 1, 2, 3, 4];
    masked_frame.extend(SECRET.iter().map(|b| b ^ 1));
    let mut huge = vec![0x82, 127, 0x80];
    huge.extend_from_slice(&[0; 7]);
    let cases: Vec<(Vec<u8>, Vec<u8>, FrameError)> = vec![
        (vec![], masked_frame, FrameError::Masked),
        (vec![], frame(0xC1, SECRET), FrameError::ReservedBit),
        (vec![], frame(0xA1, SECRET), FrameError::ReservedBit),
        (vec![], frame(0x83, SECRET), FrameError::UnknownOpcode),
        (vec![], frame(0x8B, b""), FrameError::UnknownOpcode),
        (
            vec![],
            frame(0x89, &[b'.'; 126]),
            FrameError::ControlTooLong,
        ),
        (vec![], frame(0x09, b"x"), FrameError::FragmentedControl),
        (
            vec![],
            frame(0x80, SECRET),
            FrameError::ContinuationWithoutMessage,
        ),
        (
            frame(0x01, b"hi."),
            frame(0x81, SECRET),
            FrameError::MessageInsideMessage,
        ),
        (vec![], huge, FrameError::LengthTooLarge),
    ];
    for (open, bad, error) in cases {
        let mut before = frame(0x81, b"hello");
        before.extend(open);
        let mut stream = before.clone();
        stream.extend_from_slice(&bad);
        stream.extend(frame(0x81, b"after"));
        let mut want = before.clone();
        want.extend_from_slice(&CLOSE_PROTOCOL_ERROR);
        for cut in 1..stream.len() {
            let (out, f) = through(&stream, &[cut], false);
            assert_eq!(out, want, "{error:?} cut at {cut}");
            assert_eq!(f.error, Some(error), "cut at {cut}");
        }
    }
}

/// A possible start of the secret held at the end of an unfinished message goes as `*`s,
/// so the agent is at a frame boundary for the close.
#[test]
fn held_payload_before_a_forbidden_frame_goes_as_stars() {
    let mut stream = frame(0x01, b"key=ws-canary");
    stream.extend(frame(0x89, b"between"));
    stream.extend(frame(0xC0, b"-3f9a1c7e5b2d"));
    let mut want = frame(0x01, b"key=*********");
    want.extend(frame(0x89, b"between"));
    want.extend_from_slice(&CLOSE_PROTOCOL_ERROR);
    let (out, f) = through(&stream, &[], false);
    assert_eq!(out, want, "{}", String::from_utf8_lossy(&out));
    assert_eq!(f.error, Some(FrameError::ReservedBit));
}

/// The origin ends mid-message: every byte keeps its place, the held start as `*`s.
#[test]
fn an_origin_ending_mid_message_leaves_the_held_start_masked() {
    let stream = frame(0x01, b"key=ws-canary");
    let (out, f) = through(&stream, &[], false);
    assert_eq!(out, frame(0x01, b"key=*********"));
    assert_eq!(f.error, None);
}

/// A held start of the secret, then frame after frame: what waits behind it stays bounded
/// (the held bytes go as `*`s early), and the secret is still masked when its rest comes.
#[test]
fn frames_behind_a_held_start_wait_in_bounded_memory() {
    let ping = frame(0x89, &[b'p'; 125]);
    let mut f = Frames::new(guard());
    let mut out = f.pass(&frame(0x01, b"key=ws-canary")).to_vec();
    let mut most = 0;
    for _ in 0..2000 {
        out.extend_from_slice(&f.pass(&ping));
        out.extend_from_slice(&f.pass(&frame(0x00, b"")));
        most = most.max(f.out.waiting_raw);
    }
    out.extend_from_slice(&f.pass(&frame(0x80, b"-3f9a1c7e5b2d end")));
    out.extend(f.finish());
    assert!(most <= MAX_WAITING + ping.len(), "{most} bytes waited");
    let mut want = frame(0x01, b"key=*********");
    for _ in 0..2000 {
        want.extend_from_slice(&ping);
        want.extend(frame(0x00, b""));
    }
    want.extend(frame(0x80, b"************* end"));
    assert!(
        out == want,
        "{}",
        String::from_utf8_lossy(&out[out.len() - 40..])
    );
    assert_eq!((f.hits, f.error), (1, None));
}
