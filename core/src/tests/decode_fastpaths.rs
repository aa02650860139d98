//! Differential tests for the observer's fast paths, against the full
//! `serde_json` reference:
//!
//! - the tape scanner resumes inside the prefix an event shares with the
//!   previous one: sequences of documents that differ in one byte must each
//!   get `serde_json`'s verdict and structure;
//! - learned delta templates: streams of events that look like the common
//!   delta shape but differ in one byte (escapes, unicode, whitespace,
//!   duplicate keys, key order, numbers, nested values, control bytes) must
//!   classify exactly as the reference decode does;
//! - whole-event SSE dispatch: any split of a generated SSE stream (which
//!   sends events down the line-by-line path) yields the same as one read;
//! - the fused delta path (framing and template in one comparison), for
//!   OpenAI Chat's unnamed events, Anthropic's named ones and Ollama's
//!   NDJSON lines: deltas of the
//!   learned shape mixed with framing that must stop it (no space after the
//!   colon, CR and CRLF, fields after the data line, other or unexpected
//!   names, ids, comments, multi-line data, caps, exactly at a cap and one
//!   past it) agree with the reference whole and cut anywhere.

use super::decode_support as support;

use crate::json::{Parsed, Tape, parse_reference};
use crate::observer::ObserverConfig;
use crate::protocol::ProtocolKind;
use proptest::prelude::*;
use serde_json::Value;
use support::{reference, run_with};

/// Bytes that change the meaning of JSON when put anywhere.
const INTERESTING: &[u8] = &[
    b'"', b'\\', b'{', b'}', b'[', b']', b',', b':', b' ', b'\t', b'0', b'1', b'9', b'-', b'+',
    b'.', b'e', b'E', b'a', b'u', b'n', b't', b'f', b'/', 0xC3, 0xA9, 0xFF, 0x01, 0x7F, 0x80,
];

#[derive(Debug, Clone)]
enum Edit {
    Replace(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    /// Replaces the body of the `n`th string with `text` (raw bytes).
    Body(usize, Vec<u8>),
}

fn edit() -> impl Strategy<Value = Edit> {
    let byte = prop::sample::select(INTERESTING);
    let text = prop_oneof![
        Just(Vec::new()),
        "[a-z \u{e9}\u{1F30D}]{1,12}".prop_map(String::into_bytes),
        prop::collection::vec(
            prop::sample::select(vec![
                &b"a"[..],
                b" ",
                b"\\n",
                b"\\\"",
                b"\\\\",
                b"\\/",
                b"\\u0041",
                b"\\ud83c\\udf0d",
                b"\\ud83c",
                b"\\x",
                b"\"",
                b"\\",
                b"\xC3\xA9",
                b"\xC3",
                b"\xF0\x9F\x8C\x8D",
                b"\x01",
                b"\t",
                b"}",
                b"\",\"content\":\"",
            ]),
            1..6,
        )
        .prop_map(|parts| parts.concat()),
    ];
    prop_oneof![
        (any::<usize>(), byte.clone()).prop_map(|(p, b)| Edit::Replace(p, b)),
        (any::<usize>(), byte).prop_map(|(p, b)| Edit::Insert(p, b)),
        any::<usize>().prop_map(Edit::Delete),
        (any::<usize>(), text.clone()).prop_map(|(n, t)| Edit::Body(n, t)),
        (any::<usize>(), text).prop_map(|(n, t)| Edit::Body(n, t)),
    ]
}

/// Body spans of the strings in a compact document (naive, good enough for
/// the generated documents, whose strings the scan below finds exactly).
fn string_bodies(doc: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < doc.len() {
        if doc[i] == b'"' {
            let start = i + 1;
            let mut j = start;
            while j < doc.len() && doc[j] != b'"' {
                j += if doc[j] == b'\\' { 2 } else { 1 };
            }
            out.push((start, j.min(doc.len())));
            i = j + 1;
        } else {
            i += 1;
        }
    }
    out
}

fn apply(doc: &[u8], edit: &Edit) -> Vec<u8> {
    let mut out = doc.to_vec();
    let len = out.len();
    match edit {
        Edit::Replace(p, b) if len > 0 => out[p % len] = *b,
        Edit::Insert(p, b) => out.insert(p % (len + 1), *b),
        Edit::Delete(p) if len > 0 => {
            out.remove(p % len);
        }
        Edit::Body(n, text) => {
            let bodies = string_bodies(doc);
            if !bodies.is_empty() {
                let (s, e) = bodies[n % bodies.len()];
                out.splice(s..e, text.iter().copied());
            }
        }
        _ => {}
    }
    out
}

/// Realistic delta events of each protocol with a template-shaped body.
fn bases(kind: &ProtocolKind) -> Vec<&'static str> {
    match kind {
        ProtocolKind::OpenAiChat => vec![
            r#"{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741569952,"model":"gpt-4.1-2025-04-14","service_tier":"default","system_fingerprint":"fp_b376dfbbd5","choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"x7Qp2"}"#,
            r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}"#,
            r#"{"id":"c2","choices":[{"index":1,"delta":{"content":null,"reasoning_content":"think"},"finish_reason":null}]}"#,
            r#"{"id":"c3","choices":[{"index":0,"delta":{"reasoning":"r","content":""}}],"obfuscation":"q"}"#,
            r#"{"id":"c4","choices":[{"delta":{"refusal":"no"},"index":0}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"a","content":"b"},"finish_reason":null}],"model":"m"}"#,
            r#"{ "id" : "c5" , "choices" : [ { "index" : 0 , "delta" : { "content" : "x" } } ] }"#,
        ],
        ProtocolKind::Anthropic => vec![
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"thinking_delta","thinking":"hmm"}}"#,
            r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"a\":"}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"signature_delta","signature":"EqQB"}}"#,
            r#"{"delta":{"text":"x","type":"text_delta"},"index":0,"type":"content_block_delta","extra":"e"}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"citations_delta","citation":{"cited_text":"c"}}}"#,
        ],
        _ => vec![
            r#"{"model":"llama3.2","created_at":"2026-01-01T00:00:00.123456789Z","message":{"role":"assistant","content":"Hi"},"done":false}"#,
            r#"{"model":"m","created_at":"t","response":"Hi","done":false}"#,
            r#"{"model":"m","created_at":"t","message":{"role":"assistant","content":"","thinking":"hmm"},"done":false}"#,
            r#"{"model":"m","created_at":"t","message":{"role":"assistant","content":"a","tool_calls":[]},"done":false,"error":null}"#,
        ],
    }
}

