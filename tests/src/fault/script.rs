//! The script model: what the provider answers to one request.
//!
//! Scripts are plain serde data so the very same JSON drives the in-process
//! provider (tower tests), the standalone binary (wasm tests) and the
//! conformance vectors. A script is compiled once, when it is installed, into
//! [`Compiled`] pieces with every fixture read and every split applied, so a
//! missing fixture or a bad offset fails the test at set-up rather than as a
//! confusing network error in the middle of a run.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use serde::{Deserialize, Deserializer, Serialize};

/// How the response body is framed on the wire.
///
/// The three HTTP/1.1 framings are kept distinct because a client detects
/// truncation differently under each: a short
/// chunked or `content-length` body is a body error, a close-delimited body
/// cut by FIN is a clean end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transfer {
    /// `transfer-encoding: chunked`; every write is one chunk.
    #[default]
    Chunked,
    /// `content-length` set to the sum of the writes (or [`Script::content_length`]).
    ContentLength,
    /// No length at all and `connection: close`: the body ends when the server closes.
    CloseDelimited,
}

/// What happens after the body writes (or instead of the head, for the
/// `*_before_head` and `never_answer` variants).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ending {
    /// Proper end of framing: the chunked terminator, nothing for
    /// `content-length`, FIN for close-delimited. The connection stays open for
    /// the next request unless the framing or [`Script::keep_alive`] forbids it.
    #[default]
    Clean,
    /// `shutdown(Write)` right after the writes, without the chunked terminator.
    Fin,
    /// `SO_LINGER` 0 then close: the client reads the bytes already sent, then
    /// `ECONNRESET`.
    Rst,
    /// Keep the connection open, silent, until a stall permit is released (see
    /// [`crate::fault::FaultProvider::release`]) or the client disconnects; then FIN.
    /// Meant for chunked and close-delimited bodies: under `content_length`
    /// the client already has the whole body and sees nothing stall.
    Stall,
    /// Declare a `content-length` larger than the bytes sent, then FIN.
    /// The declared value is [`Script::content_length`] if set, else the body
    /// length plus one.
    ShortContentLength,
    /// Read the request, then RST before writing any byte of a response.
    ResetBeforeHead,
    /// Read the request, then FIN before writing any byte of a response.
    FinBeforeHead,
    /// Read the request and stall without answering until released or until
    /// the client disconnects; then FIN.
    NeverAnswer,
}

impl Ending {
    /// True for the endings that never write a response head.
    pub fn skips_head(self) -> bool {
        matches!(
            self,
            Self::ResetBeforeHead | Self::FinBeforeHead | Self::NeverAnswer
        )
    }
}

/// One body write: a slice of bytes from inline text, a byte list or a
/// fixture file, optionally split into several writes, repeated, delayed or
/// gated on a stall permit.
///
/// In JSON a write is either a bare string (inline text) or an object:
/// `{"fixture": "anthropic/happy.sse", "start": 0, "end": 120, "split_at": [40]}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Write {
    /// Inline UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Inline bytes (for invalid UTF-8 and other byte-exact cases).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<Vec<u8>>,
    /// A fixture file, relative to the fixtures directory (`tests/fixtures/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fixture: Option<String>,
    /// First byte of the source to use (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<usize>,
    /// One past the last byte of the source to use (default: its end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<usize>,
    /// Offsets, relative to the selected bytes, at which to split them into
    /// separate writes (separate chunks under chunked framing).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub split_at: Vec<usize>,
    /// Split the selected bytes at every line feed (after it), so each SSE
    /// line or NDJSON record is its own write.
    #[serde(default, skip_serializing_if = "is_false")]
    pub split_lines: bool,
    /// How many times to write the selected bytes (default 1); handy for
    /// keepalive runs and oversized lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat: Option<u32>,
    /// Wait this long before the write. Tests should prefer 0 and gate on
    /// stalls instead; delays exist for wasm runtimes whose timers are the subject.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub delay_ms: u64,
    /// Wait for a stall permit (or the client disconnecting) before this write.
    #[serde(default, skip_serializing_if = "is_false")]
    pub stall: bool,
    /// Write the bytes verbatim, bypassing chunked framing, to produce broken
    /// framing on purpose (a chunk header promising more than follows, ...).
    #[serde(default, skip_serializing_if = "is_false")]
    pub raw: bool,
}

