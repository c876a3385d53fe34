//! Orchestration metrics, one row per trace, read from the canonical Arrow columns through
//! the batch's [`BatchView`] (no [`crate::Trace`] is built). Traces are measured in parallel
//! with rayon; each row depends only on its own trace, so the table is the same at any thread
//! count. The definitions are on [`TraceMetrics`]; `compute` holds the per-trace algorithm.

mod compute;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, Float64Array, Int32Array, RecordBatch};
use arrow_schema::{Field, Schema};
use rayon::prelude::*;

use crate::error::Result;
use crate::interrupt::Checkpoint;
use crate::store::TraceBatch;
use crate::trace_view::BatchView;

/// The orchestration figures of one trace.
///
/// Conventions: each event is one *step* of its author. Sub-agents, their parents (by
/// earliest spawn) and the orchestrator are those of [`crate::trace_view::agents`]; a
/// tool_result's `agent` names the tool, so tool results are nobody's steps. Events are
/// read in time order ((t, id)), never by row, so the metrics ignore the input order.
/// Ratios whose denominator is empty are `None` (null in Arrow), so means over a batch skip
/// them instead of averaging in a made-up value.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceMetrics {
    pub n_events: u32,
    /// Events on the longest path of the event DAG (a trace without edges: 1).
    pub critical_path_steps: u32,
    /// The longest path weighted by `duration_s`, an event without one weighing 1 (as steps).
    pub critical_path_s: f64,
    /// Every event is one step of work: the number of events.
    pub total_work_steps: u32,
    /// `total_work_steps / critical_path_steps`: 1 for a serial chain, the measured speedup
    /// over running every step in sequence.
    pub parallelism_efficiency: f64,
    /// Kimi PARL's critical steps, recursively: for an agent, the sum over its stages (its
    /// own events, a stage closing at each of its aggregate events) of its steps in the
    /// stage plus the largest critical steps among the sub-agents it spawned in that stage.
    /// For the orchestrator of a one-level system this is exactly PARL's
    /// sum_t (S_main(t) + max_i S_sub,i(t)); nested spawners count as the sub-orchestrators
    /// they are. The trace's value is the orchestrator's.
    pub critical_steps: u32,
    /// Share of sub-agents that return: a return event they author whose `to` is their
    /// parent (or, without `to`, that has an edge into an event of their parent). `None`
    /// when nothing was spawned.
    pub finish_rate: Option<f64>,
    /// Sub-agents that author no event at all.
    pub idle_agents: u32,
    /// Share of sub-agent steps taken by sub-agents that returned: the work that could reach
    /// the answer. `None` when sub-agents took no steps.
    pub utilization: Option<f64>,
    /// Tokens of inter-agent protocol over all tokens: spawn and despawn events, and
    /// messages addressed (`to`) to an agent other than their author. Everything else is
    /// content: decisions, an agent's own text (a message without another addressee), tool
    /// calls and results (work on the task), returns, aggregates, human and safety events.
    /// `None` when the trace records no tokens.
    pub protocol_overhead: Option<f64>,
    /// Among message events with a content_ref, the share that repeat a content_ref already
    /// sent: `1 - distinct / messages`. `None` without such messages.
    pub message_redundancy: Option<f64>,
    /// Events reachable along edges from a safety_event or an untrusted tool_result
    /// (`trusted == false`), counted once, over the number of such sources. `None` without
    /// sources.
    pub error_amplification: Option<f64>,
    /// The most agents alive at one instant. An agent (every author but tools, plus every
    /// spawned sub-agent) lives from the earlier of its spawn and its first event to the
    /// later of its last event's end (`t + duration_s`) and its despawn; intervals are
    /// closed, so an idle sub-agent is alive at the instant of its spawn.
    pub max_concurrent_agents: u32,
    pub spawn_count: u32,
    pub despawn_count: u32,
    /// Levels of the spawn tree below the orchestrator (0 when nothing was spawned).
    pub spawn_depth: u32,
    /// The most sub-agents one agent spawned.
    pub spawn_branching: u32,
}

/// The columns that are null where their denominator is empty.
const NULLABLE: &[&str] =
    &["finish_rate", "utilization", "protocol_overhead", "message_redundancy", "error_amplification"];

/// Metrics of every trace of `batch`, one per row.
pub fn trace_metrics(batch: &TraceBatch) -> Result<Vec<TraceMetrics>> {
    let view = BatchView::new(batch);
    let checkpoint = Checkpoint::here();
    (0..batch.len())
        .into_par_iter()
        .map_init(
            || compute::Scratch::new(view.n_agent_names()),
            |scratch, i| checkpoint.check().map(|()| scratch.measure(&view, i)),
        )
        .collect()
}

/// The metrics table: `trace_id`, then one column per field of [`TraceMetrics`] (counts
/// int32, ratios and seconds float64, nullable where the field is an `Option`), then the
/// event graph's `depth` and `max_branching` as the batch stores them.
pub fn metrics_table(batch: &TraceBatch) -> Result<RecordBatch> {
    let rows = trace_metrics(batch)?;
    let record = batch.record_batch();
    let counts = |get: fn(&TraceMetrics) -> u32| -> ArrayRef {
        Arc::new(Int32Array::from_iter_values(rows.iter().map(|row| get(row) as i32)))
    };
    let reals =
        |get: fn(&TraceMetrics) -> f64| -> ArrayRef { Arc::new(Float64Array::from_iter_values(rows.iter().map(get))) };
    let ratios =
        |get: fn(&TraceMetrics) -> Option<f64>| -> ArrayRef { Arc::new(Float64Array::from_iter(rows.iter().map(get))) };
    let trace_id: ArrayRef = Arc::new(record.column(0).as_string::<i32>().clone());
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("trace_id", trace_id),
        ("n_events", counts(|m| m.n_events)),
        ("critical_path_steps", counts(|m| m.critical_path_steps)),
        ("critical_path_s", reals(|m| m.critical_path_s)),
        ("total_work_steps", counts(|m| m.total_work_steps)),
        ("parallelism_efficiency", reals(|m| m.parallelism_efficiency)),
        ("critical_steps", counts(|m| m.critical_steps)),
        ("finish_rate", ratios(|m| m.finish_rate)),
        ("idle_agents", counts(|m| m.idle_agents)),
        ("utilization", ratios(|m| m.utilization)),
        ("protocol_overhead", ratios(|m| m.protocol_overhead)),
        ("message_redundancy", ratios(|m| m.message_redundancy)),
        ("error_amplification", ratios(|m| m.error_amplification)),
        ("max_concurrent_agents", counts(|m| m.max_concurrent_agents)),
        ("spawn_count", counts(|m| m.spawn_count)),
        ("despawn_count", counts(|m| m.despawn_count)),
        ("depth", record.column_by_name("depth").expect("derived column").clone()),
        ("max_branching", record.column_by_name("max_branching").expect("derived column").clone()),
        ("spawn_depth", counts(|m| m.spawn_depth)),
        ("spawn_branching", counts(|m| m.spawn_branching)),
    ];
    let fields: Vec<Field> = columns
        .iter()
        .map(|(name, array)| Field::new(*name, array.data_type().clone(), NULLABLE.contains(name)))
        .collect();
    let arrays = columns.into_iter().map(|(_, array)| array).collect();
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)?)
}
