//! Saving and restoring a buffer: the canonical table of its traces in insertion order, one
//! extra `buffer_priority` column, and the buffer's settings in the schema metadata. The same
//! record batch goes to Parquet (save/load) and to Arrow IPC (pickling, in Python).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Float64Type;
use arrow_array::{ArrayRef, Float64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use serde_json::{Value, json};

use super::{GraphBuffer, Unit};
use crate::error::{MasreplayError, Result};
use crate::store::{TraceBatch, read_parquet, write_parquet};

const STATE_KEY: &str = "masreplay.buffer";
const PRIORITY_COLUMN: &str = "buffer_priority";

fn corrupt(reason: impl Into<String>) -> MasreplayError {
    MasreplayError::Parquet(parquet::errors::ParquetError::General(format!(
        "not a saved GraphBuffer: {}",
        reason.into()
    )))
}

impl GraphBuffer {
    /// The buffer as one record batch (see module docs).
    pub fn persisted_batch(&self) -> Result<RecordBatch> {
        let traces = self.to_batch()?;
        let record = traces.record_batch();
        let state = json!({
            "capacity": self.capacity,
            "unit": self.unit.as_str(),
            "seed": self.seed,
            "calls": self.calls,
            "max_priority": self.max_priority,
            "policy_version": self.policy_version,
            "max_staleness": self.max_staleness,
        });
        let mut metadata: HashMap<String, String> = record.schema().metadata().clone();
        metadata.insert(STATE_KEY.to_owned(), state.to_string());
        let mut fields: Vec<Field> = record.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.push(Field::new(PRIORITY_COLUMN, DataType::Float64, false));
        let mut columns: Vec<ArrayRef> = record.columns().to_vec();
        columns.push(Arc::new(Float64Array::from(self.priorities_in_order())));
        Ok(RecordBatch::try_new(Arc::new(Schema::new_with_metadata(fields, metadata)), columns)?)
    }

    /// Rebuilds a buffer from [`Self::persisted_batch`] output (possibly split in batches).
    /// With `trusted` (unpickling masreplay's own bytes), traces in the canonical layout are
    /// not validated again; files read from disk always are.
    pub fn restore(batches: &[RecordBatch], trusted: bool) -> Result<Self> {
        let schema = batches.first().map(|b| b.schema()).ok_or_else(|| corrupt("no data"))?;
        let state_text =
            schema.metadata().get(STATE_KEY).ok_or_else(|| corrupt(format!("no {STATE_KEY:?} metadata")))?;
        let state: Value = serde_json::from_str(state_text).map_err(|e| corrupt(format!("buffer state: {e}")))?;
        let number = |key: &str| {
            state.get(key).and_then(Value::as_u64).ok_or_else(|| corrupt(format!("buffer state lacks {key:?}")))
        };
        let unit = state
            .get("unit")
            .and_then(Value::as_str)
            .and_then(Unit::parse)
            .ok_or_else(|| corrupt("buffer state lacks \"unit\""))?;
        let mut buffer = GraphBuffer::new(number("capacity")? as usize, unit, number("seed")?)?;
        buffer.calls = number("calls")?;
        buffer.max_priority = state.get("max_priority").and_then(Value::as_f64).unwrap_or(1.0);
        // Files saved before staleness control have neither key: version 0, no bound.
        buffer.set_policy_version(state.get("policy_version").and_then(Value::as_i64).unwrap_or(0))?;
        let max_staleness = match state.get("max_staleness") {
            None | Some(Value::Null) => None,
            Some(value) => Some(value.as_u64().ok_or_else(|| corrupt("max_staleness is not a count"))?),
        };

        let mut priorities = Vec::new();
        for batch in batches {
            let column = batch
                .column_by_name(PRIORITY_COLUMN)
                .ok_or_else(|| corrupt(format!("no {PRIORITY_COLUMN:?} column")))?;
            let column =
                column.as_primitive_opt::<Float64Type>().ok_or_else(|| corrupt("priorities are not float64"))?;
            priorities.extend(column.values().iter().copied());
        }
        let traces = if trusted { own_traces(batches)? } else { None };
        let traces = match traces {
            Some(traces) => traces,
            None => {
                let (traces, rejected) = TraceBatch::from_arrow(batches)?;
                if let Some((_, error)) = rejected.into_iter().next() {
                    return Err(error.into());
                }
                traces
            }
        };
        if let Some((_, error)) = buffer.check_addable(&traces).into_iter().next() {
            return Err(error.into());
        }
        if priorities.iter().any(|p| !(p.is_finite() && *p >= 0.0)) {
            return Err(corrupt("a stored priority is negative or not finite"));
        }
        buffer.add_with_priorities(&traces, Some(&priorities))?;
        buffer.set_max_staleness(max_staleness);
        Ok(buffer)
    }
}

/// The traces of persisted batches, if they are in masreplay's own canonical layout.
fn own_traces(batches: &[RecordBatch]) -> Result<Option<TraceBatch>> {
    let mut traces = Vec::with_capacity(batches.len());
    for batch in batches {
        let Ok(priority) = batch.schema().index_of(PRIORITY_COLUMN) else { return Ok(None) };
        let columns: Vec<usize> = (0..batch.num_columns()).filter(|&i| i != priority).collect();
        traces.push(batch.project(&columns)?);
    }
    TraceBatch::from_own_arrow(&traces)
}

/// Writes the buffer to one Parquet file, replaced atomically.
pub fn save(buffer: &GraphBuffer, path: &Path) -> Result<()> {
    write_parquet(&buffer.persisted_batch()?, path)
}

pub fn load(path: &Path) -> Result<GraphBuffer> {
    GraphBuffer::restore(&read_parquet(path)?, false)
}
