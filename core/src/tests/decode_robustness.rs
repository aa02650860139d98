//! Decoder robustness cases R1–R35 (malformed, split, oversized and
//! adversarial streams) and the decoder fault rows (BD3, BD6, BD7, PT8,
//! PT10, PT14, PT15, DC2, ST4; CONTRIBUTING.md, "Test names").

use super::decode_support as support;

use crate::observer::{EndOfStream, StreamObserver};
use crate::progress::{Proof, Transience, UnsuccessfulReason};
use crate::protocol::{EventClass, ProtocolKind, classify_error_body};
use crate::wire::{Limits, ProtocolViolation, SseDecoder, SseItem};
use support::{fixture, run, run_fixture, run_with};

/// Raw SSE framing: (event type, data) of each dispatched event.
fn frames(chunks: &[&[u8]]) -> (Vec<(String, String)>, usize, SseDecoder) {
    let mut dec = SseDecoder::new(Limits::default());
    let mut out = Vec::new();
    let mut comments = 0;
    for c in chunks {
        dec.feed(c, |item| {
            match item {
                SseItem::Event(e) => out.push((
                    String::from_utf8(e.event_type.to_vec()).unwrap(),
                    String::from_utf8(e.data.to_vec()).unwrap(),
                )),
                SseItem::Comment { .. } => comments += 1,
            }
            Ok(())
        })
        .unwrap();
    }
    (out, comments, dec)
}

fn data(list: &[(String, String)]) -> Vec<&str> {
    list.iter().map(|(_, d)| d.as_str()).collect()
}

fn chat() -> ProtocolKind {
    ProtocolKind::OpenAiChat
}

#[test]
fn r1_crlf_gives_the_same_events_as_lf() {
    let crlf = run_fixture("gemini/crlf-happy.sse");
    let lf = run_fixture("gemini/lf-happy.sse");
    assert_eq!(crlf.classes(), lf.classes());
    assert_eq!(crlf.end, lf.end);
}

#[test]
fn r2_cr_only_line_ends() {
    assert_eq!(data(&frames(&[b"data: a\r\rdata: b\r\r"]).0), ["a", "b"]);
}

#[test]
fn r3_crlf_split_across_reads_is_one_line_end() {
    let (ev, ..) = frames(&[b"data: a\r", b"\ndata: b\r\n\r\n"]);
    assert_eq!(data(&ev), ["a\nb"]);
}

#[test]
fn r4_split_utf8_code_point() {
    let (ev, ..) = frames(&[b"data: caf\xC3", b"\xA9\n\n"]);
    assert_eq!(data(&ev), ["café"]);
}

#[test]
fn r5_r6_leading_space_rules() {
    assert_eq!(data(&frames(&[b"data:{\"a\":1}\n\n"]).0), ["{\"a\":1}"]);
    assert_eq!(data(&frames(&[b"data:  x\n\n"]).0), [" x"]);
}

#[test]
fn r7_multi_line_data_is_joined_with_lf() {
    assert_eq!(
        data(&frames(&[b"data: {\"a\":\ndata: 1}\n\n"]).0),
        ["{\"a\":\n1}"]
    );
}

#[test]
fn r8_field_without_colon_dispatches_empty_data() {
    let (ev, ..) = frames(&[b"data\n\n"]);
    assert_eq!(data(&ev), [""]);
    let run = run(
        ProtocolKind::Sse {
            terminal_sentinel: None,
        },
        b"data\n\n",
    );
    assert_eq!(run.classes(), "N");
}

#[test]
fn r9_event_without_data_dispatches_nothing() {
    assert!(frames(&[b"event: ping\n\n"]).0.is_empty());
}

#[test]
fn r10_comment_between_fields() {
    let (ev, comments, _) = frames(&[b"event: x\n: hi\ndata: 1\n\n"]);
    assert_eq!(ev, [("x".to_owned(), "1".to_owned())]);
    assert_eq!(comments, 1);
}

#[test]
fn r11_bom_is_stripped_once() {
    assert_eq!(data(&frames(&[b"\xEF\xBB\xBFdata: 1\n\n"]).0), ["1"]);
    // Split inside the BOM.
    assert_eq!(
        data(&frames(&[b"\xEF", b"\xBB", b"\xBFdata: 1\n\n"]).0),
        ["1"]
    );
    // A second BOM is data: the field name no longer matches.
    assert!(
        frames(&[b"\xEF\xBB\xBF\xEF\xBB\xBFdata: 1\n\n"])
            .0
            .is_empty()
    );
}

