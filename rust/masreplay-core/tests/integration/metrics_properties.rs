//! The metrics read the event graph, not the row order: permuting a trace's events (and
//! remapping its edges) must not change one figure.

use masreplay_core::TraceBatch;
use masreplay_core::metrics::trace_metrics;
use masreplay_core::sim::{SimConfig, generate};
use masreplay_core::trace::{Edge, Trace};
use proptest::prelude::*;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_xoshiro::Xoshiro256PlusPlus;

/// The trace with its events in a shuffled order and its edges renumbered to match.
fn permuted(trace: &Trace, seed: u64) -> Trace {
    let mut order: Vec<usize> = (0..trace.events.len()).collect();
    order.shuffle(&mut Xoshiro256PlusPlus::seed_from_u64(seed));
    let mut position = vec![0u32; order.len()];
    for (at, &old) in order.iter().enumerate() {
        position[old] = at as u32;
    }
    let mut shuffled = trace.clone();
    shuffled.events = order.iter().map(|&old| trace.events[old].clone()).collect();
    shuffled.edges = trace
        .edges
        .iter()
        .map(|edge| Edge { src: position[edge.src as usize], dst: position[edge.dst as usize], ..*edge })
        .collect();
    shuffled.edges.reverse();
    shuffled
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn metrics_ignore_event_order(seed in 0u64..10_000, shuffle in any::<u64>(), depth in 1usize..4) {
        let config = SimConfig { n_traces: 6, depth, agents: (1, 12), seed, ..SimConfig::default() };
        let traces = generate(&config).unwrap();
        let shuffled: Vec<Trace> = traces.iter().map(|trace| permuted(trace, shuffle)).collect();
        let expected = trace_metrics(&TraceBatch::from_traces(&traces).unwrap()).unwrap();
        let got = trace_metrics(&TraceBatch::from_traces(&shuffled).unwrap()).unwrap();
        prop_assert_eq!(got, expected);
    }
}
