//! Reading provider usage objects into [`Usage`], keeping absent fields absent.

use crate::json::JsonView;
use crate::progress::Usage;

fn set<'a, V: JsonView<'a>>(slot: &mut Option<u64>, v: Option<V>) {
    if let Some(n) = v.and_then(JsonView::as_u64) {
        *slot = Some(n);
    }
}

/// OpenAI Chat `usage` (`prompt_tokens`, `completion_tokens`, details).
pub(crate) fn chat<'a, V: JsonView<'a>>(usage: &mut Usage, v: V) {
    let [p, c, t, pd, cd] = v.fields([
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "prompt_tokens_details",
        "completion_tokens_details",
    ]);
    set(&mut usage.input_tokens, p);
    set(&mut usage.output_tokens, c);
    set(&mut usage.total_tokens, t);
    set(
        &mut usage.cached_input_tokens,
        pd.and_then(|d| d.get("cached_tokens")),
    );
    set(
        &mut usage.reasoning_tokens,
        cd.and_then(|d| d.get("reasoning_tokens")),
    );
}

/// OpenAI Responses `response.usage`.
pub(crate) fn responses<'a, V: JsonView<'a>>(usage: &mut Usage, v: V) {
    let [i, o, t, id, od] = v.fields([
        "input_tokens",
        "output_tokens",
        "total_tokens",
        "input_tokens_details",
        "output_tokens_details",
    ]);
    set(&mut usage.input_tokens, i);
    set(&mut usage.output_tokens, o);
    set(&mut usage.total_tokens, t);
    set(
        &mut usage.cached_input_tokens,
        id.and_then(|d| d.get("cached_tokens")),
    );
    set(
        &mut usage.reasoning_tokens,
        od.and_then(|d| d.get("reasoning_tokens")),
    );
}

/// Anthropic `usage` (in `message_start` and, cumulative, in `message_delta`).
pub(crate) fn anthropic<'a, V: JsonView<'a>>(usage: &mut Usage, v: V) {
    let [i, o, cc, cr] = v.fields([
        "input_tokens",
        "output_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    ]);
    set(&mut usage.input_tokens, i);
    set(&mut usage.output_tokens, o);
    set(&mut usage.cache_creation_input_tokens, cc);
    set(&mut usage.cached_input_tokens, cr);
}

/// Gemini `usageMetadata`.
pub(crate) fn gemini<'a, V: JsonView<'a>>(usage: &mut Usage, v: V) {
    let [p, c, t, th, ca] = v.fields([
        "promptTokenCount",
        "candidatesTokenCount",
        "totalTokenCount",
        "thoughtsTokenCount",
        "cachedContentTokenCount",
    ]);
    set(&mut usage.input_tokens, p);
    set(&mut usage.output_tokens, c);
    set(&mut usage.total_tokens, t);
    set(&mut usage.reasoning_tokens, th);
    set(&mut usage.cached_input_tokens, ca);
}

/// Ollama counts and durations, read from the final object's fields.
pub(crate) struct OllamaMetrics<V> {
    pub prompt_eval_count: Option<V>,
    pub eval_count: Option<V>,
    pub total_duration: Option<V>,
    pub load_duration: Option<V>,
    pub prompt_eval_duration: Option<V>,
    pub eval_duration: Option<V>,
}

#[allow(clippy::needless_pass_by_value)] // a bundle of Copy views
pub(crate) fn ollama<'a, V: JsonView<'a>>(usage: &mut Usage, m: OllamaMetrics<V>) {
    set(&mut usage.input_tokens, m.prompt_eval_count);
    set(&mut usage.output_tokens, m.eval_count);
    set(&mut usage.total_duration_ns, m.total_duration);
    set(&mut usage.load_duration_ns, m.load_duration);
    set(&mut usage.prompt_eval_duration_ns, m.prompt_eval_duration);
    set(&mut usage.eval_duration_ns, m.eval_duration);
}
