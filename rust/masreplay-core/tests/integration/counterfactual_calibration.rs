//! Calibrated error bars for branch credit: over a fixed set of simulator seeds, with 3 to 8
//! branches per event, credit +- 1.96 stderr covers the true effect (E[R | the factual event]
//! minus E[R | its alternatives], from the simulator's ground truth) between 93% and 97% of the
//! time where the branches replicate one intervention (`ablate`, `no_spawn`). Two-sided:
//! intervals 1.4x wider or narrower must leave the band, and the test checks that they do.
//! `substitute` branches each draw another alternative, so their spread overstates the
//! factual reward's noise: those intervals are conservative and only their floor is checked.
//!
//! The same two-sided rule for same-prefix credit: groups whose traces fork among two or three
//! alternatives with planted mean rewards; each credited fork's interval is checked against
//! mu(alternative) minus the (importance-weighted) mean of mu over the group's traces.

use std::collections::HashMap;

use masreplay_core::counterfactual::{Baseline, Signature, branch_credit, same_prefix_credit};
use masreplay_core::sim::SimConfig;
use masreplay_core::sim::branches::{BranchConfig, generate_with_branches};
use masreplay_core::store::TraceBatch;
use masreplay_core::trace::CounterfactualKind;
use masreplay_core::validate::trace_from_json;
use masreplay_core::{Trace, ValidateOptions};
use rand::{RngExt, SeedableRng};
use rand_distr::StandardNormal;
use rand_xoshiro::Xoshiro256PlusPlus;
use serde_json::json;

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

/// Alternatives of the fork: (name, probability of being taken, mean reward).
const FORKS: [&[(&str, f64, f64)]; 2] =
    [&[("spawn", 0.6, 0.3), ("answer", 0.4, 0.0)], &[("search", 0.5, 0.2), ("ask", 0.3, -0.1), ("stop", 0.2, 0.0)]];

/// |credit - planted effect| / stderr for every credited fork of 3,000 groups of 6-16 traces.
fn same_prefix_errors(importance_weighting: bool) -> Vec<f64> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(900 + importance_weighting as u64);
    let (mut traces, mut planted): (Vec<Trace>, Vec<f64>) = (Vec::new(), Vec::new());
    for group in 0..3000 {
        let fork = FORKS[group % 2];
        let size = rng.random_range(6..=16usize);
        let mut taken = Vec::with_capacity(size);
        for k in 0..size {
            let (u, mut cumulative): (f64, f64) = (rng.random(), 0.0);
            let choice = fork
                .iter()
                .position(|&(_, p, _)| {
                    cumulative += p;
                    u < cumulative
                })
                .unwrap_or(fork.len() - 1);
            let (name, p, mean) = fork[choice];
            let reward = mean + 0.2 * rng.sample::<f64, _>(StandardNormal);
            let value = json!({
                "trace_id": format!("g{group}-{k}"), "task_id": format!("g{group}"),
                "events": [
                    {"id": "e0", "t": 0.0, "type": "orchestrator_decision", "agent": "orch"},
                    {"id": "e1", "t": 1.0, "type": "orchestrator_decision", "agent": "orch", "content_ref": name, "logprob": p.ln()},
                    {"id": "e9", "t": 9.0, "type": "aggregate", "agent": "orch"}],
                "edges": [], "rewards": {"team": reward}, "costs": {"tokens": 0, "wall_clock_s": 0}});
            traces.push(trace_from_json(&value, ValidateOptions::default()).expect("a valid trace"));
            taken.push(choice);
        }
        // The planted effect of each trace's choice against the group's (weighted) mix.
        let weight = |c: usize| if importance_weighting { 1.0 / fork[c].1 } else { 1.0 };
        let total: f64 = taken.iter().map(|&c| weight(c)).sum();
        let mix = taken.iter().map(|&c| weight(c) * fork[c].2).sum::<f64>() / total;
        planted.extend(taken.iter().map(|&c| fork[c].2 - mix));
    }
    let batch = TraceBatch::from_traces(&traces).unwrap();
    let credit = same_prefix_credit(&batch, "team", &Signature::default(), importance_weighting).unwrap();
    // One interval per (group, alternative): every trace of an alternative has the same one.
    let mut seen = std::collections::HashSet::new();
    credit
        .trace
        .iter()
        .enumerate()
        .filter(|&(k, _)| seen.insert((credit.credit[k].to_bits(), credit.stderr[k].to_bits())))
        .map(|(k, &row)| (credit.credit[k] - planted[row as usize]).abs() / credit.stderr[k])
        .collect()
}

#[test]
fn same_prefix_intervals_cover_the_planted_effect_95_percent_of_the_time() {
    for importance_weighting in [false, true] {
        let errors = same_prefix_errors(importance_weighting);
        assert!(errors.len() > 6_000, "{} credited forks", errors.len());
        let covered = coverage(&errors, 1.0);
        assert!(
            (0.93..=0.97).contains(&covered),
            "coverage {covered:.3} over {} forks ({importance_weighting})",
            errors.len()
        );
        let (inflated, shrunk) = (coverage(&errors, 1.4), coverage(&errors, 1.0 / 1.4));
        assert!(inflated > 0.97, "1.4x inflated errors would pass: {inflated:.3}");
        assert!(shrunk < 0.93, "1.4x shrunk errors would pass: {shrunk:.3}");
    }
}
