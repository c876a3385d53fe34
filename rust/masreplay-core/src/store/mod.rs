//! Columnar storage of traces: the canonical Arrow layout, building it from traces, reading
//! traces back, ingesting foreign Arrow data, and Parquet files.

mod build;
mod column_checks;
mod concat;
mod ingest;
mod memory;
mod nulls;
mod parquet_io;
mod read;
pub mod schema;
mod structure;
mod take;

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, Int32Array, ListArray, RecordBatch, UInt32Array};
use arrow_schema::{Field, Schema};

pub use build::{AttributeTexts, batch_from_traces};
pub use ingest::{Ingested, ingest_batches, ingest_well_formed};
pub(crate) use ingest::{trim_lists, with_canonical_codes};
pub use memory::allocated_bytes;
pub(crate) use nulls::share_null_columns;
pub use parquet_io::{read_parquet, write_parquet};
pub(crate) use read::ChannelReader;
pub(crate) use read::same_text;
pub use read::{trace_at, trace_channel, trace_text_codes};
pub use structure::{WellFormed, batches_or_empty};
pub use take::take_texts;

use crate::error::{MasreplayError, Result};
use crate::trace::Trace;

/// An immutable batch of validated traces in the canonical layout.
#[derive(Clone, Debug)]
pub struct TraceBatch {
    batch: RecordBatch,
}

impl TraceBatch {
    /// Wraps a batch that already has the canonical schema and passed validation.
    pub(crate) fn from_canonical(batch: RecordBatch) -> Self {
        debug_assert_eq!(batch.schema().fields(), schema::canonical_schema().fields());
        TraceBatch { batch }
    }

    pub fn from_traces(traces: &[Trace]) -> Result<Self> {
        Ok(Self::from_canonical(batch_from_traces(traces)?))
    }

    /// [`Self::from_traces`] of traces whose events hold no attributes, each event's given
    /// instead as the JSON text of one object (`attributes[trace]`), as a converter wrote it.
    pub fn from_traces_and_attributes(traces: &[Trace], attributes: &[AttributeTexts]) -> Result<Self> {
        Ok(Self::from_canonical(build::batch_from_traces_and_attributes(traces, attributes)?))
    }

    /// Checks Arrow data in (or close to) the canonical layout; rejected traces are returned
    /// beside the batch of accepted ones.
    pub fn from_arrow(batches: &[RecordBatch]) -> Result<(Self, Vec<(usize, crate::error::ValidationError)>)> {
        Self::from_well_formed(&WellFormed::check(batches)?)
    }

    /// Parquet files in the canonical layout (or close to it), checked like any Arrow input;
    /// rejected traces are returned beside the batch of accepted ones, numbered across the
    /// files. Consecutive files of one schema are checked together; files whose schemas differ
    /// (one written without an optional column, or with a column nullable that another has
    /// not) are each brought to the canonical layout first and then joined, which Arrow could
    /// not do with the files' own columns.
    pub fn from_parquet_files(
        paths: &[std::path::PathBuf],
    ) -> Result<(Self, Vec<(usize, crate::error::ValidationError)>)> {
        let mut runs: Vec<WellFormed> = Vec::new();
        for path in paths {
            let file = read_parquet(path)?;
            let fields = |batches: &WellFormed| batches.first().map(|batch| batch.schema().fields().clone());
            match runs.last_mut() {
                Some(run) if fields(run) == fields(&file) || file.is_empty() => run.append(file),
                _ => runs.push(file),
            }
        }
        if runs.len() <= 1 {
            return Self::from_well_formed(&runs.pop().unwrap_or_default());
        }
        let (mut parts, mut rejected, mut rows_before) = (Vec::with_capacity(runs.len()), Vec::new(), 0);
        for run in &runs {
            let (part, refused) = Self::from_well_formed(run)?;
            rejected.extend(refused.into_iter().map(|(row, error)| (rows_before + row, error)));
            rows_before += run.iter().map(RecordBatch::num_rows).sum::<usize>();
            parts.push(part);
        }
        Ok((Self::concat(&parts.iter().collect::<Vec<_>>())?, rejected))
    }

    /// [`Self::from_arrow`] for data already proven well-formed (a Parquet file's batches).
    pub fn from_well_formed(batches: &WellFormed) -> Result<(Self, Vec<(usize, crate::error::ValidationError)>)> {
        let Ingested { batch, rejected } = ingest_well_formed(batches)?;
        Ok((Self::from_canonical(batch), rejected))
    }

    /// Arrow data that must hold only valid traces (masreplay's own state after an Arrow IPC
    /// round trip, a saved buffer): checked like any Arrow input, and the first rejected trace
    /// is the error instead of a report.
    pub fn from_arrow_strict(batches: &[RecordBatch]) -> Result<Self> {
        Self::from_well_formed_strict(&WellFormed::check(batches)?)
    }

    /// [`Self::from_arrow_strict`] for data already proven well-formed.
    pub fn from_well_formed_strict(batches: &WellFormed) -> Result<Self> {
        let Ingested { batch, rejected } = ingest_well_formed(batches)?;
        match rejected.into_iter().next() {
            Some((_, error)) => Err(error.into()),
            None => Ok(Self::from_canonical(batch)),
        }
    }