/// Events that settle or otherwise change state between deltas.
fn others(kind: &ProtocolKind) -> Vec<&'static str> {
    match kind {
        ProtocolKind::OpenAiChat => vec![
            r#"{"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
            r#"{"id":"c1","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}"#,
            r#"{"error":{"message":"overloaded","type":"server_error"}}"#,
            r#"{"id":"c1","choices":[{"index":1,"delta":{"content":"x"},"finish_reason":null}]}"#,
        ],
        ProtocolKind::Anthropic => vec![
            r#"{"type":"ping"}"#,
            r#"{"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":3}}}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":2}}"#,
            r#"{"type":"message_stop"}"#,
            r#"{"type":"error","error":{"type":"overloaded_error"}}"#,
        ],
        _ => vec![
            r#"{"model":"m","created_at":"t","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","eval_count":2}"#,
            r#"{"error":"boom"}"#,
            r#"{"model":"m","created_at":"t","message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":{}}}]},"done":false}"#,
        ],
    }
}

fn frame(kind: &ProtocolKind, doc: &[u8], named: bool) -> Vec<u8> {
    let mut out = Vec::new();
    if kind.is_ndjson() {
        out.extend_from_slice(doc);
        out.push(b'\n');
    } else {
        if named {
            out.extend_from_slice(b"event: content_block_delta\n");
        }
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(doc);
        out.extend_from_slice(b"\n\n");
    }
    out
}

