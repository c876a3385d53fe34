//! The reading of foreign records (lines, Python's view of values) and the Claude Code
//! conversion on small sessions; the Python tests compare whole conversions with the sample.

use super::json::{Json, Keep, repr};
use super::{IN_MEMORY, Source, claude_code, json_lines};

fn error_of(text: &str) -> (Option<usize>, String) {
    let error = json_lines("f", text.as_bytes(), &Keep::All).expect_err("the text is refused");
    (error.line, error.reason)
}

#[test]
fn lines_are_numbered_and_blank_ones_skipped() {
    let records = json_lines("f", b"{\"a\": 1}\n \n\n{\"b\": NaN}\r\n", &Keep::All).expect("two records");
    assert_eq!(records.iter().map(|record| record.line).collect::<Vec<_>>(), [1, 4]);
    assert!(matches!(records[1].value.get("b"), Some(Json::Float(x)) if x.is_nan()));
    let bom = json_lines("f", b"\xef\xbb\xbf{\"a\": 1}", &Keep::All).expect("a BOM is skipped");
    assert!(matches!(bom[0].value.get("a"), Some(Json::Int(1))));
}

#[test]
fn broken_lines_are_named_in_pythons_words() {
    assert_eq!(error_of("{}\n[1, 2]\n"), (Some(2), "expected a JSON object, got list".into()));
    assert_eq!(error_of("\"x\""), (Some(1), "expected a JSON object, got str".into()));
    assert_eq!(error_of("null"), (Some(1), "expected a JSON object, got NoneType".into()));
    assert!(error_of("{}\n{\"a\": ").1.starts_with("not valid JSON ("));
    let error = json_lines("f", b"{}\n{\"a\": \"\xff\"}", &Keep::All).expect_err("not UTF-8");
    assert_eq!((error.line, error.reason.as_str()), (Some(2), "not UTF-8 text (byte 7: invalid start byte)"));
    let cut = json_lines("f", b"{\"a\": \"\xe2\x82", &Keep::All).expect_err("cut short");
    assert_eq!(cut.reason, "not UTF-8 text (byte 7: unexpected end of data)");
    let bad = json_lines("f", b"{\"a\": \"\xe2(\"}", &Keep::All).expect_err("a bad continuation");
    assert_eq!(bad.reason, "not UTF-8 text (byte 7: invalid continuation byte)");
}

#[test]
fn nesting_stops_where_python_stops_even_in_skipped_values() {
    let deep = |levels: usize| format!("{{\"skipped\": {}1{}}}", "[".repeat(levels), "]".repeat(levels));
    let keep_nothing = Keep::Fields(&[]);
    assert!(json_lines("f", deep(900).as_bytes(), &keep_nothing).is_ok());
    let error = json_lines("f", deep(2000).as_bytes(), &keep_nothing).expect_err("too deep");
    assert_eq!(error.reason, "JSON nested too deeply to read");
    let kept = json_lines("f", deep(2000).as_bytes(), &Keep::All).expect_err("too deep");
    assert_eq!(kept.reason, "JSON nested too deeply to read");
    // Beyond serde_json's own limit (128), as Python reads it.
    assert!(json_lines("f", deep(300).as_bytes(), &Keep::All).is_ok());
    // Brackets inside strings are text.
    let text = format!("{{\"a\": \"{}\"}}", "[".repeat(2000));
    assert!(json_lines("f", text.as_bytes(), &Keep::All).is_ok());
}

