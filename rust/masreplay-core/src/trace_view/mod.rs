//! One view of the traces of a batch, between [`crate::store`] and the estimators: the
//! Arrow columns downcast once, each trace's event and edge ranges, its event graph both
//! ways, agent numbers comparable across the batch, and the rules every estimator shares,
//! each defined here once:
//! - time order: events by (t, id), never by row, so results ignore the input order;
//! - roles: what an event's `role` says about its author ([`Role`]);
//! - tool results: a tool_result's `agent` names the tool, so it acts for the author of the
//!   event that called it ([`BatchView::tool_calls`]);
//! - spawns, the spawn tree and the orchestrator: see [`agents`].
//!
//! Events are named by their position among the batch's events (aligned with
//! `TraceBatch::events()`), or by their local index within their trace where a method says so.

pub mod agents;
#[cfg(test)]
pub(crate) mod tests;

use std::cmp::Ordering;
use std::collections::HashMap;
use std::ops::Range;

use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch, StringArray};
use arrow_buffer::ArrowNativeType;

use crate::error::{MasreplayError, Result};
use crate::graph::Csr;
use crate::prefetch::prefetch_all;
use crate::rank_sort::{KEY_MAX, RANKED_MAX, sort_distinct};
use crate::store::schema::{EdgeColumns, EventColumns, TraceColumns};
use crate::store::{TraceBatch, same_text};
use crate::trace::EventType;

pub use agents::{Claim, TraceAgent, TraceAgents};

/// Marks "no event" and "no agent" in the view's index arrays.
pub const NONE: u32 = u32::MAX;

/// An integer that sorts as [`f64::total_cmp`] sorts the float: the sign bit flipped on
/// positive numbers, every bit on negative ones.
#[inline]
pub fn total_order_key(x: f64) -> u64 {
    let bits = x.to_bits();
    if bits >> 63 == 0 { bits | 1 << 63 } else { !bits }
}

/// Sorts by `earlier` each run of `order` whose places `tie` with the run's first.
#[inline]
fn sort_tied_runs(order: &mut [u32], tie: impl Fn(usize, usize) -> bool, earlier: impl Fn(u32, u32) -> Ordering) {
    let mut first = 0;
    while first < order.len() {
        let tied = (first + 1..order.len()).take_while(|&place| tie(first, place)).count();
        if tied > 0 {
            order[first..=first + tied].sort_unstable_by(|&a, &b| earlier(a, b));
        }
        first += tied + 1;
    }
}

/// What an event's `role` says about its author, for finding the orchestrator.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Role {
    /// `orchestrator`, or `lead` (the seed schema example's name for it).
    Orchestrator,
    /// `human`, `user`, `harness`, `monitor`, `tool`: acts on the trace, never orchestrates it.
    NotAnAgent,
    /// Any other role, or none.
    Other,
}

impl Role {
    pub fn of(name: &str) -> Role {
        match name {
            "orchestrator" | "lead" => Role::Orchestrator,
            "human" | "user" | "harness" | "monitor" | "tool" => Role::NotAnAgent,
            _ => Role::Other,
        }
    }
}

/// The traces of a batch as the estimators read them.
pub struct BatchView<'a> {
    pub trace_id: &'a StringArray,
    pub events: EventColumns<'a>,
    pub edges: EdgeColumns<'a>,
    /// Row of the batch's first event in the event columns.
    base: usize,
    event_offsets: &'a [i32],
    edge_offsets: &'a [i32],
    // The hot columns' values, from the batch's first event (indexed by event position).
    t: &'a [f64],
    type_codes: &'a [i8],
    agent_keys: &'a [i32],
    to_keys: &'a [i32],
    role_keys: &'a [i32],
    src: &'a [i32],
    dst: &'a [i32],
    /// `agent` dictionary key -> agent number (equal names, equal numbers).
    agent_of_key: Vec<u32>,
    /// `to` dictionary key -> agent number.
    agent_of_to: Vec<u32>,
    /// Names of the agent numbers: the authors' first, then names only `to` gives.
    agent_names: Vec<&'a str>,
    n_authors: usize,
    /// `role` dictionary key -> what the role says about its event's author.
    role_of_key: Vec<Role>,
}

impl<'a> BatchView<'a> {
    pub fn new(batch: &'a TraceBatch) -> Self {
        Self::of_record_batch(batch.record_batch())
    }

