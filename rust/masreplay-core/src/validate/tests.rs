//! The fast path agrees with the Reader: on simulated traces broken at random (values swapped
//! for others of any type, keys dropped, added, repeated or escaped, bytes flipped), whatever
//! the fast path accepts the Reader accepts as the same trace, and what it declines gets the
//! Reader's verdict; whole documents come out as the Reader alone makes them.

use proptest::prelude::*;
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use serde_json::{Value, json};

use super::*;
use crate::sim::{SimConfig, generate};

/// JSON text spliced in where a mutation puts a value: every JSON type, numbers written in every
/// form (some out of range), ids and enum names that may or may not fit where they land.
#[rustfmt::skip]
const PALETTE: &[&str] = &[
    "null", "true", "false", "0", "-0", "-0.0", "1", "-1", "1.0", "1.5", "-2.5", "1e2", "1E-2", "0.1e1",
    "9007199254740993", "18446744073709551615", "18446744073709551616", "-9223372036854775809", "1e400",
    "8999999999999999.0", "\"\"", "\"x\"", "\"e0\"", "\"e1\"", "\"spawn\"", "\"temporal\"", "\"ablate\"",
    "\"centralized\"", "\"a\\u0000b\"", "[]", "{}", "[1]", "{\"a\": 1}", "{\"src\": \"e0\", \"dst\": \"e1\"}",
];

/// Keys a mutation may add: every key the Reader knows, and one it does not.
#[rustfmt::skip]
const KEYS: &[&str] = &[
    "trace_id", "task_id", "system", "topology", "events", "edges", "rewards", "costs", "metrics",
    "schema_version", "group_id", "policy_version", "counterfactual_of", "id", "t", "type", "agent", "role",
    "from", "to", "tool", "content_ref", "trusted", "reward", "tokens", "duration_s", "logprob", "src", "dst",
    "kind", "event_id", "wall_clock_s", "tool_calls", "messages", "note",
];

/// Marks a string that stands for raw JSON text from [`PALETTE`].
const RAW: &str = "\u{0}raw:";

fn raw(rng: &mut Xoshiro256PlusPlus) -> Value {
    Value::String(format!("{RAW}{}", PALETTE[rng.random_range(0..PALETTE.len())]))
}

/// A simulated trace as JSON, with the optional parts the simulator leaves out (mostly fit for
/// the mode, so that valid traces stay common).
fn base_trace(rng: &mut Xoshiro256PlusPlus, strict_seed: bool) -> Value {
    let config = SimConfig {
        n_traces: 1,
        agents: (1, rng.random_range(1..5)),
        depth: rng.random_range(1..3),
        fan_out: (1, 3),
        events_per_agent: (0, rng.random_range(0..4)),
        group_size: 1,
        seed: rng.random(),
    };
    let trace = generate(&config).expect("a valid config").remove(0);
    let seed_only = if rng.random_bool(0.9) { strict_seed } else { !strict_seed };
    let mut value = trace.to_json(seed_only);
    if !seed_only && rng.random_bool(0.3) {
        let event = trace.events[rng.random_range(0..trace.events.len())].id.clone();
        value["counterfactual_of"] = json!({"trace_id": "t0", "event_id": event, "kind": "ablate", "note": [1]});
    }
    if !seed_only && rng.random_bool(0.3) {
        value["annotator"] = json!({"name": "a", "scores": [1, 2.5]});
    }
    if rng.random_bool(0.3) {
        value["costs"]["gpu_s"] = json!(2.5);
    }
    let events = value["events"].as_array_mut().expect("events");
    let n = events.len();
    let event = &mut events[rng.random_range(0..n)];
    if rng.random_bool(0.3) {
        event["logprob"] = json!(-0.25);
        event["model"] = json!({"name": "m", "temperature": 0.7});
    }
    value
}

/// A step from a value to one of its children.
#[derive(Clone)]
enum Step {
    Key(String),
    Index(usize),
}

fn paths(value: &Value, prefix: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    out.push(prefix.clone());
    let children: Vec<(Step, &Value)> = match value {
        Value::Object(map) => map.iter().map(|(k, v)| (Step::Key(k.clone()), v)).collect(),
        Value::Array(items) => items.iter().enumerate().map(|(i, v)| (Step::Index(i), v)).collect(),
        _ => Vec::new(),
    };
    for (step, child) in children {
        prefix.push(step);
        paths(child, prefix, out);
        prefix.pop();
    }
}

