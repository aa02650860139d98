//! One policy spec, every front end: the cases of
//! `tests/conformance/policy/knobs.json` built through the gateway's
//! `[policy]` (TOML), `recover`'s flags, the npm options as the wasm module
//! reads them and a conformance vector's `policy` (JSON) must give the same
//! policy, for every knob of the policy table; and a spec with 0 where the
//! table refuses it must fail in each with the same words. The npm shell
//! and the Python package run the same file in their own suites
//! (`wasm/tests/node/policy.test.mjs`, `python/tests/test_policy.py`).

use std::ffi::OsString;
use std::fmt::Write as _;

use recovery_cli::args::{Command, parse};
use recovery_core::RecoveryPolicy;
use recovery_core::conformance::PolicySpec;
use recovery_core::policy::{FIELDS, Unit, Value, field};
use serde::Deserialize;
use serde_json::Map;

#[derive(Deserialize)]
struct Knobs {
    defaults: Map<String, serde_json::Value>,
    cases: Vec<Case>,
    refused: Vec<Refused>,
}

#[derive(Deserialize)]
struct Case {
    spec: Map<String, serde_json::Value>,
    policy: Map<String, serde_json::Value>,
}

#[derive(Deserialize)]
struct Refused {
    spec: Map<String, serde_json::Value>,
    error: String,
}