#[test]
fn only_the_kept_parts_are_read_and_a_repeated_key_keeps_its_last_value() {
    const KEEP: Keep = Keep::Fields(&[("a", Keep::All), ("b", Keep::Fields(&[("c", Keep::All)]))]);
    let records =
        json_lines("f", br#"{"a": 1, "x": [1, {"y": 2}], "b": {"c": 3, "d": 4}, "a": 5}"#, &KEEP).expect("read");
    let value = &records[0].value;
    assert!(value.get("x").is_none() && value.get("b").and_then(|b| b.get("d")).is_none());
    assert!(matches!(value.get("a"), Some(Json::Int(5))));
    let Json::Object(entries) = value else { panic!("an object") };
    assert_eq!(entries.iter().map(|(key, _)| key.as_ref()).collect::<Vec<_>>(), ["a", "b"]);
    assert!(records[0].whole().get("x").is_some());
}

#[test]
fn values_compare_and_print_as_python_does() {
    fn read(text: &'static str) -> Json<'static> {
        json_lines("f", text.as_bytes(), &Keep::All).expect("read").remove(0).value
    }
    assert!(read(r#"{"a": 1, "b": [true, 2.0]}"#).py_eq(&read(r#"{"b": [1, 2], "a": 1.0}"#)));
    assert!(!read(r#"{"a": 1}"#).py_eq(&read(r#"{"a": "1"}"#)));
    assert!(!read(r#"{"a": 1}"#).py_eq(&read(r#"{"a": 1, "b": null}"#)));
    assert_eq!(repr("a'b"), "\"a'b\"");
    assert_eq!(repr("a\"b'c\n"), "'a\"b\\'c\\n'");
    assert_eq!(repr("\u{1}é"), "'\\x01é'");
    assert!(!Json::Str("".into()).truthy() && Json::Float(f64::NAN).truthy() && !Json::Array(vec![]).truthy());
}

fn session(lines: &[&str]) -> Result<(crate::Trace, super::Report), Box<super::ConversionError>> {
    let text = lines.join("\n");
    let records = claude_code::read("s.jsonl", text.as_bytes())?;
    let sources = [Source { name: "s.jsonl".into(), label: "s.jsonl".into(), records }];
    claude_code::convert(&sources, &claude_code::Options::default())
}

const USER: &str = r#"{"type": "user", "uuid": "u1", "sessionId": "s", "timestamp": "2026-01-01T00:00:00Z", "message": {"content": "do it"}}"#;
const ASSISTANT: &str = r#"{"type": "assistant", "uuid": "a1", "parentUuid": "u1", "timestamp": "2026-01-01T00:00:01Z", "message": {"id": "m", "usage": {"input_tokens": 3, "output_tokens": 4}, "content": [{"type": "thinking", "thinking": "x"}, {"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}]}}"#;
const RESULT: &str = r#"{"type": "user", "uuid": "r1", "parentUuid": "a1", "timestamp": "2026-01-01T00:00:03Z", "message": {"content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": true}]}}"#;

#[test]
fn a_small_session_converts() {
    let (trace, report) =
        session(&[USER, ASSISTANT, RESULT, r#"{"type": "progress", "data": {"type": "hook_progress"}}"#])
            .expect("converts");
    let ids: Vec<&str> = trace.events.iter().map(|event| event.id.as_str()).collect();
    assert_eq!(ids, ["u1", "a1#0", "a1#1", "r1", "r1!error"]);
    assert_eq!(trace.events[1].tokens, Some(7));
    assert_eq!(trace.events[3].duration_s, Some(2.0));
    assert_eq!(trace.events[3].content_ref.as_deref(), Some("s.jsonl:3"));
    assert_eq!(trace.system.as_deref(), Some("claude-code"));
    let edges: Vec<(u32, u32, &str)> = trace.edges.iter().map(|e| (e.src, e.dst, e.edge_type.as_str())).collect();
    assert_eq!(edges, [(1, 2, "causal"), (0, 1, "causal"), (3, 4, "safety_flow"), (2, 3, "return")]);
    assert_eq!(report.records, 4);
    assert_eq!(report.ignored, [("progress hook_progress".to_owned(), 1)]);
}

#[test]
fn lines_that_lack_what_they_need_are_errors_naming_the_line() {
    let reason = |lines: &[&str]| session(lines).map(|_| ()).expect_err("refused").reason;
    let no_time = USER.replace(r#""timestamp": "2026-01-01T00:00:00Z", "#, "");
    assert_eq!(reason(&[&no_time]), "line without a timestamp");
    let bad_time = USER.replace("2026-01-01T00:00:00Z", "yesterday");
    assert_eq!(reason(&[&bad_time]), "timestamp 'yesterday' is not an ISO-8601 time");
    assert_eq!(reason(&[r#"{"uuid": "u"}"#]), "line without a string 'type'");
    assert_eq!(reason(&[r#"{"type": "user", "uuid": ["u"]}"#]), "uuid is a list, expected text");
    let conflict = USER.replace("do it", "other");
    let error = session(&[USER, &conflict]).map(|_| ()).expect_err("two lines, one uuid");
    assert_eq!(
        (error.line, error.reason.as_str()),
        (Some(2), "uuid 'u1' is already the uuid of s.jsonl:1, a different line")
    );
    let no_session = USER.replace(r#""sessionId": "s", "#, "");
    let error = session(&[&no_session]).map(|_| ()).expect_err("no session id");
    assert_eq!((error.source.as_str(), error.line), ("s.jsonl", None));
    let negative = ASSISTANT.replace(r#""input_tokens": 3"#, r#""input_tokens": -3"#);
    assert_eq!(reason(&[USER, &negative]), "message.usage.input_tokens is negative (-3)");
}

#[test]
fn repeated_lines_are_read_once_and_what_a_trace_cannot_hold_is_named() {
    let (trace, report) = session(&[USER, USER]).expect("converts");
    assert_eq!(trace.events.len(), 1);
    assert_eq!(report.ignored, [("line repeating an earlier line (same uuid and content)".to_owned(), 1)]);
    let failed = r#"{"type": "system", "subtype": "stop_hook_summary", "uuid": "h", "timestamp": "2026-01-01T00:00:02Z", "hookErrors": [NaN]}"#;
    let error = session(&[USER, failed]).map(|_| ()).expect_err("NaN");
    assert_eq!(error.reason, "converted trace 's' is invalid at /events/1/hook_errors/0: NaN is not a finite number");
    assert!(error.cause.is_some());
    assert_eq!(
        claude_code::convert(&[], &claude_code::Options::default()).map(|_| ()).expect_err("empty").source,
        IN_MEMORY
    );
}

#[test]
fn the_trace_built_directly_is_checked_as_its_json_would_be() {
    let reason = |lines: &[&str]| session(lines).map(|_| ()).expect_err("refused").reason;
    // Two counts of 2^63: their sum is past i64, as JSON a number that is no integer.
    let huge = ASSISTANT
        .replace(r#""input_tokens": 3"#, r#""input_tokens": 9223372036854775808"#)
        .replace(r#""output_tokens": 4"#, r#""output_tokens": 9223372036854775808"#);
    assert_eq!(
        reason(&[USER, &huge]),
        "converted trace 's' is invalid at /events/1/tokens: expected an integer, got the number 1.8446744073709552e+19"
    );
    let nameless = ASSISTANT.replace(r#""parentUuid": "u1","#, r#""parentUuid": "u1", "agentId": "","#);
    assert_eq!(
        reason(&[USER, &nameless]),
        "converted trace 's' is invalid at /events/1/agent: must be a non-empty string"
    );
    // A line whose uuid is another event's id.
    let twin = USER.replace(r#""uuid": "u1""#, r#""uuid": "a1#0""#);
    assert_eq!(
        reason(&[&twin, &ASSISTANT.replace(r#""parentUuid": "u1""#, r#""parentUuid": null"#)]),
        "converted trace 's' is invalid at /events/1/id: duplicate event id \"a1#0\" (first used by /events/0)"
    );
    let looped = USER.replace(r#""sessionId""#, r#""parentUuid": "a1", "sessionId""#);
    let cycle = reason(&[&looped, ASSISTANT]);
    assert!(cycle.starts_with("converted trace 's' is invalid at /edges/") && cycle.contains(": edges form a cycle"));
    let only_progress = r#"{"type": "progress", "sessionId": "s", "data": {"type": "hook_progress"}}"#;
    assert_eq!(reason(&[only_progress]), "converted trace 's' is invalid at /events: a trace needs at least one event");
    // A value no trace can hold is named before an event refused earlier in the trace.
    let failed = r#"{"type": "system", "subtype": "stop_hook_summary", "uuid": "h", "timestamp": "2026-01-01T00:00:02Z", "hookErrors": [NaN]}"#;
    assert_eq!(
        reason(&[USER, &nameless, failed]),
        "converted trace 's' is invalid at /events/3/hook_errors/0: NaN is not a finite number"
    );
}

#[test]
fn floats_print_as_python_prints_them() {
    // Expected values from Python 3.11's repr().
    let cases = [
        (1.0, "1.0"),
        (0.0001, "0.0001"),
        (1e-05, "1e-05"),
        (1e16, "1e+16"),
        (1.5e16, "1.5e+16"),
        (123.456, "123.456"),
        (-0.0, "-0.0"),
        (1e15, "1000000000000000.0"),
        (12345678901234567.0, "1.2345678901234568e+16"),
        (5e-324, "5e-324"),
        (0.1, "0.1"),
    ];
    for (x, expected) in cases {
        assert_eq!(super::json::float_repr(x), expected);
    }
}

#[test]
fn otel_spans_in_every_id_form_make_one_trace() {
    // The same chat span with its ids in hex, base64 (protobuf's JSON mapping) and 0x-hex.
    let otlp = br#"{"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": "AAAAAAAAAAAAAAAAAAAAAQ==", "spanId": "AAAAAAAAAAI=", "name": "chat",
         "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": 1700000001000000000,
         "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                        {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "7"}}],
         "links": [{}, {}]}]}]}]}"#;
    let document = super::otel::read("f", otlp).expect("one document");
    let (converted, report) = super::otel::convert("f", &document).expect("converts");
    let traces = converted.into_traces();
    assert_eq!(traces.len(), 1);
    assert_eq!(traces[0].trace_id, "00000000000000000000000000000001");
    assert_eq!(traces[0].events[0].id, "0000000000000002");
    assert_eq!(traces[0].events[0].tokens, Some(7));
    assert_eq!(report.ignored, [("span link".to_owned(), 2)]);
    let flat =
        br#"{"name": "chat", "context": {"trace_id": "0x01", "span_id": "0x02"}, "start_time": "2026-01-01T00:00:00Z",
        "end_time": "2026-01-01T00:00:01Z", "attributes": {"gen_ai.usage.input_tokens": -1}}"#;
    let document = super::otel::read("f", flat).expect("one document");
    let error = super::otel::convert("f", &document).expect_err("a negative token count");
    assert_eq!(error.reason, "/attributes/gen_ai.usage.input_tokens is -1, expected a whole number of tokens");
}

/// Fields of every kind a converter gives an event: text made or borrowed, values, floats
/// (one not finite), input values nested and escaped, nulls left out, and fields of the schema.
fn every_field<'r>(
    input: &'r Json<'r>,
    deep: &'r Json<'r>,
    unfit: bool,
) -> Vec<(&'static str, super::builder::Out<'r>)> {
    use super::builder::Out;
    let mut fields = vec![
        ("span_name", Out::Str("chat \"quoted\"\n\u{e9}\u{2028}")),
        ("role", Out::Text("worker".to_owned())),
        ("kind", Out::Text("invoke_agent".to_owned())),
        ("tool", Out::Str("search")),
        ("duration_s", Out::Float(1.5)),
        ("status_error", Out::Value(serde_json::Value::Bool(true))),
        ("tokens", Out::Value(serde_json::Value::from(12))),
        ("ratio", Out::Float(0.1)),
        ("span_attributes", Out::Raw(Some(input))),
        ("absent", Out::Raw(None)),
        ("null", Out::Json(Json::Null)),
        ("exceptions", Out::Json(Json::Array(vec![Json::Str("ValueError".into()), Json::UInt(u64::MAX)]))),
    ];
    if unfit {
        fields.push(("late", Out::Float(f64::NAN)));
        fields.push(("deep", Out::Raw(Some(deep))));
    }
    fields
}

#[test]
fn attributes_written_as_text_are_the_text_of_the_event_map() {
    use super::builder::{Builder, Head};
    use crate::trace::{EventType, Topology};
    let input = Json::Object(vec![
        ("k/~\"".into(), Json::Float(1e300)),
        ("list".into(), Json::Array(vec![Json::Bool(false), Json::Int(-3), Json::Null, Json::Float(0.5)])),
        ("map".into(), Json::Object(vec![("\u{1F600}".into(), Json::Str("x\ty".into()))])),
    ]);
    let mut deep = Json::Str("bottom".into());
    for _ in 0..crate::validate::MAX_DEPTH {
        deep = Json::Array(vec![deep]);
    }
    let head = || Head {
        task_id: "t",
        system: "s",
        topology: Topology::Hierarchical,
        wall_clock_s: 1.0,
        tokens: None,
        rewards: Vec::new(),
        metrics: None,
        attributes: serde_json::Map::new(),
    };
    for unfit in [false, true] {
        let (mut kept, mut written) = (Builder::new("tr"), Builder::writing_attributes("tr"));
        for builder in [&mut kept, &mut written] {
            builder.event("e0".to_owned(), 0.0, EventType::Message, "a", every_field(&input, &deep, unfit));
            builder.event(
                "e1".to_owned(),
                1.0,
                EventType::ToolCall,
                "a",
                vec![("tool", super::builder::Out::Str("t"))],
            );
            builder.event("e2".to_owned(), 2.0, EventType::Message, "a", every_field(&input, &deep, false));
        }
        let (kept, written) = (kept.build(head()), written.build_with_attributes(head()));
        if unfit {
            let error = kept.expect_err("a NaN and a value nested too deep");
            assert_eq!(error.path, "/events/0/late");
            assert_eq!(written.expect_err("the same error"), error);
            continue;
        }
        let (kept, (written, texts)) = (kept.expect("valid"), written.expect("valid"));
        let texts: Vec<Option<String>> = texts.texts().map(|text| text.map(str::to_owned)).collect();
        let expected: Vec<Option<String>> = kept
            .events
            .iter()
            .map(|event| event.attributes.as_ref().map(|map| serde_json::to_string(map).expect("json")))
            .collect();
        assert_eq!(texts, expected);
        assert!(texts[1].is_none() && texts[0].as_deref().is_some_and(|text| text.contains(r#"chat \"quoted\"\n"#)));
        let mut without = kept.clone();
        without.events.iter_mut().for_each(|event| event.attributes = None);
        assert_eq!(written, without);
    }
}

#[test]
fn event_fields_are_those_the_reader_sets() {
    use crate::trace::EventType;
    use serde_json::json;
    let valid = |key: &str| match key {
        "trusted" => json!(true),
        "reward" => json!({"r": 1.0}),
        "tokens" => json!(3),
        "duration_s" => json!(1.5),
        "logprob" => json!(-0.5),
        _ => json!("text"),
    };
    for key in
        ["role", "from", "to", "tool", "content_ref", "trusted", "reward", "tokens", "duration_s", "logprob", "kind"]
    {
        let event = crate::validate::event_from_parts(
            "t",
            0,
            ("e".to_owned(), 0.0, EventType::Message, "a"),
            vec![(key, valid(key))],
        )
        .expect("valid");
        assert_eq!(event.attributes.is_none(), crate::validate::is_event_field(key), "{key}");
    }
    let event = crate::validate::event_from_parts(
        "t",
        0,
        ("e".to_owned(), 0.0, EventType::Message, "a"),
        vec![("from", json!("moved"))],
    )
    .expect("valid");
    assert_eq!(event.from.as_deref(), Some("moved"));
}

/// Bytes with a quote, a backslash or a control character every few.
fn mixed_bytes() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
    use proptest::prelude::*;
    let byte = prop_oneof![1 => Just(b'"'), 1 => Just(b'\\'), 1 => 0u8..0x20, 12 => 0x20u8..=0xff];
    proptest::collection::vec(byte, 0..40)
}

proptest::proptest! {
    /// The word-at-a-time look for the bytes a JSON string holds only escaped finds the first
    /// of them, as a look at each byte does.
    #[test]
    fn the_first_byte_to_escape_is_found_as_byte_by_byte(bytes in mixed_bytes()) {
        let by_byte = bytes.iter().position(|&byte| matches!(byte, b'"' | b'\\' | 0..0x20));
        proptest::prop_assert_eq!(super::json::first_special(&bytes), by_byte);
    }

    /// Text is written as serde_json writes it, escapes and all.
    #[test]
    fn strings_are_written_as_serde_json_writes_them(text in "[\"\\\\\\x00-\\x1f\\x7f a-z\u{e9}\u{2603}\u{1F600}]{0,24}") {
        let mut written = Vec::new();
        super::json::write_str(&mut written, &text);
        proptest::prop_assert_eq!(written, serde_json::to_vec(&text).expect("text"));
    }
}
