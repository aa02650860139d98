//! Every fixture under `tests/fixtures/<protocol>/` decoded in one read:
//! the class of each frame, how the stream ends, whether semantic output was
//! observed (replay forbidden), and completed tool calls. The expectations
//! are the providers' documented stream grammars (README, "Supported
//! protocols") applied to recorded streams.

use super::decode_support as support;

use crate::observer::EndOfStream;
use crate::progress::{Proof, Transience, UnsuccessfulReason};
use support::{run_fixture, run_with};

const STRONG: &str = "Success { proof: Strong }";
const WEAK: &str = "Success { proof: FinishReasonOnly }";
const EOF_CLEAN: &str = "UnexpectedEof { pending: None }";

/// (fixture, classes, end (Debug), semantic observed, completed tool calls)
const TABLE: &[(&str, &str, &str, bool, u64)] = &[
    // OpenAI Chat
    (
        "openai-chat/happy-usage.sse",
        "N S S N N T+",
        STRONG,
        true,
        0,
    ),
    (
        "openai-chat/role-only-then-cut.sse",
        "N",
        EOF_CLEAN,
        false,
        0,
    ),
    ("openai-chat/finish-no-done.sse", "N S N", WEAK, true, 0),
    (
        "openai-chat/done-no-finish.sse",
        "N S T-",
        "Unsuccessful { reason: MissingFinishReason }",
        true,
        0,
    ),
    (
        "openai-chat/clean-eof-no-terminal.sse",
        "N S",
        EOF_CLEAN,
        true,
        0,
    ),
    (
        "openai-chat/length.sse",
        "N S N T-",
        "Unsuccessful { reason: Length }",
        true,
        0,
    ),
    (
        "openai-chat/content-filter.sse",
        "N N T-",
        "Unsuccessful { reason: ContentFilter }",
        false,
        0,
    ),
    ("openai-chat/tool-call.sse", "S S S N T+", STRONG, true, 1),
    (
        "openai-chat/tool-name-then-cut.sse",
        "S",
        EOF_CLEAN,
        true,
        0,
    ),
    (
        "openai-chat/keepalive-comments.sse",
        "K K K N S N T+",
        STRONG,
        true,
        0,
    ),
    (
        "openai-chat/keepalive-only.sse",
        "K K K",
        EOF_CLEAN,
        false,
        0,
    ),
    ("openai-chat/reasoning.sse", "S S S N T+", STRONG, true, 0),
    (
        "openai-chat/n2-choices.sse",
        "N S S N N T+",
        STRONG,
        true,
        0,
    ),
    (
        "openai-chat/n2-one-unfinished.sse",
        "S S N T-",
        "Unsuccessful { reason: MissingFinishReason }",
        true,
        0,
    ),
    (
        "openai-chat/azure-prompt-filter.sse",
        "N N S N T+",
        STRONG,
        true,
        0,
    ),
    (
        "openai-chat/unknown-finish.sse",
        "S N T-",
        "Unsuccessful { reason: Other(Some(\"weird_reason\")) }",
        true,
        0,
    ),
    (
        "openai-chat/after-done-ignored.sse",
        "S N T+ N",
        STRONG,
        true,
        0,
    ),
    (
        "openai-chat/midstream-error.sse",
        "N S E",
        "ProviderError { error: ProviderError { code: Some(\"server_error\"), status: None, transience: Transient } }",
        true,
        0,
    ),
    (
        "openai-chat/error-first.sse",
        "E",
        "ProviderError { error: ProviderError { code: Some(\"server_error\"), status: None, transience: Transient } }",
        false,
        0,
    ),
    (
        "openai-chat/error-permanent.sse",
        "E",
        "ProviderError { error: ProviderError { code: Some(\"insufficient_quota\"), status: None, transience: Permanent } }",
        false,
        0,
    ),
    (
        "openai-chat/openrouter-error.sse",
        "N S E",
        "ProviderError { error: ProviderError { code: None, status: Some(502), transience: Transient } }",
        true,
        0,
    ),
    (
        "openai-chat/vllm-error.sse",
        "E",
        "ProviderError { error: ProviderError { code: None, status: Some(400), transience: Permanent } }",
        false,
        0,
    ),
    (
        "openai-chat/unicode-crlf.sse",
        "N S S N T+",
        STRONG,
        true,
        0,
    ),
    (
        "openai-chat/pending-cut.sse",
        "N",
        "UnexpectedEof { pending: Some(Unfinished { bytes: 18, may_be_semantic: false }) }",
        false,
        0,
    ),
    // OpenAI Responses
    (
        "openai-responses/happy.sse",
        "N N N N S S S S T+",
        STRONG,
        true,
        0,
    ),
    (
        "openai-responses/keepalive.sse",
        "N N N N S K S S S T+",
        STRONG,
        true,
        0,
    ),
    (
        "openai-responses/keepalive-only.sse",
        "N K K K",
        EOF_CLEAN,
        false,
        0,
    ),
    (
        "openai-responses/error-nested.sse",
        "N N E N",
        "ProviderError { error: ProviderError { code: Some(\"insufficient_quota\"), status: None, transience: Permanent } }",
        false,
        0,
    ),
    (
        "openai-responses/error-flat.sse",
        "N E",
        "ProviderError { error: ProviderError { code: Some(\"server_error\"), status: None, transience: Transient } }",
        false,
        0,
    ),
    (
        "openai-responses/failed-only.sse",
        "N E",
        "ProviderError { error: ProviderError { code: Some(\"server_error\"), status: None, transience: Transient } }",
        false,
        0,
    ),
    (
        "openai-responses/incomplete.sse",
        "N N N N S T-",
        "Unsuccessful { reason: MaxTokens }",
        true,
        0,
    ),
    (
        "openai-responses/content-filter.sse",
        "N N T-",
        "Unsuccessful { reason: ContentFilter }",
        false,
        0,
    ),
    (
        "openai-responses/nonbackground-cut.sse",
        "N N N N S",
        EOF_CLEAN,
        true,
        0,
    ),
    (
        "openai-responses/done-after-completed.sse",
        "N N N N S K S S S T+ N",
        STRONG,
        true,
        0,
    ),
    (
        "openai-responses/done-codex.sse",
        "N N N N S T+",
        STRONG,
        true,
        0,
    ),
    (
        "openai-responses/reasoning.sse",
        "N N N N S S T+",
        STRONG,
        true,
        0,
    ),
    (
        "openai-responses/reasoning-opaque-then-cut.sse",
        "N N N S",
        EOF_CLEAN,
        true,
        0,
    ),
    (
        "openai-responses/resume-first.sse",
        "N N N N S S S S S S S",
        EOF_CLEAN,
        true,
        0,
    ),
    (
        "openai-responses/resume-tail.sse",
        "S S S S S T+",
        STRONG,
        true,
        0,
    ),
    (
        "openai-responses/tool-call.sse",
        "N N S S S S T+",
        STRONG,
        true,
        1,
    ),
    (
        "openai-responses/web-search-then-cut.sse",
        "N N X",
        EOF_CLEAN,
        true,
        0,
    ),
    (
        "openai-responses/unknown-events.sse",
        "N N N S T+",
        STRONG,
        true,
        0,
    ),
    (
        "openai-responses/pending-keepalive-cut.sse",
        "N N",
        "UnexpectedEof { pending: Some(Unfinished { bytes: 29, may_be_semantic: false }) }",
        false,
        0,
    ),
    // Anthropic
    ("anthropic/happy.sse", "N N K S N N T+", STRONG, true, 0),
    (
        "anthropic/ping-only-then-cut.sse",
        "N K",
        EOF_CLEAN,
        false,
        0,
    ),
    ("anthropic/keepalive-only.sse", "K K K", EOF_CLEAN, false, 0),
    (
        "anthropic/error-first.sse",
        "N K E",
        "ProviderError { error: ProviderError { code: Some(\"overloaded_error\"), status: None, transience: Transient } }",
        false,
        0,
    ),
    (
        "anthropic/error-midstream.sse",
        "N N K S E",
        "ProviderError { error: ProviderError { code: Some(\"overloaded_error\"), status: None, transience: Transient } }",
        true,
        0,
    ),
    (
        "anthropic/error-permanent.sse",
        "N E",
        "ProviderError { error: ProviderError { code: Some(\"invalid_request_error\"), status: None, transience: Permanent } }",
        false,
        0,
    ),
    (
        "anthropic/thinking-omitted.sse",
        "N S S S",
        EOF_CLEAN,
        true,
        0,
    ),
    (
        "anthropic/thinking.sse",
        "N S S S N N K S N N T+",
        STRONG,
        true,
        0,
    ),
    (
        "anthropic/duplicate-message-start.sse",
        "N N N K S N N T+",
        STRONG,
        true,
        0,
    ),
    (
        "anthropic/spliced-message-start.sse",
        "N N K S",
        "Violation { violation: SplicedMessage }",
        true,
        0,
    ),
    (
        "anthropic/max-tokens.sse",
        "N N K S N N T-",
        "Unsuccessful { reason: MaxTokens }",
        true,
        0,
    ),
    (
        "anthropic/refusal.sse",
        "N N T-",
        "Unsuccessful { reason: Refusal }",
        false,
        0,
    ),
    ("anthropic/tool-use.sse", "N S S S N N T+", STRONG, true, 1),
    ("anthropic/tool-use-cut.sse", "N S S", EOF_CLEAN, true, 0),
    ("anthropic/server-tool.sse", "N X", EOF_CLEAN, true, 0),
    (
        "anthropic/stop-without-reason.sse",
        "N N K S N T-",
        "Unsuccessful { reason: MissingFinishReason }",
        true,
        0,
    ),
    (
        "anthropic/unknown-event.sse",
        "N N N K S N N T+",
        STRONG,
        true,
        0,
    ),
    (
        "anthropic/pending-ping-cut.sse",
        "N",
        "UnexpectedEof { pending: Some(Unfinished { bytes: 14, may_be_semantic: false }) }",
        false,
        0,
    ),
    (
        "anthropic/pending-delta-cut.sse",
        "N N",
        "UnexpectedEof { pending: Some(Unfinished { bytes: 105, may_be_semantic: true }) }",
        false,
        0,
    ),
    // Gemini
    ("gemini/crlf-happy.sse", "S S N", WEAK, true, 0),
    ("gemini/lf-happy.sse", "S S N", WEAK, true, 0),
    (
        "gemini/error-chunk.sse",
        "E",
        "ProviderError { error: ProviderError { code: None, status: Some(503), transience: Transient } }",
        false,
        0,
    ),
    (
        "gemini/error-permanent.sse",
        "E",
        "ProviderError { error: ProviderError { code: None, status: Some(400), transience: Permanent } }",
        false,
        0,
    ),
    (
        "gemini/prompt-blocked.sse",
        "T-",
        "Unsuccessful { reason: ContentFilter }",
        false,
        0,
    ),
    (
        "gemini/max-tokens.sse",
        "S S",
        "Unsuccessful { reason: MaxTokens }",
        true,
        0,
    ),
    ("gemini/no-finish.sse", "S S", EOF_CLEAN, true, 0),
    (
        "gemini/tail-no-blank.sse",
        "S S",
        "UnexpectedEof { pending: Some(Unfinished { bytes: 255, may_be_semantic: true }) }",
        true,
        0,
    ),
    ("gemini/function-call.sse", "S", WEAK, true, 1),
    ("gemini/thought.sse", "S S N", WEAK, true, 0),
    ("gemini/keepalive-only.sse", "K K", EOF_CLEAN, false, 0),
    // Ollama
    ("ollama/chat-happy.ndjson", "S S T+", STRONG, true, 0),
    ("ollama/generate-happy.ndjson", "S S T+", STRONG, true, 0),
    ("ollama/crlf.ndjson", "S S T+", STRONG, true, 0),
    (
        "ollama/error-midstream.ndjson",
        "S E",
        "ProviderError { error: ProviderError { code: None, status: None, transience: Unknown } }",
        true,
        0,
    ),
    (
        "ollama/length.ndjson",
        "S T-",
        "Unsuccessful { reason: Length }",
        true,
        0,
    ),
    ("ollama/tool-call.ndjson", "S T+", STRONG, true, 1),
    ("ollama/thinking.ndjson", "S S T+", STRONG, true, 0),
    ("ollama/unterminated-tail.ndjson", "S S", STRONG, true, 0),
    (
        "ollama/cut.ndjson",
        "S",
        "UnexpectedEof { pending: Some(Unfinished { bytes: 98, may_be_semantic: true }) }",
        true,
        0,
    ),
    ("ollama/done-without-reason.ndjson", "S T+", STRONG, true, 0),
    ("ollama/final-with-content.ndjson", "T+", STRONG, true, 0),
    // Generic SSE
    (
        "sse/edge.sse",
        "K S S",
        "UnexpectedEof { pending: Some(Unfinished { bytes: 5, may_be_semantic: true }) }",
        true,
        0,
    ),
    ("sse/sentinel.sse", "S S T+", STRONG, true, 0),
    ("sse/keepalive-only.sse", "K K", EOF_CLEAN, false, 0),
    ("sse/cr-only.sse", "S S", EOF_CLEAN, true, 0),
];

