use std::io::Read;

use http::HeaderValue;
use proptest::prelude::*;

use super::*;

fn coded(coding: &str, plain: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let fast = flate2::Compression::fast();
    let read = match coding {
        "gzip" => flate2::read::GzEncoder::new(plain, fast).read_to_end(&mut out),
        _ => flate2::read::ZlibEncoder::new(plain, fast).read_to_end(&mut out),
    };
    assert!(read.is_ok());
    out
}

fn message(flag: u8, bytes: &[u8]) -> Vec<u8> {
    let mut m = vec![flag];
    m.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    m.extend_from_slice(bytes);
    m
}

fn messages(encoding: Option<&str>, cap: usize) -> Messages {
    let mut head = HeaderMap::new();
    if let Some(e) = encoding {
        head.insert(GRPC_ENCODING, HeaderValue::from_str(e).unwrap());
    }
    let m = Messages::for_head(&mut head, cap);
    assert!(head.is_empty(), "grpc-encoding leaves the head");
    m
}

/// Plain, compressed, empty and compressed again, as `coding` sends them; and what the
/// agent must get: the same messages, all uncompressed.
fn mixed(coding: &str) -> (Vec<u8>, Vec<u8>) {
    let long: Vec<u8> = b"you sent Bearer s3cret ".repeat(300);
    let (mut body, mut plain) = (Vec::new(), Vec::new());
    for (flag, m) in [
        (0, &b"first"[..]),
        (1, &long[..]),
        (0, &b""[..]),
        (1, &b"short one"[..]),
    ] {
        let sent = if flag == 1 {
            coded(coding, m)
        } else {
            m.to_vec()
        };
        body.extend_from_slice(&message(flag, &sent));
        plain.extend_from_slice(&message(0, m));
    }
    (body, plain)
}

#[test]
fn compressed_messages_are_framed_again_uncompressed() {
    for coding in ["gzip", "deflate", "GZIP "] {
        let (body, plain) = mixed(coding.trim().to_ascii_lowercase().as_str());
        let out = messages(Some(coding), 1 << 20).whole(&body);
        assert_eq!(out.as_deref(), Ok(&plain[..]), "{coding}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// However the origin's bytes are cut into DATA frames, the agent gets the same bytes.
    #[test]
    fn any_chunking_gives_the_same_messages(cuts in proptest::collection::vec(1usize..700, 1..40)) {
        let (body, plain) = mixed("gzip");
        let mut m = messages(Some("gzip"), 1 << 20);
        let (mut out, mut rest) = (Vec::new(), &body[..]);
        for cut in cuts.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let n = (*cut).min(rest.len());
            let (got, failed) = m.push(&rest[..n], false);
            prop_assert_eq!(failed, None);
            out.extend_from_slice(&got);
            rest = &rest[n..];
        }
        prop_assert_eq!(m.push(&[], true), (Bytes::new(), None));
        prop_assert_eq!(out, plain);
    }
}

#[test]
fn an_uncompressed_message_passes_as_it_comes() {
    let body = message(0, b"hello there");
    let mut m = messages(Some("snappy"), 1 << 20);
    let pass = |b: &[u8]| (Bytes::copy_from_slice(b), None);
    assert_eq!(m.push(&body[..3], false), pass(b""), "a prefix waits");
    assert_eq!(m.push(&body[3..8], false), pass(&body[..8]));
    assert_eq!(m.push(&body[8..], true), pass(&body[8..]));
}

#[test]
fn the_messages_before_an_undecodable_one_come_out_whole_and_nothing_after() {
    let first = message(0, b"first, whole");
    let mut body = first.clone();
    body.extend_from_slice(&message(1, b"not gzip"));
    body.extend_from_slice(&message(0, b"after"));
    let mut m = messages(Some("gzip"), 1 << 20);
    let (out, failed) = m.push(&body, false);
    assert_eq!(
        (&out[..], failed),
        (&first[..], Some(Undecodable::DecodeError))
    );
    let after = message(0, b"more");
    assert_eq!(
        m.push(&after, true),
        (Bytes::new(), Some(Undecodable::DecodeError))
    );
}

#[test]
fn a_compressed_message_without_a_known_encoding_is_unsupported() {
    let body = message(1, &coded("gzip", b"you sent s3cret"));
    for encoding in [
        None,
        Some("identity"),
        Some("snappy"),
        Some("gzip, deflate"),
    ] {
        let got = messages(encoding, 1 << 20).whole(&body);
        assert_eq!(got, Err(Undecodable::UnsupportedCoding), "{encoding:?}");
    }
}

#[test]
fn corrupt_cut_and_oversized_messages_are_undecodable() {
    let mut cut = message(1, &coded("gzip", b"you sent s3cret"));
    cut.truncate(cut.len() - 3);
    let bomb = coded("gzip", &vec![0u8; 1 << 20]);
    let mut huge = vec![1];
    huge.extend_from_slice(&u32::MAX.to_be_bytes());
    for (body, why) in [
        (message(1, b"not gzip at all"), Undecodable::DecodeError),
        (cut, Undecodable::DecodeError),
        (message(2, b"flag 2"), Undecodable::DecodeError),
        (message(1, &bomb), Undecodable::TooLarge),
        (huge, Undecodable::TooLarge),
    ] {
        let got = messages(Some("gzip"), 64 << 10).whole(&body);
        assert_eq!(got, Err(why));
    }
}

#[test]
fn a_cut_prefix_goes_on_as_it_came() {
    let mut m = messages(Some("gzip"), 1 << 20);
    assert_eq!(m.push(&[0, 0, 0], false), (Bytes::new(), None));
    assert_eq!(m.push(&[], true), (Bytes::from_static(&[0, 0, 0]), None));
}
