//! The command line and the environment: flags, each with its variable;
//! flags win over the environment, the environment over the file.

use std::path::PathBuf;

use super::file::File;
use super::file::read_file;
use super::merge::{FLAGS, Layer, build};
use super::{Config, ConfigError, err};

/// What the command line asks for.
#[derive(Debug)]
pub enum Command {
    /// Run with this configuration.
    Run(Box<Config>),
    /// Print the help.
    Help,
    /// Print the version.
    Version,
    /// Read a client key on stdin and print its `[[clients]]` entry.
    HashKey {
        /// The entry's name.
        name: String,
    },
}

/// The usage line.
pub const USAGE: &str = "usage: recovery-gateway [--listen ADDR] [--upstream URL] [--config FILE] \
[--stream-log memory|redis://...|redis+unix://...] [--keep-generating-ms N] [--max-streams N] \
[--max-body-bytes N] [--fleet-redis redis://...|redis+unix://...] [--otlp-endpoint URL] [--log-level LEVEL] [--help] [--version]
       recovery-gateway hash-key [--name NAME] < key";

/// The help text after the usage line.
pub const HELP: &str = "
A recovering gateway in front of LLM providers. Point an SDK's base URL at it:
upstream faults before the first token are replayed, Responses background
streams are resumed, failures after are the provider's own error event, and a
client that disconnects resumes its SSE stream with Last-Event-ID.

Options (each also from an environment variable; flags win over the
environment, the environment over the file):
  --listen ADDR            listen address (RECOVERY_GATEWAY_LISTEN; default 127.0.0.1:8787)
  --upstream URL           default upstream, e.g. https://api.openai.com (RECOVERY_GATEWAY_UPSTREAM)
  --config FILE            TOML file: these keys, [policy], [log], [[routes]], [[alternates]] (RECOVERY_GATEWAY_CONFIG)
  --stream-log LOG         memory, or redis://HOST/ or redis+unix:///path (RECOVERY_GATEWAY_STREAM_LOG)
  --keep-generating-ms N   generation kept after the client left, ms (RECOVERY_GATEWAY_KEEP_GENERATING_MS; 60000)
  --max-streams N          concurrent forwarded requests (RECOVERY_GATEWAY_MAX_STREAMS; 1024)
  --max-body-bytes N       largest request body (RECOVERY_GATEWAY_MAX_BODY_BYTES; 67108864)
  --fleet-redis URL        share upstream cooldowns and the retry budget with the other instances
                           through this Redis (RECOVERY_GATEWAY_FLEET_REDIS; default: this process's)
  --otlp-endpoint URL      export spans and GenAI metrics over OTLP/HTTP to this base URL, e.g.
                           http://127.0.0.1:4318 (RECOVERY_GATEWAY_OTLP_ENDPOINT; metrics every
                           OTEL_METRIC_EXPORT_INTERVAL ms, 60000, and at shutdown; default: off)
  --log-level LEVEL        debug, info, warn or error (RECOVERY_GATEWAY_LOG_LEVEL; info: one line
                           per stream that goes well, at its end; debug: every step)
  --help, --version

