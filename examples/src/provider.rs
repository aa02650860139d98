//! What the real-provider examples share: configuration from the
//! environment, one streamed request through the recovery stack, the text on
//! stdout and the lifecycle on stderr.

use std::io::{self, Write as _};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Uri};
use http_body_util::Full;
use recovery_core::call::{Cancellation, RecoveryCall};
use recovery_core::policy::RecoveryPolicy;
use recovery_core::protocol::ProtocolKind;
use tower_layer::Layer as _;
use tower_recovery::recovery::AdmissionHook;
use tower_recovery::{ObserveLayer, RecoveryLayer};

use crate::client::{exchange, https_client};
use crate::show::{self, Style};
use crate::text::DeltaText;

/// Exit status when the configuration an example needs is missing.
pub const NEEDS_CONFIGURATION: u8 = 2;

/// A variable from the environment, `None` when unset or blank.
pub fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Says what `example` needs and returns exit status 2.
pub fn needs(example: &str, what: &str) -> ExitCode {
    eprintln!("{example}: {what}");
    ExitCode::from(NEEDS_CONFIGURATION)
}

/// The prompt: the command-line arguments joined, or `default`.
pub fn prompt(default: &str) -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        default.to_owned()
    } else {
        args.join(" ")
    }
}

/// `base` (without a trailing slash) followed by `path`, checked to be an
/// `http`/`https` URL.
pub fn endpoint(base: &str, path: &str) -> Result<Uri, String> {
    let url = format!("{}{path}", base.trim_end_matches('/'));
    match url.parse::<Uri>() {
        Ok(uri)
            if matches!(uri.scheme_str(), Some("http" | "https")) && uri.authority().is_some() =>
        {
            Ok(uri)
        }
        _ => Err(format!("not an http(s) URL: {url:?}")),
    }
}

/// One streamed request to a provider.
pub struct Call {
    /// The example's name, for messages.
    pub example: &'static str,
    /// The wire protocol.
    pub protocol: ProtocolKind,
    /// Where to POST.
    pub url: Uri,
    /// Extra request headers (credentials, versions).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The JSON body.
    pub body: serde_json::Value,
    /// The policy.
    pub policy: RecoveryPolicy,
    /// An admission hook for ambiguous resends (local runners).
    pub admission: Option<AdmissionHook>,
}

/// Runs `call`: lifecycle events on stderr as they happen, the text on stdout
/// as it streams, then the report summary on stderr. Exit status 0 when the
/// stream completed with terminal proof, 1 when recovery failed, 130 on
/// Ctrl-C.
pub async fn run(call: Call) -> ExitCode {
    let style = Style::for_stderr();
    let cancel = Cancellation::new();
    let on_ctrl_c = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_ctrl_c.cancel();
        }
    });
    // Keeps the text and the event lines on separate lines when stdout and
    // stderr share a terminal.
    let mid_line = Arc::new(Mutex::new(false));
    let events_mid_line = Arc::clone(&mid_line);
    let mut layer = RecoveryLayer::new(call.policy).on_event(move |event| {
        let mut mid = events_mid_line
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if *mid {
            println!();
            *mid = false;
        }
        eprintln!("{}", show::describe(event, style));
    });
    if let Some(hook) = call.admission {
        layer = layer.with_admission(hook);
    }
    let mut svc = layer.layer(ObserveLayer::new(call.protocol.clone()).layer(https_client()));

    let body = Bytes::from(call.body.to_string());
    let mut builder = Request::post(call.url).header("content-type", "application/json");
    for (name, value) in call.headers {
        builder = builder.header(name, value);
    }
    let mut request = match builder.body(Full::new(body)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{}: cannot build the request: {e}", call.example);
            return ExitCode::from(NEEDS_CONFIGURATION);
        }
    };
    request
        .extensions_mut()
        .insert(RecoveryCall::new().with_cancellation(cancel.clone()));

    let mut text = DeltaText::new(call.protocol);
    let result = exchange(&mut svc, request, &cancel, |chunk| {
        let t = text.push(chunk);
        if !t.is_empty() {
            let mut out = io::stdout().lock();
            out.write_all(t.as_bytes())?;
            out.flush()?;
            *mid_line.lock().unwrap_or_else(PoisonError::into_inner) = !t.ends_with('\n');
        }
        Ok(())
    })
    .await;
    drop(svc);
    if *mid_line.lock().unwrap_or_else(PoisonError::into_inner) {
        println!();
    }
    eprintln!("{}", show::summary(&result.report, style));
    if result.cancelled {
        eprintln!("{}: interrupted", call.example);
        ExitCode::from(130)
    } else if result.completed() {
        ExitCode::SUCCESS
    } else {
        if let Some(status) = result.status.filter(|s| *s >= 400) {
            eprintln!("{}: the provider answered {status}", call.example);
        }
        eprintln!("{}: {}", call.example, show::failure_line(&result.report));
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_join_and_validate() {
        assert_eq!(
            endpoint("https://api.openai.com/v1/", "/chat/completions").unwrap(),
            "https://api.openai.com/v1/chat/completions"
        );
        assert!(endpoint("api.openai.com", "/x").is_err());
        assert!(endpoint("ftp://h", "/x").is_err());
    }
}
