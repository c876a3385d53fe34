//! Every class of bad input is rejected with the right JSON pointer; good input round-trips.

use masreplay_core::validate::{ValidateOptions, parse_documents, trace_from_json};
use masreplay_core::{TraceBatch, ValidationError};
use serde_json::{Value, json};

fn seed_example() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../python/masreplay/data/seed_example_trace.json");
    let text = std::fs::read_to_string(path).expect("the bundled seed example");
    serde_json::from_str(&text).unwrap()
}

/// JSON with every number as f64, so `1` and `1.0` compare equal (the model stores f64).
fn normalized(value: &Value) -> Value {
    match value {
        Value::Number(n) => json!(n.as_f64().unwrap()),
        Value::Array(items) => Value::Array(items.iter().map(normalized).collect()),
        Value::Object(map) => Value::Object(map.iter().map(|(k, v)| (k.clone(), normalized(v))).collect()),
        other => other.clone(),
    }
}

fn error_of(trace: &Value, strict_seed: bool) -> ValidationError {
    trace_from_json(trace, ValidateOptions { strict_seed }).expect_err("the trace must be rejected")
}

fn assert_rejected(mutate: impl FnOnce(&mut Value), path: &str, reason_part: &str) {
    let mut trace = seed_example();
    mutate(&mut trace);
    let error = error_of(&trace, false);
    assert_eq!(error.path, path, "{error}");
    assert!(error.reason.contains(reason_part), "{error:?} should mention {reason_part:?}");
    assert_eq!(error.trace_id.as_deref(), Some("demo-trace-001"));
}

#[test]
fn the_seed_example_validates_and_round_trips() {
    let trace = trace_from_json(&seed_example(), ValidateOptions { strict_seed: true }).unwrap();
    assert_eq!(normalized(&trace.to_json(true)), normalized(&seed_example()));
    let batch = TraceBatch::from_traces(std::slice::from_ref(&trace)).unwrap();
    assert_eq!(batch.trace(0).unwrap(), trace);
}

#[test]
fn required_fields() {
    for key in ["trace_id", "task_id", "events", "edges", "rewards", "costs"] {
        let mut trace = seed_example();
        trace.as_object_mut().unwrap().remove(key);
        let error = error_of(&trace, false);
        assert_eq!(error.path, format!("/{key}"));
        assert!(error.reason.contains("missing required field"), "{error}");
    }
    assert_rejected(
        |t| {
            t["events"][2].as_object_mut().unwrap().remove("agent");
        },
        "/events/2/agent",
        "missing",
    );
    assert_rejected(
        |t| {
            t["costs"].as_object_mut().unwrap().remove("wall_clock_s");
        },
        "/costs/wall_clock_s",
        "missing",
    );
    assert_rejected(
        |t| {
            t["edges"][1].as_object_mut().unwrap().remove("type");
        },
        "/edges/1/type",
        "missing",
    );
}

#[test]
fn enums() {
    assert_rejected(|t| t["events"][3]["type"] = json!("telepathy"), "/events/3/type", "unknown value \"telepathy\"");
    assert_rejected(|t| t["edges"][0]["type"] = json!("wormhole"), "/edges/0/type", "wormhole");
    assert_rejected(|t| t["topology"] = json!("star"), "/topology", "expected one of");
}

#[test]
fn value_types() {
    assert_rejected(|t| t["events"][0]["t"] = json!("0"), "/events/0/t", "expected a number");
    assert_rejected(|t| t["events"][4]["trusted"] = json!("yes"), "/events/4/trusted", "boolean");
    assert_rejected(|t| t["events"][1]["role"] = json!(7), "/events/1/role", "expected a string");
    assert_rejected(|t| t["events"] = json!({}), "/events", "expected an array");
    assert_rejected(|t| t["events"] = json!([]), "/events", "at least one event");
    assert_rejected(|t| t["events"][0] = json!(3), "/events/0", "expected an object");
    assert_rejected(|t| t["rewards"]["team"] = json!("high"), "/rewards/team", "expected a number");
    assert_rejected(|t| t["metrics"]["a/b"] = json!(null), "/metrics/a~1b", "expected a number");
    assert_rejected(|t| t["events"][0]["tokens"] = json!(1.5), "/events/0/tokens", "integer");
    assert_rejected(|t| t["events"][0]["logprob"] = json!(0.5), "/events/0/logprob", "positive");
}

#[test]
fn an_unreadable_trace_id_is_reported_as_unknown() {
    let mut trace = seed_example();
    trace["trace_id"] = json!("");
    let error = error_of(&trace, false);
    assert_eq!((error.trace_id, error.path.as_str()), (None, "/trace_id"));
    assert!(error.reason.contains("non-empty"));
}

