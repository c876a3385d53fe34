//! Copying picked traces out of the buffer's chunks. A pick is cheap (chunk handles and row
//! ranges) and owns its chunks, so it outlives the buffer's lock; the copy is direct (one
//! slice per run of consecutive rows, no generic take kernel) and deferred, so a trainer that
//! reads one per-event field pays for that field only.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{ArrowPrimitiveType, Float64Type, Int64Type};
use arrow_array::{Array, ArrayRef, PrimitiveArray, RecordBatch};
use arrow_schema::DataType;
use rayon::prelude::*;

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
    /// Traces of several batches: `picks` are (position in `batches`, row) per trace, in
    /// output order (how a sharded buffer joins its shards' answers without copying them).
    pub fn of_batches(batches: &[TraceBatch], picks: &[(usize, usize)]) -> Result<Self> {
        if let Some(&(batch, row)) =
            picks.iter().find(|&&(batch, row)| batches.get(batch).is_none_or(|b| row >= b.len()))
        {
            return Err(MasreplayError::InvalidArgument(format!(
                "pick (batch {batch}, row {row}) is outside the {} given batch(es)",
                batches.len()
            )));
        }
        let chunks = batches.iter().map(|b| b.record_batch().clone()).collect();
        Ok(Gather::new(chunks, picks.iter().copied()))
    }

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

    /// One canonical column of each run's chunk, by run. Every chunk has the canonical
    /// schema, so the column's position is looked up once rather than by name per run.
    fn column_by_run<'a>(&'a self, name: &str) -> impl Fn(&Run) -> &'a ArrayRef + 'a {
        let index = self.chunks.first().map_or(0, |chunk| chunk.schema_ref().index_of(name).expect("canonical column"));
        move |run: &Run| self.chunks[run.chunk].column(index)
    }

    pub fn trace_ids(&self) -> Vec<&str> {
        let mut ids = Vec::with_capacity(self.len);
        let trace_id = self.column_by_run("trace_id");
        for run in &self.runs {
            let column = trace_id(run).as_string::<i32>();
            ids.extend((run.start..run.start + run.len).map(|row| column.value(row)));
        }
        ids
    }

    /// Start of each picked trace's events in the gathered event columns, plus the total.
    /// Read from the events' list offsets, which [`Self::event_field`] reads too: a trainer
    /// asking for both finds them in cache.
    pub fn event_offsets(&self) -> Vec<i64> {
        let mut offsets = Vec::with_capacity(self.len + 1);
        let mut total = 0i64;
        offsets.push(0);
        let events = self.column_by_run("events");
        for run in &self.runs {
            let starts = &events(run).as_list::<i32>().value_offsets()[run.start..=run.start + run.len];
            for pair in starts.windows(2) {
                total += (pair[1] - pair[0]) as i64;
                offsets.push(total);
            }
        }
        offsets
    }

    pub fn num_events(&self) -> usize {
        *self.event_offsets().last().expect("offsets start with 0") as usize
    }

    /// (the field's column in the run's chunk, first event, number of events) per run.
    fn ranges(&self, name: &str) -> Result<Vec<(&ArrayRef, usize, usize)>> {
        let Some((index, _)) = schema::event_fields().find(name) else {
            return Err(MasreplayError::InvalidArgument(format!("events have no field {name:?}")));
        };
        let events = self.column_by_run("events");
        Ok(self
            .runs
            .iter()
            .map(|run| {
                let events = events(run).as_list::<i32>();
                let offsets = events.value_offsets();
                let (start, end) = (offsets[run.start] as usize, offsets[run.start + run.len] as usize);
                (events.values().as_struct().column(index), start, end - start)
            })
            .collect())
    }

    /// One per-event field of every picked trace, in pick order: a 64-bit number field
    /// without nulls as owned values (a caller may take the buffer), any other as an array.
    pub fn gather_event_field(&self, name: &str) -> Result<Gathered> {
        let ranges = self.ranges(name)?;
        if let Some(numbers) = gather_numbers(&ranges) {
            return Ok(numbers);
        }
        let slices: Vec<ArrayRef> = ranges.iter().map(|&(field, start, len)| field.slice(start, len)).collect();
        Ok(Gathered::Array(concat_or_empty(&slices, || self.empty_event_field(name))?))
    }

    /// One per-event field of every picked trace, in pick order (as `TraceBatch::event_field`
    /// of the collected batch would give it).
    pub fn event_field(&self, name: &str) -> Result<ArrayRef> {
        Ok(self.gather_event_field(name)?.into_array())
    }

    /// A 64-bit number field without nulls as one row per picked trace, padded with `pad` to
    /// the longest (for trainers that take a rectangle, not offsets), copied straight from the
    /// chunks; None for any other field or pad (the caller pads the gathered array).
    pub fn padded_numbers(&self, name: &str, pad: PadValue) -> Result<Option<PaddedNumbers>> {
        let ranges = self.ranges(name)?;
        let Some((first, _, _)) = ranges.first() else { return Ok(None) };
        if ranges.iter().any(|(column, _, _)| column.null_count() > 0) {
            return Ok(None);
        }
        let float_pad = match pad {
            PadValue::Int(pad) => pad as f64,
            PadValue::Float(pad) => pad,
        };
        Ok(match (first.data_type(), pad) {
            (DataType::Int64, PadValue::Int(pad)) => Some(PaddedNumbers::Int64(self.pad::<Int64Type>(&ranges, pad))),
            (DataType::Float64, _) => Some(PaddedNumbers::Float64(self.pad::<Float64Type>(&ranges, float_pad))),
            _ => None,
        })
    }

    /// The picked traces' values of a primitive event field without nulls (its `ranges`, one
    /// per run), padded.
    fn pad<T: ArrowPrimitiveType>(&self, ranges: &[(&ArrayRef, usize, usize)], pad: T::Native) -> Padded<T::Native> {
        let events = self.column_by_run("events");
        let mut rows = Vec::with_capacity(self.len);
        for (run, &(column, _, _)) in self.runs.iter().zip(ranges) {
            let values = column.as_primitive::<T>().values();
            let offsets = &events(run).as_list::<i32>().value_offsets()[run.start..=run.start + run.len];
            rows.extend(offsets.windows(2).map(|pair| &values[pair[0] as usize..pair[1] as usize]));
        }
        pad_rows(&rows, pad)
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

/// Below this many bytes a gathered column is copied by the calling thread alone. Handing a
/// copy to the rayon threads costs their wake-up (tens of microseconds when a training loop
/// samples between steps): measured on 256 traces of 1,000 tokens (2 MB of int64), one thread
/// was faster; from several megabytes on, two threads' memory bandwidth wins.
pub(super) const PARALLEL_COPY_BYTES: usize = 1 << 23;

/// A gathered per-event field.
pub enum Gathered {
    /// 64-bit integers without nulls, copied out of the chunks.
    Int64(Vec<i64>),
    /// 64-bit floats without nulls, copied out of the chunks.
    Float64(Vec<f64>),
    /// Any other field.
    Array(ArrayRef),
}

impl Gathered {
    pub fn into_array(self) -> ArrayRef {
        match self {
            Gathered::Int64(values) => Arc::new(PrimitiveArray::<Int64Type>::new(values.into(), None)),
            Gathered::Float64(values) => Arc::new(PrimitiveArray::<Float64Type>::new(values.into(), None)),
            Gathered::Array(array) => array,
        }
    }
}

/// The ranges (column, first, length) of a 64-bit number column without nulls, copied
/// straight from the chunks' value buffers (no array per range); None for other columns,
/// which go through arrow's concat.
fn gather_numbers(ranges: &[(&ArrayRef, usize, usize)]) -> Option<Gathered> {
    let (first, _, _) = ranges.first()?;
    if ranges.iter().any(|(column, _, _)| column.null_count() > 0) {
        return None;
    }
    match first.data_type() {
        DataType::Int64 => Some(Gathered::Int64(gather_values::<Int64Type>(ranges))),
        DataType::Float64 => Some(Gathered::Float64(gather_values::<Float64Type>(ranges))),
        _ => None,
    }
}

/// A pad value as the caller gives it: an integer pads an integer field; a float field takes
/// either (as `numpy.result_type` would type the result).
#[derive(Clone, Copy, Debug)]
pub enum PadValue {
    Int(i64),
    Float(f64),
}

/// One row per trace, padded to the longest: `values` and `mask` (true at real events) are
/// row-major `(rows, width)`, `lengths` the events per row.
pub struct Padded<N> {
    pub values: Vec<N>,
    pub mask: Vec<bool>,
    pub lengths: Vec<i64>,
    pub width: usize,
}

/// A padded 64-bit number field.
pub enum PaddedNumbers {
    Int64(Padded<i64>),
    Float64(Padded<f64>),
}

/// `rows` padded with `pad` to the longest. The output starts as `pad` everywhere (zero pads
/// come from the allocator as fresh zeroed pages) and each row's events are copied in.
fn pad_rows<N: Copy>(rows: &[&[N]], pad: N) -> Padded<N> {
    let width = rows.iter().map(|row| row.len()).max().unwrap_or(0);
    let mut values = vec![pad; rows.len() * width];
    let mut mask = vec![false; rows.len() * width];
    for (i, row) in rows.iter().enumerate() {
        values[i * width..i * width + row.len()].copy_from_slice(row);
        mask[i * width..i * width + row.len()].fill(true);
    }
    let lengths = rows.iter().map(|row| row.len() as i64).collect();
    Padded { values, mask, lengths, width }
}

/// Part of an output buffer and the sources that fill it, in order.
type CopyJob<'a, N> = (&'a mut [std::mem::MaybeUninit<N>], &'a [&'a [N]]);

