//! Saving and restoring a buffer: the canonical table of its traces in insertion order, one
//! extra `buffer_priority` column, and the buffer's settings in the schema metadata. The same
//! record batch goes to Parquet (save/load) and to Arrow IPC (pickling, in Python).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Float64Type;
use arrow_array::{Array, ArrayRef, Float64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use serde_json::{Value, json};

use super::{GraphBuffer, Unit, check_priority};
use crate::error::{MasreplayError, Result};
use crate::store::{TraceBatch, WellFormed, read_parquet, write_parquet};

const STATE_KEY: &str = "masreplay.buffer";
const PRIORITY_COLUMN: &str = "buffer_priority";

/// What a saved buffer is called in errors that cannot name a file (restoring from memory).
const STATE_SOURCE: &str = "GraphBuffer state";

fn corrupt(reason: impl Into<String>) -> MasreplayError {
    MasreplayError::DataFormat {
        path: STATE_SOURCE.to_owned(),
        reason: format!("not a saved GraphBuffer: {}", reason.into()),
    }
}

/// The buffer settings kept in the schema metadata, each checked.
struct Settings {
    capacity: usize,
    unit: Unit,
    seed: u64,
    calls: u64,
    max_priority: f64,
    policy_version: i64,
    max_staleness: Option<u64>,
}

impl Settings {
    fn read(state_text: &str) -> Result<Self> {
        let state: Value = serde_json::from_str(state_text).map_err(|e| corrupt(format!("buffer state: {e}")))?;
        let Value::Object(state) = state else { return Err(corrupt("the buffer state is not a JSON object")) };
        let whole = |key: &str| {
            state.get(key).and_then(Value::as_u64).ok_or_else(|| {
                corrupt(format!("buffer state {key:?} must be a non-negative integer, got {}", shown(state.get(key))))
            })
        };
        let capacity = whole("capacity")?;
        let capacity = usize::try_from(capacity)
            .ok()
            .filter(|&c| c >= 1)
            .ok_or_else(|| corrupt(format!("buffer state \"capacity\" is {capacity}; it must be at least 1")))?;
        let unit = state.get("unit").and_then(Value::as_str).and_then(Unit::from_name).ok_or_else(|| {
            corrupt(format!("buffer state \"unit\" must be \"traces\" or \"events\", got {}", shown(state.get("unit"))))
        })?;
        let max_priority = match state.get("max_priority") {
            Some(Value::Number(number)) => number.as_f64().unwrap_or(f64::NAN),
            other => {
                return Err(corrupt(format!("buffer state \"max_priority\" must be a number, got {}", shown(other))));
            }
        };
        check_priority(max_priority).map_err(|reason| corrupt(format!("buffer state \"max_priority\": {reason}")))?;
        // Files saved before staleness control have neither key: version 0, no bound.
        let policy_version = match state.get("policy_version") {
            None | Some(Value::Null) => 0,
            Some(value) => value.as_i64().filter(|&v| v >= 0).ok_or_else(|| {
                corrupt(format!("buffer state \"policy_version\" must be a non-negative integer, got {value}"))
            })?,
        };
        let max_staleness = match state.get("max_staleness") {
            None | Some(Value::Null) => None,
            Some(value) => Some(value.as_u64().ok_or_else(|| {
                corrupt(format!("buffer state \"max_staleness\" must be a non-negative integer or null, got {value}"))
            })?),
        };
        Ok(Settings {
            capacity,
            unit,
            seed: whole("seed")?,
            calls: whole("calls")?,
            max_priority,
            policy_version,
            max_staleness,
        })
    }
}

fn shown(value: Option<&Value>) -> String {
    value.map_or_else(|| "nothing (the key is missing)".to_owned(), |v| v.to_string())
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

    /// Rebuilds a buffer from [`Self::persisted_batch`] output (possibly split in batches),
    /// from a file or from unpickled bytes alike: the Arrow data is checked structurally, every
    /// trace against the data contract, and the settings and priorities for their ranges. A
    /// state that holds more than its capacity is refused, never silently cut.
    pub fn restore(batches: &[RecordBatch]) -> Result<Self> {
        Self::restore_well_formed(&WellFormed::check(batches)?)
    }

    /// [`Self::restore`] for data already proven well-formed (a saved file's batches).
    fn restore_well_formed(batches: &WellFormed) -> Result<Self> {
        let schema = batches.first().map(|b| b.schema()).ok_or_else(|| corrupt("no data"))?;
        let state_text =
            schema.metadata().get(STATE_KEY).ok_or_else(|| corrupt(format!("no {STATE_KEY:?} metadata")))?;
        let settings = Settings::read(state_text)?;
        let mut buffer = GraphBuffer::new(settings.capacity, settings.unit, settings.seed)?;
        buffer.calls = settings.calls;
        buffer.max_priority = settings.max_priority;
        buffer.set_policy_version(settings.policy_version)?;

        let traces = TraceBatch::from_well_formed_strict(batches)?;
        let mut priorities = Vec::with_capacity(traces.len());
        for batch in batches.iter() {
            let column = batch
                .column_by_name(PRIORITY_COLUMN)
                .ok_or_else(|| corrupt(format!("no {PRIORITY_COLUMN:?} column")))?;
            let column =
                column.as_primitive_opt::<Float64Type>().ok_or_else(|| corrupt("priorities are not float64"))?;
            if column.null_count() > 0 {
                return Err(corrupt("a stored priority is null"));
            }
            priorities.extend(column.values().iter().copied());
        }
        if let Some((k, reason)) =
            priorities.iter().enumerate().find_map(|(k, &p)| check_priority(p).err().map(|r| (k, r)))
        {
            return Err(corrupt(format!("the priority of trace {k}: {reason}")));
        }
        if let Some((_, error)) = buffer.check_addable(&traces).into_iter().next() {
            return Err(error.into());
        }
        let used = match settings.unit {
            Unit::Traces => traces.len(),
            Unit::Events => traces.num_events(),
        };
        if used > settings.capacity {
            return Err(corrupt(format!(
                "it holds {used} {}, more than its capacity of {}",
                settings.unit.as_str(),
                settings.capacity
            )));
        }
        buffer.add_with_priorities(&traces, Some(&priorities))?;
        buffer.set_max_staleness(settings.max_staleness);
        Ok(buffer)
    }
}

/// Writes the buffer to one Parquet file, replaced atomically.
pub fn save(buffer: &GraphBuffer, path: &Path) -> Result<()> {
    write_parquet(&buffer.persisted_batch()?, path)
}

/// Reads a buffer saved by [`save`]. Temporary files of saves in progress or killed are other
/// files: they are never read.
pub fn load(path: &Path) -> Result<GraphBuffer> {
    GraphBuffer::restore_well_formed(&read_parquet(path)?).map_err(|error| match error {
        MasreplayError::DataFormat { reason, .. } => {
            MasreplayError::DataFormat { path: path.display().to_string(), reason }
        }
        other => other,
    })
}
