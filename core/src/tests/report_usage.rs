//! The report keeps the token use the provider stated on the stream that
//! succeeded (OpenTelemetry `gen_ai.usage.*`), and none of a stream that
//! did not.

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use crate::budget::AttemptAllowance;
use crate::exchange::{Exchange, Head, Io, RequestFacts, Send, Setup};
use crate::policy::RecoveryPolicy;
use crate::protocol::{ProtocolChoice, ProtocolKind};
use crate::timing::Instant;

const TEXT: &[u8] = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
const USAGE: &[u8] = b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":2,\"total_tokens\":13}}\n\n";
const DONE: &[u8] = b"data: [DONE]\n\n";

struct Sse;
impl Head for Sse {
    fn status(&self) -> u16 {
        200
    }
    fn header(&self, name: &str) -> Option<Cow<'_, str>> {
        (name == "content-type").then_some(Cow::Borrowed("text/event-stream"))
    }
}

fn at(ms: u64) -> Instant {
    Instant::from_origin(Duration::from_millis(ms))
}

fn streaming() -> Exchange<Vec<u8>> {
    let policy = RecoveryPolicy::default();
    let allowance = AttemptAllowance::new(policy.max_attempts().get());
    let request = RequestFacts::new("POST", "/v1/chat/completions", b"{\"model\":\"m\"}");
    let mut ex: Exchange<Vec<u8>> = Setup::new(
        policy,
        &ProtocolChoice::Fixed(ProtocolKind::OpenAiChat),
        request,
        allowance,
        1,
    )
    .start(at(0));
    assert_eq!(ex.poll(at(0), true), Io::Send(Send::Original));
    ex.on_sent(at(0));
    ex.on_head(at(0), SystemTime::UNIX_EPOCH, &Sse, None);
    ex
}

/// Polls until the request ends; whether it succeeded.
fn run_out(ex: &mut Exchange<Vec<u8>>, ms: u64) -> bool {
    for _ in 0..16 {
        if let Io::End(result) = ex.poll(at(ms), true) {
            return result.is_ok();
        }
    }
    panic!("the request did not end");
}

#[test]
fn a_stream_that_succeeds_reports_the_usage_it_stated() {
    let mut ex = streaming();
    for chunk in [TEXT, USAGE, DONE] {
        let _ = ex.on_chunk(at(5), chunk.to_vec());
        let _ = ex.poll(at(5), true);
    }
    ex.on_end(at(6));
    assert!(run_out(&mut ex, 6));
    let usage = ex.ledger().report().generation.usage;
    assert_eq!(
        (usage.input_tokens, usage.output_tokens, usage.total_tokens),
        (Some(11), Some(2), Some(13))
    );
}

#[test]
fn a_stream_cut_after_its_text_reports_no_usage() {
    let mut ex = streaming();
    let _ = ex.on_chunk(at(5), TEXT.to_vec());
    let _ = ex.poll(at(5), true);
    ex.on_end(at(6));
    assert!(!run_out(&mut ex, 6));
    assert!(ex.ledger().report().generation.is_empty());
}
