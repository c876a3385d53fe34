use super::*;

/// The characters for which Python 3.11's `str.isspace()` is true (what `\s` matches in `re`),
/// listed from Python: `[c for c in range(0x110000) if chr(c).isspace()]`.
const PYTHON_SPACE: [u32; 29] = [
    0x9, 0xa, 0xb, 0xc, 0xd, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x85, 0xa0, 0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004,
    0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000,
];

#[test]
fn space_is_pythons_not_rusts() {
    for c in (0..=0x10ffff).filter_map(char::from_u32) {
        assert_eq!(python_space(c), PYTHON_SPACE.contains(&(c as u32)), "U+{:04X}", c as u32);
    }
    // The four separators Rust's char::is_whitespace leaves out.
    assert!(!'\u{1c}'.is_whitespace() && python_space('\u{1c}'));
}

fn turns(text: &str) -> (&str, Vec<(&str, &str)>) {
    speaker_turns(text)
}

#[test]
fn speaker_lines_split_as_python_re_does() {
    let text = "In Session 1\nFrom agent1 to agent2: hi\nmore\nFrom agent2 to agent1: yes";
    assert_eq!(turns(text), ("In Session 1\n", vec![("agent1", "agent2"), ("agent2", "agent1")]));
    // `^` is the text's start or just after "\n" (a "\r" starts no line); not in mid-line.
    assert_eq!(turns("\rFrom a to b: hi").1, vec![]);
    assert_eq!(turns("x\r\nFrom a to b: hi"), ("x\r\n", vec![("a", "b")]));
    assert_eq!(turns("From a to b: From c to d: hi").1, vec![("a", "b")]);
    // The receiver is the shortest run before ": ", so it may hold colons.
    assert_eq!(turns("From a to b:c: hi").1, vec![("a", "b:c")]);
    assert_eq!(turns("From a to b::  hi").1, vec![("a", "b:")]);
    // Exactly one space after the colon and around "to"; no empty names.
    for text in
        ["From a to b:\thi", "From a to b:", "From a  to b: hi", "From  a to b: hi", "From a to : hi", "From a to b :"]
    {
        assert_eq!(turns(text), (text, vec![]), "{text:?}");
    }
    // U+001C..U+001F end a name in Python (Rust's is_whitespace would read "a\u{1c}b" as one).
    assert_eq!(turns("From a\u{1c}b to c: hi").1, vec![]);
    assert_eq!(turns("From a to b\u{1f}: hi").1, vec![]);
    assert_eq!(turns("From a to b\u{a0}: hi").1, vec![]);
    assert_eq!(turns("From é to ü✓: hi\nFrom ü✓ to é: ok").1, vec![("é", "ü✓"), ("ü✓", "é")]);
}

#[test]
fn session_header_as_python_re_matches_it() {
    for header in ["", " \n\t", "In Session 69404dce \n", "\u{1c}In Session x\u{1f}", "  In Session a:b"] {
        assert!(is_session_header(header), "{header:?}");
    }
    for other in ["hello", "In Session ", "In Session  x", "In Session x y", "In session x", "x\nIn Session y"] {
        assert!(!is_session_header(other), "{other:?}");
    }
}

#[test]
fn task_ids_are_sha256_prefixes() {
    // Expected values from Python: "marble-" + hashlib.sha256(task.encode()).hexdigest()[:16].
    assert_eq!(task_id(""), "marble-e3b0c44298fc1c14");
    assert_eq!(task_id("t"), "marble-e3b98a4da31a127d");
    assert_eq!(task_id("é✓ task\n"), "marble-14e515c346822ad3");
}

#[test]
fn stems_are_python_splitext() {
    for (file, stem_) in [
        ("a.jsonl", "a"),
        ("a.b.jsonl", "a.b"),
        (".jsonl", ".jsonl"),
        ("..x", "..x"),
        ("a.", "a"),
        ("<object>", "<object>"),
    ] {
        assert_eq!(stem(file), stem_, "{file}");
    }
}

#[test]
fn integer_means_are_rounded_once() {
    // Expected values from Python (`a / b` of ints is correctly rounded); dividing the
    // integers' floats instead gives the neighbouring float for each of these.
    let cases: [(i128, u64, f64); 4] = [
        (531_699_034_997_011_043_707, 5, 1.063398069994022e20),
        (477_031_035_475_977_380_300, 5, 9.540620709519548e19),
        (428_619_458_515_189_932_463, 6, 7.143657641919832e19),
        (-531_699_034_997_011_043_707, 5, -1.063398069994022e20),
    ];
    for (a, b, expected) in cases {
        assert_eq!(ratio(a, b), expected, "{a} / {b}");
        assert_ne!(a as f64 / b as f64, expected, "{a} / {b} needs the exact division");
    }
    assert_eq!(ratio(7, 2), 3.5);
    assert_eq!(ratio(0, 3), 0.0);
}

