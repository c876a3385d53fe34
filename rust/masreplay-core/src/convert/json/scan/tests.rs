//! The fast reader against serde_json's guided read (`convert::read`, what it stands in for):
//! where it answers, the same value; where serde_json refuses a text, no answer. Inputs: the
//! MARBLE samples, and the same lines and small documents broken at random.

use proptest::prelude::*;

use super::*;

/// What MARBLE's converter keeps of an episode, in the same shape (named fields, other keys
/// counted, items, fields skipped).
const GUIDE: Keep = Keep::Keys(&[
    ("task", Keep::All),
    ("iterations", Keep::Items(&Keep::Keys(&[("task_results", Keep::Items(&Keep::Keys(&[("agent_id", Keep::All)])))]))),
    ("scores", Keep::All),
    ("a", Keep::Fields(&[("b", Keep::All)])),
]);
const KEEPS: [&Keep; 3] = [&Keep::All, &GUIDE, &Keep::Fields(&[])];

/// The fast answer for `text`, checked against serde_json's: `Ok(true)` when it read the
/// text (to the same value), `Ok(false)` when it left it to serde_json.
fn agrees(text: &str, keep: &Keep) -> Result<bool, String> {
    match (read(text, keep), crate::convert::read(text, keep)) {
        (None, _) => Ok(false),
        (Some(fast), Ok(slow)) if format!("{fast:?}") == format!("{slow:?}") => Ok(true),
        (Some(fast), slow) => Err(format!("{text:?}: fast {fast:?}, serde_json {slow:?}")),
    }
}

fn sample_lines() -> &'static [String] {
    static LINES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    LINES.get_or_init(read_samples)
}

fn read_samples() -> Vec<String> {
    let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/marble");
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(folder).expect("the MARBLE samples") {
        let path = entry.expect("a sample").path();
        if path.extension().is_some_and(|extension| extension == "jsonl") {
            let text = std::fs::read_to_string(&path).expect("UTF-8 lines");
            lines.extend(text.lines().filter(|line| !line.trim().is_empty()).map(str::to_owned));
        }
    }
    assert!(lines.len() >= 20, "the samples' episodes");
    lines
}

#[test]
fn the_samples_are_read_fast_to_what_serde_json_reads() {
    for line in sample_lines() {
        for keep in KEEPS {
            assert_eq!(agrees(line, keep), Ok(true));
        }
    }
}

