//! Property tests: split invariance (DC1, R23), no panic on arbitrary bytes,
//! bounded memory on an endless line, and the differential check that the
//! fast classifier agrees with a full `serde_json` decode.

use super::decode_support as support;

use std::fmt::Write as _;

use crate::observer::{EndOfStream, ObserverConfig, StreamObserver};
use crate::protocol::ProtocolKind;
use crate::wire::{Limits, ProtocolViolation};
use proptest::prelude::*;
use serde_json::{Value, json};
use support::{all_stream_fixtures, fixture, kind_of, reference, run_fixture, run_with};

fn kinds() -> Vec<ProtocolKind> {
    vec![
        ProtocolKind::OpenAiChat,
        ProtocolKind::OpenAiResponses,
        ProtocolKind::Anthropic,
        ProtocolKind::Gemini,
        ProtocolKind::Ollama,
        ProtocolKind::Sse {
            terminal_sentinel: None,
        },
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// DC1 / R23: any partition of any fixture yields identical events,
    /// offsets, evidence and end (cuts land inside UTF-8 code points and
    /// between CR and LF as they fall).
    #[test]
    fn every_split_of_every_fixture_is_identical(
        pick in any::<prop::sample::Index>(),
        raw_cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..40),
    ) {
        let files = all_stream_fixtures();
        let file = &files[pick.index(files.len())];
        let bytes = fixture(file);
        let mut cuts: Vec<usize> = raw_cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
        cuts.sort_unstable();
        let split = run_with(kind_of(file), ObserverConfig::default(), &bytes, &cuts);
        prop_assert_eq!(split, run_fixture(file));
    }

    /// Arbitrary bytes, any protocol, any partition: typed results only, and
    /// buffers stay under the caps.
    #[test]
    fn arbitrary_bytes_never_panic(
        kind in 0usize..6,
        bytes in prop::collection::vec(any::<u8>(), 0..2048),
        raw_cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..16),
        streaming in any::<bool>(),
    ) {
        let kind = kinds()[kind].clone();
        let cap = 256;
        let config = ObserverConfig { limits: Limits::uniform(cap), ..Default::default() };
        let mut obs = if streaming {
            StreamObserver::with_config(kind, config)
        } else {
            StreamObserver::non_streaming(kind, config)
        };
        let mut cuts: Vec<usize> = raw_cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
        cuts.sort_unstable();
        let mut start = 0;
        for end in cuts.into_iter().chain(std::iter::once(bytes.len())) {
            let _ = obs.feed(&bytes[start..end]);
            prop_assert!(obs.buffered() <= 3 * cap + 2);
            start = end;
        }
        let _ = obs.finish();
    }

    /// Interesting byte soup: SSE/JSON-ish fragments glued at random.
    #[test]
    fn structured_garbage_never_panics(
        kind in 0usize..6,
        parts in prop::collection::vec(prop::sample::select(vec![
            "data: ", "event: ", "id: ", ": c", "\n", "\r", "\r\n", "{", "}", "[", "]", "\"", "\\", "\\u12",
            "\"type\":", "\"choices\":[", "\"delta\":{", "\"content\":\"x\"", ",", ":", "null", "1e999", "-0",
            "\"message_start\"", "\"done\":true", "[DONE]", "\u{e9}", "\u{1F30D}",
        ]), 0..64),
    ) {
        let kind = kinds()[kind].clone();
        let bytes = parts.concat();
        let fast = run_with(kind.clone(), ObserverConfig::default(), bytes.as_bytes(), &[]);
        let slow = run_with(kind, reference(), bytes.as_bytes(), &[]);
        prop_assert_eq!(fast, slow);
    }
}

#[test]
fn fast_and_reference_agree_on_every_fixture() {
    for file in all_stream_fixtures() {
        let bytes = fixture(&file);
        let slow = run_with(kind_of(&file), reference(), &bytes, &[]);
        assert_eq!(run_fixture(&file), slow, "{file}");
    }
}