File-only keys: [[clients]] (name, key_hash), upstream_headers, stream_secret
(or RECOVERY_GATEWAY_STREAM_SECRET; the same on every instance of one Redis log),
sse_comments (pass|drop), header_read_timeout_ms, body_read_timeout_ms,
body_min_bytes_per_sec, max_upload_bytes, max_held_body_bytes, max_kept_streams, max_readers,
max_readers_per_stream, shutdown_grace_ms, threads (that serve connections; one
per core), http2_streams_per_connection (100), http2_keep_alive_ms (30000, or \"off\");
[[routes]] take resumable, headers, credential_header.
Header values \"$NAME\" are read from the environment.

Bounds (defaults; each breach is an HTTP error in the provider's shape, and
each is a gauge recovery_gateway_bound{name=...} in /metrics):
  max_streams 1024 (head to the end of the client's read), max_kept_streams 256
  (generations kept for clients that left), max_readers 1024 and
  max_readers_per_stream 4 (reconnects), header_read_timeout_ms 10000,
  body_read_timeout_ms 10000 plus 1 s per body_min_bytes_per_sec 65536 bytes,
  max_body_bytes 67108864, max_held_body_bytes 536870912 (bodies held at once, in
  all), max_upload_bytes 536870912 (streamed, not held),
  [log] max_total_bytes 268435456 (finished streams
  evicted first), max_bytes 67108864 per stream, max_streams 10000, ttl_ms 300000.

Client keys: with [[clients]], every request but GET /healthz needs a known key
in its SDK's API-key header and is sent with the operator's headers; without,
requests spend their own keys, and operator keys are refused on a listener
that is not loopback. `recovery-gateway hash-key --name team < key` prints an entry.

Reserved paths: GET /healthz, GET /metrics, GET /streams/<id>?after=<seq>.
Streams are readable only with the credentials that created them; a request
with `x-recovery-resumable: off` gets the upstream's bytes as they came.
Requests that are not generations (model lists, embeddings, files, audio)
pass through as they came; a WebSocket handshake (Upgrade) becomes a tunnel
that holds a max_streams slot and closes after the policy's idle_timeout_ms.
Exit status: 0 after a graceful shutdown (SIGTERM, SIGINT), 2 on bad usage or configuration.

Example:
  recovery-gateway --upstream https://api.openai.com
  # then: OpenAI(base_url=\"http://127.0.0.1:8787/v1\")
";

/// Parses the command line (without the program name), with `env` as the
/// environment and files read from disk.
pub fn parse(
    args: impl IntoIterator<Item = String>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Command, ConfigError> {
    let mut flags = Layer::default();
    let mut args = args.into_iter().peekable();
    if args.peek().map(String::as_str) == Some("hash-key") {
        args.next();
        return hash_key_args(args);
    }
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--help" | "-h" => return Ok(Command::Help),
            "--version" | "-V" => return Ok(Command::Version),
            _ => {}
        }
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        let Some(i) = FLAGS.iter().position(|(f, _)| *f == name) else {
            return err(format!("unknown argument {arg:?}"));
        };
        let value = match inline {
            Some(v) => v,
            None => match args.next() {
                Some(v) => v,
                None => return err(format!("{name} needs a value")),
            },
        };
        *flags.slot(i) = Some(value);
    }
    let mut merged = Layer::default();
    for (i, (_, var)) in FLAGS.iter().enumerate() {
        let from_flag = flags.slot(i).clone();
        *merged.slot(i) = from_flag.or_else(|| env(var).filter(|v| !v.is_empty()));
    }
    let file = match &merged.config {
        Some(path) => read_file(&PathBuf::from(path))?,
        None => File::default(),
    };
    build(&merged, file, &env).map(|c| Command::Run(Box::new(c)))
}

/// `hash-key [--name NAME]`.
fn hash_key_args(mut args: impl Iterator<Item = String>) -> Result<Command, ConfigError> {
    let mut name = "client".to_owned();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--name" => {
                name = args
                    .next()
                    .ok_or_else(|| ConfigError("--name needs a value".into()))?;
            }
            other => match other.strip_prefix("--name=") {
                Some(v) => v.clone_into(&mut name),
                None => return err(format!("hash-key: unknown argument {other:?}")),
            },
        }
    }
    if name.is_empty() {
        return err("hash-key: --name must not be empty");
    }
    Ok(Command::HashKey { name })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use recovery_core::protocol::ProtocolKind;

    use super::super::{
        DEFAULT_LISTEN, RouteProtocol, StreamLogChoice, from_toml, from_toml_with_env,
    };
    use super::*;

    fn run(args: &[&str], env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        match parse(args.iter().map(|s| (*s).to_owned()), |k| {
            env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        })? {
            Command::Run(c) => Ok(*c),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn defaults() {
        let c = run(&[], &[]).unwrap();
        assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
        assert!(matches!(c.stream_log, StreamLogChoice::Memory));
        assert_eq!(c.keep_generating, Duration::from_mins(1));
        assert_eq!(c.max_streams, 1024);
        assert_eq!(c.max_body_bytes, 64 << 20);
        assert_eq!(c.max_held_body_bytes, 512 << 20);
        assert_eq!(c.max_upload_bytes, 512 << 20);
        assert_eq!(
            c.threads,
            std::thread::available_parallelism().unwrap().get(),
            "the command line serves on a thread per core"
        );
        assert_eq!(
            crate::Config::default().threads,
            1,
            "a library, on its caller's runtime"
        );
    }

    #[test]
    fn the_body_budget_holds_a_body_of_the_largest_size() {
        let c = from_toml("max_body_bytes = 100\nmax_held_body_bytes = 100\n").unwrap();
        assert_eq!((c.max_body_bytes, c.max_held_body_bytes), (100, 100));
        assert_eq!(
            from_toml("max_body_bytes = 100\nmax_held_body_bytes = 99\n")
                .unwrap_err()
                .0,
            "max_held_body_bytes must be at least max_body_bytes: a body of the largest size must fit"
        );
    }

    #[test]
    fn counts_beyond_any_machine_are_refused_not_a_panic() {
        let e = run(&["--max-streams", "18446744073709551615"], &[]).unwrap_err();
        assert_eq!(e.0, "--max-streams must be at most 1099511627776");
        assert_eq!(
            from_toml("max_readers = 18446744073709551615\n")
                .unwrap_err()
                .0,
            "max_readers must be at most 1099511627776"
        );
        assert_eq!(
            from_toml("max_held_body_bytes = 18446744073709551615\n")
                .unwrap_err()
                .0,
            "max_held_body_bytes must be at most 2305843009213693951"
        );
    }

    #[test]
    fn threads_come_from_the_file() {
        assert_eq!(from_toml("threads = 3\n").unwrap().threads, 3);
        for bad in ["threads = 0\n", "threads = 1025\n"] {
            assert_eq!(
                from_toml(bad).unwrap_err().0,
                "threads must be from 1 to 1024",
                "{bad}"
            );
        }
    }

    #[test]
    fn flags_win_over_env() {
        let c = run(
            &["--listen", "127.0.0.1:0", "--max-streams=7"],
            &[
                ("RECOVERY_GATEWAY_LISTEN", "127.0.0.1:9"),
                ("RECOVERY_GATEWAY_MAX_STREAMS", "3"),
                ("RECOVERY_GATEWAY_UPSTREAM", "http://127.0.0.1:1"),
            ],
        )
        .unwrap();
        assert_eq!(c.listen.port(), 0);
        assert_eq!(c.max_streams, 7);
        assert_eq!(c.upstream.unwrap().to_string(), "http://127.0.0.1:1/");
    }

    #[test]
    fn env_wins_over_file() {
        let dir = std::env::temp_dir().join(format!("gw-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("g.toml");
        std::fs::write(
            &path,
            "max_streams = 5\nmax_body_bytes = 10\nmax_upload_bytes = 11\nmax_held_body_bytes = 12\n\
             keep_generating_ms = 7\n\
             [policy]\nmax_attempts = 4\nattempts_per_target = 2\nidle_timeout_ms = \"off\"\n\
             first_token_timeout_ms = 10000\n\
             [[routes]]\nprefix = \"/a/\"\nupstream = \"https://api.anthropic.com\"\nstrip_prefix = true\nprotocol = \"anthropic\"\n",
        )
        .unwrap();
        let c = run(
            &["--config", path.to_str().unwrap()],
            &[("RECOVERY_GATEWAY_MAX_STREAMS", "9")],
        )
        .unwrap();
        assert_eq!(c.max_streams, 9);
        assert_eq!(c.max_body_bytes, 10);
        assert_eq!(c.max_upload_bytes, 11);
        assert_eq!(c.max_held_body_bytes, 12);
        assert_eq!(c.keep_generating, Duration::from_millis(7));
        assert_eq!(c.policy.max_attempts().get(), 4);
        assert_eq!(c.policy.attempts_per_target().get(), 2);
        assert_eq!(
            c.policy.first_token_timeout(),
            Some(Duration::from_secs(10))
        );
        assert_eq!(c.policy.idle_timeout(), None);
        assert_eq!(c.routes[0].prefix, "/a");
        assert!(c.routes[0].strip_prefix);
        assert_eq!(
            c.routes[0].protocol,
            RouteProtocol::Fixed(ProtocolKind::Anthropic)
        );
    }

    /// `[policy]` is the policy spec every front end reads: `"off"` turns a
    /// bound off, 0 is refused with the spec's own words under `policy.`,
    /// and a value a knob does not take names the knob (and the table's
    /// line).
    #[test]
    fn the_policy_table_is_the_spec() {
        let c = from_toml("[policy]\ndeadline_ms = 9000\nhead_timeout_ms = \"off\"\n").unwrap();
        assert_eq!(c.policy.deadline(), Some(Duration::from_secs(9)));
        assert_eq!(c.policy.head_timeout(), None);
        assert_eq!(
            from_toml("[policy]\nidle_timeout_ms = 0\n").unwrap_err().0,
            "policy.idle_timeout_ms: 0 is not a duration; use \"off\" to turn it off"
        );
        assert_eq!(
            from_toml("[policy]\nmax_attempts = 0\n").unwrap_err().0,
            "policy.max_attempts: must be at least 1"
        );
        for (text, want) in [
            (
                "budget_ms = \"soon\"",
                "budget_ms: expected a whole number of milliseconds",
            ),
            (
                "max_attempts = \"off\"",
                "max_attempts: expected a whole number",
            ),
            ("max_atempts = 3", "unknown policy knob `max_atempts`"),
        ] {
            let e = from_toml(&format!("[policy]\n{text}\n")).unwrap_err().0;
            assert!(e.starts_with("line ") && e.contains(want), "{text}: {e}");
        }
        let e = from_toml("[policy]\nretryable_statuses = [401]\n")
            .unwrap_err()
            .0;
        assert_eq!(e, "[policy]: status 401 cannot be made retryable");
    }

    /// The README's config file is one the gateway takes, and its
    /// `[policy]` is the default policy written out.
    #[test]
    fn the_readme_config_file_parses() {
        let readme = include_str!("../../README.md");
        let start = readme.find("## Config file (TOML)").unwrap();
        let block = &readme[start..];
        let block = &block[block.find("```toml\n").unwrap() + 8..];
        let block = &block[..block.find("```").unwrap()];
        let secret = "0123456789abcdef0123456789abcdef";
        let c = from_toml_with_env(block, &|_| Some(secret.into())).unwrap();
        assert_eq!(c.policy, recovery_core::RecoveryPolicy::default());
    }

    #[test]
    fn the_fleet_redis_is_a_flag_an_env_or_a_file_key() {
        let c = run(&["--fleet-redis", "redis+unix:///run/r.sock"], &[]).unwrap();
        assert_eq!(c.fleet_redis.as_deref(), Some("redis+unix:///run/r.sock"));
        let c = run(&[], &[("RECOVERY_GATEWAY_FLEET_REDIS", "redis://h:6379/0")]).unwrap();
        assert_eq!(c.fleet_redis.as_deref(), Some("redis://h:6379/0"));
        let c = from_toml("fleet_redis = \"redis://f/1\"\n").unwrap();
        assert_eq!(c.fleet_redis.as_deref(), Some("redis://f/1"));
        assert_eq!(run(&[], &[]).unwrap().fleet_redis, None);
    }

    #[test]
    fn the_log_level_is_a_flag_an_env_or_a_file_key() {
        use crate::logs::Level;
        assert_eq!(run(&[], &[]).unwrap().logger.level(), Level::Info);
        let c = run(&["--log-level", "debug"], &[]).unwrap();
        assert_eq!(c.logger.level(), Level::Debug);
        let c = run(&[], &[("RECOVERY_GATEWAY_LOG_LEVEL", "warn")]).unwrap();
        assert_eq!(c.logger.level(), Level::Warn);
        let c = from_toml("log_level = \"error\"\n").unwrap();
        assert_eq!(c.logger.level(), Level::Error);
        let bad = run(&["--log-level", "loud"], &[]).unwrap_err();
        assert!(bad.to_string().contains("--log-level"), "{bad}");
    }

    #[test]
    fn the_otlp_endpoint_is_a_flag_an_env_or_a_file_key() {
        let c = run(&["--otlp-endpoint", "http://127.0.0.1:4318"], &[]).unwrap();
        assert_eq!(
            c.otlp_endpoint.unwrap().to_string(),
            "http://127.0.0.1:4318/"
        );
        let c = run(
            &[],
            &[("RECOVERY_GATEWAY_OTLP_ENDPOINT", "https://otel.example/")],
        )
        .unwrap();
        assert_eq!(c.otlp_endpoint.unwrap().host(), Some("otel.example"));
        let c = from_toml("otlp_endpoint = \"http://collector:4318\"\n").unwrap();
        assert_eq!(c.otlp_endpoint.unwrap().port_u16(), Some(4318));
        assert_eq!(run(&[], &[]).unwrap().otlp_endpoint, None);
        let bad = run(&["--otlp-endpoint", "grpc://x"], &[]).unwrap_err();
        assert!(bad.to_string().contains("--otlp-endpoint"), "{bad}");
    }

    #[test]
    fn alternates_name_their_protocol_and_keep_keys_out_of_errors() {
        let base =
            "[[alternates]]\nlabel = \"b\"\nurl = \"https://b.example/v1/chat/completions\"\n";
        let none = |_: &str| None;
        let e = from_toml_with_env(&format!("{base}protocol = \"auto\"\n"), &none).unwrap_err();
        assert!(e.0.contains("name its protocol"), "{e}");
        let missing = format!(
            "{base}protocol = \"openai-chat\"\nheaders = {{ x-api-key = \"$NOPE_KEY\" }}\n"
        );
        let e = from_toml_with_env(&missing, &none).unwrap_err();
        assert!(e.0.contains("$NOPE_KEY is not set"), "{e}");
        let bad = format!(
            "{base}protocol = \"openai-chat\"\nheaders = {{ x-api-key = \"sk-1\\u0001\" }}\n"
        );
        let e = from_toml_with_env(&bad, &none).unwrap_err();
        assert!(!e.0.contains("sk-1"), "no credential in the error: {e}");
        let label = "[[alternates]]\nlabel = \"a b\"\nprotocol = \"openai-chat\"\nurl = \"/x\"\n";
        assert!(
            from_toml_with_env(label, &none)
                .unwrap_err()
                .0
                .contains("label")
        );
        let ok = format!("{base}protocol = \"openai-chat\"\nmodel = \"m\"\n");
        let c = from_toml_with_env(&ok, &none).unwrap();
        assert_eq!(c.alternates.len(), 1);
        assert_eq!(c.alternates[0].protocol, ProtocolKind::OpenAiChat);
        assert_eq!(c.alternates[0].alternate.label(), "b");
    }

    #[test]
    fn bad_input_is_one_line() {
        for (args, want) in [
            (vec!["--bogus"], "unknown argument"),
            (vec!["--listen"], "needs a value"),
            (vec!["--listen", "nope"], "IP:PORT"),
            (vec!["--upstream", "ftp://x"], "http:// or https://"),
            (vec!["--max-streams", "x"], "not a valid number"),
            (vec!["--stream-log", "disk"], "memory"),
            (vec!["--config", "/nonexistent/g.toml"], "cannot read"),
            (vec!["--fleet-redis", "http://h"], "redis://"),
        ] {
            let e = run(&args, &[]).unwrap_err();
            assert!(e.0.contains(want), "{args:?}: {e}");
            assert!(!e.0.contains('\n'), "{e}");
        }
        let e = from_toml("bogus = 1\n").unwrap_err();
        assert!(e.0.contains("line 1"), "{e}");
        assert!(!e.0.contains('\n'), "{e}");
        let e = from_toml("# caf\u{e9} \u{1f600}\n\nbogus = 1\n").unwrap_err();
        assert!(e.0.contains("line 3"), "{e}");
        let e =
            from_toml("[[routes]]\nprefix = \"/x\"\nupstream = \"http://h\"\nprotocol = \"x\"\n")
                .unwrap_err();
        assert!(e.0.contains("unknown protocol"), "{e}");
    }
}