    /// Arrow data in the canonical layout that masreplay already validated, from a producer
    /// the caller proved (a writer's stream authenticated by a keyed digest): only the layout
    /// is checked (every batch has the canonical fields exactly), not the trace rules. Data of
    /// unproven origin goes through [`Self::from_arrow_strict`].
    pub fn from_validated_canonical(batches: &[RecordBatch]) -> Result<Self> {
        let schema = schema::canonical_schema();
        if batches.iter().any(|batch| batch.schema().fields() != schema.fields()) {
            let reason = "validated traces must come in the canonical schema".to_owned();
            return Err(MasreplayError::Arrow(arrow_schema::ArrowError::InvalidArgumentError(reason)));
        }
        if let [batch] = batches {
            return Ok(Self::from_canonical(RecordBatch::try_new(schema, batch.columns().to_vec())?));
        }
        // Joined dictionaries may come out re-coded: back to the vocabularies' codes.
        let joined = arrow_select::concat::concat_batches(&schema, batches)?;
        Ok(Self::from_canonical(with_canonical_codes(&joined)?))
    }

    pub fn empty() -> Self {
        Self::from_canonical(RecordBatch::new_empty(schema::canonical_schema()))
    }

    pub fn record_batch(&self) -> &RecordBatch {
        &self.batch
    }

    pub fn len(&self) -> usize {
        self.batch.num_rows()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn trace_ids(&self) -> Vec<&str> {
        self.batch.column(0).as_string::<i32>().iter().map(|id| id.unwrap_or_default()).collect()
    }

    fn list(&self, name: &str) -> &ListArray {
        self.batch.column_by_name(name).expect("canonical column").as_list()
    }

    fn offsets(&self, name: &str) -> Vec<i64> {
        let offsets = self.list(name).value_offsets();
        let first = offsets[0] as i64;
        offsets.iter().map(|&o| o as i64 - first).collect()
    }

    /// Start of each trace's events in [`Self::events`], plus the total (length n + 1).
    pub fn event_offsets(&self) -> Vec<i64> {
        self.offsets("events")
    }

    pub fn num_events(&self) -> usize {
        let offsets = self.list("events").value_offsets();
        (offsets[offsets.len() - 1] - offsets[0]) as usize
    }

    pub fn edge_offsets(&self) -> Vec<i64> {
        self.offsets("edges")
    }

    /// One row per element of a list column, led by `trace_index` and `trace_id`.
    fn flatten(&self, name: &str) -> Result<RecordBatch> {
        let list = self.list(name);
        let offsets = list.value_offsets();
        let (start, end) = (offsets[0] as usize, offsets[offsets.len() - 1] as usize);
        let items = list.values().slice(start, end - start);
        let items = items.as_struct();
        let trace_index: Int32Array = offsets
            .windows(2)
            .enumerate()
            .flat_map(|(i, w)| std::iter::repeat_n(i as i32, (w[1] - w[0]) as usize))
            .collect();
        let take_index = UInt32Array::from(trace_index.values().iter().map(|&i| i as u32).collect::<Vec<_>>());
        let trace_id = arrow_select::take::take(self.batch.column(0), &take_index, None)?;
        let mut fields = vec![
            Field::new("trace_index", arrow_schema::DataType::Int32, false),
            Field::new("trace_id", arrow_schema::DataType::Utf8, false),
        ];
        fields.extend(items.fields().iter().map(|f| f.as_ref().clone()));
        let mut columns: Vec<ArrayRef> = vec![Arc::new(trace_index), trace_id];
        columns.extend(items.columns().iter().cloned());
        Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?)
    }

    /// One per-trace column of the canonical layout (zero-copy).
    pub fn trace_field(&self, name: &str) -> Result<ArrayRef> {
        self.record_batch()
            .column_by_name(name)
            .cloned()
            .ok_or_else(|| MasreplayError::InvalidArgument(format!("traces have no field {name:?}")))
    }

    /// One field of every event (as in [`Self::events`]), without building the others.
    pub fn event_field(&self, name: &str) -> Result<ArrayRef> {
        let list = self.list("events");
        let offsets = list.value_offsets();
        let (start, end) = (offsets[0] as usize, offsets[offsets.len() - 1] as usize);
        let field = list
            .values()
            .as_struct()
            .column_by_name(name)
            .ok_or_else(|| MasreplayError::InvalidArgument(format!("events have no field {name:?}")))?;
        Ok(field.slice(start, end - start))
    }

    /// Every event of every trace, in trace order.
    pub fn events(&self) -> Result<RecordBatch> {
        self.flatten("events")
    }

    pub fn edges(&self) -> Result<RecordBatch> {
        self.flatten("edges")
    }

    fn check_index(&self, index: usize) -> Result<()> {
        if index < self.len() {
            Ok(())
        } else {
            Err(MasreplayError::InvalidArgument(format!(
                "trace index {index} out of range for a batch of {}",
                self.len()
            )))
        }
    }

    pub fn trace(&self, index: usize) -> Result<Trace> {
        self.check_index(index)?;
        Ok(trace_at(&self.batch, index))
    }

    /// The traces at `indices`, in that order (slices stay zero-copy where contiguous).
    pub fn take(&self, indices: &[usize]) -> Result<Self> {
        for &index in indices {
            self.check_index(index)?;
        }
        let take_index = UInt32Array::from(indices.iter().map(|&i| i as u32).collect::<Vec<_>>());
        let taken = arrow_select::take::take_record_batch(&self.batch, &take_index)?;
        Ok(Self::from_canonical(with_canonical_codes(&taken)?))
    }

    pub fn concat(batches: &[&TraceBatch]) -> Result<Self> {
        let records: Vec<&RecordBatch> = batches.iter().map(|b| &b.batch).collect();
        let joined = arrow_select::concat::concat_batches(&schema::canonical_schema(), records)?;
        Ok(Self::from_canonical(with_canonical_codes(&joined)?))
    }
}
