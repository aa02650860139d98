//! The `recover` command line: parsing and validation, kept apart from I/O so
//! every usage error is tested without spawning a process.
//!
//! The policy flags are not written here: each knob of the policy spec's
//! table ([`FIELDS`]) is a flag of its name with dashes
//! (`idle_timeout_ms` is `--idle-timeout-ms`), read as the gateway's
//! `[policy]` reads it (`--idle-timeout-ms off`, 0 refused with the same
//! error), and `--help` lists them from the table. A knob added to the
//! table is a flag of `recover` with nothing more to do here.

use std::ffi::OsString;
use std::fmt::{self, Write as _};
use std::path::PathBuf;

use http::{HeaderName, HeaderValue, Uri};
use recovery_core::policy::{FIELDS, Field, PolicySpec, Unit, Value};
use recovery_core::{ProtocolKind, RecoveryPolicy};

/// The synopsis printed with every usage error and at the top of `--help`.
pub const USAGE: &str = "\
usage: recover --protocol {openai-chat|openai-responses|anthropic|gemini|ollama|sse}
               [POLICY OPTIONS] [--resumable-sse]
               [--header 'K: V']... [--events FILE] [--report FILE] URL
       recover --help | --version
Reads the JSON request body from stdin, POSTs it to URL and writes the delivered
body to stdout. Exit status: 0 completed with terminal proof, 1 recovery failed,
2 usage error, 130 interrupted (Ctrl-C).";

/// What `--help` prints after the synopsis, before the policy options.
const OPTIONS_HELP: &str = "

Options:
  --protocol NAME              the wire protocol of the answer (required)
  --resumable-sse              the endpoint resumes an SSE stream from Last-Event-ID
                               (OpenAI Responses background streams need nothing)
  --header 'Name: value'       a request header (repeatable); values are never logged
  --events FILE                lifecycle events as JSON lines
  --report FILE                the final report as JSON (also after a failure or Ctrl-C)
  -h, --help                   this text
  -V, --version                the version

Policy options: the gateway's [policy] keys with dashes (the npm options in
camelCase, the Python keywords). One left out keeps its default; \"off\" turns
a bound off; 0 is refused where it would mean nothing.
";

/// What `--help` prints after the policy options.
const EXAMPLES_HELP: &str = "
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

  recover --protocol ollama --idle-timeout-ms off http://127.0.0.1:11434/api/chat < request.json";

/// The column the help's descriptions start at, and the width they wrap to.
const HELP_COLUMN: usize = 31;
const HELP_WIDTH: usize = 80;

/// What `--help` prints after the synopsis: `recover`'s own options, one
/// line or more per knob of the policy table, and examples.
pub fn help() -> String {
    let mut out = String::from(OPTIONS_HELP);
    for f in FIELDS {
        let mut doc = f.doc().to_owned();
        if !f.choices.is_empty() && f.unit == Unit::List {
            let _ = write!(doc, ": {}", f.choices.join(", "));
        }
        if f.unit != Unit::Bool {
            let _ = write!(doc, " (default {})", f.default);
        }
        let head = match metavar(f) {
            Some(v) => format!("  {} {v}", f.flag()),
            None => format!("  {}", f.flag()),
        };
        out.push_str(&head);
        let mut column = head.chars().count();
        let mut first = true;
        for word in doc.split(' ') {
            let fits = column + 1 + word.chars().count() <= HELP_WIDTH;
            if first || !fits {
                if !first || column >= HELP_COLUMN {
                    out.push('\n');
                    column = 0;
                }
                out.push_str(&" ".repeat(HELP_COLUMN - column));
                column = HELP_COLUMN;
            } else {
                out.push(' ');
                column += 1;
            }
            out.push_str(word);
            column += word.chars().count();
            first = false;
        }
        out.push('\n');
    }
    out.push_str(EXAMPLES_HELP);
    out
}