    /// The view of a record batch of the canonical schema.
    pub fn of_record_batch(record: &'a RecordBatch) -> Self {
        let traces = TraceColumns::new(record);
        let events = traces.event_columns();
        let edges = traces.edge_columns();
        let event_offsets = traces.events.value_offsets();
        let base = event_offsets[0] as usize;
        let mut numbers: HashMap<&str, u32> = HashMap::new();
        let mut agent_names = Vec::new();
        let mut number = |name: Option<&'a str>| {
            let name = name.unwrap_or("");
            *numbers.entry(name).or_insert_with(|| {
                agent_names.push(name);
                agent_names.len() as u32 - 1
            })
        };
        let agent_of_key: Vec<u32> = events.agent.values().as_string::<i32>().iter().map(&mut number).collect();
        let n_authors = agent_of_key.iter().max().map_or(0, |&m| m as usize + 1);
        let agent_of_to = events.to.values().as_string::<i32>().iter().map(&mut number).collect();
        let role_of_key = events.role.values().as_string::<i32>().iter().map(|n| Role::of(n.unwrap_or(""))).collect();
        let edge_base = traces.edges.value_offsets()[0] as usize;
        BatchView {
            trace_id: traces.trace_id,
            base,
            event_offsets,
            edge_offsets: traces.edges.value_offsets(),
            t: &events.t.values()[base..],
            type_codes: &events.event_type.keys().values()[base..],
            agent_keys: &events.agent.keys().values()[base..],
            to_keys: &events.to.keys().values()[base..],
            role_keys: &events.role.keys().values()[base..],
            src: &edges.src.values()[edge_base..],
            dst: &edges.dst.values()[edge_base..],
            agent_of_key,
            agent_of_to,
            agent_names,
            n_authors,
            role_of_key,
            events,
            edges,
        }
    }

    pub fn n_traces(&self) -> usize {
        self.event_offsets.len() - 1
    }

    pub fn n_events(&self) -> usize {
        (self.event_offsets[self.n_traces()] - self.event_offsets[0]) as usize
    }

    /// Positions of the trace's events among the batch's events.
    #[inline]
    pub fn events_of(&self, trace: usize) -> Range<usize> {
        let base = self.event_offsets[0];
        (self.event_offsets[trace] - base) as usize..(self.event_offsets[trace + 1] - base) as usize
    }

    /// Positions of the trace's edges among the batch's edges.
    pub fn edges_of(&self, trace: usize) -> Range<usize> {
        let base = self.edge_offsets[0];
        (self.edge_offsets[trace] - base) as usize..(self.edge_offsets[trace + 1] - base) as usize
    }

    /// The trace's edges as (sources, destinations), by local event index, in stored order.
    #[inline]
    pub fn edge_pairs(&self, trace: usize) -> (&'a [i32], &'a [i32]) {
        let range = self.edges_of(trace);
        (&self.src[range.clone()], &self.dst[range])
    }

    /// Row of event position `e` in the Arrow event columns.
    #[inline]
    pub fn column_row(&self, e: usize) -> usize {
        self.base + e
    }

    /// The local index of the event `event_id` of `trace`.
    pub fn event_index(&self, trace: usize, event_id: &str) -> Option<u32> {
        self.events_of(trace).position(|e| same_text(self.id(e), event_id)).map(|j| j as u32)
    }

    #[inline]
    pub fn id(&self, e: usize) -> &'a str {
        self.events.id.value(self.column_row(e))
    }

    #[inline]
    pub fn t(&self, e: usize) -> f64 {
        self.t[e]
    }

    #[inline]
    pub fn event_type(&self, e: usize) -> EventType {
        EventType::from_code(self.type_codes[e] as usize).expect("canonical event type codes")
    }

    /// Number of agent numbers: every author's and every name a `to` gives.
    pub fn n_agent_names(&self) -> usize {
        self.agent_names.len()
    }

    /// Number of authors: their agent numbers are `0..n_authors()`.
    pub fn n_authors(&self) -> usize {
        self.n_authors
    }

    pub fn agent_name(&self, agent: u32) -> &'a str {
        self.agent_names[agent as usize]
    }

    /// The agent number of the author of event `e` (a null author is named "").
    #[inline]
    pub fn agent(&self, e: usize) -> u32 {
        self.agent_of_key[self.agent_keys[e].as_usize()]
    }

    /// The agent a spawn, despawn, message or return addresses.
    #[inline]
    pub fn to(&self, e: usize) -> Option<u32> {
        self.events.to.is_valid(self.column_row(e)).then(|| self.agent_of_to[self.to_keys[e].as_usize()])
    }

    #[inline]
    pub fn role(&self, e: usize) -> Role {
        let row = self.column_row(e);
        if self.events.role.is_valid(row) { self.role_of_key[self.role_keys[e].as_usize()] } else { Role::Other }
    }

    /// Token count of event `e`, where recorded.
    #[inline]
    pub fn tokens(&self, e: usize) -> Option<i64> {
        let row = self.column_row(e);
        self.events.tokens.is_valid(row).then(|| self.events.tokens.value(row))
    }

    /// Every event's token count, NaN where not recorded (one pass over the column).
    pub fn tokens_or_nan(&self) -> Vec<f64> {
        let rows = self.base..self.base + self.n_events();
        let values = &self.events.tokens.values()[rows.clone()];
        match self.events.tokens.nulls() {
            None => values.iter().map(|&t| t as f64).collect(),
            Some(valid) => {
                values.iter().zip(rows).map(|(&t, row)| if valid.is_valid(row) { t as f64 } else { f64::NAN }).collect()
            }
        }
    }

    #[inline]
    pub fn duration_s(&self, e: usize) -> Option<f64> {
        let row = self.column_row(e);
        self.events.duration_s.is_valid(row).then(|| self.events.duration_s.value(row))
    }

    /// The content_ref of event `e`, where recorded.
    #[inline]
    pub fn content_ref(&self, e: usize) -> Option<&'a str> {
        let row = self.column_row(e);
        self.events.content_ref.is_valid(row).then(|| self.events.content_ref.value(row))
    }

    /// Whether event `e` is a tool_result marked `trusted: false`.
    #[inline]
    pub fn untrusted(&self, e: usize) -> bool {
        let row = self.column_row(e);
        self.events.trusted.is_valid(row) && !self.events.trusted.value(row)
    }

    /// Asks the CPU for the trace's rows of the event columns that a walk in time order
    /// reads: where events are stored shuffled, such a walk jumps about those rows in an
    /// order the hardware prefetcher cannot follow.
    pub fn prefetch_events(&self, trace: usize) {
        let range = self.events_of(trace);
        let rows = self.column_row(range.start)..self.column_row(range.end);
        prefetch_all(&self.type_codes[range.clone()]);
        prefetch_all(&self.agent_keys[range.clone()]);
        prefetch_all(&self.to_keys[range.clone()]);
        prefetch_all(&self.role_keys[range]);
        prefetch_all(&self.events.tokens.values()[rows.clone()]);
        prefetch_all(&self.events.duration_s.values()[rows.clone()]);
        let text = self.events.content_ref.value_offsets();
        prefetch_all(&text[rows.clone()]);
        prefetch_all(&self.events.content_ref.value_data()[text[rows.start] as usize..text[rows.end] as usize]);
    }

    /// The time order of two events: by (t, id). Ids are unique within a trace, so two
    /// events of one trace are never equal.
    #[inline]
    pub fn earlier(&self, a: usize, b: usize) -> Ordering {
        self.t[a].total_cmp(&self.t[b]).then_with(|| self.id(a).cmp(self.id(b)))
    }

    /// `order`: the trace's events (local indices) in time order. Events already stored in
    /// that order (the usual case) are only checked, not sorted, and ids only compared
    /// where times tie. Otherwise they are sorted as integers, each its time's
    /// [`total_order_key`] cut to its high bits, with its index in the low bits: that orders
    /// events whose times differ in the kept bits, and only the events whose kept bits tie
    /// are then sorted by (t, id) proper. A trace of at most [`RANKED_MAX`] events keeps
    /// 31 bits in all, its keys taken less the earliest's so that the kept bits are those
    /// where its times differ, and sorts them by rank (see [`crate::rank_sort`]); a longer
    /// one keeps 64 bits (`keys` is the buffer).
    #[inline]
    pub fn time_order_into(&self, trace: usize, order: &mut Vec<u32>, keys: &mut Vec<u64>) {
        let range = self.events_of(trace);
        let (start, n) = (range.start, range.len());
        order.clear();
        let earlier = |a: u32, b: u32| self.earlier(start + a as usize, start + b as usize);
        let times = &self.t[range];
        let times_increase = times.windows(2).all(|pair| pair[0] < pair[1]);
        if times_increase || (1..n as u32).all(|j| earlier(j - 1, j).is_lt()) {
            order.extend(0..n as u32);
            return;
        }
        // n >= 2 here, and at most 2^32 events, so the index takes 1 to 32 bits.
        let index_bits = u64::BITS - ((n - 1) as u64).leading_zeros();
        let index_mask = (1u64 << index_bits) - 1;
        // Keys are distinct, as their indices are; two tie where their bits above the
        // index are equal.
        if n <= RANKED_MAX {
            let (low, high) = times
                .iter()
                .map(|&t| total_order_key(t))
                .fold((u64::MAX, 0), |(low, high), key| (low.min(key), high.max(key)));
            // Shifting the offsets right keeps their order (ties aside) in what fits.
            let time_bits = KEY_MAX.count_ones() - index_bits;
            let shift = (u64::BITS - (high - low).leading_zeros()).saturating_sub(time_bits);
            let mut short = [0u32; RANKED_MAX];
            for ((key, &t), j) in short.iter_mut().zip(times).zip(0u32..) {
                *key = (((total_order_key(t) - low) >> shift) as u32) << index_bits | j;
            }
            order.resize(n, 0);
            sort_distinct(&short, order);
            let tie = |a: u32, b: u32| (a ^ b) >> index_bits == 0;
            // Times that tie in the kept bits are rare: one branch-free look for a tie
            // between neighbours spares the scan run by run.
            let any_tie = order.windows(2).fold(false, |any, pair| any | tie(pair[0], pair[1]));
            if any_tie {
                short[..n].copy_from_slice(order);
            }
            for key in order.iter_mut() {
                *key &= index_mask as u32;
            }
            if any_tie {
                sort_tied_runs(order, |a, b| tie(short[a], short[b]), earlier);
            }
        } else {
            keys.clear();
            keys.extend(times.iter().zip(0u64..).map(|(&t, j)| total_order_key(t) & !index_mask | j));
            keys.sort_unstable();
            order.extend(keys.iter().map(|&key| (key & index_mask) as u32));
            sort_tied_runs(order, |a, b| (keys[a] ^ keys[b]) >> index_bits == 0, earlier);
        }
    }

    /// The trace's events (local indices) in time order.
    pub fn time_order(&self, trace: usize) -> Vec<u32> {
        let mut order = Vec::new();
        self.time_order_into(trace, &mut order, &mut Vec::new());
        order
    }

    /// Each event's position among its author's events in time order: its turn.
    pub fn turns(&self, trace: usize) -> Vec<u32> {
        let start = self.events_of(trace).start;
        let mut order = self.time_order(trace);
        // Stable: each agent's events stay in time order.
        order.sort_by_key(|&j| self.agent(start + j as usize));
        let mut turns = vec![0u32; order.len()];
        for w in 1..order.len() {
            let (previous, this) = (order[w - 1] as usize, order[w] as usize);
            if self.agent(start + this) == self.agent(start + previous) {
                turns[this] = turns[previous] + 1;
            }
        }
        turns
    }

    /// The trace's event graph by local index (outgoing edges).
    pub fn graph(&self, trace: usize) -> Csr {
        let (src, dst) = self.edge_pairs(trace);
        let pairs: Vec<(u32, u32)> = src.iter().zip(dst).map(|(&s, &d)| (s as u32, d as u32)).collect();
        Csr::from_edges(self.events_of(trace).len(), &pairs)
    }

    /// The trace's event graph with every edge reversed (incoming edges).
    pub fn graph_in(&self, trace: usize) -> Csr {
        let (src, dst) = self.edge_pairs(trace);
        let pairs: Vec<(u32, u32)> = src.iter().zip(dst).map(|(&s, &d)| (d as u32, s as u32)).collect();
        Csr::from_edges(self.events_of(trace).len(), &pairs)
    }

    /// Topological order of the trace's events (validated traces are acyclic).
    pub fn topological_order(&self, trace: usize, graph: &Csr) -> Result<Vec<u32>> {
        graph.topological_order().map_err(|_| {
            MasreplayError::InvalidArgument(format!("trace {trace} of the batch has a cycle in its event graph"))
        })
    }

    /// For each event of `trace` (local index), the event that called it, or [`NONE`]: a
    /// tool_result's call is the event with an edge into it that is not a tool_result itself
    /// (the last such edge in stored order, where there are several).
    pub fn tool_calls(&self, trace: usize) -> Vec<u32> {
        let start = self.events_of(trace).start;
        let mut calls = vec![NONE; self.events_of(trace).len()];
        let is_result = |j: i32| self.event_type(start + j as usize) == EventType::ToolResult;
        let (src, dst) = self.edge_pairs(trace);
        for (&s, &d) in src.iter().zip(dst) {
            if is_result(d) && !is_result(s) {
                calls[d as usize] = s as u32;
            }
        }
        calls
    }

    /// The agent each event of `trace` acts for (local index -> agent number): its author,
    /// except that a tool_result, whose `agent` names the tool, acts for its caller's author.
    pub fn acting_agents(&self, trace: usize) -> Vec<u32> {
        let start = self.events_of(trace).start;
        let calls = self.tool_calls(trace);
        (0..calls.len()).map(|j| self.agent(start + if calls[j] == NONE { j } else { calls[j] as usize })).collect()
    }
}
