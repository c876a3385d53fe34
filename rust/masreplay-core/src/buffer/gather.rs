//! Copying picked traces out of the buffer's chunks. A pick is cheap (chunk handles and row
//! ranges) and owns its chunks, so it outlives the buffer's lock; the copy is direct (one
//! slice per run of consecutive rows, no generic take kernel) and deferred, so a trainer that
//! reads one per-event field pays for that field only.

use arrow_array::cast::AsArray;
use arrow_array::types::Int32Type;
use arrow_array::{Array, ArrayRef, RecordBatch};

use crate::error::{MasreplayError, Result};
use crate::store::{TraceBatch, schema};

/// Consecutive rows of one chunk.
#[derive(Clone, Copy, Debug)]
struct Run {
    chunk: usize,
    start: usize,
    len: usize,
}

/// Stored traces picked for output, in the order they were picked.
#[derive(Clone, Debug, Default)]
pub struct Gather {
    chunks: Vec<RecordBatch>,
    runs: Vec<Run>,
    len: usize,
}

impl Gather {
    /// `picks` are (position in `chunks`, row) per trace, in output order.
    pub(super) fn new(chunks: Vec<RecordBatch>, picks: impl IntoIterator<Item = (usize, usize)>) -> Self {
        let mut runs: Vec<Run> = Vec::new();
        let mut len = 0;
        for (chunk, row) in picks {
            len += 1;
            match runs.last_mut() {
                Some(run) if run.chunk == chunk && run.start + run.len == row => run.len += 1,
                _ => runs.push(Run { chunk, start: row, len: 1 }),
            }
        }
        Gather { chunks, runs, len }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn column(&self, run: &Run, name: &str) -> &ArrayRef {
        self.chunks[run.chunk].column_by_name(name).expect("canonical column")
    }

    pub fn trace_ids(&self) -> Vec<&str> {
        let mut ids = Vec::with_capacity(self.len);
        for run in &self.runs {
            let column = self.column(run, "trace_id").as_string::<i32>();
            ids.extend((run.start..run.start + run.len).map(|row| column.value(row)));
        }
        ids
    }

    /// Start of each picked trace's events in the gathered event columns, plus the total.
    pub fn event_offsets(&self) -> Vec<i64> {
        let mut offsets = Vec::with_capacity(self.len + 1);
        let mut total = 0i64;
        offsets.push(0);
        for run in &self.runs {
            let n_events = self.column(run, "n_events").as_primitive::<Int32Type>();
            for &n in &n_events.values()[run.start..run.start + run.len] {
                total += n as i64;
                offsets.push(total);
            }
        }
        offsets
    }

    pub fn num_events(&self) -> usize {
        *self.event_offsets().last().expect("offsets start with 0") as usize
    }

    /// One per-event field of every picked trace, in pick order (as `TraceBatch::event_field`
    /// of the collected batch would give it).
    pub fn event_field(&self, name: &str) -> Result<ArrayRef> {
        if schema::event_fields().find(name).is_none() {
            return Err(MasreplayError::InvalidArgument(format!("events have no field {name:?}")));
        }
        let slices: Vec<ArrayRef> = self
            .runs
            .iter()
            .map(|run| {
                let events = self.column(run, "events").as_list::<i32>();
                let offsets = events.value_offsets();
                let (start, end) = (offsets[run.start] as usize, offsets[run.start + run.len] as usize);
                let field = events.values().as_struct().column_by_name(name).expect("canonical event field");
                field.slice(start, end - start)
            })
            .collect();
        concat_or_empty(&slices, || self.empty_event_field(name))
    }

    fn empty_event_field(&self, name: &str) -> ArrayRef {
        TraceBatch::empty().event_field(name).expect("canonical event field")
    }

    /// The picked traces as one batch in the canonical layout.
    pub fn collect(&self) -> Result<TraceBatch> {
        let slices: Vec<TraceBatch> = self
            .runs
            .iter()
            .map(|run| TraceBatch::from_canonical(self.chunks[run.chunk].slice(run.start, run.len)))
            .collect();
        match slices.as_slice() {
            [] => Ok(TraceBatch::empty()),
            [only] => Ok(only.clone()),
            _ => TraceBatch::concat(&slices.iter().collect::<Vec<_>>()),
        }
    }
}

fn concat_or_empty(slices: &[ArrayRef], empty: impl FnOnce() -> ArrayRef) -> Result<ArrayRef> {
    match slices {
        [] => Ok(empty()),
        [only] => Ok(only.clone()),
        _ => {
            let refs: Vec<&dyn Array> = slices.iter().map(|a| a.as_ref()).collect();
            Ok(arrow_select::concat::concat(&refs)?)
        }
    }
}
