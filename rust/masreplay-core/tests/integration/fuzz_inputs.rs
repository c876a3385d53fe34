//! Fuzzing that stays (issue 22): broken JSON text, structurally broken Arrow arrays and
//! corrupted Parquet bytes never panic; whatever is accepted is a valid batch. A panic fails the
//! test; a crash ends the test binary, which fails too. The number of cases grows with
//! MASREPLAY_FUZZ_SECONDS (about 1,000 cases a second here; the default, a few seconds).

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, RecordBatch, StructArray, make_array};
use arrow_buffer::Buffer;
use arrow_data::ArrayData;
use masreplay_core::sim::{SimConfig, generate};
use masreplay_core::validate::{ValidateOptions, parse_documents};
use masreplay_core::{Trace, TraceBatch};
use proptest::prelude::*;

fn cases() -> u32 {
    let seconds = std::env::var("MASREPLAY_FUZZ_SECONDS").ok().and_then(|s| s.parse::<u32>().ok());
    seconds.map_or(2000, |s| s.saturating_mul(1000).max(1))
}

fn sample_traces(seed: u64) -> Vec<Trace> {
    let config = SimConfig {
        n_traces: 3,
        agents: (1, 3),
        depth: 2,
        fan_out: (1, 2),
        events_per_agent: (0, 3),
        group_size: 2,
        seed,
    };
    generate(&config).expect("a valid config")
}

/// Accepted output must be valid Arrow and read back trace by trace.
fn assert_sound(batch: &TraceBatch) {
    let whole: ArrayRef = Arc::new(StructArray::from(batch.record_batch().clone()));
    whole.to_data().validate_full().expect("an accepted batch is valid Arrow");
    for i in 0..batch.len() {
        batch.trace(i).expect("an accepted trace reads back");
    }
    let (again, rejected) = TraceBatch::from_arrow(&[batch.record_batch().clone()]).expect("ingests again");
    assert!(rejected.is_empty(), "what was accepted is accepted again: {rejected:?}");
    assert_eq!(again.len(), batch.len());
}

/// Byte edits: (position as a fraction of the length, replacement byte).
fn edits() -> impl Strategy<Value = Vec<(f64, u8)>> {
    prop::collection::vec((0.0..1.0f64, any::<u8>()), 1..6)
}

fn edit(bytes: &mut [u8], edits: &[(f64, u8)]) {
    if bytes.is_empty() {
        return;
    }
    for &(at, byte) in edits {
        let i = ((at * bytes.len() as f64) as usize).min(bytes.len() - 1);
        bytes[i] = byte;
    }
}

/// Every buffer of `data` and its descendants, as (path of child indices, buffer index).
fn buffer_places(data: &ArrayData, path: &mut Vec<usize>, out: &mut Vec<(Vec<usize>, usize)>) {
    for b in 0..data.buffers().len() {
        out.push((path.clone(), b));
    }
    for (c, child) in data.child_data().iter().enumerate() {
        path.push(c);
        buffer_places(child, path, out);
        path.pop();
    }
}

/// `data` with the bytes of one buffer edited, rebuilt without any check (as the C data
/// interface and decoders hand arrays over).
fn with_edited_buffer(data: &ArrayData, path: &[usize], buffer: usize, edits: &[(f64, u8)]) -> ArrayData {
    let mut children = data.child_data().to_vec();
    let mut buffers = data.buffers().to_vec();
    match path.split_first() {
        Some((&c, rest)) => children[c] = with_edited_buffer(&children[c], rest, buffer, edits),
        None => {
            let mut bytes = buffers[buffer].as_slice().to_vec();
            edit(&mut bytes, edits);
            buffers[buffer] = Buffer::from_slice_ref(&bytes); // copied into aligned memory, as imports are
        }
    }
    let builder = data.clone().into_builder().buffers(buffers).child_data(children);
    // SAFETY: none for readers; this is the broken input that ingest must check before reading.
    unsafe { builder.build_unchecked() }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn json_text_never_panics(seed in any::<u64>(), edits in edits(), lines in any::<bool>()) {
        let traces = sample_traces(seed);
        let texts: Vec<String> = traces.iter().map(|t| t.to_json(false).to_string()).collect();
        let mut bytes = if lines { texts.join("\n") } else { format!("[{}]", texts.join(",")) }.into_bytes();
        edit(&mut bytes, &edits);
        for outcome in parse_documents(&bytes, ValidateOptions::default()).unwrap().into_iter().flatten() {
            assert_sound(&TraceBatch::from_traces(&[outcome]).expect("a checked trace is stored"));
        }
    }

    #[test]
    fn broken_arrow_arrays_never_panic(seed in any::<u64>(), column in any::<prop::sample::Index>(),
                                        place in any::<prop::sample::Index>(), edits in edits()) {
        let batch = TraceBatch::from_traces(&sample_traces(seed)).unwrap();
        let record = batch.record_batch();
        let c = column.index(record.num_columns());
        let data = record.column(c).to_data();
        let mut places = Vec::new();
        buffer_places(&data, &mut Vec::new(), &mut places);
        prop_assume!(!places.is_empty());
        let (path, buffer) = &places[place.index(places.len())];
        let broken = make_array(with_edited_buffer(&data, path, *buffer, &edits));
        let mut columns = record.columns().to_vec();
        columns[c] = broken;
        if let Ok(broken) = RecordBatch::try_new(record.schema(), columns)
            && let Ok((accepted, _)) = TraceBatch::from_arrow(&[broken])
        {
            assert_sound(&accepted);
        }
    }

    #[test]
    fn corrupted_parquet_never_panics(seed in any::<u64>(), edits in edits(), footer in any::<bool>()) {
        let batch = TraceBatch::from_traces(&sample_traces(seed)).unwrap();
        let folder = std::env::temp_dir().join(format!("masreplay-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&folder).unwrap();
        let path = folder.join(format!("{seed}.parquet"));
        masreplay_core::store::write_parquet(batch.record_batch(), &path).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        // The footer (metadata) is the last part of a file: aim at it half of the time.
        let len = bytes.len();
        let region = if footer { &mut bytes[len.saturating_sub(len / 4)..] } else { &mut bytes[..] };
        edit(region, &edits);
        std::fs::write(&path, &bytes).unwrap();
        let read = masreplay_core::store::read_parquet(&path);
        std::fs::remove_file(&path).unwrap();
        if let Ok(batches) = read
            && let Ok((accepted, _)) = TraceBatch::from_arrow(&batches)
        {
            assert_sound(&accepted);
        }
    }
}