/// A 1 GiB line without a newline, fed from a generator in 64 KiB reads,
/// ends in `LineTooLong` once the (default 1 MiB) cap is crossed; the
/// buffered bytes never exceed the cap.
#[test]
fn a_gigabyte_line_ends_typed_with_bounded_memory() {
    const GIB: usize = 1 << 30;
    let read = vec![b'a'; 64 * 1024];
    for kind in [ProtocolKind::OpenAiChat, ProtocolKind::Ollama] {
        let mut obs = StreamObserver::new(kind);
        let cap = Limits::default().max_line;
        let mut fed = 0;
        let mut error = None;
        obs.feed(b"data: ").unwrap();
        while fed < GIB {
            match obs.feed(&read) {
                Ok(_) => assert!(obs.buffered() <= cap + 1),
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
            fed += read.len();
        }
        assert_eq!(error, Some(ProtocolViolation::LineTooLong { cap }));
        assert!(fed <= cap + read.len(), "stopped at the cap, not at 1 GiB");
        assert!(matches!(obs.finish(), EndOfStream::Violation { .. }));
    }
}

// ------------------------------------------------ generated events

/// Re-encodes compact JSON with random whitespace and `\uXXXX` escapes, so
/// the scanner meets every legal spelling of the same value.
fn respell(compact: &str, noise: &[u8]) -> String {
    let mut out = String::with_capacity(compact.len() * 2);
    let mut n = noise.iter().copied().cycle();
    let mut in_string = false;
    let mut escaped = false;
    for c in compact.chars() {
        if in_string {
            if escaped {
                escaped = false;
                out.push(c);
            } else if c == '\\' {
                escaped = true;
                out.push(c);
            } else if c == '"' {
                in_string = false;
                out.push(c);
            } else if c.is_ascii_alphanumeric() && n.next().unwrap_or(0) % 5 == 0 {
                write!(out, "\\u{:04x}", c as u32).unwrap();
            } else if c == '/' && n.next().unwrap_or(0) % 2 == 0 {
                out.push_str("\\/");
            } else {
                out.push(c);
            }
        } else {
            out.push(c);
            if c == '"' {
                in_string = true;
            } else if matches!(c, ',' | ':' | '{' | '[') {
                match n.next().unwrap_or(0) % 4 {
                    0 => out.push(' '),
                    1 => out.push_str(" \t "),
                    _ => {}
                }
            }
        }
    }
    out
}

fn text() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        Just(json!("")),
        "[a-z \u{e9}\u{1F30D}\"\\\\/\n\t]{0,12}".prop_map(Value::String),
        Just(json!([])),
        Just(json!({"type":"text","text":"x"})),
        any::<i64>().prop_map(Value::from),
        Just(json!(1.5e300)),
    ]
}

fn word(options: &'static [&'static str]) -> impl Strategy<Value = Value> {
    prop::sample::select(options).prop_map(Value::from)
}

fn extra() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<u32>().prop_map(Value::from),
        "[a-z\"\\\\{}\\[\\]:,]{0,6}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 12, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,6}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Puts `fields` into an object together with random extra keys, in a