fn kind_from(i: usize) -> ProtocolKind {
    [
        ProtocolKind::OpenAiChat,
        ProtocolKind::Anthropic,
        ProtocolKind::Ollama,
    ][i % 3]
        .clone()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// One tape, a sequence of documents each one edit away from a base
    /// (so consecutive documents share prefixes of every length): every
    /// verdict and every tape equals `serde_json`'s.
    #[test]
    fn tape_resume_agrees_with_serde_json(
        kind in 0usize..3,
        pick in any::<prop::sample::Index>(),
        edits in prop::collection::vec(edit(), 1..12),
        chain in any::<bool>(),
    ) {
        let kind = kind_from(kind);
        let all: Vec<&str> = bases(&kind).into_iter().chain(others(&kind)).collect();
        let base = all[pick.index(all.len())].as_bytes().to_vec();
        let mut tape = Tape::default();
        let mut doc = base.clone();
        let mut docs = vec![base.clone()];
        for e in &edits {
            doc = apply(if chain { &doc } else { &base }, e);
            docs.push(doc.clone());
            docs.push(base.clone());
        }
        for d in &docs {
            let want = parse_reference(d);
            match (tape.parse(d), want) {
                (Ok(Parsed::Tape(root)), Ok(value)) => prop_assert_eq!(root.to_value(), value),
                (Ok(Parsed::Lazy(_)), _) => prop_assert!(false, "small documents go on the tape"),
                (Err(got), Err(want)) => prop_assert_eq!(got, want, "{:?}", String::from_utf8_lossy(d)),
                (got, want) => prop_assert!(
                    false,
                    "{:?}: fast {:?} reference {:?}",
                    String::from_utf8_lossy(d),
                    got.is_ok(),
                    want.is_ok()
                ),
            }
        }
    }

    /// Streams that arm a delta template (two deltas of one shape), then
    /// events one edit away from it, settling events and deltas again:
    /// the observer's records, evidence and end equal the reference's.
    #[test]
    fn templates_agree_with_the_reference(
        kind in 0usize..3,
        pick in any::<prop::sample::Index>(),
        edits in prop::collection::vec(edit(), 1..6),
        between in prop::collection::vec(any::<prop::sample::Index>(), 0..3),
        named in any::<bool>(),
        opaque in any::<bool>(),
    ) {
        let kind = kind_from(kind);
        let list = bases(&kind);
        let base = list[pick.index(list.len())].as_bytes();
        let others = others(&kind);
        let mut stream = Vec::new();
        stream.extend(frame(&kind, base, named));
        stream.extend(frame(&kind, &apply(base, &Edit::Body(usize::MAX, b"next".to_vec())), named));
        for (i, e) in edits.iter().enumerate() {
            stream.extend(frame(&kind, &apply(base, e), named));
            if let Some(o) = between.get(i) {
                stream.extend(frame(&kind, others[o.index(others.len())].as_bytes(), false));
            }
            stream.extend(frame(&kind, base, named));
        }
        let mut config = ObserverConfig::default();
        config.semantic.opaque_reasoning_is_semantic = opaque;
        let mut slow_config = reference();
        slow_config.semantic.opaque_reasoning_is_semantic = opaque;
        let fast = run_with(kind.clone(), config, &stream, &[]);
        let slow = run_with(kind, slow_config, &stream, &[]);
        prop_assert_eq!(fast, slow);
    }

    /// Whole-event SSE dispatch against the line-by-line path: a stream of
    /// random lines (named and unnamed events, ids, retries, comments, CR,
    /// CRLF, no space after the colon, multi-line data) read whole and read
    /// cut anywhere.
    #[test]
    fn whole_event_dispatch_equals_line_by_line(
        kind in 0usize..2,
        lines in prop::collection::vec(prop::sample::select(vec![
            "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}\n",
            "data:{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}]}\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"}}]}\r\n",
            "event: content_block_delta\n",
            "event:ping\n",
            "event: message_stop\r",
            "id: 7\n",
            "id\n",
            "retry: 10\n",
            ": keepalive\n",
            "\n",
            "\r\n",
            "\r",
            "data\n",
            "data: {\"type\":\"message_stop\"}\n",
            "data: [DONE]\n",
            "\u{FEFF}",
        ]), 0..40),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 1..8),
    ) {
        let kind = [ProtocolKind::Anthropic, ProtocolKind::OpenAiChat][kind].clone();
        let bytes = lines.concat().into_bytes();
        let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
        cuts.sort_unstable();
        let whole = run_with(kind.clone(), ObserverConfig::default(), &bytes, &[]);
        let mut split = run_with(kind.clone(), ObserverConfig::default(), &bytes, &cuts);
        // After an error the reads stop, at a boundary that depends on the cuts.
        split.evidence.progress.raw_bytes = whole.evidence.progress.raw_bytes;
        prop_assert_eq!(&whole, &split);
        let slow = run_with(kind, reference(), &bytes, &[]);
        prop_assert_eq!(whole, slow);
    }
}

