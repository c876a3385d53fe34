//! What the advantage code reads of a batch, downcast once: event and edge columns, their
//! offsets, each trace's event graph, agent numbers comparable across the batch, and the
//! order of an agent's own events (its turns).

use std::collections::HashMap;
use std::ops::Range;

use arrow_array::cast::AsArray;
use arrow_buffer::ArrowNativeType;

use crate::error::{MasreplayError, Result};
use crate::graph::Csr;
use crate::store::TraceBatch;
use crate::store::schema::{EdgeColumns, EventColumns, TraceColumns};

pub(crate) struct BatchView<'a> {
    pub events: EventColumns<'a>,
    edges: EdgeColumns<'a>,
    event_offsets: &'a [i32],
    edge_offsets: &'a [i32],
    /// `agent` dictionary key -> agent number (equal names, equal numbers).
    agent_of_key: Vec<u32>,
    pub n_agents: usize,
}

impl<'a> BatchView<'a> {
    pub fn new(batch: &'a TraceBatch) -> Self {
        let traces = TraceColumns::new(batch.record_batch());
        let events = traces.event_columns();
        let mut numbers: HashMap<&str, u32> = HashMap::new();
        let agent_of_key = events
            .agent
            .values()
            .as_string::<i32>()
            .iter()
            .map(|name| {
                let next = numbers.len() as u32;
                *numbers.entry(name.unwrap_or("")).or_insert(next)
            })
            .collect();
        BatchView {
            edges: traces.edge_columns(),
            event_offsets: traces.events.value_offsets(),
            edge_offsets: traces.edges.value_offsets(),
            agent_of_key,
            n_agents: numbers.len(),
            events,
        }
    }

    pub fn n_traces(&self) -> usize {
        self.event_offsets.len() - 1
    }

    pub fn n_events(&self) -> usize {
        (self.event_offsets[self.n_traces()] - self.event_offsets[0]) as usize
    }

    /// Positions of the trace's events in the batch-wide event arrays (0-based).
    pub fn events_of(&self, trace: usize) -> Range<usize> {
        let base = self.event_offsets[0];
        (self.event_offsets[trace] - base) as usize..(self.event_offsets[trace + 1] - base) as usize
    }

    /// Row of event position `e` in the Arrow event columns.
    pub fn column_row(&self, e: usize) -> usize {
        self.event_offsets[0] as usize + e
    }

    pub fn agent(&self, e: usize) -> u32 {
        self.agent_of_key[self.events.agent.keys().value(self.column_row(e)).as_usize()]
    }

    /// The trace's event graph by local index.
    pub fn graph(&self, trace: usize) -> Csr {
        let range = self.edge_offsets[trace] as usize..self.edge_offsets[trace + 1] as usize;
        let pairs: Vec<(u32, u32)> =
            range.map(|k| (self.edges.src.value(k) as u32, self.edges.dst.value(k) as u32)).collect();
        Csr::from_edges(self.events_of(trace).len(), &pairs)
    }

    /// Topological order of the trace's events (validated traces are acyclic).
    pub fn order(&self, trace: usize, graph: &Csr) -> Result<Vec<u32>> {
        graph.topological_order().map_err(|_| {
            MasreplayError::InvalidArgument(format!("trace {trace} of the batch has a cycle in its event graph"))
        })
    }

    /// Each event's position among its author's events ordered by (t, id): its turn.
    pub fn turns(&self, trace: usize) -> Vec<u32> {
        let range = self.events_of(trace);
        let start = range.start;
        let mut local: Vec<u32> = (0..range.len() as u32).collect();
        let key = |j: u32| {
            let row = self.column_row(start + j as usize);
            (self.agent(start + j as usize), self.events.t.value(row), self.events.id.value(row))
        };
        local.sort_by(|&a, &b| {
            let (ka, kb) = (key(a), key(b));
            ka.0.cmp(&kb.0).then(ka.1.total_cmp(&kb.1)).then(ka.2.cmp(kb.2))
        });
        let mut turns = vec![0u32; range.len()];
        for w in 0..local.len() {
            let same_agent =
                w > 0 && self.agent(start + local[w] as usize) == self.agent(start + local[w - 1] as usize);
            turns[local[w] as usize] = if same_agent { turns[local[w - 1] as usize] + 1 } else { 0 };
        }
        turns
    }

    /// Token count of event position `e`, where recorded.
    pub fn tokens(&self, e: usize) -> Option<i64> {
        let row = self.column_row(e);
        arrow_array::Array::is_valid(self.events.tokens, row).then(|| self.events.tokens.value(row))
    }
}