#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_false(value: &bool) -> bool {
    !*value
}

#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero(value: &u64) -> bool {
    *value == 0
}

impl Write {
    /// A write of inline text.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: Some(text.into()),
            ..Self::default()
        }
    }

    /// A write of inline bytes.
    pub fn bytes(bytes: impl Into<Vec<u8>>) -> Self {
        Self {
            bytes: Some(bytes.into()),
            ..Self::default()
        }
    }

    /// A write of a whole fixture file (relative to the fixtures directory).
    pub fn fixture(path: impl Into<String>) -> Self {
        Self {
            fixture: Some(path.into()),
            ..Self::default()
        }
    }

    /// A pure gate: no bytes, just wait for a stall permit.
    pub fn stall() -> Self {
        Self {
            stall: true,
            ..Self::default()
        }
    }

    /// Restrict the source to `start..end`.
    pub fn range(mut self, start: usize, end: usize) -> Self {
        self.start = Some(start);
        self.end = Some(end);
        self
    }

    /// Split the selected bytes at these offsets.
    pub fn split_at(mut self, offsets: impl Into<Vec<usize>>) -> Self {
        self.split_at = offsets.into();
        self
    }

    /// Split the selected bytes after every line feed.
    pub fn split_lines(mut self) -> Self {
        self.split_lines = true;
        self
    }

    /// Repeat the write `times` times.
    pub fn repeat(mut self, times: u32) -> Self {
        self.repeat = Some(times);
        self
    }

    /// Wait `ms` milliseconds before writing.
    pub fn delay_ms(mut self, ms: u64) -> Self {
        self.delay_ms = ms;
        self
    }

    /// Write bypassing chunked framing.
    pub fn raw(mut self) -> Self {
        self.raw = true;
        self
    }
}

impl<'de> Deserialize<'de> for WriteSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Parsed through a Value so a bad object reports its own field error
        // instead of serde's opaque "did not match any variant".
        let value = serde_json::Value::deserialize(deserializer)?;
        match value {
            serde_json::Value::String(text) => Ok(Self(Write::text(text))),
            other => serde_json::from_value(other)
                .map(Self)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// A [`Write`] that also accepts the bare-string shorthand in JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct WriteSpec(pub Write);

impl From<Write> for WriteSpec {
    fn from(write: Write) -> Self {
        Self(write)
    }
}

/// Response headers, in order, duplicates allowed; values are sent verbatim.
///
/// JSON accepts either an object (`{"retry-after": "2"}`) or a list of pairs
/// (`[["retry-after", "2"], ["x-a", "1"]]`) when order or duplicates matter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Headers(pub Vec<(String, String)>);

impl<'de> Deserialize<'de> for Headers {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Map(BTreeMap<String, String>),
            List(Vec<(String, String)>),
        }
        Ok(match Repr::deserialize(deserializer)? {
            Repr::Map(map) => Self(map.into_iter().collect()),
            Repr::List(list) => Self(list),
        })
    }
}

/// What the provider does with one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    /// Optional label, echoed nowhere on the wire; for humans reading vectors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Response status (default 200).
    #[serde(default = "default_status")]
    pub status: u16,
    /// Response headers, written verbatim after the provider's framing headers.
    #[serde(default)]
    pub headers: Headers,
    /// Body framing.
    #[serde(default)]
    pub transfer: Transfer,
    /// Body writes, in order.
    #[serde(default)]
    pub body: Vec<WriteSpec>,
    /// Keep only the first `cut_at` body bytes (counted after splits and
    /// repeats), so a fixture can be cut at any offset; combine with
    /// `ending: "rst"` or `"fin"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut_at: Option<usize>,
    /// Declared `content-length` override (for `content_length` transfer and
    /// the `short_content_length` ending).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_length: Option<u64>,
    /// After a clean response, keep the connection for the next request
    /// (default true). `false` closes it with FIN *without* announcing
    /// `connection: close`, which is how an idle pooled connection dies.
    #[serde(default = "default_true")]
    pub keep_alive: bool,
    /// What happens after the writes.
    #[serde(default)]
    pub ending: Ending,
}

