//! How much memory Arrow data holds. Buffers are shared (slices, the zero buffer of absent
//! fields, dictionaries), so each allocation is counted once, at its full capacity.

use std::collections::HashMap;

use arrow_array::{Array, RecordBatch};
use arrow_data::ArrayData;

/// Bytes of the distinct allocations behind `batches`.
pub fn allocated_bytes<'a>(batches: impl IntoIterator<Item = &'a RecordBatch>) -> usize {
    let mut seen: HashMap<usize, usize> = HashMap::new();
    for batch in batches {
        for column in batch.columns() {
            visit(&column.to_data(), &mut seen);
        }
    }
    seen.values().sum()
}

fn visit(data: &ArrayData, seen: &mut HashMap<usize, usize>) {
    let nulls = data.nulls().map(|n| n.buffer());
    for buffer in data.buffers().iter().chain(nulls) {
        let capacity = seen.entry(buffer.data_ptr().as_ptr() as usize).or_default();
        *capacity = (*capacity).max(buffer.capacity());
    }
    for child in data.child_data() {
        visit(child, seen);
    }
}