/// Pieces of an OpenAI Chat stream around the delta shape the fused path
/// learns: `{}` stands for a fresh content string.
const FUSED_PIECES: &[&str] = &[
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"{}\"},\"finish_reason\":null}],\"obfuscation\":\"{}\"}\n\n",
    "data:{\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"{}\"},\"finish_reason\":null}],\"obfuscation\":\"o\"}\n\n",
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"{}\"},\"finish_reason\":null}],\"obfuscation\":\"o\"}\r\n\r\n",
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"{}\"},\"finish_reason\":null}],\"obfuscation\":\"o\"}\n",
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"{}\"},\"finish_reason\":null}],\"obfuscation\":\"o\"}\r",
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"{}\"},\"finish_reason\":null}],\"obfuscation\":\"o\"}",
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"{}\"},\"finish_reason\":null}],\n\"obfuscation\":\"o\"}\n\n",
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"{}\"},\"finish_reason\":\"stop\"}]}\n\n",
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\\n\\u00e9{}\"},\"finish_reason\":null}],\"obfuscation\":\"o\"}\n\n",
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\u{e9}{}\"},\"finish_reason\":null}],\"obfuscation\":\"o\"}\n\n",
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"},\"finish_reason\":null}],\"obfuscation\":\"o\"}\n\n",
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"{}\"},\"finish_reason\":null}],\ndata: \"obfuscation\":\"o\"}\n\n",
    "event: delta\n",
    "id: 9\n",
    "id\n",
    ": ping\n",
    "retry: 5\n",
    "\n",
    "\r\n",
    "data: [DONE]\n\n",
    "data: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}\n\n",
];

/// Pieces of an Anthropic stream around the `content_block_delta` shape the
/// fused path learns (after a named event line): `{}` stands for a fresh
/// text.
const ANTHROPIC_FUSED_PIECES: &[&str] = &[
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"{}\"}}\n\n",
    "event:content_block_delta\ndata:{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"{}\"}}\n\n",
    "event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"{}\"}}\n\n",
    "event: content_block_delta\rdata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"{}\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"{}\"}}\r\n\r\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"{}\"}}\n",
    "event: content_block_delta\n",
    "event: \ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"{}\"}}\n\n",
    "event:\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"{}\"}}\n\n",
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"{}\"}}\n\n",
    "event: ping\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"{}\"}}\n\n",
    "event: content_block_delta\n: comment\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"{}\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\ndata: \"delta\":{\"type\":\"text_delta\",\"text\":\"{}\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"\\n\\u00e9{}\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"\u{e9}{}\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"{}\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"{}\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{}\"}}\n\n",
    "event: a_very_long_event_name_that_passes_the_caps_set_below_by_a_margin\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"{}\"}}\n\n",
    // At the event cap set below and one past it (the arming event's data
    // with a longer name), with and without the space after the colon; and
    // a name longer than the line cap.
    "event: content_block_delta_12345678\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"second\"}}\n\n",
    "event:content_block_delta_123456789\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"second\"}}\n\n",
    "event: content_block_delta_123456789\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"second\"}}\n\n",
    "event: xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"{}\"}}\n\n",
    "event: ping\ndata: {\"type\": \"ping\"}\n\n",
    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":5}}\n\n",
    "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
    "id: 9\n",
    ": ping\n",
    "retry: 5\n",
    "\n",
];