fn default_status() -> u16 {
    200
}

fn default_true() -> bool {
    true
}

impl Default for Script {
    fn default() -> Self {
        Self {
            name: None,
            status: 200,
            headers: Headers::default(),
            transfer: Transfer::default(),
            body: Vec::new(),
            cut_at: None,
            content_length: None,
            keep_alive: true,
            ending: Ending::default(),
        }
    }
}

impl Script {
    /// An empty 200 response with chunked framing and a clean end.
    pub fn ok() -> Self {
        Self::default()
    }

    /// An empty response with this status.
    pub fn status(status: u16) -> Self {
        Self {
            status,
            ..Self::default()
        }
    }

    /// A 200 `text/event-stream` response that performs `write`.
    pub fn event_stream(write: impl Into<WriteSpec>) -> Self {
        Self::ok()
            .header("content-type", "text/event-stream")
            .write(write)
    }

    /// A 200 `text/event-stream` response whose body is `text`, one write.
    pub fn sse(text: impl Into<String>) -> Self {
        Self::ok()
            .header("content-type", "text/event-stream")
            .write(Write::text(text))
    }

    /// A script that only performs this ending (e.g. [`Ending::ResetBeforeHead`]).
    pub fn just(ending: Ending) -> Self {
        Self::ok().ending(ending)
    }

    /// Add a header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.0.push((name.into(), value.into()));
        self
    }

    /// Append a body write.
    pub fn write(mut self, write: impl Into<WriteSpec>) -> Self {
        self.body.push(write.into());
        self
    }

    /// Set the framing.
    pub fn transfer(mut self, transfer: Transfer) -> Self {
        self.transfer = transfer;
        self
    }

    /// Set the ending.
    pub fn ending(mut self, ending: Ending) -> Self {
        self.ending = ending;
        self
    }

    /// Keep only the first `offset` body bytes.
    pub fn cut_at(mut self, offset: usize) -> Self {
        self.cut_at = Some(offset);
        self
    }

    /// Override the declared `content-length`.
    pub fn content_length(mut self, length: u64) -> Self {
        self.content_length = Some(length);
        self
    }

    /// Close the connection (FIN, unannounced) after a clean response.
    pub fn no_keep_alive(mut self) -> Self {
        self.keep_alive = false;
        self
    }

    /// Read fixtures and apply splits, repeats and cuts.
    pub fn compile(&self, fixtures: &Path) -> Result<Compiled, ScriptError> {
        let mut pieces = Vec::new();
        for (index, spec) in self.body.iter().enumerate() {
            compile_write(&spec.0, index, fixtures, &mut pieces)?;
        }
        if let Some(cut) = self.cut_at {
            let total: usize = pieces.iter().map(|p| p.bytes.len()).sum();
            if cut > total {
                return Err(ScriptError::new(format!(
                    "cut_at {cut} is past the body's {total} bytes"
                )));
            }
            let mut left = cut;
            let mut kept = Vec::with_capacity(pieces.len());
            for mut piece in pieces {
                if left == 0 {
                    break;
                }
                if piece.bytes.len() > left {
                    piece.bytes = piece.bytes.slice(..left);
                }
                left -= piece.bytes.len();
                kept.push(piece);
            }
            pieces = kept;
        }
        let body_len: u64 = pieces
            .iter()
            .filter(|p| !p.raw)
            .map(|p| p.bytes.len() as u64)
            .sum();
        if !(100..=999).contains(&self.status) {
            return Err(ScriptError::new(format!(
                "status {} is not a three-digit code",
                self.status
            )));
        }
        for (name, value) in &self.headers.0 {
            if name.is_empty() || name.contains([':', '\r', '\n']) || value.contains(['\r', '\n']) {
                return Err(ScriptError::new(format!(
                    "header {name:?} cannot be written"
                )));
            }
        }
        Ok(Compiled {
            status: self.status,
            headers: self.headers.0.clone(),
            transfer: self.transfer,
            pieces,
            body_len,
            content_length: self.content_length,
            keep_alive: self.keep_alive,
            ending: self.ending,
        })
    }
}