#[test]
fn what_serde_json_refuses_is_left_to_it() {
    let refused = [
        r#"{"a": "x\qy"}"#,
        r#"{"a": "\u12G4"}"#,
        r#"{"a": "\u123"}"#,
        "{\"a\": \"tab\there\"}",
        "{\"a\":\t1}",
        r#"{"a": 1,}"#,
        r#"{"a": [1, 2,]}"#,
        r#"{"a": [1 2]}"#,
        r#"{"a" 1}"#,
        r#"{"a": 01}"#,
        r#"{"a": 1.}"#,
        r#"{"a": .5}"#,
        r#"{"a": 1e}"#,
        r#"{"a": -}"#,
        r#"{"a": tru}"#,
        r#"{"a": nulls}"#,
        r#"{"a": NaN}"#,
        r#"{"a": -Infinity}"#,
        r#"{"a": "x"} x"#,
        r#"{"a": "x"}}"#,
        r#"{"a": ["x"}"#,
        r#"{"a": {"b": 1]}"#,
        r#"{"a": "x\"}"#,
        r#"{"a": \"x"}"#,
        r#"{1: 2}"#,
        r#"{"a": "x"#,
        "",
    ];
    for text in refused {
        for keep in KEEPS {
            assert_eq!(agrees(text, keep), Ok(false), "{text:?}");
        }
    }
    // Out of a float's range, or a lone surrogate: serde_json's error where it reads the
    // value, none where it skips it.
    assert_eq!(agrees(r#"{"z": 1e400, "a": {"b": 1e400}}"#, &GUIDE), Ok(false));
    assert_eq!(agrees(r#"{"z": 1e400, "a": {"c": 1e400}}"#, &GUIDE), Ok(true));
    assert_eq!(agrees(r#"{"z": "\ud800", "a": {"b": "\ud83d\ude00"}}"#, &GUIDE), Ok(true));
    assert_eq!(agrees(r#"{"a": {"b": "\ud800"}}"#, &GUIDE), Ok(false));
}

#[test]
fn escapes_and_numbers_read_as_serde_json_reads_them() {
    let texts = [
        r#"{"task": "a\"b\\\"c\\\\", "x": "\\\\\"", "scores": [1, -0, 0.1, 1e300, -2.5E-3, 18446744073709551616, -9223372036854775809]}"#,
        r#" { "task" : "\u00e9\ud83d\ude00\/\b\f\n\r\t" , "scores" : { "k" : [ true , false , null ] } } "#,
        r#"{"iterations": [{"task_results": [{"agent_id": "a", "r": "\\"}, 7, "s", [1]]}, {"task_results": {"x": 1}}]}"#,
        r#"{"a": {"b": 1, "b": 2, "c": 3}, "a": [1, {"b": 4}], "task": "t", "task": "u"}"#,
        "{\"é\": \"ü✓\", \"a\": {\"\\u00e9\": 1, \"b\": \"\\\\u\"}}",
        "[]",
        "{}",
        "\"top\"",
        "-12.5e+3",
        "[0, -0, 7, -7, 123456789012345678, -123456789012345678, 1234567890123456789, 9223372036854775808, -0.0, 1E2]",
    ];
    for text in texts {
        for keep in KEEPS {
            assert_eq!(agrees(text, keep), Ok(true), "{text:?}");
        }
    }
}

/// Nesting up to the limit is read or skipped here, past it left to serde_json (which words
/// the error), on a thread with half the stack of a rayon worker.
#[test]
fn nesting_past_the_limit_is_left_to_serde_json() {
    let deep = |levels: usize, key: &str| format!("{{\"{key}\": {}1{}}}", "[".repeat(levels), "]".repeat(levels));
    std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(move || {
            for key in ["a", "z"] {
                for (levels, read_here) in
                    [(MAX_NESTING - 2, true), (MAX_NESTING - 1, true), (MAX_NESTING, false), (5000, false)]
                {
                    for keep in KEEPS {
                        assert_eq!(agrees(&deep(levels, key), keep), Ok(read_here), "{levels} {key}");
                    }
                }
            }
        })
        .expect("a thread")
        .join()
        .expect("no overflow");
}

/// Every run length of backslashes, at every offset across a block boundary, before a quote.
#[test]
fn quotes_after_backslash_runs_across_blocks() {
    for offset in 0..70 {
        for run in 0..6 {
            let text = format!("[\"{}{}\\\"\", 1]", "x".repeat(offset), "\\\\".repeat(run));
            assert_eq!(agrees(&text, &Keep::All), Ok(true), "{text:?}");
            let odd = format!("[\"{}{}\", 1]", "x".repeat(offset), "\\".repeat(2 * run + 1));
            assert_eq!(agrees(&odd, &Keep::All), Ok(false), "{odd:?}");
        }
    }
}

/// The escaped bytes of `bytes`, a byte at a time.
fn escaped_by_byte(bytes: &[u8]) -> Vec<bool> {
    let mut escaping = false;
    bytes
        .iter()
        .map(|&byte| {
            let escaped = escaping;
            escaping = !escaping && byte == b'\\';
            escaped
        })
        .collect()
}

/// JSON documents with the keys the guide names, the escapes and numbers JSON has, and
/// spaces or none between tokens.
fn document() -> impl Strategy<Value = String> {
    let number = "-?(0|[1-9][0-9]{0,20})(\\.[0-9]{1,3})?([eE][+-]?[0-9]{1,3})?";
    let string = "\"([a-c \u{e9}]|\\\\[\"\\\\/bfnrt]|\\\\u00[eE]9|\\\\ud83d\\\\ude00|\\\\udc00){0,6}\"";
    let leaf = prop_oneof![Just("null".to_owned()), Just("true".to_owned()), Just("false".to_owned()), number, string];
    let key = prop::sample::select(
        &["\"a\"", "\"b\"", "\"task\"", "\"iterations\"", "\"task_results\"", "\"agent_id\"", "\"z\""][..],
    );
    let gap = prop::sample::select(&["", " ", "  "][..]);
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            (prop::collection::vec(inner.clone(), 0..6), gap.clone())
                .prop_map(|(items, gap)| format!("[{gap}{}{gap}]", items.join(&format!("{gap},{gap}")))),
            (prop::collection::vec((key.clone(), inner), 0..6), gap.clone()).prop_map(|(entries, gap)| {
                let entries: Vec<String> =
                    entries.into_iter().map(|(key, value)| format!("{key}{gap}:{gap}{value}")).collect();
                format!("{{{gap}{}{gap}}}", entries.join(&format!("{gap},{gap}")))
            }),
        ]
    })
}

/// The bytes a JSON line is made of, each often enough to meet the others.
fn json_byte() -> impl Strategy<Value = u8> {
    prop::sample::select(&b"\\\\\\\"\"\"unbt/x0129eE.-+,:{}[] \t\x01\xc3\xa9tfalsenul\xff\x80"[..])
}

/// A byte replaced (0), inserted (1) or removed (2), at a place of the text.
type Edit = (prop::sample::Index, u8, u8);

fn edits(count: std::ops::Range<usize>) -> impl Strategy<Value = Vec<Edit>> {
    prop::collection::vec((any::<prop::sample::Index>(), 0u8..3, json_byte()), count)
}

fn broken(mut bytes: Vec<u8>, edits: Vec<Edit>) -> Vec<u8> {
    for (at, edit, byte) in edits {
        if bytes.is_empty() {
            break;
        }
        let at = at.index(bytes.len());
        match edit {
            0 => bytes[at] = byte,
            1 => bytes.insert(at, byte),
            _ => {
                bytes.remove(at);
            }
        }
    }
    bytes
}

/// [`agrees`] for every keep, where the bytes are UTF-8 (the reader's input: `parse_line`
/// checks the bytes first).
fn agrees_for_every_keep(bytes: &[u8]) -> Result<(), String> {
    let Ok(text) = std::str::from_utf8(bytes) else { return Ok(()) };
    KEEPS.iter().try_for_each(|keep| agrees(text, keep).map(drop))
}

fn block() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(json_byte(), 64)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn block_masks_match_a_byte_at_a_time(bytes in block(), high in prop::collection::vec(128u8..=255, 64)) {
        let block: [u8; 64] = bytes.try_into().expect("64 bytes");
        prop_assert_eq!(masks(&block), masks_by_byte(&block));
        let high: [u8; 64] = high.try_into().expect("64 bytes");
        prop_assert_eq!(masks(&high), masks_by_byte(&high));
    }

    #[test]
    fn escaped_bytes_match_a_byte_at_a_time(bytes in prop::collection::vec(prop::sample::select(&b"\\\\\\x\""[..]), 0..400)) {
        let mut carry = false;
        let mut fast = Vec::new();
        for chunk in bytes.chunks(64) {
            let mut block = [b' '; 64];
            block[..chunk.len()].copy_from_slice(chunk);
            let bits = escaped(masks_by_byte(&block).backslash, &mut carry);
            fast.extend((0..chunk.len()).map(|at| bits >> at & 1 == 1));
        }
        prop_assert_eq!(fast, escaped_by_byte(&bytes));
    }

    /// A sample line broken in a few places: never read otherwise than serde_json reads it.
    #[test]
    fn broken_sample_lines_are_read_as_serde_json_reads_them(line in 0usize..64, edits in edits(1..4)) {
        let lines = sample_lines();
        let bytes = broken(lines[line % lines.len()].as_bytes().to_vec(), edits);
        prop_assert_eq!(agrees_for_every_keep(&bytes), Ok(()));
    }

    /// Generated documents, whole and then broken: read to serde_json's value when whole.
    #[test]
    fn documents_are_read_as_serde_json_reads_them(text in document(), edits in edits(0..3)) {
        let whole_read = crate::convert::read(&text, &Keep::All).is_ok();
        for keep in KEEPS {
            prop_assert_eq!(agrees(&text, keep), Ok(whole_read || read(&text, keep).is_some()));
        }
        prop_assert_eq!(agrees_for_every_keep(&broken(text.into_bytes(), edits)), Ok(()));
    }

    /// Small documents of JSON's bytes in any order: most are broken, some are not.
    #[test]
    fn short_texts_are_read_as_serde_json_reads_them(bytes in prop::collection::vec(json_byte(), 0..40)) {
        prop_assert_eq!(agrees_for_every_keep(&bytes), Ok(()));
    }
}
