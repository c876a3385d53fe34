//! Calibrated error bars for branch credit: over a fixed set of simulator seeds, with 3 to 8
//! branches per event, credit +- 1.96 stderr covers the true effect (E[R | the factual event]
//! minus E[R | its alternatives], from the simulator's ground truth) between 93% and 97% of the
//! time where the branches replicate one intervention (`ablate`, `no_spawn`). Two-sided:
//! intervals 1.4x wider or narrower must leave the band, and the test checks that they do.
//! `substitute` branches each draw another alternative, so their spread overstates the
//! factual reward's noise: those intervals are conservative and only their floor is checked.

use std::collections::HashMap;

use masreplay_core::counterfactual::{Baseline, branch_credit};
use masreplay_core::sim::SimConfig;
use masreplay_core::sim::branches::{BranchConfig, generate_with_branches};
use masreplay_core::store::TraceBatch;
use masreplay_core::trace::CounterfactualKind;

const SEEDS: u64 = 24;
const TRACES: usize = 100;

/// (|credit - effect| / stderr, kind) for every branch point of every seed.
fn standardized_errors() -> Vec<(f64, CounterfactualKind)> {
    let mut errors = Vec::new();
    for seed in 0..SEEDS {
        let config = BranchConfig {
            base: SimConfig { n_traces: TRACES, seed: 500 + seed, ..SimConfig::default() },
            branches: 3 + (seed % 6) as usize,
            branch_points: 3,
            noise: 0.2,
        };
        let truth = generate_with_branches(&config).unwrap();
        let credit = branch_credit(&TraceBatch::from_traces(&truth.traces).unwrap(), "team", Baseline::Mean).unwrap();
        // Events are positions among the batch's events, trace by trace in the given order.
        let mut position = HashMap::new();
        let mut first = 0u64;
        for trace in &truth.traces {
            for (k, event) in trace.events.iter().enumerate() {
                position.insert((trace.trace_id.as_str(), event.id.as_str()), first + k as u64);
            }
            first += trace.events.len() as u64;
        }
        let row: HashMap<u64, usize> = credit.event.iter().enumerate().map(|(k, &event)| (event, k)).collect();
        assert_eq!(row.len(), truth.effects.len(), "one credited event per branch point");
        for effect in &truth.effects {
            let k = row[&position[&(effect.trace_id.as_str(), effect.event_id.as_str())]];
            assert_eq!(credit.n_branches[k] as usize, config.branches);
            errors.push(((credit.credit[k] - effect.effect).abs() / credit.stderr[k], effect.kind));
        }
    }
    errors
}

fn coverage(errors: &[f64], scale: f64) -> f64 {
    errors.iter().filter(|&&z| z <= 1.96 * scale).count() as f64 / errors.len() as f64
}

#[test]
fn branch_credit_intervals_cover_the_true_effect_95_percent_of_the_time() {
    let errors = standardized_errors();
    let replicated: Vec<f64> =
        errors.iter().filter(|(_, kind)| *kind != CounterfactualKind::Substitute).map(|(z, _)| *z).collect();
    assert!(replicated.len() > 3_000, "{} replicated branch points", replicated.len());
    let covered = coverage(&replicated, 1.0);
    assert!((0.93..=0.97).contains(&covered), "coverage {covered:.3} over {} branch points", replicated.len());
    let (inflated, shrunk) = (coverage(&replicated, 1.4), coverage(&replicated, 1.0 / 1.4));
    assert!(inflated > 0.97, "1.4x inflated errors would pass: {inflated:.3}");
    assert!(shrunk < 0.93, "1.4x shrunk errors would pass: {shrunk:.3}");

    let substituted: Vec<f64> =
        errors.iter().filter(|(_, kind)| *kind == CounterfactualKind::Substitute).map(|(z, _)| *z).collect();
    let conservative = coverage(&substituted, 1.0);
    assert!(conservative >= 0.95, "substitute coverage {conservative:.3} over {}", substituted.len());
}