fn compile_write(
    write: &Write,
    index: usize,
    fixtures: &Path,
    out: &mut Vec<Piece>,
) -> Result<(), ScriptError> {
    let context = |msg: String| ScriptError::new(format!("body write {index}: {msg}"));
    let sources = usize::from(write.text.is_some())
        + usize::from(write.bytes.is_some())
        + usize::from(write.fixture.is_some());
    if sources > 1 {
        return Err(context("give at most one of text, bytes, fixture".into()));
    }
    let source: Bytes = if let Some(text) = &write.text {
        Bytes::from(text.clone().into_bytes())
    } else if let Some(bytes) = &write.bytes {
        Bytes::from(bytes.clone())
    } else if let Some(fixture) = &write.fixture {
        let path: PathBuf = fixtures.join(fixture);
        std::fs::read(&path)
            .map(Bytes::from)
            .map_err(|err| context(format!("fixture {}: {err}", path.display())))?
    } else {
        Bytes::new()
    };
    let start = write.start.unwrap_or(0);
    let end = write.end.unwrap_or(source.len());
    if start > end || end > source.len() {
        return Err(context(format!(
            "range {start}..{end} is outside the source's {} bytes",
            source.len()
        )));
    }
    let selected = source.slice(start..end);
    let mut cuts: Vec<usize> = write.split_at.clone();
    if write.split_lines {
        cuts.extend(
            selected
                .iter()
                .enumerate()
                .filter(|&(_, &b)| b == b'\n')
                .map(|(i, _)| i + 1),
        );
    }
    cuts.sort_unstable();
    cuts.dedup();
    if let Some(&bad) = cuts.iter().find(|&&c| c > selected.len()) {
        return Err(context(format!(
            "split offset {bad} is past the selected {} bytes",
            selected.len()
        )));
    }
    let mut parts = Vec::new();
    let mut from = 0;
    for cut in cuts.into_iter().chain(std::iter::once(selected.len())) {
        if cut > from {
            parts.push(selected.slice(from..cut));
        }
        from = cut;
    }
    let repeat = write.repeat.unwrap_or(1);
    let mut first = true;
    for _ in 0..repeat {
        for part in &parts {
            out.push(Piece {
                bytes: part.clone(),
                delay_ms: if first { write.delay_ms } else { 0 },
                stall: first && write.stall,
                raw: write.raw,
            });
            first = false;
        }
    }
    if first && (write.stall || write.delay_ms > 0) {
        // A write with no bytes still carries its gate or delay.
        out.push(Piece {
            bytes: Bytes::new(),
            delay_ms: write.delay_ms,
            stall: write.stall,
            raw: write.raw,
        });
    }
    Ok(())
}

/// A script with fixtures read and splits applied, ready to serve.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// Response status.
    pub status: u16,
    /// Script headers, verbatim.
    pub headers: Vec<(String, String)>,
    /// Body framing.
    pub transfer: Transfer,
    /// The writes, in order.
    pub pieces: Vec<Piece>,
    /// Sum of the framed (non-raw) body bytes.
    pub body_len: u64,
    /// Declared length override.
    pub content_length: Option<u64>,
    /// Keep the connection after a clean response.
    pub keep_alive: bool,
    /// What happens after the writes.
    pub ending: Ending,
}

/// One write on the wire.
#[derive(Debug, Clone)]
pub struct Piece {
    /// The payload (framed as one chunk under chunked transfer unless `raw`).
    pub bytes: Bytes,
    /// Delay before the write.
    pub delay_ms: u64,
    /// Wait for a stall permit before the write.
    pub stall: bool,
    /// Bypass chunked framing.
    pub raw: bool,
}

/// The scripts of a provider: a default sequence plus per-path sequences.
///
/// Request n (counted per sequence) gets script n; once a sequence is used
/// up, `default` answers if set, else its last script repeats. JSON accepts
/// a bare array as shorthand for `{"scripts": [...]}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ScriptSet {
    /// The sequence for requests whose path has no entry in `paths`.
    pub scripts: Vec<Script>,
    /// Sequences keyed by request path (without the query string).
    pub paths: BTreeMap<String, Vec<Script>>,
    /// Answer once a sequence is used up (instead of repeating its last script).
    pub default: Option<Script>,
}

