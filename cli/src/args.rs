//! The `recover` command line: parsing and validation, kept apart from I/O so
//! every usage error is tested without spawning a process.

use std::ffi::OsString;
use std::fmt;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Uri};
use recovery_core::{OverCeiling, ProtocolKind, RecoveryPolicy};

/// The synopsis printed with every usage error and at the top of `--help`.
pub const USAGE: &str = "\
usage: recover --protocol {openai-chat|openai-responses|anthropic|gemini|ollama|sse}
               [--max-attempts N] [--budget-ms N] [--retry-after-ceiling-ms N]
               [--head-timeout-ms N] [--idle-timeout-ms N] [--progress-timeout-ms N]
               [--resumable-sse] [--idempotency-key] [--retry-protocol-violations]
               [--header 'K: V']... [--events FILE] [--report FILE] URL
       recover --help | --version
Reads the JSON request body from stdin, POSTs it to URL and writes the delivered
body to stdout. Exit status: 0 completed with terminal proof, 1 recovery failed,
2 usage error, 130 interrupted (Ctrl-C).";

/// What `--help` prints after the synopsis.
pub const HELP: &str = "

Options:
  --protocol NAME              the wire protocol of the answer (required)
  --max-attempts N             physical sends, first included (default 3)
  --attempts-per-target N      sends a target gets before alternates take over (default 1)
  --budget-ms N                time for recovery after the first failure (default 60000)
  --retry-after-ceiling-ms N   the longest Retry-After honoured; longer ones fail (default 60000)
  --head-timeout-ms N          from a send to its response head (default 300000)
  --idle-timeout-ms N          a body silent this long has stalled (default 300000)
  --progress-timeout-ms N      no output, keepalives aside, this long has stalled (default 600000)
  --first-token-timeout-ms N   from a streamed head to its first token, before any output:
                               past it the attempt is dropped and sent again (default off)
  --resumable-sse              the endpoint resumes an SSE stream from Last-Event-ID
                               (OpenAI Responses background streams need nothing)
  --idempotency-key            one Idempotency-Key on every send, replay and resume
  --retry-protocol-violations  replay a stream that breaks its protocol before any
                               output, as a reset
  --header 'Name: value'       a request header (repeatable); values are never logged
  --events FILE                lifecycle events as JSON lines
  --report FILE                the final report as JSON (also after a failure or Ctrl-C)
  -h, --help                   this text
  -V, --version                the version

