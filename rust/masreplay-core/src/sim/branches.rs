//! Ground truth for counterfactual credit. Factual traces come from [`super::generate`]; their
//! team reward is replaced by a known additive model, R = sum of per-event contributions +
//! noise, and each gets branch rollouts at a few of its events that differ only there:
//! - `substitute`: another version of the event, whose contribution is a fresh draw from the
//!   same zero-mean distribution (true effect: the factual contribution);
//! - `ablate`: the event removed (true effect: its contribution);
//! - `no_spawn`: a spawn replaced by a no-op decision, so the spawned agent's subtree never
//!   runs (true effect: the spawn's contribution plus everything the subtree contributed).
//!
//! Branches keep the factual's continuation (as C3 replays alternatives with a fixed
//! continuation) and draw fresh noise. Each agent's true Shapley value is the sum of its
//! events' contributions (the expected game is additive over agents).

use rand::RngExt;
use rand::seq::index::sample;
use rand_distr::StandardNormal;
use rand_xoshiro::Xoshiro256PlusPlus;
use rayon::prelude::*;

use super::{SimConfig, generate, stream};
use crate::ensure;
use crate::error::Result;
use crate::interrupt::Checkpoint;
use crate::trace::{CounterfactualKind, CounterfactualOf, EdgeType, EventType, Trace};

#[derive(Clone, Debug)]
pub struct BranchConfig {
    pub base: SimConfig,
    /// Branch rollouts per branch point.
    pub branches: usize,
    /// Events of each factual trace that get branches (one spawn, when there is one, as
    /// `no_spawn`; the rest alternate `substitute` and `ablate`).
    pub branch_points: usize,
    /// Standard deviation of the reward noise of every rollout.
    pub noise: f64,
}