/// random order.
fn object(fields: Vec<(&'static str, Value)>, extras: Vec<(String, Value)>, order: u64) -> Value {
    let mut all: Vec<(String, Value)> =
        fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    all.extend(extras);
    let len = all.len().max(1);
    all.rotate_left((order as usize) % len);
    if order.is_multiple_of(3) {
        all.reverse();
    }
    let mut map = serde_json::Map::new();
    for (k, v) in all {
        if v != Value::Null || order.is_multiple_of(2) {
            map.insert(k, v);
        }
    }
    Value::Object(map)
}

fn extras() -> impl Strategy<Value = Vec<(String, Value)>> {
    prop::collection::vec(("[a-z]{1,8}", extra()), 0..3)
}

fn chat_event() -> impl Strategy<Value = Value> {
    (
        text(),
        text(),
        prop_oneof![
            Just(Value::Null),
            Just(json!([{"index":0,"id":"call_1","function":{"name":"f","arguments":""}}])),
            Just(json!([]))
        ],
        word(&[
            "stop",
            "length",
            "tool_calls",
            "content_filter",
            "weird",
            "error",
            "network_error",
        ]),
        any::<bool>(),
        prop_oneof![
            Just(Value::Null),
            Just(json!({"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}))
        ],
        prop_oneof![
            Just(Value::Null),
            Just(json!({"type":"server_error","code":null})),
            Just(json!({"code":429}))
        ],
        extras(),
        any::<u64>(),
        0u64..3,
    )
        .prop_map(
            |(content, reasoning, tools, finish, finished, usage, error, extras, order, index)| {
                let delta = object(
                    vec![
                        ("content", content),
                        ("reasoning_content", reasoning),
                        ("tool_calls", tools),
                    ],
                    vec![],
                    order,
                );
                let choice = object(
                    vec![
                        ("index", json!(index)),
                        ("delta", delta),
                        ("finish_reason", if finished { finish } else { Value::Null }),
                    ],
                    vec![],
                    order / 7,
                );
                object(
                    vec![
                        ("choices", json!([choice])),
                        ("usage", usage),
                        ("error", error),
                    ],
                    extras,
                    order / 11,
                )
            },
        )
}

fn anthropic_event() -> impl Strategy<Value = Value> {
    (
        word(&[
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
            "ping",
            "error",
            "future",
        ]),
        word(&[
            "text_delta",
            "input_json_delta",
            "thinking_delta",
            "signature_delta",
            "citations_delta",
            "other",
        ]),
        word(&[
            "text",
            "tool_use",
            "thinking",
            "redacted_thinking",
            "server_tool_use",
            "web_search_tool_result",
            "fallback",
        ]),
        text(),
        word(&["end_turn", "max_tokens", "refusal", "pause_turn", "odd"]),
        word(&["msg_1", "msg_2"]),
        extras(),
        any::<u64>(),
    )
        .prop_map(
            |(kind, delta_type, block_type, t, stop, id, extras, order)| {
                let delta = object(
                    vec![
                        ("type", delta_type),
                        ("text", t.clone()),
                        ("thinking", t.clone()),
                        ("stop_reason", stop),
                    ],
                    vec![],
                    order,
                );
                let block = object(vec![("type", block_type), ("text", t)], vec![], order / 3);
                let message = json!({"id": id, "usage": {"input_tokens": 3}});
                object(
                    vec![
                        ("type", kind),
                        ("index", json!(order % 3)),
                        ("delta", delta),
                        ("content_block", block),
                        ("message", message),
                        ("error", json!({"type":"overloaded_error"})),
                    ],
                    extras,
                    order / 5,
                )
            },
        )
}

fn responses_event() -> impl Strategy<Value = Value> {
    (
        word(&["response.created", "response.output_text.delta", "response.output_text.done", "keepalive", "response.completed", "response.incomplete", "response.failed", "error", "response.output_item.added", "response.output_item.done", "response.web_search_call.searching", "response.function_call_arguments.done", "response.done", "response.mystery", "response.mystery.delta"]),
        0u64..20,
        word(&["message", "reasoning", "function_call", "web_search_call", "other"]),
        text(),
        word(&["completed", "incomplete", "failed", "cancelled", "queued"]),
        extras(),
        any::<u64>(),
    )
        .prop_map(|(kind, seq, item_type, t, status, extras, order)| {
            let item = object(vec![("type", item_type), ("content", t.clone()), ("summary", json!([]))], vec![], order);
            let response = json!({"id":"resp_1","status":status,"error":{"code":"server_error"},"incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":1}});
            object(
                vec![("type", kind), ("sequence_number", json!(seq)), ("item", item), ("response", response), ("text", t.clone()), ("delta", t), ("code", json!("rate_limit_exceeded"))],
                extras,
                order / 3,
            )
        })
}

fn gemini_event() -> impl Strategy<Value = Value> {
    (
        text(),
        any::<bool>(),
        word(&["STOP", "MAX_TOKENS", "SAFETY", "OTHER"]),
        any::<bool>(),
        any::<bool>(),
        extras(),
        any::<u64>(),
    )
        .prop_map(|(t, thought, finish, finished, blocked, extras, order)| {
            let part = object(
                vec![
                    ("text", t),
                    ("thought", json!(thought)),
                    (
                        "functionCall",
                        if order % 4 == 0 {
                            json!({"name":"f"})
                        } else {
                            Value::Null
                        },
                    ),
                ],
                vec![],
                order,
            );
            let cand = object(
                vec![
                    ("content", json!({"parts":[part]})),
                    ("finishReason", if finished { finish } else { Value::Null }),
                    ("index", json!(order % 2)),
                ],
                vec![],
                order / 3,
            );
            let feedback = if blocked {
                json!({"blockReason":"SAFETY"})
            } else {
                Value::Null
            };
            object(
                vec![
                    ("candidates", json!([cand])),
                    ("promptFeedback", feedback),
                    ("usageMetadata", json!({"promptTokenCount": 4})),
                ],
                extras,
                order / 5,
            )
        })
}

fn ollama_event() -> impl Strategy<Value = Value> {
    (
        text(),
        text(),
        any::<bool>(),
        word(&["stop", "length", "load", "weird"]),
        any::<bool>(),
        extras(),
        any::<u64>(),
    )
        .prop_map(|(content, thinking, done, reason, err, extras, order)| {
            if err && order % 5 == 0 {
                return json!({"error": "boom"});
            }
            let message = object(
                vec![
                    ("role", json!("assistant")),
                    ("content", content.clone()),
                    ("thinking", thinking),
                ],
                vec![],
                order,
            );
            object(
                vec![
                    ("message", message),
                    ("response", content),
                    ("done", json!(done)),
                    ("done_reason", reason),
                    ("eval_count", json!(order % 100)),
                ],
                extras,
                order / 3,
            )
        })
}

fn frame(kind: &ProtocolKind, event: &Value, noise: &[u8]) -> String {
    let body = respell(&event.to_string(), noise);
    if kind.is_ndjson() {
        format!("{body}\n")
    } else {
        format!("data: {body}\n\n")
    }
}

fn check(kind: &ProtocolKind, events: &[Value], noise: &[u8]) -> Result<(), TestCaseError> {
    let stream: String = events.iter().map(|e| frame(kind, e, noise)).collect();
    // Every respelling still means the same JSON.
    for e in events {
        let spelled = respell(&e.to_string(), noise);
        prop_assert_eq!(&serde_json::from_str::<Value>(&spelled).unwrap(), e);
    }
    let fast = run_with(
        kind.clone(),
        ObserverConfig::default(),
        stream.as_bytes(),
        &[],
    );
    let slow = run_with(kind.clone(), reference(), stream.as_bytes(), &[]);
    prop_assert_eq!(fast, slow);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn differential_chat(events in prop::collection::vec(chat_event(), 1..6), noise in prop::collection::vec(any::<u8>(), 1..32)) {
        check(&ProtocolKind::OpenAiChat, &events, &noise)?;
    }

    #[test]
    fn differential_anthropic(events in prop::collection::vec(anthropic_event(), 1..6), noise in prop::collection::vec(any::<u8>(), 1..32)) {
        check(&ProtocolKind::Anthropic, &events, &noise)?;
    }

    #[test]
    fn differential_responses(events in prop::collection::vec(responses_event(), 1..6), noise in prop::collection::vec(any::<u8>(), 1..32)) {
        check(&ProtocolKind::OpenAiResponses, &events, &noise)?;
    }

    #[test]
    fn differential_gemini(events in prop::collection::vec(gemini_event(), 1..6), noise in prop::collection::vec(any::<u8>(), 1..32)) {
        check(&ProtocolKind::Gemini, &events, &noise)?;
    }

    #[test]
    fn differential_ollama(events in prop::collection::vec(ollama_event(), 1..6), noise in prop::collection::vec(any::<u8>(), 1..32)) {
        check(&ProtocolKind::Ollama, &events, &noise)?;
    }

    /// Arbitrary JSON documents: the validator accepts exactly what
    /// serde_json accepts.
    #[test]
    fn validator_agrees_with_serde_json(doc in "[ \\[\\]{}\":,0-9a-z.eE+\\-\\\\u]{0,40}") {
        use crate::json::parse_reference;
        prop_assert_eq!(fast_verdict(doc.as_bytes()), parse_reference(doc.as_bytes()).err(), "{}", doc);
    }
}

/// The fast validators' verdict on `doc` (`None`: valid): the lazy one and
/// a fresh tape must agree.
fn fast_verdict(doc: &[u8]) -> Option<ProtocolViolation> {
    use crate::json::{Lazy, Tape};
    let lazy = Lazy::parse(doc).err();
    let tape = Tape::default().parse(doc).err();
    assert_eq!(
        lazy,
        tape,
        "lazy and tape disagree on {:?}",
        String::from_utf8_lossy(doc)
    );
    lazy
}

#[test]
fn validator_edge_cases_match_serde_json() {
    use crate::json::parse_reference;
    let cases: &[&str] = &[
        "{}",
        "[]",
        " {\"a\" : [1, -0, 0.5e-3, 1E+2]} ",
        "01",
        "-",
        "1.",
        ".5",
        "1e",
        "\"\\ud83c\\udf0d\"",
        "\"\\ud83c\"",
        "\"\\udf0d\"",
        "\"\\ud83c\\u0041\"",
        "\"\\x\"",
        "\"a\u{1}\"",
        "1e400",
        "-1e400",
        "123456789012345678901234567890",
        "[1,]",
        "{\"a\":1,}",
        "{\"a\"}",
        "nul",
        "true false",
        "\"\\u00e9\"",
        "[[[[[[[[[[]]]]]]]]]]",
        "\"\t\"",
        "{\"a\":1}x",
        "  ",
        "",
    ];
    for c in cases {
        assert_eq!(
            fast_verdict(c.as_bytes()),
            parse_reference(c.as_bytes()).err(),
            "{c:?}"
        );
    }
    let deep_ok = format!("{}{}", "[".repeat(127), "]".repeat(127));
    let deep_bad = format!("{}{}", "[".repeat(128), "]".repeat(128));
    for d in [deep_ok, deep_bad] {
        assert_eq!(
            fast_verdict(d.as_bytes()),
            parse_reference(d.as_bytes()).err(),
            "depth {}",
            d.len() / 2
        );
    }
}