/// Lines of an Ollama stream around the delta shape the fused path learns:
/// `{}` stands for a fresh text.
const OLLAMA_FUSED_PIECES: &[&str] = &[
    "{\"model\":\"m\",\"created_at\":\"2024-01-01T00:00:00Z\",\"message\":{\"role\":\"assistant\",\"content\":\"{}\"},\"done\":false}\n",
    "{\"model\":\"m\",\"created_at\":\"2024-01-01T00:00:00Z\",\"message\":{\"role\":\"assistant\",\"content\":\"{}\"},\"done\":false}\r\n",
    "{\"model\":\"m\",\"created_at\":\"2024-01-01T00:00:00Z\",\"message\":{\"role\":\"assistant\",\"content\":\"{}\"},\"done\":false}",
    "{\"model\":\"m\",\"created_at\":\"2024-01-01T00:00:01.25Z\",\"message\":{\"role\":\"assistant\",\"content\":\"{}\"},\"done\":false}\n",
    "{\"model\":\"m\",\"created_at\":\"2024-01-01T00:00:00Z\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":false}\n",
    "{\"model\":\"m\",\"created_at\":\"2024-01-01T00:00:00Z\",\"message\":{\"role\":\"assistant\",\"content\":\"\\n\\u00e9{}\"},\"done\":false}\n",
    "{\"model\":\"m\",\"created_at\":\"2024-01-01T00:00:00Z\",\"message\":{\"role\":\"assistant\",\"content\":\"\u{e9}{}\"},\"done\":false}\n",
    " {\"model\":\"m\",\"created_at\":\"2024-01-01T00:00:00Z\",\"message\":{\"role\":\"assistant\",\"content\":\"{}\"},\"done\":false}\n",
    "{\"model\":\"m\",\"created_at\":\"2024-01-01T00:00:00Z\",\"message\":{\"role\":\"assistant\",\"content\":\"{}\"},\n\"done\":false}\n",
    "{\"model\":\"m\",\"created_at\":\"2024-01-01T00:00:00Z\",\"message\":{\"role\":\"assistant\",\"content\":\"\",\"thinking\":\"{}\"},\"done\":false}\n",
    "{\"model\":\"m\",\"created_at\":\"2024-01-01T00:00:00Z\",\"message\":{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":{}}}]},\"done\":false}\n",
    "{\"model\":\"m\",\"created_at\":\"2024-01-01T00:00:00Z\",\"response\":\"{}\",\"done\":false}\n",
    // Exactly at the caps set below and one past them (the arming line's
    // text is `second`), and far past them.
    "{\"model\":\"m\",\"created_at\":\"2024-01-01T00:00:00Z\",\"message\":{\"role\":\"assistant\",\"content\":\"second12345678\"},\"done\":false}\n",
    "{\"model\":\"m\",\"created_at\":\"2024-01-01T00:00:00Z\",\"message\":{\"role\":\"assistant\",\"content\":\"second123456789\"},\"done\":false}\n",
    "{\"model\":\"m\",\"created_at\":\"2024-01-01T00:00:00Z\",\"message\":{\"role\":\"assistant\",\"content\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx{}\"},\"done\":false}\n",
    "{\"model\":\"m\",\"created_at\":\"2024-01-01T00:00:00Z\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true,\"done_reason\":\"stop\"}\n",
    "{\"error\":\"model overloaded\"}\n",
    "\n",
    "   \n",
    "\r\n",
];