fn at<'v>(value: &'v mut Value, path: &[Step]) -> &'v mut Value {
    path.iter().fold(value, |value, step| match step {
        Step::Key(key) => &mut value[key.as_str()],
        Step::Index(i) => &mut value[*i],
    })
}

/// Changes one node: replaced by palette text, removed, or given a new or renamed key.
fn mutate(value: &mut Value, rng: &mut Xoshiro256PlusPlus) {
    let mut all = Vec::new();
    paths(value, &mut Vec::new(), &mut all);
    let path = &all[rng.random_range(0..all.len())];
    let key = KEYS[rng.random_range(0..KEYS.len())];
    let new_value = raw(rng);
    let node = at(value, path);
    match (rng.random_range(0..4), node) {
        (0, Value::Object(map)) if !map.is_empty() => {
            let old = map.keys().nth(rng.random_range(0..map.len())).expect("a key").clone();
            if rng.random_bool(0.5) {
                map.shift_remove(&old);
            } else if let Some(moved) = map.shift_remove(&old) {
                map.insert(key.to_owned(), moved); // renamed
            }
        }
        (1, Value::Object(map)) => _ = map.insert(key.to_owned(), new_value),
        (2, Value::Array(items)) if !items.is_empty() => _ = items.remove(rng.random_range(0..items.len())),
        (_, node) => *node = new_value,
    }
}

