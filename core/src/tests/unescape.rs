//! `json::unescape` decodes exactly the string literals `serde_json` decodes,
//! to the same text, and refuses the rest.

use crate::json::unescape;
use proptest::prelude::*;

fn reference(literal: &[u8]) -> Option<String> {
    serde_json::from_slice::<String>(literal).ok()
}

/// Pieces that make up literals: plain text, every escape, surrogate pairs
/// (also broken ones), raw controls and quotes, invalid UTF-8.
fn piece() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        "[a-z é€😀]{0,4}".prop_map(String::into_bytes),
        prop::sample::select(vec![
            r#"\""#,
            r"\\",
            r"\/",
            r"\b",
            r"\f",
            r"\n",
            r"\r",
            r"\t",
            r"\u0041",
            r"\u00e9",
            r"\u20AC",
            r"\uD83D\uDE00",
            r"\ud83d\ude00",
            r"\uD83D",
            r"\uDE00",
            r"\uD83D\u0041",
            r"\uD83Dx",
            r"\u12",
            r"\u12G4",
            r"\x",
            r"\",
            "\"",
            "\n",
            "\u{1}",
            r"\u0000",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        prop::sample::select(vec![vec![0xFFu8], vec![0xC3], vec![0xE2, 0x82]]),
    ]
}

proptest! {
    #[test]
    fn agrees_with_serde_json(pieces in prop::collection::vec(piece(), 0..6)) {
        let mut literal = b"\"".to_vec();
        for p in &pieces {
            literal.extend_from_slice(p);
        }
        literal.push(b'"');
        prop_assert_eq!(unescape(&literal), reference(&literal), "{:?}", String::from_utf8_lossy(&literal));
    }
}

#[test]
fn not_a_literal() {
    for bad in [&b""[..], b"\"", b"abc", b"\"abc", b"abc\"", b"\"a\"b\""] {
        assert_eq!(unescape(bad), None, "{bad:?}");
    }
    assert_eq!(
        unescape(br#""a\u00e9\uD83D\uDE00\n""#).as_deref(),
        Some("a\u{e9}\u{1F600}\n")
    );
}