/// What a policy flag's value looks like in the help; none for a switch.
fn metavar(f: &Field) -> Option<String> {
    Some(match f.unit {
        Unit::Ms if f.can_be_off => "MS|off".into(),
        Unit::Ms => "MS".into(),
        Unit::Count => "N".into(),
        Unit::Bytes => "BYTES".into(),
        Unit::Bool => return None,
        Unit::Choice => f.choices.join("|"),
        Unit::List if f.choices.is_empty() => "STATUS,...".into(),
        Unit::List => "NAME,...".into(),
    })
}

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
    /// The policy flags given, as the policy spec they write.
    pub spec: PolicySpec,
    /// `--resumable-sse`: the endpoint resumes from `Last-Event-ID`.
    pub resumable_sse: bool,
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
    /// The policy: the defaults with the command line's policy flags.
    pub fn policy(&self) -> Result<RecoveryPolicy, UsageError> {
        self.spec
            .build()
            .map_err(|e| usage(format!("invalid policy: {e}")))
    }
}

/// `recover`'s own options, beside the policy's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Own {
    Protocol,
    ResumableSse,
    Header,
    Events,
    Report,
}

impl Own {
    const ALL: [(&'static str, Own); 5] = [
        ("--protocol", Own::Protocol),
        ("--resumable-sse", Own::ResumableSse),
        ("--header", Own::Header),
        ("--events", Own::Events),
        ("--report", Own::Report),
    ];

    fn takes_value(self) -> bool {
        self != Own::ResumableSse
    }
}

/// An option of the command line: one of `recover`'s own, or a policy knob.
#[derive(Clone, Copy)]
enum Opt {
    Own(Own),
    Knob(&'static Field),
}

impl Opt {
    fn named(flag: &str) -> Option<Opt> {
        Own::ALL
            .iter()
            .find(|(name, _)| *name == flag)
            .map(|(_, own)| Opt::Own(*own))
            .or_else(|| FIELDS.iter().find(|f| f.flag() == flag).map(Opt::Knob))
    }

    fn takes_value(self) -> bool {
        match self {
            Opt::Own(own) => own.takes_value(),
            Opt::Knob(f) => f.unit != Unit::Bool,
        }
    }
}

/// The command line read so far.
#[derive(Default)]
struct Parsed {
    protocol: Option<ProtocolKind>,
    spec: PolicySpec,
    resumable_sse: bool,
    headers: Vec<(HeaderName, HeaderValue)>,
    events: Option<PathBuf>,
    report: Option<PathBuf>,
    urls: Vec<String>,
}

impl Parsed {
    /// `opt` with its value (`None` for a switch).
    fn apply(&mut self, opt: Opt, value: Option<String>) -> Result<(), UsageError> {
        let own = match opt {
            Opt::Knob(f) => {
                let v = value.map_or(Value::Bool(true), |text| f.parse(&text));
                return self
                    .spec
                    .set(f.name, v)
                    .map_err(|e| usage(format!("invalid policy: {e}")));
            }
            Opt::Own(own) => own,
        };
        let value = value.unwrap_or_default();
        match own {
            Own::Protocol => self.protocol = Some(protocol(&value)?),
            Own::ResumableSse => self.resumable_sse = true,
            Own::Header => self.headers.push(header(&value)?),
            Own::Events => self.events = Some(PathBuf::from(value)),
            Own::Report => self.report = Some(PathBuf::from(value)),
        }
        Ok(())
    }