#[test]
fn r12_eof_with_pending_buffer() {
    // Truncation evidence; no semantic value had begun (AT3), so it does not
    // block a replay.
    let run = run(chat(), b"data: {\"choices\":[");
    assert!(run.records.is_empty());
    assert!(
        matches!(run.end, EndOfStream::UnexpectedEof { pending: Some(p) } if p.bytes > 0 && !p.may_be_semantic)
    );
}

#[test]
fn r13_complete_event_without_terminal_is_unexpected_eof() {
    assert_eq!(
        run_fixture("openai-chat/clean-eof-no-terminal.sse").end,
        EndOfStream::UnexpectedEof { pending: None }
    );
}

#[test]
fn r14_finish_reason_without_done_is_weak_success() {
    assert_eq!(
        run_fixture("openai-chat/finish-no-done.sse").end,
        EndOfStream::Success {
            proof: Proof::FinishReasonOnly
        }
    );
}

#[test]
fn r15_done_without_finish_reason() {
    assert_eq!(
        run_fixture("openai-chat/done-no-finish.sse").end,
        EndOfStream::Unsuccessful {
            reason: UnsuccessfulReason::MissingFinishReason
        }
    );
}

#[test]
fn r16_r17_pt8_responses_error_shapes() {
    let flat = run_fixture("openai-responses/error-flat.sse")
        .evidence
        .provider_error
        .unwrap();
    assert_eq!(flat.code.unwrap().as_str(), "server_error");
    assert_eq!(flat.transience, Transience::Transient);
    let nested = run_fixture("openai-responses/error-nested.sse");
    let e = nested.evidence.provider_error.clone().unwrap();
    assert_eq!(e.code.unwrap().as_str(), "insufficient_quota");
    assert_eq!(e.transience, Transience::Permanent);
    // PT8: error followed by response.failed is still one outcome.
    assert_eq!(
        nested
            .records
            .iter()
            .filter(|r| r.info.class == EventClass::Error)
            .count(),
        1
    );
    // response.failed alone classifies the same way.
    let alone = run_fixture("openai-responses/failed-only.sse")
        .evidence
        .provider_error
        .unwrap();
    assert_eq!(alone.transience, Transience::Transient);
}

#[test]
fn r18_pt15_keepalive_between_deltas() {
    let with = run_fixture("openai-responses/keepalive.sse");
    assert_eq!(with.evidence.progress.keepalives, 1);
    assert_eq!(with.end, run_fixture("openai-responses/happy.sse").end);
}

#[test]
fn r19_pt15_done_after_completed_is_ignored() {
    let run = run_fixture("openai-responses/done-after-completed.sse");
    assert_eq!(
        run.records.last().unwrap().info.class,
        EventClass::NonSemantic
    );
    assert_eq!(
        run.end,
        EndOfStream::Success {
            proof: Proof::Strong
        }
    );
}

#[test]
fn r20_response_done_completed() {
    assert!(
        run_fixture("openai-responses/done-codex.sse")
            .evidence
            .terminal
            .unwrap()
            .is_success()
    );
}

#[test]
fn r21_bad_retry_and_nul_id_are_ignored() {
    let (_, _, dec) = frames(&[&fixture("sse/edge.sse")]);
    assert_eq!(dec.last_event_id(), b"7");
    assert_eq!(dec.retry_ms(), None);
    let (_, _, dec) = frames(&[b"retry: 1500\n\n"]);
    assert_eq!(dec.retry_ms(), Some(1500));
    let run = run_fixture("sse/edge.sse");
    assert_eq!(run.evidence.cursor.last_event_id.as_deref(), Some("7"));
}

