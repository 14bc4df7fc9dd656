use super::*;

fn decoded(raw: &str) -> String {
    let mut d = Decoded::default();
    assert_eq!(d.decode(raw.as_bytes(), true), raw.len(), "{raw}");
    String::from_utf8_lossy(&d.text).into_owned()
}

#[test]
fn each_escape_decodes_to_its_character() {
    for (raw, text) in [
        ("\\u0041 \\u00e9 \\u20AC", "A é €"),
        ("\\ud83d\\ude00 \\uD83D%uDE00", "😀 😀"),
        ("\\U0001F600 \\x41\\x62", "😀 Ab"),
        ("\\\\u0041 \\\\\\\\x41", "A A"),
        ("\\\" \\/ \\\\ \\' \\+ \\? \\ ", "\" / \\ ' + ?  "),
        ("\\n\\t\\r\\b\\f", "\n\t\r\u{8}\u{c}"),
        ("%41%6a %2541 %252541 %u00e9", "Aj A A é"),
        ("&#65;&#x42;&#X43; &amp;&LT;&gt;&quot;&apos;", "ABC &<>\"'"),
        ("&#128512;", "😀"),
    ] {
        assert_eq!(decoded(raw), text, "{raw}");
    }
}

#[test]
fn what_is_no_escape_stays_as_it_is() {
    for raw in [
        "100% sure, 50%off",
        "%zz %4 %u12 \\uZZZZ \\x4 \\q \\0",
        "C:\\Users\\me",
        "a & b &am; &#; &#x; &#12345678; &#xZ;",
        "trailing \\",
        "trailing %",
        "trailing &#x4",
        "a+b",
    ] {
        assert_eq!(decoded(raw), raw);
    }
    assert_eq!(decoded("\\ud800 alone"), "\u{FFFD} alone");
}

#[test]
fn an_escape_cut_off_by_the_end_waits_unless_the_stream_ended() {
    for cut in [
        "\\",
        "\\u",
        "\\u00",
        "\\ud83d",
        "\\ud83d\\",
        "\\ud83d\\ude0",
        "\\\\",
        "\\x4",
        "%",
        "%4",
        "%25",
        "%254",
        "%u00",
        "&",
        "&#",
        "&#x4",
        "&#65",
        "&am",
        "&quo",
    ] {
        assert_eq!(escape(cut.as_bytes(), false), Step::Wait, "{cut}");
        let mut d = Decoded::default();
        assert_eq!(d.decode(format!("ab{cut}").as_bytes(), false), 2, "{cut}");
        assert_eq!(d.text, b"ab");
        assert_ne!(escape(cut.as_bytes(), true), Step::Wait, "{cut}");
    }
}

#[test]
fn a_decoded_byte_maps_back_to_the_escape_it_came_from() {
    let raw = b"xC\\u0041NA%52Y&#x31;z";
    let mut d = Decoded::default();
    d.decode(raw, true);
    assert_eq!(d.text, b"xCANARY1z");
    // `A` is text[2], from raw[2..8].
    assert_eq!((d.raw_start(2), d.raw_end(3)), (2, 8));
    assert_eq!((d.raw_start(1), d.raw_end(7)), (1, 14));
    assert_eq!(d.raw_end(8), 20);
    assert!(d.escaped(1, 7));
    assert!(!d.escaped(3, 5), "`NA` is plain");
    assert!(d.escaped(3, 6));
    assert_eq!(d.raw_start(d.text.len()), raw.len());
    let mut multi = Decoded::default();
    multi.decode("é=\\u00e9".as_bytes(), true);
    assert_eq!(multi.text, "é=é".as_bytes());
    // The second `é` is two decoded bytes of one six-byte escape.
    assert_eq!((multi.raw_start(4), multi.raw_end(4)), (3, 9));
    assert!(!multi.escaped(0, 2));
}