    fn finish(self) -> Result<Command, UsageError> {
        let protocol = self
            .protocol
            .ok_or_else(|| usage("--protocol is required"))?;
        let url = match self.urls.as_slice() {
            [] => return Err(usage("missing URL")),
            [one] => url(one)?,
            [_, extra, ..] => return Err(usage(format!("unexpected argument {extra:?}"))),
        };
        let parsed = RecoverArgs {
            protocol,
            spec: self.spec,
            resumable_sse: self.resumable_sse,
            headers: self.headers,
            events: self.events,
            report: self.report,
            url,
        };
        parsed.policy()?;
        Ok(Command::Run(Box::new(parsed)))
    }
}

fn protocol(value: &str) -> Result<ProtocolKind, UsageError> {
    if !PROTOCOLS.contains(&value) {
        return Err(usage(format!(
            "unknown protocol {value:?} (expected one of {})",
            PROTOCOLS.join(", ")
        )));
    }
    value
        .parse::<ProtocolKind>()
        .map_err(|_| usage(format!("unknown protocol {value:?}")))
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
    let mut parsed = Parsed::default();
    let mut args = args.into_iter();
    let mut only_positional = false;
    while let Some(arg) = args.next() {
        let arg = arg
            .into_string()
            .map_err(|a| usage(format!("argument {} is not valid UTF-8", a.display())))?;
        if only_positional || !arg.starts_with('-') || arg == "-" {
            parsed.urls.push(arg);
            continue;
        }
        match arg.as_str() {
            "--" => {
                only_positional = true;
                continue;
            }
            "-h" | "--help" => return Ok(Command::Help),
            "-V" | "--version" => return Ok(Command::Version),
            _ => {}
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_owned())),
            _ => (arg.as_str(), None),
        };
        let opt = Opt::named(flag).ok_or_else(|| usage(format!("unknown option {flag}")))?;
        let value = match (opt.takes_value(), inline) {
            (false, Some(_)) => return Err(usage(format!("{flag} takes no value"))),
            (false, None) => None,
            (true, Some(v)) => Some(v),
            (true, None) => Some(
                args.next()
                    .ok_or_else(|| usage(format!("{flag} needs a value")))?
                    .into_string()
                    .map_err(|a| {
                        usage(format!("{flag} value {} is not valid UTF-8", a.display()))
                    })?,
            ),
        };
        parsed.apply(opt, value)?;
    }
    parsed.finish()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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
        assert_eq!(a.headers.len(), 2);
        assert_eq!(a.headers[1].1, "2023-06-01");
        assert_eq!(a.events, Some(PathBuf::from("ev.jsonl")));
        let p = a.policy().unwrap();
        assert_eq!(p.max_attempts().get(), 5);
        assert_eq!(p.budget(), Some(Duration::from_secs(2)));
        assert_eq!(p.retry_after_ceiling(), Duration::ZERO);
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
        assert_eq!(
            err(&[
                "--protocol",
                "ollama",
                "--head-timeout-ms",
                "0",
                "http://h/"
            ]),
            "invalid policy: head_timeout_ms: 0 is not a duration; use \"off\" to turn it off"
        );
    }

    /// Every knob of the policy table is a flag, `off` turns a bound off,
    /// and the help lists each one with its default.
    #[test]
    fn the_policy_flags_are_the_table() {
        let help = help();
        for f in FIELDS {
            assert!(help.contains(&f.flag()), "--help lacks {}", f.flag());
            let mut args = vec!["--protocol".to_owned(), "sse".to_owned()];
            match f.unit {
                Unit::Bool => args.push(f.flag()),
                _ => args.extend([f.flag(), f.default.to_owned()]),
            }
            args.push("http://h/".into());
            let a = match parse(args.iter().map(OsString::from)) {
                Ok(Command::Run(a)) => a,
                other => panic!("{args:?}: {other:?}"),
            };
            assert!(a.spec.get(f.name).is_some(), "{}", f.name);
        }
        let off = ok(&[
            "--protocol",
            "sse",
            "--idle-timeout-ms",
            "off",
            "--deadline-ms=off",
            "--endpoint",
            "local",
            "--retryable-statuses",
            "503,429",
            "--retryable-categories",
            "http",
            "--holdback-cap",
            "1024",
            "http://h/",
        ])
        .policy()
        .unwrap();
        assert_eq!(off.idle_timeout(), None);
        assert_eq!(off.deadline(), None);
        assert_eq!(off.endpoint(), recovery_core::Endpoint::Local);
        assert_eq!(off.retryable_statuses(), &[429, 503]);
        assert!(off.categories().http && !off.categories().transport);
        assert_eq!(off.holdback_cap(), 1024);
        assert!(
            err(&["--protocol", "sse", "--max-attempts", "off", "http://h/"])
                .contains("max_attempts: expected a whole number up to 4294967295, got \"off\"")
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