/// Writes JSON text, sometimes escaping characters of strings and repeating a key of an
/// object (with its own value or another one). Returns whether a key was repeated.
fn write(value: &Value, out: &mut String, rng: &mut Xoshiro256PlusPlus, repeat_keys: bool) -> bool {
    let mut repeated = false;
    match value {
        Value::String(text) if text.starts_with(RAW) => out.push_str(&text[RAW.len()..]),
        Value::String(text) => write_string(text, out, rng),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(if rng.random_bool(0.1) { " ,\n " } else { "," });
                }
                repeated |= write(item, out, rng, repeat_keys);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            let mut entries: Vec<(&String, Value)> = map.iter().map(|(k, v)| (k, v.clone())).collect();
            if repeat_keys && !map.is_empty() && rng.random_bool(0.05) {
                let (key, old) = map.iter().nth(rng.random_range(0..map.len())).expect("an entry");
                let again = if rng.random_bool(0.5) { old.clone() } else { raw(rng) };
                entries.insert(rng.random_range(0..=entries.len()), (key, again));
                repeated = true;
            }
            for (i, (key, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(key, out, rng);
                out.push_str(if rng.random_bool(0.1) { " : " } else { ":" });
                repeated |= write(item, out, rng, repeat_keys);
            }
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
    repeated
}

fn write_string(text: &str, out: &mut String, rng: &mut Xoshiro256PlusPlus) {
    let plain = serde_json::to_string(text).expect("a string serialises");
    if rng.random_bool(0.05) {
        out.push('"');
        for unit in text.encode_utf16() {
            out.push_str(&format!("\\u{unit:04x}"));
        }
        out.push('"');
    } else {
        out.push_str(&plain);
    }
}

/// A broken byte: syntax errors, invalid UTF-8, control characters.
fn flip_byte(text: &mut Vec<u8>, rng: &mut Xoshiro256PlusPlus) {
    const BYTES: &[u8] = b"{}[]\",:\\ 0-ea\n\x01\xff";
    let position = rng.random_range(0..=text.len());
    let byte = BYTES[rng.random_range(0..BYTES.len())];
    match rng.random_range(0..3) {
        0 => text.insert(position, byte),
        1 if position < text.len() => _ = text.remove(position),
        _ if position < text.len() => text[position] = byte,
        _ => text.push(byte),
    }
}

/// A trace's JSON text, perhaps broken; and whether it is free of repeated keys.
fn trace_text(rng: &mut Xoshiro256PlusPlus, strict_seed: bool) -> (Vec<u8>, bool) {
    let mut value = base_trace(rng, strict_seed);
    for _ in 0..[0, 0, 0, 1, 1, 1, 1, 1, 2, 3][rng.random_range(0..10)] {
        mutate(&mut value, rng);
    }
    let mut text = String::new();
    let repeat_keys = rng.random_bool(0.3);
    let repeated = write(&value, &mut text, rng, repeat_keys);
    let mut bytes = text.into_bytes();
    let flipped = rng.random_bool(0.15);
    if flipped {
        flip_byte(&mut bytes, rng);
    }
    (bytes, !repeated && !flipped)
}

fn outcome(result: &Result<Trace, ValidationError>) -> String {
    format!("{result:?}") // Debug tells -0.0 from 0.0, and keeps the order of attributes
}

fn options(strict_seed: bool) -> ValidateOptions {
    ValidateOptions { strict_seed }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn the_fast_path_accepts_only_what_the_reader_accepts(seed in any::<u64>(), strict_seed in any::<bool>()) {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        let (text, no_repeated_keys) = trace_text(&mut rng, strict_seed);
        let shown = String::from_utf8_lossy(&text);
        let reader = serde_json::from_slice::<Value>(&text).map(|value| trace_from_json(&value, options(strict_seed)));
        match direct::read_trace(&text, options(strict_seed)) {
            Some(trace) => prop_assert_eq!(Some(outcome(&Ok(trace))), reader.as_ref().ok().map(outcome), "{}", shown),
            // Declining costs only speed, but a valid trace is declined only for a repeated key.
            None => prop_assert!(
                !(no_repeated_keys && matches!(reader, Ok(Ok(_)))),
                "the fast path declined a valid trace without repeated keys: {}", shown
            ),
        }
    }

    #[test]
    fn documents_come_out_as_the_reader_makes_them(seed in any::<u64>(), strict_seed in any::<bool>(), form in 0..4) {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        let texts: Vec<Vec<u8>> = (0..rng.random_range(1..5)).map(|_| trace_text(&mut rng, strict_seed).0).collect();
        let joined = |separator: &[u8]| texts.join(separator);
        let document = match form {
            0 => joined(b"\n"),
            1 => [b"[".as_slice(), &joined(b", "), b"]"].concat(),
            2 => [b" [\n".as_slice(), &joined(b",\n"), b"\n] "].concat(),
            _ => joined(b" "),
        };
        let options = options(strict_seed);
        let expected: Vec<Result<Trace, ValidationError>> = match json_lines(&document) {
            Some(lines) => lines
                .iter()
                .map(|&(number, line)| match serde_json::from_slice::<Value>(line) {
                    Ok(value) => trace_from_json(&value, options),
                    Err(error) => {
                        let mut error = syntax_error(line, &error);
                        error.reason = format!("line {number}: {}", error.reason);
                        Err(error)
                    }
                })
                .collect(),
            None => read_documents(&document, options).unwrap(),
        };
        let actual = parse_documents(&document, options).unwrap();
        prop_assert_eq!(
            actual.iter().map(outcome).collect::<Vec<_>>(),
            expected.iter().map(outcome).collect::<Vec<_>>(),
            "{}", String::from_utf8_lossy(&document)
        );
    }
}

/// Writes a JSON value onto a tape, as the Python bindings write a dict.
fn write_tape(value: &Value, tape: &mut tape::Tape) {
    match value {
        Value::Null => tape.null(),
        Value::Bool(flag) => tape.bool(*flag),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(n), _, _) => tape.int(n),
            (_, Some(n), _) => tape.uint(n),
            (_, _, n) => tape.float(n.expect("a finite number")),
        },
        Value::String(text) => tape.str(text),
        Value::Array(items) => {
            let open = tape.open_array();
            items.iter().for_each(|item| write_tape(item, tape));
            tape.close(open, items.len());
        }
        Value::Object(map) => {
            let open = tape.open_object();
            for (key, item) in map {
                tape.str(key);
                write_tape(item, tape);
            }
            tape.close(open, map.len());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// A document read from a tape (fast path, or the Reader on what it declines) gets the
    /// Reader's verdict on the same value, and reads back as the value written.
    #[test]
    fn a_tape_gets_the_readers_verdict(seed in any::<u64>(), strict_seed in any::<bool>()) {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        let values: Vec<Value> = (0..3)
            .filter_map(|_| serde_json::from_slice(&trace_text(&mut rng, strict_seed).0).ok())
            .collect();
        let mut tape = tape::Tape::new();
        let abandoned = tape.mark();
        write_tape(&json!({"written": [1, 2], "then": "truncated"}), &mut tape);
        tape.truncate(abandoned);
        let roots: Vec<usize> = values.iter().map(|value| { let root = tape.mark(); write_tape(value, &mut tape); root }).collect();
        for (value, root) in values.iter().zip(roots) {
            prop_assert_eq!(&Value::deserialize(tape.document(root)).expect("a JSON value"), value);
            let options = options(strict_seed);
            prop_assert_eq!(outcome(&trace_from_tape(&tape, root, options)), outcome(&trace_from_json(value, options)), "{}", value);
        }
    }
}

#[test]
fn repeated_keys_take_the_last_value_in_both_paths() {
    let text = br#"{"trace_id": "a", "task_id": "t", "trace_id": "b", "events": [{"id": "e0", "t": 0, "type": "spawn",
        "agent": "o", "agent": "p", "x": 1, "x": 2}], "edges": [], "rewards": {"r": 1, "r": 2}, "costs": {"tokens": 1,
        "wall_clock_s": 2}}"#;
    assert!(direct::read_trace(text, ValidateOptions::default()).is_none());
    let [Ok(trace)] = &parse_documents(text, ValidateOptions::default()).unwrap()[..] else {
        panic!("one valid trace")
    };
    assert_eq!((trace.trace_id.as_str(), trace.events[0].agent.as_str()), ("b", "p"));
    assert_eq!(trace.events[0].attributes.as_ref().map(|a| a["x"].clone()), Some(json!(2)));
    assert_eq!(trace.rewards, vec![("r".to_owned(), 2.0)]);
}