#[test]
fn score_means_add_as_python_sum() {
    let mean_of = |values: &[Json<'_>]| mean(&values.iter().collect::<Vec<_>>());
    // Integers add exactly: (2^53 + 2) / 3, where float additions would lose the ones.
    assert_eq!(mean_of(&[Json::Int(1 << 53), Json::Int(1), Json::Int(1)]), 3002399751580331.5);
    // Floats add left to right (Python 3.11's sum).
    assert_eq!(mean_of(&[Json::Float(0.1), Json::Float(0.2), Json::Float(0.3)]), (0.1 + 0.2 + 0.3) / 3.0);
    // The integers before the first float are one exact total; those after it are added to a
    // float (values from Python's sum([2**53, 1, 1, 0.0]) / 4 and sum([2**53, 1, 0.0, 1]) / 4).
    assert_eq!(mean_of(&[Json::Int(1 << 53), Json::Int(1), Json::Int(1), Json::Float(0.0)]), 2251799813685248.5);
    assert_eq!(mean_of(&[Json::Int(1 << 53), Json::Int(1), Json::Float(0.0), Json::Int(1)]), 2251799813685248.0);
    assert_eq!(mean_of(&[Json::UInt(u64::MAX), Json::UInt(u64::MAX)]), u64::MAX as f64);
    assert_eq!(mean_of(&[Json::Float(1e308), Json::Float(1e308)]), f64::INFINITY);
}

fn convert_text(text: &str) -> Result<(Vec<Trace>, Report), Box<ConversionError>> {
    let records = read("runs.jsonl", text.as_bytes()).map_err(Box::new)?;
    convert(&Source { name: "logs/runs.jsonl".to_owned(), label: "runs.jsonl".to_owned(), records })
}

#[test]
fn an_episode_becomes_a_trace() {
    let episode = r#"{"task": "t", "coordination_mode": "tree", "extra": {"skipped": [1, 2]}, "extra": 1,
        "iterations": [{"iteration": 1, "task_assignments": {"a1": "long text", "a2": "x"}, "note": "?",
            "communications": ["In Session s\nFrom a1 to a2: hi\nFrom a2 to a1: ok", "chat"],
            "task_results": [{"agent_id": "a1", "result": "r"}, {"a2": "r2", "a3": "r3"}],
            "summary": "s", "continue_simulation": false}],
        "planning_scores": [4, -1, 5.0], "communication_scores": [-1.0],
        "task_evaluation": {"x": 3, "y": -1, "z": "n/a"}, "code_quality": 2,
        "agent_kpis": {"a2": 2, "a9": 1}, "total_milestones": 3, "token_usage": 12}"#
        .replace('\n', " ");
    let (traces, report) = convert_text(&episode).expect("converts");
    let trace = &traces[0];
    assert_eq!((trace.trace_id.as_str(), trace.task_id.as_str()), ("runs:1", "marble-e3b98a4da31a127d"));
    assert_eq!(trace.topology, Some(Topology::Hierarchical));
    let events: Vec<(&str, EventType, &str, Option<&str>)> = trace
        .events
        .iter()
        .map(|event| (event.id.as_str(), event.event_type, event.agent.as_str(), event.to.as_deref()))
        .collect();
    assert_eq!(
        events,
        [
            ("e0", EventType::OrchestratorDecision, "planner", None),
            ("e1", EventType::Message, "planner", Some("a1")),
            ("e2", EventType::Message, "planner", Some("a2")),
            ("e3", EventType::Message, "a1", Some("a2")),
            ("e4", EventType::Message, "a2", Some("a1")),
            ("e5", EventType::Return, "a1", Some("planner")),
            ("e6", EventType::Return, "a2", Some("planner")),
            ("e7", EventType::Return, "a3", Some("planner")),
            ("e8", EventType::Aggregate, "planner", None),
        ]
    );
    assert_eq!(trace.events[6].content_ref.as_deref(), Some("runs.jsonl:1#/iterations/0/task_results/1/a2"));
    assert_eq!(trace.events[3].content_ref.as_deref(), Some("runs.jsonl:1#/iterations/0/communications/0/0"));
    assert_eq!(trace.events[6].reward, Some(vec![("milestones".to_owned(), 2.0)]));
    let edges: Vec<(u32, u32, EdgeType)> =
        trace.edges.iter().map(|edge| (edge.src, edge.dst, edge.edge_type)).collect();
    assert_eq!(
        edges,
        [
            (0, 1, EdgeType::Causal),
            (0, 2, EdgeType::Causal),
            (1, 3, EdgeType::Causal),
            (2, 3, EdgeType::Causal),
            (3, 4, EdgeType::Causal),
            (4, 5, EdgeType::Causal),
            (4, 6, EdgeType::Causal),
            (5, 8, EdgeType::Aggregate),
            (6, 8, EdgeType::Aggregate),
            (7, 8, EdgeType::Aggregate),
        ]
    );
    let rewards: Vec<(&str, f64)> = trace.rewards.iter().map(|(name, value)| (name.as_str(), *value)).collect();
    assert_eq!(
        rewards,
        [
            ("planning", 4.5),
            ("task_evaluation.x", 3.0),
            ("code_quality", 2.0),
            ("milestones.a2", 2.0),
            ("milestones.a9", 1.0)
        ]
    );
    assert_eq!(trace.metrics, Some(vec![("total_milestones".to_owned(), 3.0)]));
    assert_eq!(trace.costs.tokens, 12.0);
    let attributes = trace.attributes.as_ref().expect("attributes");
    assert_eq!(attributes.keys().collect::<Vec<_>>(), ["coordination_mode", "missing_scores"]);
    assert_eq!(
        attributes["missing_scores"],
        json!(["planning_scores/1", "communication_scores/0", "task_evaluation.y"])
    );
    let unknown: Vec<(&str, usize)> = report.unknown.iter().map(|(name, count)| (name.as_str(), *count)).collect();
    assert_eq!(
        unknown,
        [("episode key extra", 1), ("iteration key note", 1), ("communication text outside 'From A to B:' lines", 1)]
    );
}