/// The fused path against the reference decode, whole and cut anywhere:
/// `preamble`, two deltas of `pieces[0]`'s shape that arm the template, then
/// the chosen pieces. `caps` 1 and 2 set the event cap and the line cap a
/// little above the arming event, so that longer ones pass them.
fn fused_agrees(
    kind: &ProtocolKind,
    preamble: &str,
    pieces: &[&str],
    (chosen, texts): (&[prop::sample::Index], &[String]),
    cuts: &[prop::sample::Index],
    caps: usize,
) -> Result<(), TestCaseError> {
    let piece = |i: usize, text: &str| {
        let text = text.replace('\\', "\\\\").replace('"', "\\\"");
        pieces[i].replace("{}", &text)
    };
    let mut stream = preamble.to_owned() + &piece(0, "first") + &piece(0, "second");
    let armed = stream.len();
    for (k, p) in chosen.iter().enumerate() {
        stream += &piece(p.index(pieces.len()), &texts[k]);
    }
    let bytes = stream.into_bytes();
    let mut config = ObserverConfig::default();
    let mut slow = reference();
    let arming = piece(0, "second");
    let name = arming
        .lines()
        .find_map(|l| l.strip_prefix("event: "))
        .map_or(0, str::len);
    // The event cap counts an SSE event's data, its line end and its name;
    // an NDJSON line counts against both caps alike.
    let (line, event) = match arming.lines().find(|l| l.starts_with("data:")) {
        Some(data_line) => (data_line.len(), data_line.len() - 6 + 1 + name),
        None => (arming.trim_end().len(), arming.trim_end().len()),
    };
    match caps {
        1 => config.limits.max_event = event + 8,
        2 => config.limits.max_line = line + 8,
        _ => {}
    }
    slow.limits = config.limits;
    // The caps leave the preamble and the arming deltas whole.
    let start = run_with(kind.clone(), config, &bytes[..armed], &[]);
    prop_assert_eq!(start.error, None);
    let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
    cuts.sort_unstable();
    let whole = run_with(kind.clone(), config, &bytes, &[]);
    let reference = run_with(kind.clone(), slow, &bytes, &[]);
    prop_assert_eq!(&whole, &reference, "{}", String::from_utf8_lossy(&bytes));
    let mut split = run_with(kind.clone(), config, &bytes, &cuts);
    split.evidence.progress.raw_bytes = whole.evidence.progress.raw_bytes;
    prop_assert_eq!(&whole, &split);
    // One read per line, and one per SSE event (as a server flushing each
    // event delivers them): most reads then start where the fused path
    // looks.
    for end in [&b"\n"[..], b"\n\n"] {
        let ends: Vec<usize> = (end.len()..=bytes.len())
            .filter(|&i| bytes[..i].ends_with(end))
            .collect();
        let mut read = run_with(kind.clone(), config, &bytes, &ends);
        read.evidence.progress.raw_bytes = whole.evidence.progress.raw_bytes;
        prop_assert_eq!(&whole, &read);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The fused delta path against the line-by-line path and the
    /// reference decode: a learned delta shape, then pieces that match it,
    /// break its framing or change the stream's state.
    #[test]
    fn fused_deltas_agree_with_the_reference(
        pieces in prop::collection::vec(any::<prop::sample::Index>(), 0..30),
        texts in prop::collection::vec("[a-z \"\\\\]{0,12}", 30),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        caps in 0usize..3,
    ) {
        fused_agrees(&ProtocolKind::OpenAiChat, "", FUSED_PIECES, (&pieces, &texts), &cuts, caps)?;
    }

    /// The same for Ollama's NDJSON delta lines.
    #[test]
    fn fused_ollama_lines_agree_with_the_reference(
        pieces in prop::collection::vec(any::<prop::sample::Index>(), 0..30),
        texts in prop::collection::vec("[a-z \"\\\\]{0,12}", 30),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        caps in 0usize..3,
    ) {
        fused_agrees(&ProtocolKind::Ollama, "", OLLAMA_FUSED_PIECES, (&pieces, &texts), &cuts, caps)?;
    }

    /// The same for Anthropic's named `content_block_delta` events.
    #[test]
    fn fused_anthropic_deltas_agree_with_the_reference(
        pieces in prop::collection::vec(any::<prop::sample::Index>(), 0..30),
        texts in prop::collection::vec("[a-z \"\\\\]{0,12}", 30),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        caps in 0usize..3,
    ) {
        // Short enough for the caps below.
        let preamble = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\"}}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\"}}\n\n";
        fused_agrees(
            &ProtocolKind::Anthropic,
            preamble,
            ANTHROPIC_FUSED_PIECES,
            (&pieces, &texts),
            &cuts,
            caps,
        )?;
    }
}

/// A read that starts inside a line (after a carried partial line) is never
/// taken as whole delta lines, even when what it starts with matches.
#[test]
fn a_read_inside_a_line_is_never_taken_whole() {
    let line = |t: &str| {
        format!(
            "{{\"model\":\"m\",\"created_at\":\"2024-01-01T00:00:00Z\",\"message\":{{\"role\":\"assistant\",\"content\":\"{t}\"}},\"done\":false}}\n"
        )
    };
    for carried in [" ", "x", "[", "{\"error\":\"a\"}"] {
        let head = line("a") + &line("b") + carried;
        let stream = head.clone() + &line("c") + &line("d");
        let bytes = stream.as_bytes();
        let whole = run_with(ProtocolKind::Ollama, reference(), bytes, &[]);
        let cut = run_with(
            ProtocolKind::Ollama,
            ObserverConfig::default(),
            bytes,
            &[head.len()],
        );
        assert_eq!(whole, cut, "after {carried:?}");
    }
}

/// The template survives other events, lets unread strings vary (an
/// OpenAI `obfuscation`, an Ollama timestamp) and still sees an empty
/// probe, a settled stream and a changed shape.
#[test]
fn templates_track_real_variation() {
    let kind = ProtocolKind::OpenAiChat;
    let chunk = |content: &str, pad: &str| {
        format!(
            "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":{}}},\"finish_reason\":null}}],\"obfuscation\":\"{pad}\"}}\n\n",
            Value::from(content)
        )
    };
    let mut stream = String::new();
    for (i, text) in ["", "a", "\"q\"", "é\u{1F30D}", "", "\\", "x\ny"]
        .iter()
        .enumerate()
    {
        stream.push_str(&chunk(text, &"z".repeat(i)));
    }
    stream.push_str("data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n");
    stream.push_str(&chunk("late", "zz"));
    stream.push_str("data: [DONE]\n\n");
    let fast = run_with(
        kind.clone(),
        ObserverConfig::default(),
        stream.as_bytes(),
        &[],
    );
    let slow = run_with(kind, reference(), stream.as_bytes(), &[]);
    assert_eq!(fast, slow);
    assert_eq!(fast.evidence.progress.observed_content, 6);

    let kind = ProtocolKind::Ollama;
    let line = |content: &str, stamp: usize, done: bool| {
        format!(
            "{{\"model\":\"m\",\"created_at\":\"2026-01-01T00:00:{stamp:02}Z\",\"message\":{{\"role\":\"assistant\",\"content\":{}}},\"done\":{done}}}\n",
            Value::from(content)
        )
    };
    let mut stream = String::new();
    for (i, text) in ["", "a", "b", "", "c"].iter().enumerate() {
        stream.push_str(&line(text, i, false));
    }
    stream.push_str(&line("", 9, true));
    stream.push_str(&line("after", 10, false));
    let fast = run_with(
        kind.clone(),
        ObserverConfig::default(),
        stream.as_bytes(),
        &[],
    );
    let slow = run_with(kind, reference(), stream.as_bytes(), &[]);
    assert_eq!(fast, slow);
    assert_eq!(fast.evidence.progress.observed_content, 3);
}