#[test]
fn one_nesting_limit_alone_and_inside_a_document() {
    // The trace, its events and an event take 3 levels: `deep` may take MAX_DEPTH - 3 more.
    let trace = |levels: usize| {
        let deep = format!("{}{}", "[".repeat(levels), "]".repeat(levels));
        format!(
            r#"{{"trace_id": "a", "task_id": "t", "events": [{{"id": "e0", "t": 0, "type": "spawn", "agent": "o",
            "deep": {deep}}}], "edges": [], "rewards": {{}}, "costs": {{"tokens": 1, "wall_clock_s": 2}}}}"#
        )
    };
    let deepest = trace(crate::validate::MAX_DEPTH - 3);
    let too_deep = trace(crate::validate::MAX_DEPTH - 2);
    for document in [deepest.clone(), format!("[{deepest}]")] {
        assert!(parse_documents(document.as_bytes(), ValidateOptions::default()).unwrap()[0].is_ok());
    }
    for document in [too_deep.clone(), format!("[{too_deep}]")] {
        let outcomes = parse_documents(document.as_bytes(), ValidateOptions::default()).unwrap();
        let error = outcomes[0].as_ref().unwrap_err();
        assert_eq!((error.trace_id.as_deref(), error.path.as_str()), (Some("a"), "/events/0/deep"));
        assert!(error.reason.contains("nests deeper than 100"), "{error:?}");
    }
    // Past serde_json's own limit the text is not read at all, and the error says why.
    let outcomes = parse_documents(trace(130).as_bytes(), ValidateOptions::default()).unwrap();
    assert!(outcomes[0].as_ref().unwrap_err().reason.contains("nests too deep"), "{outcomes:?}");
}

#[test]
fn any_thread_count_gives_the_same_batch() {
    let traces = generate(&SimConfig { n_traces: 40, ..SimConfig::default() }).expect("a valid config");
    let texts: Vec<String> = traces.iter().map(|trace| trace.to_json(false).to_string()).collect();
    for document in [texts.join("\n"), format!("[{}]", texts.join(","))] {
        let ingest = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a pool");
            pool.install(|| {
                let outcomes = parse_documents(document.as_bytes(), ValidateOptions::default()).unwrap();
                let traces: Vec<Trace> = outcomes.into_iter().collect::<Result<_, _>>().expect("valid traces");
                crate::store::batch_from_traces(&traces).expect("a batch")
            })
        };
        let one = ingest(1);
        assert_eq!(one.num_rows(), traces.len());
        assert_eq!(ingest(4), one);
    }
}