impl<'de> Deserialize<'de> for ScriptSet {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Full {
            #[serde(default)]
            scripts: Vec<Script>,
            #[serde(default)]
            paths: BTreeMap<String, Vec<Script>>,
            #[serde(default)]
            default: Option<Script>,
        }
        let value = serde_json::Value::deserialize(deserializer)?;
        if value.is_array() {
            let scripts = serde_json::from_value(value).map_err(serde::de::Error::custom)?;
            return Ok(Self {
                scripts,
                ..Self::default()
            });
        }
        let full: Full = serde_json::from_value(value).map_err(serde::de::Error::custom)?;
        Ok(Self {
            scripts: full.scripts,
            paths: full.paths,
            default: full.default,
        })
    }
}

impl ScriptSet {
    /// A set whose default sequence is `scripts`.
    pub fn new(scripts: impl Into<Vec<Script>>) -> Self {
        Self {
            scripts: scripts.into(),
            ..Self::default()
        }
    }

    /// Add a sequence for one path.
    pub fn path(mut self, path: impl Into<String>, scripts: impl Into<Vec<Script>>) -> Self {
        self.paths.insert(path.into(), scripts.into());
        self
    }

    /// Answer with `script` once a sequence is used up.
    pub fn with_default(mut self, script: Script) -> Self {
        self.default = Some(script);
        self
    }

    /// Parse JSON (an object or a bare array of scripts).
    pub fn from_json(json: &str) -> Result<Self, ScriptError> {
        serde_json::from_str(json).map_err(|err| ScriptError::new(format!("script JSON: {err}")))
    }

    /// Compile every script against a fixtures directory.
    pub fn compile(&self, fixtures: &Path) -> Result<CompiledSet, ScriptError> {
        let compile_all = |label: &str, list: &[Script]| {
            list.iter()
                .enumerate()
                .map(|(i, s)| {
                    s.compile(fixtures)
                        .map_err(|e| ScriptError::new(format!("{label}[{i}]: {}", e.0)))
                })
                .collect::<Result<Vec<_>, _>>()
        };
        let mut paths = BTreeMap::new();
        for (path, list) in &self.paths {
            paths.insert(path.clone(), compile_all(&format!("paths[{path}]"), list)?);
        }
        Ok(CompiledSet {
            scripts: compile_all("scripts", &self.scripts)?,
            paths,
            default: self
                .default
                .as_ref()
                .map(|s| s.compile(fixtures))
                .transpose()
                .map_err(|e| ScriptError::new(format!("default: {}", e.0)))?,
        })
    }
}

impl From<Vec<Script>> for ScriptSet {
    fn from(scripts: Vec<Script>) -> Self {
        Self::new(scripts)
    }
}

/// A compiled [`ScriptSet`].
#[derive(Debug, Clone, Default)]
pub struct CompiledSet {
    pub(crate) scripts: Vec<Compiled>,
    pub(crate) paths: BTreeMap<String, Vec<Compiled>>,
    pub(crate) default: Option<Compiled>,
}

impl CompiledSet {
    /// The script for the `index`-th request (0-based) of the sequence that
    /// `path` selects, and whether the path has its own sequence.
    pub(crate) fn pick(&self, path: &str, index: usize) -> Option<&Compiled> {
        let list = self.paths.get(path).unwrap_or(&self.scripts);
        list.get(index)
            .or(self.default.as_ref())
            .or_else(|| list.last())
    }

    /// The cursor key for `path`: its own name if it has a sequence, else
    /// the shared default sequence.
    pub(crate) fn key<'a>(&self, path: &'a str) -> Option<&'a str> {
        self.paths.contains_key(path).then_some(path)
    }
}

/// A script that cannot be compiled or parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptError(pub String);

impl ScriptError {
    fn new(message: String) -> Self {
        Self(message)
    }
}

impl fmt::Display for ScriptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ScriptError {}