#[test]
fn every_fixture_decodes_as_catalogued() {
    let mut failures = Vec::new();
    for &(file, classes, end, semantic, tools) in TABLE {
        let run = run_fixture(file);
        let got = (
            run.classes(),
            format!("{:?}", run.end),
            run.evidence.progress.semantic_observed(),
            run.evidence.progress.completed_tool_calls,
        );
        let want = (classes.to_owned(), end.to_owned(), semantic, tools);
        if got != want {
            failures.push(format!("{file}:\n   got  {got:?}\n   want {want:?}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn every_fixture_file_is_in_the_table() {
    for file in support::all_stream_fixtures() {
        assert!(
            TABLE.iter().any(|row| row.0 == file),
            "{file} has no expectation"
        );
    }
}

#[test]
fn commit_point_is_the_end_of_the_first_semantic_frame() {
    for &(file, ..) in TABLE {
        let run = run_fixture(file);
        let first_semantic = run
            .records
            .iter()
            .find(|r| matches!(r.info.class, crate::protocol::EventClass::Semantic(_)))
            .map(|r| r.end_offset);
        if run.evidence.progress.semantic_observed() && first_semantic.is_none() {
            // Semantic output on a terminal line (Ollama final-with-content).
            assert!(run.committed_at.is_some(), "{file}");
            continue;
        }
        assert_eq!(run.committed_at, first_semantic, "{file}");
    }
}

#[test]
fn usage_is_provider_reported_only() {
    let chat = run_fixture("openai-chat/happy-usage.sse")
        .evidence
        .generation
        .usage;
    assert_eq!(
        (chat.input_tokens, chat.output_tokens, chat.total_tokens),
        (Some(9), Some(2), Some(11))
    );
    assert_eq!(chat.reasoning_tokens, None);
    let no_usage = run_fixture("openai-chat/finish-no-done.sse")
        .evidence
        .generation
        .usage;
    assert!(no_usage.is_empty());
    let anthropic = run_fixture("anthropic/happy.sse").evidence.generation.usage;
    assert_eq!(
        (anthropic.input_tokens, anthropic.output_tokens),
        (Some(25), Some(15))
    );
    let responses = run_fixture("openai-responses/happy.sse")
        .evidence
        .generation
        .usage;
    assert_eq!(
        (
            responses.input_tokens,
            responses.output_tokens,
            responses.reasoning_tokens
        ),
        (Some(9), Some(1), Some(0))
    );
    let gemini = run_fixture("gemini/crlf-happy.sse")
        .evidence
        .generation
        .usage;
    assert_eq!(
        (
            gemini.input_tokens,
            gemini.output_tokens,
            gemini.total_tokens
        ),
        (Some(9), Some(4), Some(13))
    );
    let ollama = run_fixture("ollama/chat-happy.ndjson")
        .evidence
        .generation
        .usage;
    assert_eq!(
        (
            ollama.input_tokens,
            ollama.output_tokens,
            ollama.total_duration_ns,
            ollama.eval_duration_ns
        ),
        (Some(9), Some(2), Some(512_000_000), Some(3_000_000))
    );
}

#[test]
fn tool_calls_are_executable_only_after_success() {
    let ok = support::run_fixture("openai-chat/tool-call.sse");
    assert_eq!(ok.evidence.executable_tool_calls(), 1);
    let cut = support::run_fixture("anthropic/tool-use-cut.sse");
    assert_eq!(cut.evidence.executable_tool_calls(), 0);
}

#[test]
fn responses_cursor_tracks_id_and_sequence() {
    let run = run_fixture("openai-responses/resume-first.sse");
    assert_eq!(run.evidence.cursor.response_id.as_deref(), Some("resp_1"));
    assert_eq!(run.evidence.cursor.sequence_number, Some(10));
}

/// RS2 / RS8: a resumed stream replays numbers ≤ the cursor (dropped, no
/// evidence change) and may skip numbers (recorded, not a failure).
#[test]
fn rs2_rs8_resumed_stream_dedupes_and_records_gaps() {
    let bytes = support::fixture("openai-responses/resume-tail.sse");
    let config = crate::observer::ObserverConfig {
        resume_after_sequence: Some(10),
        ..Default::default()
    };
    let run = run_with("openai-responses".parse().unwrap(), config, &bytes, &[]);
    let dups: Vec<_> = run
        .records
        .iter()
        .filter(|r| r.info.duplicate)
        .map(|r| r.info.sequence_number)
        .collect();
    assert_eq!(dups, vec![Some(9), Some(10)]);
    assert_eq!(run.evidence.duplicate_events, 2);
    assert_eq!(
        run.evidence.progress.observed_content, 3,
        "11, 12 and 14 only"
    );
    assert_eq!(run.evidence.sequence_gaps, 1);
    assert_eq!(
        run.end,
        EndOfStream::Success {
            proof: Proof::Strong
        }
    );
}

#[test]
fn opaque_reasoning_opt_out() {
    let config = crate::observer::ObserverConfig {
        semantic: crate::protocol::SemanticOptions {
            opaque_reasoning_is_semantic: false,
        },
        ..Default::default()
    };
    for file in [
        "anthropic/thinking-omitted.sse",
        "openai-responses/reasoning-opaque-then-cut.sse",
    ] {
        let run = run_with(support::kind_of(file), config, &support::fixture(file), &[]);
        assert!(!run.evidence.progress.semantic_observed(), "{file}");
    }
}

#[test]
fn unknown_reason_and_transience_types_are_exposed() {
    let run = run_fixture("openai-responses/error-nested.sse");
    assert_eq!(
        run.evidence.provider_error.unwrap().transience,
        Transience::Permanent
    );
    let run = run_fixture("anthropic/refusal.sse");
    assert_eq!(
        run.end,
        EndOfStream::Unsuccessful {
            reason: UnsuccessfulReason::Refusal
        }
    );
}

/// The model that answered and why each choice ended, in the provider's
/// words (OpenTelemetry `gen_ai.response.model` and
/// `gen_ai.response.finish_reasons`), from every protocol that says them.
#[test]
fn the_answering_model_and_its_finish_reasons_are_kept() {
    let said = |file: &str| {
        let g = run_fixture(file).evidence.generation;
        let reasons: Vec<String> = g.finish_reasons.iter().map(ToString::to_string).collect();
        (g.model, reasons)
    };
    assert_eq!(
        said("openai-chat/happy-usage.sse"),
        (Some("m".into()), vec!["stop".to_owned()])
    );
    assert_eq!(
        said("openai-chat/n2-choices.sse").1.len(),
        2,
        "one reason per choice"
    );
    assert_eq!(
        said("anthropic/happy.sse"),
        (Some("m".into()), vec!["end_turn".to_owned()])
    );
    assert_eq!(
        said("gemini/crlf-happy.sse"),
        (Some("gemini-x".into()), vec!["STOP".to_owned()])
    );
    assert_eq!(
        said("ollama/chat-happy.ndjson"),
        (Some("llama3".into()), vec!["stop".to_owned()])
    );
    // The Responses API ends a response with a status; `incomplete` says
    // why.
    assert_eq!(said("openai-responses/happy.sse").1, vec!["completed"]);
    assert_eq!(
        said("openai-responses/incomplete.sse").1,
        vec!["max_output_tokens"]
    );
    assert_eq!(said("openai-responses/failed-only.sse").1, vec!["failed"]);
    // A cut stream says no reason.
    assert!(said("openai-responses/nonbackground-cut.sse").1.is_empty());
    assert!(said("openai-chat/role-only-then-cut.sse").1.is_empty());
}