/// The true effect of one event: E[R | the factual event] - E[R | its alternatives].
#[derive(Clone, Debug, PartialEq)]
pub struct TrueEffect {
    pub trace_id: String,
    pub event_id: String,
    pub kind: CounterfactualKind,
    pub effect: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TrueAgentValue {
    pub trace_id: String,
    pub agent: String,
    pub value: f64,
}

#[derive(Debug, Default)]
pub struct GroundTruth {
    /// Each factual trace followed by its branches.
    pub traces: Vec<Trace>,
    pub effects: Vec<TrueEffect>,
    pub agent_values: Vec<TrueAgentValue>,
}

const BRANCH_STREAM: u64 = 0x6272_616e_6368;
/// Contributions and substitutes are uniform on [-SCALE, SCALE].
const SCALE: f64 = 0.5;

pub fn generate_with_branches(config: &BranchConfig) -> Result<GroundTruth> {
    ensure!(config.branches >= 1, "branches must be at least 1");
    ensure!(
        config.noise.is_finite() && config.noise >= 0.0,
        "noise must be a finite number >= 0, got {}",
        config.noise
    );
    let points = config.branch_points.min(config.base.max_events_per_trace());
    config.base.check_size(points.saturating_mul(config.branches).saturating_add(1))?;
    let factual = generate(&config.base)?;
    let checkpoint = Checkpoint::here();
    let parts: Vec<GroundTruth> = factual
        .into_par_iter()
        .enumerate()
        .map(|(index, trace)| checkpoint.check().map(|()| with_branches(config, index, trace)))
        .collect::<Result<_>>()?;
    let mut truth = GroundTruth::default();
    for part in parts {
        truth.traces.extend(part.traces);
        truth.effects.extend(part.effects);
        truth.agent_values.extend(part.agent_values);
    }
    Ok(truth)
}

fn set_team_reward(trace: &mut Trace, reward: f64) {
    match trace.rewards.iter_mut().find(|(name, _)| name == "team") {
        Some(team) => team.1 = reward,
        None => trace.rewards.insert(0, ("team".into(), reward)),
    }
}

fn with_branches(config: &BranchConfig, index: usize, mut factual: Trace) -> GroundTruth {
    let mut rng = stream(config.base.seed, BRANCH_STREAM, index);
    let contributions: Vec<f64> = factual.events.iter().map(|_| rng.random_range(-SCALE..=SCALE)).collect();
    let expected: f64 = contributions.iter().sum();
    set_team_reward(&mut factual, expected + config.noise * rng.sample::<f64, _>(StandardNormal));

    let mut agents: Vec<(String, f64)> = Vec::new();
    for (event, c) in factual.events.iter().zip(&contributions) {
        match agents.iter_mut().find(|(name, _)| *name == event.agent) {
            Some(agent) => agent.1 += c,
            None => agents.push((event.agent.clone(), *c)),
        }
    }
    let agent_values = agents
        .into_iter()
        .map(|(agent, value)| TrueAgentValue { trace_id: factual.trace_id.clone(), agent, value })
        .collect();

    let points = branch_points(&factual, config.branch_points, &mut rng);
    let mut traces = Vec::with_capacity(1 + points.len() * config.branches);
    let mut effects = Vec::with_capacity(points.len());
    for (point, kind) in points {
        let removed = match kind {
            CounterfactualKind::NoSpawn => spawned_subtree(&factual, point),
            CounterfactualKind::Ablate => (0..factual.events.len()).map(|k| k == point).collect(),
            CounterfactualKind::Substitute => vec![false; factual.events.len()],
        };
        let lost: f64 = contributions.iter().zip(&removed).filter(|(_, r)| **r).map(|(c, _)| c).sum();
        // A no-op in place of a spawn contributes nothing; a substitute is a fresh draw.
        let effect =
            if kind == CounterfactualKind::NoSpawn { lost + contributions[point] } else { contributions[point] };
        effects.push(TrueEffect {
            trace_id: factual.trace_id.clone(),
            event_id: factual.events[point].id.clone(),
            kind,
            effect,
        });
        for j in 0..config.branches {
            let mut branch = without(&factual, &removed);
            let mut expected_branch = expected - effect;
            let event_id = &factual.events[point].id;
            if let Some(event) = branch.events.iter_mut().find(|e| e.id == *event_id) {
                match kind {
                    CounterfactualKind::Substitute => {
                        let alternative = rng.random_range(-SCALE..=SCALE);
                        expected_branch += alternative;
                        event.content_ref = Some(format!("alternative-{j}"));
                    }
                    _ => {
                        event.event_type = EventType::OrchestratorDecision;
                        event.to = None;
                        event.content_ref = Some("no-op".into());
                    }
                }
            }
            branch.trace_id = format!("{}/{}/{}{j}", factual.trace_id, event_id, kind.as_str());
            branch.counterfactual_of =
                Some(CounterfactualOf { trace_id: factual.trace_id.clone(), event_id: event_id.clone(), kind });
            set_team_reward(&mut branch, expected_branch + config.noise * rng.sample::<f64, _>(StandardNormal));
            traces.push(branch);
        }
    }
    traces.insert(0, factual);
    GroundTruth { traces, effects, agent_values }
}

/// Up to `count` events to branch at: a spawn first (as no_spawn) when the trace has one,
/// then other events that are neither the first event nor tool results, alternately
/// substituted and ablated.
fn branch_points(trace: &Trace, count: usize, rng: &mut Xoshiro256PlusPlus) -> Vec<(usize, CounterfactualKind)> {
    // At most one point per event, however many are asked for.
    let mut points = Vec::with_capacity(count.min(trace.events.len()));
    let spawns: Vec<usize> =
        (0..trace.events.len()).filter(|&k| trace.events[k].event_type == EventType::Spawn).collect();
    if count > 0 && !spawns.is_empty() {
        points.push((spawns[rng.random_range(0..spawns.len())], CounterfactualKind::NoSpawn));
    }
    let others: Vec<usize> = (1..trace.events.len())
        .filter(|&k| !matches!(trace.events[k].event_type, EventType::Spawn | EventType::ToolResult))
        .collect();
    let wanted = (count - points.len()).min(others.len());
    for (n, pick) in sample(rng, others.len(), wanted).into_iter().enumerate() {
        let kind = if n % 2 == 0 { CounterfactualKind::Substitute } else { CounterfactualKind::Ablate };
        points.push((others[pick], kind));
    }
    points
}

/// The events that never happen when spawn event `spawn` does not: every event of the spawned
/// agent and of the agents it (transitively) spawned, and the results of their tool calls.
fn spawned_subtree(trace: &Trace, spawn: usize) -> Vec<bool> {
    let mut subtree: Vec<&str> = trace.events[spawn].to.as_deref().into_iter().collect();
    let mut grew = true;
    while grew {
        grew = false;
        for event in &trace.events {
            if event.event_type == EventType::Spawn
                && subtree.contains(&event.agent.as_str())
                && let Some(child) = event.to.as_deref().filter(|child| !subtree.contains(child))
            {
                subtree.push(child);
                grew = true;
            }
        }
    }
    let mut removed: Vec<bool> = trace.events.iter().map(|e| subtree.contains(&e.agent.as_str())).collect();
    // Edges run forward in the list, so one pass carries removal to the tool results.
    for edge in &trace.edges {
        if edge.edge_type == EdgeType::ToolDependency && removed[edge.src as usize] {
            removed[edge.dst as usize] = true;
        }
    }
    removed
}

/// `trace` without the `removed` events and the edges that touch them.
fn without(trace: &Trace, removed: &[bool]) -> Trace {
    let mut position = vec![u32::MAX; removed.len()];
    let mut kept = 0;
    for (k, gone) in removed.iter().enumerate() {
        if !gone {
            position[k] = kept;
            kept += 1;
        }
    }
    let mut branch = trace.clone();
    branch.events = trace.events.iter().zip(removed).filter(|(_, gone)| !**gone).map(|(e, _)| e.clone()).collect();
    branch.edges = trace
        .edges
        .iter()
        .filter(|edge| !removed[edge.src as usize] && !removed[edge.dst as usize])
        .map(|edge| crate::trace::Edge { src: position[edge.src as usize], dst: position[edge.dst as usize], ..*edge })
        .collect();
    branch.costs.tokens = branch.events.iter().filter_map(|e| e.tokens).sum::<i64>() as f64;
    let count = |t| branch.events.iter().filter(|e| e.event_type == t).count() as f64;
    branch.costs.tool_calls = Some(count(EventType::ToolCall));
    branch.costs.messages = Some(count(EventType::Message));
    branch
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::{ValidateOptions, trace_from_json};

    fn config(n_traces: usize) -> BranchConfig {
        BranchConfig {
            base: SimConfig { n_traces, seed: 5, ..SimConfig::default() },
            branches: 3,
            branch_points: 3,
            noise: 0.1,
        }
    }

    #[test]
    fn branches_are_valid_traces_that_name_their_factual_event() {
        let truth = generate_with_branches(&config(20)).unwrap();
        assert_eq!(truth.effects.len() * 3 + 20, truth.traces.len());
        for trace in &truth.traces {
            let json = trace.to_json(false);
            assert_eq!(&trace_from_json(&json, ValidateOptions::default()).unwrap(), trace);
        }
        for effect in &truth.effects {
            let factual = truth.traces.iter().find(|t| t.trace_id == effect.trace_id).unwrap();
            assert!(factual.events.iter().any(|e| e.id == effect.event_id));
        }
        assert!(truth.effects.iter().any(|e| e.kind == CounterfactualKind::NoSpawn));
    }

    #[test]
    fn without_noise_branch_rewards_differ_by_the_true_effect_exactly() {
        let mut config = config(10);
        config.noise = 0.0;
        let truth = generate_with_branches(&config).unwrap();
        let team = |t: &Trace| t.rewards.iter().find(|(n, _)| n == "team").unwrap().1;
        for effect in truth.effects.iter().filter(|e| e.kind != CounterfactualKind::Substitute) {
            let factual = truth.traces.iter().find(|t| t.trace_id == effect.trace_id).unwrap();
            let branches = truth.traces.iter().filter(|t| {
                t.counterfactual_of
                    .as_ref()
                    .is_some_and(|of| of.trace_id == effect.trace_id && of.event_id == effect.event_id)
            });
            for branch in branches {
                assert!((team(factual) - team(branch) - effect.effect).abs() < 1e-9);
            }
        }
    }

    #[test]
    fn same_seed_same_ground_truth() {
        let (a, b) = (generate_with_branches(&config(6)).unwrap(), generate_with_branches(&config(6)).unwrap());
        assert_eq!(a.traces, b.traces);
        assert_eq!(a.effects, b.effects);
    }
}