#[test]
fn negative_numbers() {
    assert_rejected(|t| t["events"][5]["t"] = json!(-1), "/events/5/t", "negative");
    assert_rejected(|t| t["costs"]["tokens"] = json!(-3), "/costs/tokens", "negative");
    assert_rejected(|t| t["costs"]["gpu_s"] = json!(-0.5), "/costs/gpu_s", "negative");
    assert_rejected(|t| t["events"][0]["duration_s"] = json!(-0.5), "/events/0/duration_s", "negative");
}

#[test]
fn event_identity_and_edges() {
    assert_rejected(|t| t["events"][6]["id"] = json!("e2"), "/events/6/id", "duplicate event id \"e2\"");
    assert_rejected(|t| t["edges"][2]["dst"] = json!("e99"), "/edges/2/dst", "\"e99\"");
    assert_rejected(|t| t["edges"][2]["dst"] = json!("e2"), "/edges/2", "self-loop");
    assert_rejected(|t| t["edges"][0]["weight"] = json!(1), "/edges/0/weight", "unknown edge key");
}

#[test]
fn cycles_name_their_events() {
    let mut trace = seed_example();
    trace["edges"].as_array_mut().unwrap().push(json!({"src": "e8", "dst": "e4", "type": "causal"}));
    let error = error_of(&trace, false);
    assert!(error.path.starts_with("/edges/"), "{error}");
    assert!(
        error.reason.contains("cycle") && error.reason.contains("\"e4\"") && error.reason.contains("\"e8\""),
        "{error}"
    );
}

#[test]
fn strict_seed_mode_rejects_top_level_additions() {
    let mut trace = seed_example();
    trace["group_id"] = json!("g1");
    let error = error_of(&trace, true);
    assert_eq!(error.path, "/group_id");
    assert!(trace_from_json(&trace, ValidateOptions::default()).is_ok());
    trace["my_note"] = json!({"x": [1, 2]});
    let kept = trace_from_json(&trace, ValidateOptions::default()).unwrap();
    assert_eq!(kept.to_json(false)["my_note"], json!({"x": [1, 2]}));
    assert!(kept.to_json(true).get("my_note").is_none());
}

#[test]
fn masreplay_additions_round_trip() {
    let mut trace = seed_example();
    trace["schema_version"] = json!(1);
    trace["group_id"] = json!("group-7");
    trace["policy_version"] = json!(12);
    trace["counterfactual_of"] = json!({"trace_id": "t0", "event_id": "e2", "kind": "no_spawn"});
    trace["events"][0]["reward"] = json!({"process": 0.25});
    trace["events"][0]["tokens"] = json!(321);
    trace["events"][0]["duration_s"] = json!(1.5);
    trace["events"][0]["logprob"] = json!(-0.7);
    trace["events"][0]["model"] = json!({"name": "m", "temperature": 0.7});
    let parsed = trace_from_json(&trace, ValidateOptions::default()).unwrap();
    assert_eq!(normalized(&parsed.to_json(false)), normalized(&trace));
    let batch = TraceBatch::from_traces(std::slice::from_ref(&parsed)).unwrap();
    assert_eq!(normalized(&batch.trace(0).unwrap().to_json(false)), normalized(&trace));
    assert_rejected(
        |t| t["counterfactual_of"] = json!({"trace_id": "t0", "event_id": "e2", "kind": "maybe"}),
        "/counterfactual_of/kind",
        "maybe",
    );
    assert_rejected(|t| t["schema_version"] = json!(99), "/schema_version", "unsupported");
}

#[test]
fn documents_syntax_and_encoding() {
    let outcomes = parse_documents(b"{\"trace_id\": ", ValidateOptions::default()).unwrap();
    assert!(outcomes[0].as_ref().unwrap_err().reason.contains("invalid JSON"));
    let outcomes = parse_documents(b"\"\xff\xfe\"", ValidateOptions::default()).unwrap();
    assert!(outcomes[0].as_ref().unwrap_err().reason.contains("UTF-8"), "{:?}", outcomes[0]);
    let outcomes = parse_documents(b"[1, 2]", ValidateOptions::default()).unwrap();
    assert!(outcomes.iter().all(|o| o.as_ref().unwrap_err().reason.contains("JSON object")));
    let outcomes = parse_documents(b"   ", ValidateOptions::default()).unwrap();
    assert!(outcomes[0].is_err());
    let outcomes = parse_documents(b"{\"rewards\": {\"team\": NaN}}", ValidateOptions::default()).unwrap();
    assert!(outcomes[0].as_ref().unwrap_err().reason.contains("NaN"));
}

#[test]
fn json_lines_keep_going_after_a_bad_line() {
    let good = seed_example().to_string();
    let mut other = seed_example();
    other["trace_id"] = json!("second");
    let text = format!("{good}\n{{\"trace_id\": \"x\", oops}}\n{other}\n");
    let outcomes = parse_documents(text.as_bytes(), ValidateOptions::default()).unwrap();
    assert_eq!(outcomes.len(), 3);
    assert!(outcomes[0].is_ok() && outcomes[2].is_ok());
    assert!(outcomes[1].as_ref().unwrap_err().reason.starts_with("line 2:"));
}
