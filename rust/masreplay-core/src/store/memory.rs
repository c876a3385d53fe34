//! How much memory Arrow data holds. Buffers are shared (slices, the zero buffer of absent
//! fields, dictionaries), so each allocation is counted once, at its full capacity; of the
//! process-wide zero buffers, which every batch shares, only the widest view is counted.

use std::collections::HashMap;

use arrow_array::{Array, RecordBatch};
use arrow_data::ArrayData;

use super::nulls::is_shared_zeros;

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
        let address = buffer.data_ptr().as_ptr() as usize;
        // A view of the shared zeros reaches as far as its end from the allocation's start.
        let view_end = buffer.as_ptr() as usize - address + buffer.len();
        let size = if is_shared_zeros(address) { view_end } else { buffer.capacity() };
        let counted = seen.entry(address).or_default();
        *counted = (*counted).max(size);
    }
    for child in data.child_data() {
        visit(child, seen);
    }
}