A request is replayed only while no output was seen; after that it is resumed
where the provider allows it, or fails with exit status 1. When stderr is a
terminal a status line shows what recovery is doing (\"Reconnecting… attempt
2/3, retry in 1.2 s\"); it is silent otherwise.

Examples:
  echo '{\"model\":\"gpt-4o-mini\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}' |
    recover --protocol openai-chat --header \"authorization: Bearer $OPENAI_API_KEY\" \\
      https://api.openai.com/v1/chat/completions

  recover --protocol anthropic --header \"x-api-key: $ANTHROPIC_API_KEY\" \\
    --header 'anthropic-version: 2023-06-01' --events events.jsonl --report report.json \\
    https://api.anthropic.com/v1/messages < request.json

  recover --protocol ollama http://127.0.0.1:11434/api/chat < request.json";

/// The protocol names the command accepts, exactly.
pub const PROTOCOLS: [&str; 6] = [
    "openai-chat",
    "openai-responses",
    "anthropic",
    "gemini",
    "ollama",
    "sse",
];

/// A command line that cannot be run; the message is one readable line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

fn usage(msg: impl Into<String>) -> UsageError {
    UsageError(msg.into())
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Print the usage and the help and exit 0.
    Help,
    /// Print the version and exit 0.
    Version,
    /// Run one request.
    Run(Box<RecoverArgs>),
}

/// A validated `recover` invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoverArgs {
    /// The wire protocol of the response.
    pub protocol: ProtocolKind,
    /// `--max-attempts`: physical sends, first included.
    pub max_attempts: Option<NonZeroU32>,
    /// `--attempts-per-target`: sends a target gets before the next one.
    pub attempts_per_target: Option<NonZeroU32>,
    /// `--budget-ms`: the recovery budget.
    pub budget: Option<Duration>,
    /// `--retry-after-ceiling-ms`: the largest `Retry-After` honoured.
    pub retry_after_ceiling: Option<Duration>,
    /// `--head-timeout-ms`: the bound from a send to its response head.
    pub head_timeout: Option<Duration>,
    /// `--idle-timeout-ms`: the stall watchdog on silence.
    pub idle_timeout: Option<Duration>,
    /// `--progress-timeout-ms`: the stall watchdog on semantic progress.
    pub progress_timeout: Option<Duration>,
    /// `--first-token-timeout-ms`: head to first token, before commit.
    pub first_token_timeout: Option<Duration>,
    /// `--resumable-sse`: the endpoint resumes from `Last-Event-ID`.
    pub resumable_sse: bool,
    /// `--idempotency-key`: one `Idempotency-Key` on every send.
    pub idempotency_key: bool,
    /// `--retry-protocol-violations`: a violation before output is replayed.
    pub retry_protocol_violations: bool,
    /// `--header`, in order.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// `--events`: where lifecycle events go, one JSON object per line.
    pub events: Option<PathBuf>,
    /// `--report`: where the final report goes, as JSON.
    pub report: Option<PathBuf>,
    /// The endpoint (`http` or `https`).
    pub url: Uri,
}

impl RecoverArgs {
    /// The policy: the defaults with the command line's overrides.
    pub fn policy(&self) -> Result<RecoveryPolicy, UsageError> {
        let mut b = RecoveryPolicy::builder();
        if let Some(n) = self.max_attempts {
            b = b.max_attempts(n);
        }
        if let Some(n) = self.attempts_per_target {
            b = b.attempts_per_target(n);
        }
        if let Some(budget) = self.budget {
            b = b.budget(Some(budget));
        }
        if let Some(ceiling) = self.retry_after_ceiling {
            b = b.retry_after_ceiling(ceiling, OverCeiling::Refuse);
        }
        if let Some(head) = self.head_timeout {
            b = b.head_timeout(Some(head));
        }
        if let Some(idle) = self.idle_timeout {
            b = b.idle_timeout(Some(idle));
        }
        if let Some(progress) = self.progress_timeout {
            b = b.progress_timeout(Some(progress));
        }
        if let Some(first) = self.first_token_timeout {
            b = b.first_token_timeout(Some(first));
        }
        b = b
            .idempotency_key(self.idempotency_key)
            .retry_protocol_violations(self.retry_protocol_violations);
        b.build().map_err(|e| usage(format!("invalid policy: {e}")))
    }
}

/// A count from 1: `--max-attempts`, `--attempts-per-target`.
fn count(flag: &str, value: &str) -> Result<NonZeroU32, UsageError> {
    let n = number(flag, value)?;
    u32::try_from(n)
        .ok()
        .and_then(NonZeroU32::new)
        .ok_or_else(|| usage(format!("{flag} must be between 1 and {}", u32::MAX)))
}

fn number(flag: &str, value: &str) -> Result<u64, UsageError> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(usage(format!(
            "{flag} expects a whole number, got {value:?}"
        )));
    }
    value
        .parse()
        .map_err(|_| usage(format!("{flag} value {value:?} is too large")))
}

fn millis(flag: &str, value: &str) -> Result<Duration, UsageError> {
    let n = number(flag, value)?;
    if n == 0 {
        return Err(usage(format!("{flag} must be greater than zero")));
    }
    Ok(Duration::from_millis(n))
}