/// A template learned after another one was widened starts afresh (its
/// probe is its own): a delta of one choice, a delta of another, the first
/// shape again with an unread string changed.
#[test]
fn a_relearned_template_probes_its_own_string() {
    let base = bases(&ProtocolKind::OpenAiChat)[0];
    let id_changed = base.replacen("\"chatcmpl", "\"0hatcmpl", 1);
    let fingerprint_changed = base.replacen("\"fp_", "\"{p_", 1);
    let other =
        r#"{"id":"c1","choices":[{"index":1,"delta":{"content":"x"},"finish_reason":null}]}"#;
    let events = [base, &id_changed, other, base, &fingerprint_changed, base];
    let stream = events.iter().fold(String::new(), |mut out, d| {
        out.push_str("data: ");
        out.push_str(d);
        out.push_str("\n\n");
        out
    });
    let kind = ProtocolKind::OpenAiChat;
    let fast = run_with(
        kind.clone(),
        ObserverConfig::default(),
        stream.as_bytes(),
        &[],
    );
    let slow = run_with(kind, reference(), stream.as_bytes(), &[]);
    assert_eq!(fast, slow);
    assert_eq!(fast.classes(), "S S S S S S");
}

/// The resume cursor does not depend on where reads end: an id set and
/// then reset to empty inside one read is recorded as reset.
#[test]
fn last_event_id_reset_is_split_invariant() {
    let bytes = b"id: 7\ndata: {\"type\":\"ping\"}\n\nid\ndata: {\"type\":\"ping\"}\n\n";
    let kind = ProtocolKind::Anthropic;
    let whole = run_with(kind.clone(), ObserverConfig::default(), bytes, &[]);
    for cut in 0..=bytes.len() {
        let split = run_with(kind.clone(), ObserverConfig::default(), bytes, &[cut]);
        assert_eq!(split, whole, "cut at {cut}");
    }
    assert_eq!(whole.evidence.cursor.last_event_id.as_deref(), Some(""));
}