fn knobs() -> Knobs {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/conformance/policy/knobs.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A conformance vector's `policy`: the JSON as a vector holds it.
fn from_vector(spec: &Map<String, serde_json::Value>) -> Result<RecoveryPolicy, String> {
    let spec: PolicySpec = serde_json::from_value(serde_json::Value::Object(spec.clone()))
        .map_err(|e| e.to_string())?;
    spec.build().map_err(|e| e.to_string())
}

/// The gateway's `[policy]` table: each value written as TOML (the JSON
/// text of a number, a string, a bool or a flat array is TOML's too).
fn from_gateway(spec: &Map<String, serde_json::Value>) -> Result<RecoveryPolicy, String> {
    let mut text = String::from("[policy]\n");
    for (k, v) in spec {
        let _ = writeln!(text, "{k} = {v}");
    }
    recovery_gateway::config::from_toml(&text)
        .map(|c| c.policy)
        .map_err(|e| e.0)
}

/// `recover`'s flags: `--name-with-dashes value` as a shell would pass it
/// (a list comma-separated), a switch for `true`.
fn from_cli(spec: &Map<String, serde_json::Value>) -> Result<RecoveryPolicy, String> {
    let mut args: Vec<String> = vec!["--protocol".into(), "sse".into()];
    for (k, v) in spec {
        let f = field(k).unwrap_or_else(|| panic!("{k} is not a knob"));
        match v {
            serde_json::Value::Bool(true) => args.push(f.flag()),
            serde_json::Value::Array(items) => {
                let items: Vec<String> = items.iter().map(text).collect();
                args.extend([f.flag(), items.join(",")]);
            }
            v => args.extend([f.flag(), text(v)]),
        }
    }
    args.push("http://127.0.0.1:1/".into());
    match parse(args.iter().map(OsString::from)) {
        Ok(Command::Run(a)) => a.policy().map_err(|e| e.0),
        Ok(other) => panic!("{args:?}: {other:?}"),
        Err(e) => Err(e.0),
    }
}

/// The npm options as the shell hands them to the wasm module: one
/// `camelCaseName=value` line per option given.
fn from_npm_module(spec: &Map<String, serde_json::Value>) -> Result<String, String> {
    let mut lines = String::new();
    for (k, v) in spec {
        let f = field(k).unwrap_or_else(|| panic!("{k} is not a knob"));
        let value = match v {
            serde_json::Value::Array(items) => items.iter().map(text).collect::<Vec<_>>().join(","),
            v => text(v),
        };
        let _ = writeln!(lines, "{}={value}", f.camel_case());
    }
    let client = recovery_wasm::Client::new(&lines, &[], "", "");
    match client.error_text() {
        e if e.is_empty() => Ok(client.policy_text()),
        e => Err(e),
    }
}

/// A JSON scalar as `recover` takes it.
fn text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

/// The policy of `defaults` with `changes`, as the module's policy text.
fn module_text(policy: &RecoveryPolicy) -> String {
    let mut out = String::new();
    for (f, v) in PolicySpec::from_policy(policy).iter() {
        let _ = writeln!(out, "{}={v}", f.camel_case());
    }
    out
}

fn expected(
    defaults: &Map<String, serde_json::Value>,
    changes: &Map<String, serde_json::Value>,
) -> RecoveryPolicy {
    let mut all = defaults.clone();
    for (k, v) in changes {
        all.insert(k.clone(), v.clone());
    }
    from_vector(&all).unwrap()
}

/// Every case gives the same policy through the vector's JSON, the
/// gateway's TOML, `recover`'s flags and the npm module, and that policy
/// is the one the case says.
#[test]
fn one_spec_builds_one_policy_in_every_front_end() {
    let k = knobs();
    for case in &k.cases {
        let want = expected(&k.defaults, &case.policy);
        let label = serde_json::Value::Object(case.spec.clone());
        assert_eq!(
            from_vector(&case.spec).as_ref(),
            Ok(&want),
            "vector {label}"
        );
        assert_eq!(
            from_gateway(&case.spec).as_ref(),
            Ok(&want),
            "gateway {label}"
        );
        assert_eq!(from_cli(&case.spec).as_ref(), Ok(&want), "recover {label}");
        assert_eq!(
            from_npm_module(&case.spec),
            Ok(module_text(&want)),
            "npm {label}"
        );
    }
}

/// 0 where the table refuses it, and the builder's own refusals, fail in
/// every front end with the same words.
#[test]
fn a_refused_spec_fails_with_the_same_words_everywhere() {
    let k = knobs();
    for r in &k.refused {
        let label = serde_json::Value::Object(r.spec.clone());
        assert_eq!(from_vector(&r.spec), Err(r.error.clone()), "vector {label}");
        let gateway = from_gateway(&r.spec).unwrap_err();
        assert!(
            gateway == format!("policy.{}", r.error) || gateway == format!("[policy]: {}", r.error),
            "gateway {label}: {gateway}"
        );
        assert_eq!(
            from_cli(&r.spec),
            Err(format!("invalid policy: {}", r.error)),
            "recover {label}"
        );
        assert_eq!(
            from_npm_module(&r.spec),
            Err(r.error.clone()),
            "npm {label}"
        );
    }
}

/// The file covers the table: its defaults are the policy's, every knob
/// has a case that changes it, every bound a case that turns it off, and
/// every knob that refuses 0 a refused case; each case changes exactly
/// what it says.
#[test]
fn the_cases_cover_every_knob_of_the_table() {
    let k = knobs();
    let defaults = PolicySpec::from_policy(&RecoveryPolicy::default());
    assert_eq!(
        serde_json::to_value(&defaults).unwrap(),
        serde_json::Value::Object(k.defaults.clone())
    );
    for f in FIELDS {
        let changed = k
            .cases
            .iter()
            .any(|c| c.spec.contains_key(f.name) && c.policy.get(f.name) != k.defaults.get(f.name));
        assert!(changed, "no case changes {}", f.name);
        let off = k
            .cases
            .iter()
            .any(|c| c.spec.get(f.name) == Some(&"off".into()));
        assert_eq!(off, f.can_be_off, "{}: a case turns it off", f.name);
        let zero = k
            .refused
            .iter()
            .any(|r| r.spec.len() == 1 && r.spec.get(f.name) == Some(&0.into()));
        let takes_zero = matches!(f.unit, Unit::Ms | Unit::Count | Unit::Bytes) && !f.refuses_zero;
        assert_eq!(zero, f.refuses_zero, "{}: a case refuses 0", f.name);
        if takes_zero {
            let spec = PolicySpec::new().with(f.name, Value::Number(0)).unwrap();
            assert!(spec.build().is_ok(), "{} takes 0", f.name);
        }
    }
    let default = RecoveryPolicy::default();
    for case in &k.cases {
        let built = from_vector(&case.spec).unwrap();
        let spec = serde_json::to_value(PolicySpec::from_policy(&built)).unwrap();
        for (name, value) in spec.as_object().unwrap() {
            let said = case.policy.get(name).unwrap_or(&k.defaults[name]);
            assert_eq!(value, said, "{name} in {:?}", case.spec);
        }
        assert_eq!(built == default, case.policy.is_empty(), "{:?}", case.spec);
    }
}

/// README's table of the knobs is the policy table, row for row.
#[test]
fn the_readme_table_is_the_policy_table() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let start = readme.find("| knob | unit | default |").expect("the table");
    let rows: Vec<&str> = readme[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .collect();
    let table: Vec<String> = FIELDS
        .iter()
        .map(|f| {
            let off = if f.can_be_off { "yes" } else { "" };
            let zero = match f.unit {
                _ if f.refuses_zero => "refused",
                Unit::Ms | Unit::Count | Unit::Bytes => "allowed",
                Unit::Bool | Unit::List | Unit::Choice => "",
            };
            format!(
                "| `{}` | {} | {} | {off} | {zero} | {} |",
                f.name,
                f.unit.name(),
                f.default,
                f.doc()
            )
        })
        .collect();
    assert_eq!(rows, table);
}
