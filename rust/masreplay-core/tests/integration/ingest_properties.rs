//! Round trips through every ingest path, and columnar validation agreeing with JSON validation,
//! on simulated traces of random shape.

use masreplay_core::sim::{SimConfig, generate};
use masreplay_core::validate::{ValidateOptions, trace_from_json};
use masreplay_core::{Trace, TraceBatch};
use proptest::prelude::*;

fn traces() -> impl Strategy<Value = Vec<Trace>> {
    (1usize..6, 1usize..8, 1usize..4, 0usize..6, 1usize..4, any::<u64>()).prop_map(
        |(n_traces, agents, depth, events, group_size, seed)| {
            let config = SimConfig {
                n_traces,
                agents: (1, agents),
                depth,
                fan_out: (1, 3),
                events_per_agent: (0, events),
                group_size,
                seed,
            };
            generate(&config).expect("a valid config")
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn json_and_arrow_round_trips(traces in traces()) {
        for trace in &traces {
            let again = trace_from_json(&trace.to_json(false), ValidateOptions::default()).unwrap();
            prop_assert_eq!(&again, trace);
        }
        let batch = TraceBatch::from_traces(&traces).unwrap();
        let (ingested, rejected) = TraceBatch::from_arrow(&[batch.record_batch().clone()]).unwrap();
        prop_assert!(rejected.is_empty());
        prop_assert_eq!(ingested.record_batch(), batch.record_batch());
        for (i, trace) in traces.iter().enumerate() {
            prop_assert_eq!(&ingested.trace(i).unwrap(), trace);
        }
    }

    /// A negative time planted anywhere is reported with the same pointer by both validators,
    /// and the columnar path rejects only that trace.
    #[test]
    fn both_validators_agree_on_a_planted_error(traces in traces(), pick in any::<prop::sample::Index>()) {
        let victim = pick.index(traces.len());
        let event = pick.index(traces[victim].events.len());
        let mut broken = traces.clone();
        broken[victim].events[event].t = -1.0;
        let json_error = trace_from_json(&broken[victim].to_json(false), ValidateOptions::default()).unwrap_err();
        prop_assert_eq!(&json_error.path, &format!("/events/{event}/t"));

        let batch = TraceBatch::from_traces(&broken).unwrap();
        let (kept, rejected) = TraceBatch::from_arrow(&[batch.record_batch().clone()]).unwrap();
        prop_assert_eq!(rejected.len(), 1);
        prop_assert_eq!(rejected[0].0, victim);
        prop_assert_eq!(&rejected[0].1, &json_error);
        prop_assert_eq!(kept.len(), traces.len() - 1);
    }
}

/// Ingesting a slice of a table (with an optional column missing, so it is rebuilt) keeps
/// only the slice's events, not its parent's.
#[test]
fn a_slice_is_ingested_at_its_own_size() {
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    let traces = generate(&SimConfig { n_traces: 20, ..SimConfig::default() }).unwrap();
    let batch = TraceBatch::from_traces(&traces).unwrap();
    let mut record = batch.record_batch().clone();
    record.remove_column(record.schema().index_of("metrics").unwrap());
    let slice = record.slice(5, 3);
    let (ingested, rejected) = TraceBatch::from_arrow(&[slice]).unwrap();
    assert!(rejected.is_empty());
    let events = ingested.record_batch().column_by_name("events").unwrap().as_list::<i32>();
    let expected: usize = traces[5..8].iter().map(|t| t.events.len()).sum();
    assert_eq!(events.values().len(), expected);
    for (i, trace) in traces[5..8].iter().enumerate() {
        assert_eq!(&ingested.trace(i).unwrap().events, &trace.events);
    }
}