fn gather_values<T: ArrowPrimitiveType>(ranges: &[(&ArrayRef, usize, usize)]) -> Vec<T::Native> {
    let sources: Vec<&[T::Native]> =
        ranges.iter().map(|&(column, start, len)| &column.as_primitive::<T>().values()[start..start + len]).collect();
    let total: usize = sources.iter().map(|source| source.len()).sum();
    let threads = if total * size_of::<T::Native>() < PARALLEL_COPY_BYTES { 1 } else { rayon::current_num_threads() };
    let mut out: Vec<T::Native> = Vec::with_capacity(total);
    // One job per thread: consecutive sources of about equal length, and the part of the
    // output they fill.
    let share = total.div_ceil(threads);
    let mut jobs = Vec::with_capacity(threads);
    let mut rest = &mut out.spare_capacity_mut()[..total];
    let mut first = 0;
    while first < sources.len() {
        let (mut last, mut len) = (first, 0);
        while last < sources.len() && (len < share || last == first) {
            len += sources[last].len();
            last += 1;
        }
        let (part, tail) = rest.split_at_mut(len);
        jobs.push((part, &sources[first..last]));
        rest = tail;
        first = last;
    }
    let copy = |(part, sources): CopyJob<'_, T::Native>| {
        let mut at = 0;
        for source in sources {
            part[at..at + source.len()].write_copy_of_slice(source);
            at += source.len();
        }
    };
    if jobs.len() > 1 {
        jobs.into_par_iter().for_each(copy)
    } else {
        jobs.into_iter().for_each(copy)
    }
    // SAFETY: the jobs' parts split the first `total` slots between them, and each job wrote
    // every slot of its part (its sources' lengths sum to the part's length).
    unsafe { out.set_len(total) };
    out
}