#[test]
fn r22_bd6_line_over_the_cap_is_typed_and_bounded() {
    let cap = 4096;
    let config = crate::observer::ObserverConfig {
        limits: Limits::uniform(cap),
        ..Default::default()
    };
    for kind in [chat(), ProtocolKind::Ollama] {
        let mut obs = StreamObserver::with_config(kind, config);
        let mut err = None;
        obs.feed(b"data: ").ok();
        for _ in 0..10_000 {
            match obs.feed(&[b'x'; 1024]) {
                Ok(_) => assert!(obs.buffered() <= cap + 1),
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        assert_eq!(err, Some(ProtocolViolation::LineTooLong { cap }));
        assert!(matches!(obs.finish(), EndOfStream::Violation { .. }));
        // The error sticks.
        assert!(obs.feed(b"\n\n").is_err());
    }
}

#[test]
fn r23_one_byte_reads_match_one_read() {
    for file in support::all_stream_fixtures() {
        let bytes = fixture(&file);
        let cuts: Vec<usize> = (1..bytes.len()).collect();
        let split = run_with(
            support::kind_of(&file),
            crate::observer::ObserverConfig::default(),
            &bytes,
            &cuts,
        );
        assert_eq!(split, run_fixture(&file), "{file}");
    }
}

#[test]
fn r24_r25_pt10_anthropic_message_start_duplicates_and_splices() {
    assert!(
        run_fixture("anthropic/duplicate-message-start.sse")
            .evidence
            .terminal
            .unwrap()
            .is_success()
    );
    let spliced = run_fixture("anthropic/spliced-message-start.sse");
    assert_eq!(spliced.error, Some(ProtocolViolation::SplicedMessage));
    assert!(
        spliced.evidence.progress.semantic_observed(),
        "no replay after S"
    );
}

#[test]
fn r26_n_choices_need_every_finish_reason() {
    assert!(
        run_fixture("openai-chat/n2-choices.sse")
            .evidence
            .terminal
            .unwrap()
            .is_success()
    );
    assert!(
        !run_fixture("openai-chat/n2-one-unfinished.sse")
            .evidence
            .terminal
            .unwrap()
            .is_success()
    );
}

#[test]
fn r27_r28_empty_choices_chunks_are_n() {
    let run = run_fixture("openai-chat/azure-prompt-filter.sse");
    assert_eq!(run.records[0].info.class, EventClass::NonSemantic);
    let run = run_fixture("openai-chat/happy-usage.sse");
    assert_eq!(run.records[4].info.class, EventClass::NonSemantic);
    assert_eq!(run.evidence.generation.usage.total_tokens, Some(11));
}

#[test]
fn r29_openrouter_error_chunk() {
    let e = run_fixture("openai-chat/openrouter-error.sse")
        .evidence
        .provider_error
        .unwrap();
    assert_eq!((e.status, e.transience), (Some(502), Transience::Transient));
}

#[test]
fn r30_vllm_error() {
    assert_eq!(run_fixture("openai-chat/vllm-error.sse").classes(), "E");
}

#[test]
fn r31_gemini_tail_without_blank_line() {
    let run = run_fixture("gemini/tail-no-blank.sse");
    assert!(matches!(
        run.end,
        EndOfStream::UnexpectedEof { pending: Some(_) }
    ));
}

#[test]
fn r32_ndjson_crlf() {
    assert_eq!(run_fixture("ollama/crlf.ndjson"), {
        let mut lf = run_fixture("ollama/chat-happy.ndjson");
        // Offsets differ by the CR bytes; classes and outcome do not.
        lf.records
            .clone_from(&run_fixture("ollama/crlf.ndjson").records);
        lf.committed_at = run_fixture("ollama/crlf.ndjson").committed_at;
        lf.evidence.progress.raw_bytes = fixture("ollama/crlf.ndjson").len() as u64;
        lf
    });
}

#[test]
fn r33_ndjson_unterminated_complete_tail() {
    let run = run_fixture("ollama/unterminated-tail.ndjson");
    assert!(run.evidence.unterminated_final_line);
    assert_eq!(
        run.end,
        EndOfStream::Success {
            proof: Proof::Strong
        }
    );
}

#[test]
fn r34_anthropic_omitted_thinking_is_semantic() {
    assert!(
        run_fixture("anthropic/thinking-omitted.sse")
            .evidence
            .progress
            .observed_reasoning
            > 0
    );
}

#[test]
fn r35_tool_name_then_cut_blocks_replay() {
    let run = run_fixture("openai-chat/tool-name-then-cut.sse");
    assert!(run.evidence.progress.blocks_replay());
    assert!(matches!(run.end, EndOfStream::UnexpectedEof { .. }));
}

/// AT3: one rule for the frame an attempt ends inside, whatever ended it.
/// It may hold output when a semantic value has begun (or cannot be ruled
/// out); JSON cut before any semantic value holds none.
#[test]
fn at3_unfinished_frame_rule() {
    let sse = |kind: ProtocolKind, bytes: &[u8], semantic: bool| {
        let mut o = StreamObserver::new(kind.clone());
        o.observe(bytes).unwrap();
        let u = o.unfinished().expect("an unfinished frame");
        assert_eq!(
            u.may_be_semantic,
            semantic,
            "{kind}: {:?}",
            String::from_utf8_lossy(bytes)
        );
        assert!(u.bytes > 0);
        // The clean end judges it the same way.
        match o.finish() {
            EndOfStream::UnexpectedEof { pending: Some(p) } => assert_eq!(p, u),
            other => panic!("{other:?}"),
        }
    };
    let chat = ProtocolKind::OpenAiChat;
    sse(chat.clone(), b"data: {", false);
    sse(chat.clone(), b"dat", false);
    sse(
        chat.clone(),
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"",
        false,
    );
    sse(
        chat.clone(),
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"",
        false,
    );
    sse(
        chat.clone(),
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel",
        true,
    );
    // Cut right after the opening quote: the next byte may have been output.
    sse(
        chat.clone(),
        b"data: {\"choices\":[{\"delta\":{\"content\":\"",
        true,
    );
    sse(
        chat.clone(),
        b"data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"x",
        true,
    );
    sse(
        chat.clone(),
        b"data: {\"choices\":[{\"delta\":{\"tool_calls\":[{",
        true,
    );
    sse(
        chat.clone(),
        b"data: {\"choices\":[{\"delta\":{\"refusal\":\"I c",
        true,
    );
    sse(chat.clone(), b": keep", false);
    // A complete data line waiting for its blank line: judged the same way.
    sse(
        chat.clone(),
        b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n",
        true,
    );
    let anthropic = ProtocolKind::Anthropic;
    sse(anthropic.clone(), b"event: content_block_delta\n", false);
    sse(
        anthropic.clone(),
        b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"On",
        true,
    );
    sse(
        anthropic.clone(),
        b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"a",
        true,
    );
    sse(anthropic, b"event: ping\ndata: {\"type\":\"pi", false);
    let responses = ProtocolKind::OpenAiResponses;
    sse(
        responses.clone(),
        b"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hel",
        true,
    );
    sse(
        responses,
        b"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"item_id\":\"m",
        false,
    );
    let ollama = ProtocolKind::Ollama;
    sse(
        ollama.clone(),
        b"{\"model\":\"llama3.2\",\"message\":{\"role\":\"assistant\"",
        false,
    );
    sse(
        ollama,
        b"{\"model\":\"llama3.2\",\"message\":{\"role\":\"assistant\",\"content\":\"Hi",
        true,
    );
    // A generic SSE stream's data is text: any of it may be output.
    let generic = ProtocolKind::Sse {
        terminal_sentinel: None,
    };
    sse(generic.clone(), b"data: x", true);
    sse(generic, b"data:", false);
    // Between frames there is nothing unfinished.
    let mut o = StreamObserver::new(ProtocolKind::OpenAiChat);
    o.observe(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n")
        .unwrap();
    assert_eq!(o.unfinished(), None);
}

#[test]
fn bd3_pending_non_semantic_event_allows_replay() {
    for (file, semantic) in [
        ("anthropic/pending-ping-cut.sse", false),
        ("openai-responses/pending-keepalive-cut.sse", false),
        ("anthropic/pending-delta-cut.sse", true),
        // `data: {"choices":[`: no semantic value has begun.
        ("openai-chat/pending-cut.sse", false),
    ] {
        let p = run_fixture(file).evidence.pending_at_eof.unwrap();
        assert_eq!(p.may_be_semantic, semantic, "{file}");
    }
    // A cut comment is a keepalive, not output.
    let run = run(chat(), b": keep-al");
    assert!(!run.evidence.pending_at_eof.unwrap().may_be_semantic);
}

#[test]
fn bd7_malformed_json_and_invalid_utf8_are_typed() {
    let bad_json = run(chat(), b"data: {\"choices\":[}\n\n");
    assert_eq!(bad_json.error, Some(ProtocolViolation::MalformedJson));
    let bad_utf8 = run(chat(), b"data: {\"x\":\"\xFF\"}\n\n");
    assert_eq!(bad_utf8.error, Some(ProtocolViolation::InvalidUtf8));
    let not_object = run(ProtocolKind::Anthropic, b"data: [1]\n\n");
    assert_eq!(not_object.error, Some(ProtocolViolation::UnexpectedShape));
    // Display never carries body text.
    let text = format!("{}", ProtocolViolation::MalformedJson);
    assert!(!text.contains("choices"));
}

#[test]
fn pt14_unknown_events_and_reasons() {
    assert_eq!(
        run_fixture("anthropic/unknown-event.sse").records[1]
            .info
            .class,
        EventClass::NonSemantic
    );
    let r = run_fixture("openai-responses/unknown-events.sse");
    assert_eq!(r.records[2].info.class, EventClass::NonSemantic);
    assert!(matches!(r.records[3].info.class, EventClass::Semantic(_)));
    assert!(matches!(
        run_fixture("openai-chat/unknown-finish.sse").end,
        EndOfStream::Unsuccessful {
            reason: UnsuccessfulReason::Other(Some(_))
        }
    ));
}

#[test]
fn dc2_adversarial_streams_stay_bounded() {
    let cap = 2048;
    let config = crate::observer::ObserverConfig {
        limits: Limits::uniform(cap),
        ..Default::default()
    };
    // Endless comments: fine, nothing buffered.
    let mut obs = StreamObserver::with_config(chat(), config);
    for _ in 0..1000 {
        obs.feed(b": keep-alive\n").unwrap();
        assert!(obs.buffered() <= cap);
    }
    // Endless data lines without a blank line: event cap.
    let mut obs = StreamObserver::with_config(chat(), config);
    let mut err = None;
    for _ in 0..1000 {
        if let Err(e) = obs.feed(b"data: xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n") {
            err = Some(e);
            break;
        }
        assert!(obs.buffered() <= cap + 64);
    }
    assert_eq!(err, Some(ProtocolViolation::EventTooLarge { cap }));
}

/// Every provider's way of saying "the prompt is longer than the model's
/// context window" is one safe code, `context_length_exceeded`, permanent;
/// the words of other errors are not mistaken for it.
#[test]
fn context_length_errors_of_every_provider_are_one_code() {
    let cases: [(ProtocolKind, u16, &[u8]); 7] = [
        (
            chat(),
            400,
            br#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
        ),
        (
            ProtocolKind::Anthropic,
            400,
            br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#,
        ),
        (
            ProtocolKind::Gemini,
            400,
            br#"{"error":{"code":400,"message":"The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}"#,
        ),
        (
            chat(),
            400,
            br#"{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens. Please reduce the length of the messages or completion.","type":"BadRequestError","param":null,"code":400}"#,
        ),
        (
            chat(),
            400,
            br#"{"object":"error","message":"Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 maximum context length","type":"invalid_request_message_order","code":"3051"}"#,
        ),
        (
            chat(),
            400,
            br#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error"}}"#,
        ),
        (
            ProtocolKind::OpenAiResponses,
            400,
            br#"{"error":{"message":"Your input exceeds the context window of this model.","type":"invalid_request_error","param":"input","code":"context_length_exceeded"}}"#,
        ),
    ];
    for (kind, status, body) in cases {
        let e = classify_error_body(&kind, Some(status), body).unwrap();
        assert_eq!(
            e.code.as_ref().map(crate::safe::SafeToken::as_str),
            Some("context_length_exceeded"),
            "{}",
            String::from_utf8_lossy(body)
        );
        assert_eq!(e.transience, Transience::Permanent);
    }
    for body in [
        &br#"{"error":{"message":"Invalid value for 'temperature'","type":"invalid_request_error","code":null}}"#[..],
        br#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: too large"}}"#,
        br#"{"error":{"code":400,"message":"Request contains an invalid argument.","status":"INVALID_ARGUMENT"}}"#,
    ] {
        let e = classify_error_body(&chat(), Some(400), body).unwrap();
        assert_ne!(
            e.code.as_ref().map(crate::safe::SafeToken::as_str),
            Some("context_length_exceeded"),
            "{}",
            String::from_utf8_lossy(body)
        );
    }
}

#[test]
fn st4_error_bodies() {
    let openai = br#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
    let e = classify_error_body(&chat(), Some(429), openai).unwrap();
    assert_eq!(e.transience, Transience::Permanent);
    assert_eq!(e.code.unwrap().as_str(), "insufficient_quota");
    let rate =
        br#"{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}"#;
    assert_eq!(
        classify_error_body(&chat(), Some(429), rate)
            .unwrap()
            .transience,
        Transience::Transient
    );
    let anthropic =
        br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
    assert_eq!(
        classify_error_body(&ProtocolKind::Anthropic, Some(529), anthropic)
            .unwrap()
            .transience,
        Transience::Transient
    );
    let gemini = br#"{"error":{"code":429,"message":"x","status":"RESOURCE_EXHAUSTED"}}"#;
    let g = classify_error_body(&ProtocolKind::Gemini, Some(429), gemini).unwrap();
    assert_eq!((g.status, g.transience), (Some(429), Transience::Transient));
    let ollama = fixture("ollama/pre-stream-404.json");
    assert_eq!(
        classify_error_body(&ProtocolKind::Ollama, Some(404), &ollama)
            .unwrap()
            .transience,
        Transience::Permanent
    );
    assert_eq!(
        classify_error_body(&ProtocolKind::Ollama, None, &ollama)
            .unwrap()
            .transience,
        Transience::Unknown
    );
    let openrouter = br#"{"error":{"code":402,"message":"Insufficient credits","metadata":{}}}"#;
    assert_eq!(
        classify_error_body(&chat(), Some(402), openrouter)
            .unwrap()
            .transience,
        Transience::Permanent
    );
    // No code leaks unless allowlisted.
    let secret = br#"{"error":{"message":"m","type":"sk-live-canary","code":"sk-live-canary"}}"#;
    let e = classify_error_body(&chat(), Some(500), secret).unwrap();
    assert!(e.code.is_none());
    assert_eq!(e.transience, Transience::Transient);
    assert!(classify_error_body(&chat(), Some(500), b"<html>").is_none());
}

#[test]
fn non_streamed_bodies_are_evidence() {
    use crate::observer::ObserverConfig;
    let finish = |kind: ProtocolKind, body: &[u8]| {
        let mut obs = StreamObserver::non_streaming(kind, ObserverConfig::default());
        for piece in body.chunks(7) {
            obs.feed(piece).unwrap();
        }
        let end = obs.finish();
        (end, obs.progress().semantic_observed())
    };
    let chat_body = br#"{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;
    assert_eq!(
        finish(chat(), chat_body),
        (
            EndOfStream::Success {
                proof: Proof::Strong
            },
            true
        )
    );
    let length =
        br#"{"choices":[{"index":0,"message":{"content":"Hi"},"finish_reason":"length"}]}"#;
    assert_eq!(
        finish(chat(), length).0,
        EndOfStream::Unsuccessful {
            reason: UnsuccessfulReason::Length
        }
    );
    let hi = chat_body.windows(4).position(|w| w == b"\"Hi\"").unwrap();
    let truncated = &chat_body[..hi + 2];
    let (end, semantic) = finish(chat(), truncated);
    assert!(matches!(end, EndOfStream::UnexpectedEof { pending: Some(p) } if p.may_be_semantic));
    assert!(semantic, "content inside a cut body was observed");
    let before_content = &chat_body[..30];
    assert!(!finish(chat(), before_content).1);
    let anthropic = br#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"Hi"}],"stop_reason":"max_tokens","usage":{"input_tokens":3,"output_tokens":1}}"#;
    assert_eq!(
        finish(ProtocolKind::Anthropic, anthropic),
        (
            EndOfStream::Unsuccessful {
                reason: UnsuccessfulReason::MaxTokens
            },
            true
        )
    );
    let responses = br#"{"id":"resp_1","object":"response","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"Hi"}]}]}"#;
    assert_eq!(
        finish(ProtocolKind::OpenAiResponses, responses),
        (
            EndOfStream::Success {
                proof: Proof::Strong
            },
            true
        )
    );
    let gemini = br#"{"candidates":[{"content":{"parts":[{"text":"Hi"}]},"finishReason":"STOP"}]}"#;
    assert_eq!(
        finish(ProtocolKind::Gemini, gemini),
        (
            EndOfStream::Success {
                proof: Proof::Strong
            },
            true
        )
    );
    let ollama = fixture("ollama/non-stream.json");
    assert_eq!(
        finish(ProtocolKind::Ollama, &ollama),
        (
            EndOfStream::Success {
                proof: Proof::Strong
            },
            true
        )
    );
    let error = br#"{"error":{"type":"server_error","message":"x","code":null}}"#;
    assert!(matches!(
        finish(chat(), error).0,
        EndOfStream::ProviderError { .. }
    ));
}

#[test]
fn protocol_names_parse_and_serialize() {
    for name in [
        "openai-chat",
        "openai-responses",
        "anthropic",
        "gemini",
        "ollama",
    ] {
        let kind: ProtocolKind = name.parse().unwrap();
        assert_eq!(kind.to_string(), name);
        assert_eq!(serde_json::to_string(&kind).unwrap(), format!("\"{name}\""));
    }
    assert_eq!("openai_chat".parse::<ProtocolKind>().unwrap(), chat());
    assert!("smtp".parse::<ProtocolKind>().is_err());
}
