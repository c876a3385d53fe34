//! Returns over the event graph, for per-event rewards (process, tool, verifier channels).
//!
//! - [`ReturnKind::Descendants`]: discounted return-to-go over everything that follows an
//!   event, `G_e = sum over d in {e} + descendants(e) of gamma^dist(e, d) * r_d`, each
//!   descendant counted once at its shortest distance however many paths reach it (joins
//!   in a DAG would otherwise count it once per path).
//! - [`ReturnKind::Tree`]: MAGRPO's tree return `R_e = r_e + gamma * mean(R_c for children c)`.
//! - [`ReturnKind::Turns`]: MARSHAL's turn-level return, the discounted reverse cumulative
//!   sum over each agent's own events in time order (its turns).
//! - [`graph_gae`]: GAE on the graph with per-event values: `delta_e = r_e + gamma *
//!   mean(V_c) - V_e`, `A_e = delta_e + gamma * lambda * mean(A_c)` over the children `c`
//!   (0 at leaves); returns `A + V`. On a chain this is verl's GAE on an all-valid mask.
//!
//! Traces run in parallel; each result depends only on its own trace.

use rayon::prelude::*;

use crate::bail;
use crate::error::Result;
use crate::limit::check_in_range;
use crate::names::named_enum;
use crate::store::TraceBatch;
use crate::trace_view::BatchView;

named_enum!(
    /// Which return [`graph_returns`] computes (see the module comment).
    ReturnKind as "return kind" {
        Descendants = "descendants",
        Tree = "tree",
        Turns = "turns",
    }
);

fn check_per_event(view: &BatchView, name: &str, values: &[f64]) -> Result<()> {
    if values.len() != view.n_events() {
        bail!("{name} has {} values for {} events", values.len(), view.n_events());
    }
    check_in_range(name, values)
}

fn check_gamma(name: &str, value: f64) -> Result<()> {
    if (0.0..=1.0).contains(&value) { Ok(()) } else { bail!("{name} must be in [0, 1], got {value}") }
}

/// Per-event returns of per-event `rewards` (aligned with `batch.events()`).
pub fn graph_returns(batch: &TraceBatch, rewards: &[f64], gamma: f64, kind: ReturnKind) -> Result<Vec<f64>> {
    let view = BatchView::new(batch);
    check_per_event(&view, "rewards", rewards)?;
    check_gamma("gamma", gamma)?;
    let parts: Vec<Vec<f64>> = (0..view.n_traces())
        .into_par_iter()
        .map(|trace| {
            let range = view.events_of(trace);
            let r = &rewards[range.clone()];
            match kind {
                ReturnKind::Descendants => Ok(return_to_go(&view, trace, r, gamma)),
                ReturnKind::Tree => tree_returns(&view, trace, r, gamma),
                ReturnKind::Turns => Ok(turn_returns(&view, trace, r, gamma)),
            }
        })
        .collect::<Result<_>>()?;
    Ok(parts.concat())
}

/// Breadth-first from every event: shortest distances, each descendant reached once.
fn return_to_go(view: &BatchView, trace: usize, r: &[f64], gamma: f64) -> Vec<f64> {
    let graph = view.graph(trace);
    let n = r.len();
    let mut seen = vec![u32::MAX; n];
    let mut frontier = Vec::new();
    let mut next = Vec::new();
    (0..n as u32)
        .map(|start| {
            seen[start as usize] = start;
            frontier.clear();
            frontier.push(start);
            let (mut total, mut discount) = (r[start as usize], 1.0);
            while !frontier.is_empty() {
                discount *= gamma;
                next.clear();
                for &event in &frontier {
                    for &child in graph.successors(event) {
                        if seen[child as usize] != start {
                            seen[child as usize] = start;
                            total += discount * r[child as usize];
                            next.push(child);
                        }
                    }
                }
                std::mem::swap(&mut frontier, &mut next);
            }
            total
        })
        .collect()
}

fn mean_over(children: &[u32], of: &[f64]) -> f64 {
    if children.is_empty() {
        0.0
    } else {
        children.iter().map(|&c| of[c as usize]).sum::<f64>() / children.len() as f64
    }
}

fn tree_returns(view: &BatchView, trace: usize, r: &[f64], gamma: f64) -> Result<Vec<f64>> {
    let graph = view.graph(trace);
    let mut returns = vec![0.0; r.len()];
    for &event in view.topological_order(trace, &graph)?.iter().rev() {
        returns[event as usize] = r[event as usize] + gamma * mean_over(graph.successors(event), &returns);
    }
    Ok(returns)
}

fn turn_returns(view: &BatchView, trace: usize, r: &[f64], gamma: f64) -> Vec<f64> {
    let turns = view.turns(trace);
    let start = view.events_of(trace).start;
    // Events by (agent, turn) descending: each agent's turns from its last back to its first.
    let mut order: Vec<usize> = (0..r.len()).collect();
    order.sort_by_key(|&j| (view.agent(start + j), std::cmp::Reverse(turns[j])));
    let mut returns = vec![0.0; r.len()];
    let mut previous: Option<(u32, f64)> = None;
    for j in order {
        let agent = view.agent(start + j);
        let later = match previous {
            Some((a, g)) if a == agent => g,
            _ => 0.0,
        };
        returns[j] = r[j] + gamma * later;
        previous = Some((agent, returns[j]));
    }
    returns
}

/// GAE over each trace's event graph: (advantages, returns), aligned with `batch.events()`.
pub fn graph_gae(
    batch: &TraceBatch,
    rewards: &[f64],
    values: &[f64],
    gamma: f64,
    lam: f64,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let view = BatchView::new(batch);
    check_per_event(&view, "rewards", rewards)?;
    check_per_event(&view, "values", values)?;
    check_gamma("gamma", gamma)?;
    check_gamma("lam", lam)?;
    let parts: Vec<Vec<f64>> = (0..view.n_traces())
        .into_par_iter()
        .map(|trace| {
            let range = view.events_of(trace);
            let (r, v) = (&rewards[range.clone()], &values[range]);
            let graph = view.graph(trace);
            let mut advantages = vec![0.0; r.len()];
            for &event in view.topological_order(trace, &graph)?.iter().rev() {
                let e = event as usize;
                let children = graph.successors(event);
                let delta = r[e] + gamma * mean_over(children, v) - v[e];
                advantages[e] = delta + gamma * lam * mean_over(children, &advantages);
            }
            Ok(advantages)
        })
        .collect::<Result<_>>()?;
    let advantages = parts.concat();
    let returns = advantages.iter().zip(values).map(|(a, v)| a + v).collect();
    Ok((advantages, returns))
}