#[test]
fn errors_name_the_line_and_the_place() {
    let ok = r#"{"task": "t", "iterations": [{"task_assignments": {"a": "x"}}]}"#;
    let cases = [
        (r#"{"task": 1, "iterations": []}"#, "a MARBLE episode needs 'task' (text) and 'iterations' (a list)"),
        (r#"{"task": "t", "iterations": [3]}"#, "/iterations/0 is not an object"),
        (
            r#"{"task": "t", "iterations": [{"task_assignments": []}]}"#,
            "/iterations/0/task_assignments is a list, expected an object",
        ),
        (
            r#"{"task": "t", "iterations": [{"task_assignments": {"": 1}}]}"#,
            "/iterations/0/task_assignments has a key that is not an agent name: ''",
        ),
        (r#"{"task": "t", "iterations": [{"communications": [1]}]}"#, "/iterations/0/communications/0 is not text"),
        (
            r#"{"task": "t", "iterations": [{"task_results": [{}]}]}"#,
            "/iterations/0/task_results/0 is empty: it names no agent",
        ),
        (
            r#"{"task": "t", "iterations": [{"task_results": [{"agent_id": null}]}]}"#,
            "/iterations/0/task_results/0/agent_id is null, expected an agent name",
        ),
        (
            r#"{"task": "t", "iterations": [{"task_results": [{"a": 1, "": 2}]}]}"#,
            "/iterations/0/task_results/0 has a key that is not an agent name: ''",
        ),
        (
            r#"{"task": "t", "iterations": [{}], "planning_scores": [1, true]}"#,
            "/planning_scores/1 is a boolean, expected a finite number",
        ),
        (
            r#"{"task": "t", "iterations": [{}], "communication_scores": {}}"#,
            "/communication_scores is an object, expected a list",
        ),
        (
            r#"{"task": "t", "iterations": [{}], "agent_kpis": {"a/b": NaN}}"#,
            "/agent_kpis/a/b is a number, expected a finite number",
        ),
        (
            r#"{"task": "t", "iterations": [{}], "token_usage": "many"}"#,
            "/token_usage is text, expected a finite number",
        ),
        (r#"{"task": "t", "iterations": []}"#, "an episode without iterations has no events"),
    ];
    for (line, reason) in cases {
        let error = convert_text(&format!("{ok}\n\n{line}\n")).expect_err(line);
        assert_eq!((error.source.as_str(), error.line, error.reason.as_str()), ("logs/runs.jsonl", Some(3), reason));
    }
}

#[test]
fn a_trace_the_contract_refuses_comes_after_an_unreadable_episode() {
    let refused = r#"{"task": "t", "token_usage": -5, "iterations": [{}]}"#;
    let error = convert_text(&format!("{refused}\n{{\"task\": 2}}\n")).expect_err("unreadable");
    assert_eq!(error.line, Some(2));
    let error = convert_text(&format!("{refused}\n")).expect_err("refused");
    assert_eq!(
        (error.line, error.reason.as_str()),
        (Some(1), "converted trace 'runs:1' is invalid at /costs/tokens: -5 is negative; it must be >= 0")
    );
    assert!(error.cause.is_some());
    // A mean past the largest float is named before the events' problems come up.
    let error = convert_text(r#"{"task": "t", "iterations": [{"iteration": NaN}], "planning_scores": [1e308, 1e308]}"#)
        .expect_err("not finite");
    assert_eq!(error.reason, "converted trace 'runs:1' is invalid at /events/0/iteration: NaN is not a finite number");
    let error =
        convert_text(r#"{"task": "t", "iterations": [{}], "planning_scores": [1e308, 1e308]}"#).expect_err("inf");
    assert_eq!(error.reason, "converted trace 'runs:1' is invalid at /rewards/planning: inf is not a finite number");
}