fn header(value: &str) -> Result<(HeaderName, HeaderValue), UsageError> {
    let (name, val) = value
        .split_once(':')
        .ok_or_else(|| usage(format!("--header expects 'Name: value', got {value:?}")))?;
    let name = HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| usage(format!("--header has an invalid name {:?}", name.trim())))?;
    let val = HeaderValue::from_str(val.trim())
        .map_err(|_| usage(format!("--header {name} has an invalid value")))?;
    Ok((name, val))
}

fn url(value: &str) -> Result<Uri, UsageError> {
    let uri: Uri = value
        .parse()
        .map_err(|_| usage(format!("not a URL: {value:?}")))?;
    match uri.scheme_str() {
        Some("http" | "https") if uri.authority().is_some() => Ok(uri),
        _ => Err(usage(format!(
            "URL must start with http:// or https:// and name a host, got {value:?}"
        ))),
    }
}

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, UsageError> {
    let mut protocol = None;
    let mut max_attempts = None;
    let mut attempts_per_target = None;
    let mut budget = None;
    let mut retry_after_ceiling = None;
    let mut head_timeout = None;
    let mut idle_timeout = None;
    let mut progress_timeout = None;
    let mut first_token_timeout = None;
    let mut resumable_sse = false;
    let mut idempotency_key = false;
    let mut retry_protocol_violations = false;
    let mut headers = Vec::new();
    let mut events = None;
    let mut report = None;
    let mut urls = Vec::new();

    let mut args = args.into_iter();
    let mut only_positional = false;
    while let Some(arg) = args.next() {
        let arg = arg
            .into_string()
            .map_err(|a| usage(format!("argument {} is not valid UTF-8", a.display())))?;
        if only_positional || !arg.starts_with('-') || arg == "-" {
            urls.push(arg);
            continue;
        }
        if arg == "--" {
            only_positional = true;
            continue;
        }
        if arg == "-h" || arg == "--help" {
            return Ok(Command::Help);
        }
        if arg == "-V" || arg == "--version" {
            return Ok(Command::Version);
        }
        let switch = match arg.as_str() {
            "--resumable-sse" => Some(&mut resumable_sse),
            "--idempotency-key" => Some(&mut idempotency_key),
            "--retry-protocol-violations" => Some(&mut retry_protocol_violations),
            _ => None,
        };
        if let Some(on) = switch {
            *on = true;
            continue;
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        let known = [
            "--protocol",
            "--max-attempts",
            "--attempts-per-target",
            "--budget-ms",
            "--retry-after-ceiling-ms",
            "--head-timeout-ms",
            "--idle-timeout-ms",
            "--progress-timeout-ms",
            "--first-token-timeout-ms",
            "--header",
            "--events",
            "--report",
        ];
        if [
            "--resumable-sse",
            "--idempotency-key",
            "--retry-protocol-violations",
        ]
        .contains(&flag.as_str())
        {
            return Err(usage(format!("{flag} takes no value")));
        }
        if !known.contains(&flag.as_str()) {
            return Err(usage(format!("unknown option {flag}")));
        }
        let value = match inline {
            Some(v) => v,
            None => args
                .next()
                .ok_or_else(|| usage(format!("{flag} needs a value")))?
                .into_string()
                .map_err(|a| usage(format!("{flag} value {} is not valid UTF-8", a.display())))?,
        };
        match flag.as_str() {
            "--protocol" => {
                if !PROTOCOLS.contains(&value.as_str()) {
                    return Err(usage(format!(
                        "unknown protocol {value:?} (expected one of {})",
                        PROTOCOLS.join(", ")
                    )));
                }
                protocol = Some(
                    value
                        .parse::<ProtocolKind>()
                        .map_err(|_| usage(format!("unknown protocol {value:?}")))?,
                );
            }
            "--max-attempts" => max_attempts = Some(count(&flag, &value)?),
            "--attempts-per-target" => attempts_per_target = Some(count(&flag, &value)?),
            "--budget-ms" => budget = Some(millis(&flag, &value)?),
            "--retry-after-ceiling-ms" => {
                retry_after_ceiling = Some(Duration::from_millis(number(&flag, &value)?));
            }
            "--head-timeout-ms" => head_timeout = Some(millis(&flag, &value)?),
            "--idle-timeout-ms" => idle_timeout = Some(millis(&flag, &value)?),
            "--progress-timeout-ms" => progress_timeout = Some(millis(&flag, &value)?),
            "--first-token-timeout-ms" => first_token_timeout = Some(millis(&flag, &value)?),
            "--header" => headers.push(header(&value)?),
            "--events" => events = Some(PathBuf::from(value)),
            "--report" => report = Some(PathBuf::from(value)),
            _ => unreachable!("every known flag is matched"),
        }
    }
    let protocol = protocol.ok_or_else(|| usage("--protocol is required"))?;
    let url = match urls.as_slice() {
        [] => return Err(usage("missing URL")),
        [one] => url(one)?,
        [_, extra, ..] => return Err(usage(format!("unexpected argument {extra:?}"))),
    };
    let parsed = RecoverArgs {
        protocol,
        max_attempts,
        attempts_per_target,
        budget,
        retry_after_ceiling,
        head_timeout,
        idle_timeout,
        progress_timeout,
        first_token_timeout,
        resumable_sse,
        idempotency_key,
        retry_protocol_violations,
        headers,
        events,
        report,
        url,
    };
    parsed.policy()?;
    Ok(Command::Run(Box::new(parsed)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Command, UsageError> {
        parse(args.iter().map(OsString::from))
    }

    fn ok(args: &[&str]) -> RecoverArgs {
        match run(args) {
            Ok(Command::Run(a)) => *a,
            other => panic!("{args:?}: {other:?}"),
        }
    }

    fn err(args: &[&str]) -> String {
        match run(args) {
            Err(e) => e.0,
            Ok(other) => panic!("{args:?} parsed: {other:?}"),
        }
    }

    #[test]
    fn full_command_line() {
        let a = ok(&[
            "--protocol",
            "anthropic",
            "--max-attempts",
            "5",
            "--attempts-per-target=2",
            "--budget-ms=2000",
            "--retry-after-ceiling-ms",
            "0",
            "--idle-timeout-ms",
            "300",
            "--head-timeout-ms=4000",
            "--progress-timeout-ms",
            "9000",
            "--first-token-timeout-ms",
            "7000",
            "--header",
            "x-api-key: sk-1",
            "--header",
            "anthropic-version:2023-06-01",
            "--events",
            "ev.jsonl",
            "--report",
            "r.json",
            "https://example.invalid/v1/messages",
        ]);
        assert_eq!(a.protocol, ProtocolKind::Anthropic);
        assert_eq!(a.max_attempts.unwrap().get(), 5);
        assert_eq!(a.budget, Some(Duration::from_secs(2)));
        assert_eq!(a.retry_after_ceiling, Some(Duration::ZERO));
        assert_eq!(a.idle_timeout, Some(Duration::from_millis(300)));
        assert_eq!(a.headers.len(), 2);
        assert_eq!(a.headers[1].1, "2023-06-01");
        assert_eq!(a.events, Some(PathBuf::from("ev.jsonl")));
        let p = a.policy().unwrap();
        assert_eq!(p.max_attempts().get(), 5);
        assert_eq!(p.attempts_per_target().get(), 2);
        assert_eq!(p.idle_timeout(), Some(Duration::from_millis(300)));
        assert_eq!(p.head_timeout(), Some(Duration::from_secs(4)));
        assert_eq!(p.progress_timeout(), Some(Duration::from_secs(9)));
        assert_eq!(p.first_token_timeout(), Some(Duration::from_secs(7)));
        // Left out, the default bounds stand: nothing hangs.
        let d = ok(&["--protocol", "ollama", "http://127.0.0.1:1/"])
            .policy()
            .unwrap();
        assert_eq!(d.head_timeout(), Some(Duration::from_mins(5)));
        assert_eq!(d.progress_timeout(), Some(Duration::from_mins(10)));
        assert!(
            run(&[
                "--protocol",
                "ollama",
                "--head-timeout-ms",
                "0",
                "http://h/"
            ])
            .is_err()
        );
    }

    #[test]
    fn every_protocol_name_is_accepted_and_only_those() {
        for name in PROTOCOLS {
            let a = ok(&["--protocol", name, "http://127.0.0.1:1/"]);
            assert_eq!(a.protocol.name(), name);
        }
        for bad in ["openai", "OPENAI-CHAT", "responses", "chat", ""] {
            assert!(
                err(&["--protocol", bad, "http://h/"]).contains("protocol"),
                "{bad}"
            );
        }
    }

    #[test]
    fn usage_errors_are_one_readable_line() {
        let cases: &[&[&str]] = &[
            &["--protocol", "sse"],
            &["http://h/"],
            &["--protocol", "sse", "--bogus", "http://h/"],
            &["--protocol", "sse", "-x", "http://h/"],
            &["--protocol", "sse", "--max-attempts", "0", "http://h/"],
            &["--protocol", "sse", "--max-attempts", "x", "http://h/"],
            &["--protocol", "sse", "--max-attempts", "-1", "http://h/"],
            &[
                "--protocol",
                "sse",
                "--max-attempts",
                "99999999999",
                "http://h/",
            ],
            &[
                "--protocol",
                "sse",
                "--attempts-per-target",
                "0",
                "http://h/",
            ],
            &["--protocol", "sse", "--budget-ms", "0", "http://h/"],
            &["--protocol", "sse", "--budget-ms", "1.5", "http://h/"],
            &["--protocol", "sse", "--idle-timeout-ms", "", "http://h/"],
            &[
                "--protocol",
                "sse",
                "--retry-after-ceiling-ms",
                "1s",
                "http://h/",
            ],
            &["--protocol", "sse", "--header", "novalue", "http://h/"],
            &["--protocol", "sse", "--header", "bad name: v", "http://h/"],
            &["--protocol", "sse", "--report"],
            &["--protocol", "sse", "ftp://h/"],
            &["--protocol", "sse", "not a url"],
            &["--protocol", "sse", "http://h/", "http://other/"],
        ];
        for args in cases {
            let msg = err(args);
            assert!(!msg.is_empty() && !msg.contains('\n'), "{args:?}: {msg:?}");
        }
    }

    #[test]
    fn help_version_flags_and_double_dash() {
        assert_eq!(run(&["--help"]), Ok(Command::Help));
        assert_eq!(run(&["--protocol", "sse", "-h"]), Ok(Command::Help));
        assert_eq!(run(&["--version"]), Ok(Command::Version));
        assert_eq!(run(&["-V"]), Ok(Command::Version));
        assert!(ok(&["--protocol", "sse", "--resumable-sse", "http://h/"]).resumable_sse);
        assert!(!ok(&["--protocol", "sse", "http://h/"]).resumable_sse);
        let both = ok(&[
            "--protocol",
            "sse",
            "--idempotency-key",
            "--retry-protocol-violations",
            "http://h/",
        ]);
        let policy = both.policy().unwrap();
        assert!(policy.idempotency_key() && policy.retry_protocol_violations());
        let none = ok(&["--protocol", "sse", "http://h/"]).policy().unwrap();
        assert!(!none.idempotency_key() && !none.retry_protocol_violations());
        assert!(
            err(&["--protocol", "sse", "--idempotency-key=1", "http://h/"])
                .contains("takes no value")
        );
        assert!(
            err(&["--protocol", "sse", "--resumable-sse=yes", "http://h/"])
                .contains("takes no value")
        );
        for flag in ["--resumable-sse", "--help", "--version"] {
            assert!(USAGE.contains(flag), "{flag}");
        }
        let a = ok(&["--protocol", "gemini", "--", "http://h/x"]);
        assert_eq!(a.url, "http://h/x");
    }
}
