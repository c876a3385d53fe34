//! Null columns for the optional fields an input leaves out. Arrow gives every null column
//! full-width buffers; here all of them share one zeroed allocation (a zero validity bitmap is
//! "all null", zero offsets are empty lists and strings, zero keys are never read), so an
//! absent field costs nothing beyond one zero buffer. Batches of up to [`SHARED_ROWS`] rows
//! (every chunk a replay buffer keeps) share a single process-wide zero buffer, and columns
//! that arrive or come out of a kernel all null are swapped for views of it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int32Type, Int64Type};
use arrow_array::{
    Array, ArrayRef, BooleanArray, DictionaryArray, ListArray, MapArray, PrimitiveArray, RecordBatch, StringArray,
    new_null_array,
};
use arrow_array::{ArrowPrimitiveType, StructArray};
use arrow_buffer::{BooleanBuffer, Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::DataType;

/// One zeroed allocation wide enough for any null column of up to `max_len` rows.
#[derive(Clone, Debug)]
pub(crate) struct Zeros {
    buffer: Buffer,
    max_len: usize,
}

/// Rows up to which batches share the process-wide zero buffer (8 MB at its largest).
pub(crate) const SHARED_ROWS: usize = 1 << 20;

/// The process-wide zero buffers, newest last: a longer one is made (the next power of two)
/// when asked for. Older ones are kept, never freed, so their addresses stay theirs and
/// [`is_shared_zeros`] stays true; together they are at most twice the newest.
static SHARED: Mutex<Vec<Buffer>> = Mutex::new(Vec::new());

/// `bytes` zero bytes from the system allocator, which takes large requests straight from the
/// operating system as pages that are zero already: nothing is written, and a page never read
/// costs nothing. (The global allocator clears what it hands out: for the 80 MB under a batch
/// of 10^7 events that was half the time of a `GraphBuffer::add`.)
fn zeroed(bytes: usize) -> Buffer {
    // 16 bytes: the alignment of every Arrow native type, and what calloc gives.
    let layout = Layout::from_size_align(bytes.max(1), 16).unwrap_or_else(|_| panic!("{bytes} bytes of zeros"));
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { System.alloc_zeroed(layout) };
    let Some(ptr) = NonNull::new(ptr) else { std::alloc::handle_alloc_error(layout) };
    // SAFETY: `ptr` holds `bytes` bytes, all zero, until `SystemAllocation` is dropped.
    unsafe { Buffer::from_custom_allocation(ptr, bytes, Arc::new(SystemAllocation { ptr, layout })) }
}

/// Frees an allocation of [`System`] when the last buffer viewing it is dropped.
struct SystemAllocation {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the allocation is plain bytes, never written after `zeroed`; `System` may free it
// from any thread.
unsafe impl Send for SystemAllocation {}
// SAFETY: as above: shared references only read it.
unsafe impl Sync for SystemAllocation {}

impl Drop for SystemAllocation {
    fn drop(&mut self) {
        // SAFETY: allocated by `System` with this layout, and freed once.
        unsafe { System.dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Bytes of zeros for `max_len` rows: the widest buffer is 8 bytes a row (int64, float64),
/// and offsets need one row more.
fn zero_bytes(max_len: usize) -> usize {
    8 * (max_len + 1)
}

fn shared_zeros(max_len: usize) -> Buffer {
    let needed = zero_bytes(max_len);
    let mut shared = SHARED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    match shared.last() {
        Some(buffer) if buffer.len() >= needed => buffer.clone(),
        _ => {
            let buffer = zeroed(needed.next_power_of_two());
            shared.push(buffer.clone());
            buffer
        }
    }
}

/// Whether `address` starts one of the process-wide zero buffers (which no batch owns: memory
/// accounting charges a batch only the part it views).
pub(crate) fn is_shared_zeros(address: usize) -> bool {
    let shared = SHARED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    shared.iter().any(|buffer| buffer.as_ptr() as usize == address)
}

impl Default for Zeros {
    fn default() -> Self {
        Zeros::new(0)
    }
}

impl Zeros {
    /// Zeros for up to `max_len` rows: the process-wide ones up to [`SHARED_ROWS`], beyond that
    /// a fresh allocation (reuse one with [`Zeros::covering`]).
    pub fn new(max_len: usize) -> Self {
        let buffer = if max_len <= SHARED_ROWS { shared_zeros(max_len) } else { zeroed(zero_bytes(max_len)) };
        Zeros { buffer, max_len }
    }

    /// These zeros if they reach `max_len` rows, new ones otherwise.
    pub fn covering(&self, max_len: usize) -> Self {
        if max_len <= self.max_len { self.clone() } else { Zeros::new(max_len) }
    }

    pub fn max_len(&self) -> usize {
        self.max_len
    }

    fn nulls(&self, len: usize) -> Option<NullBuffer> {
        // `new` would count the bits, one pass over the bitmap per null column.
        // SAFETY: the bits are zeros: all `len` of them are nulls.
        Some(unsafe { NullBuffer::new_unchecked(self.bits(len), len) })
    }

    /// `len` zero bits, viewing only the bytes they need (memory accounting reads the view).
    fn bits(&self, len: usize) -> BooleanBuffer {
        BooleanBuffer::new(self.buffer.slice_with_length(0, len.div_ceil(8)), 0, len)
    }

    fn scalars<T: ArrowPrimitiveType>(&self, len: usize) -> ScalarBuffer<T::Native> {
        ScalarBuffer::new(self.buffer.clone(), 0, len)
    }

    /// `len` empty lists or strings. `OffsetBuffer::new` would scan every offset to check
    /// they never decrease.
    fn offsets(&self, len: usize) -> OffsetBuffer<i32> {
        // SAFETY: the offsets are all 0: non-negative and never decreasing.
        unsafe { OffsetBuffer::new_unchecked(self.scalars::<Int32Type>(len + 1)) }
    }

    fn primitive<T: ArrowPrimitiveType>(&self, len: usize) -> ArrayRef {
        Arc::new(PrimitiveArray::<T>::new(self.scalars::<T>(len), self.nulls(len)))
    }

    /// An all-null array of `data_type`, sharing the zero buffer where the type allows.
    pub fn null_array(&self, data_type: &DataType, len: usize) -> ArrayRef {
        self.shared_null_array(data_type, len).unwrap_or_else(|| new_null_array(data_type, len))
    }

    /// An all-null array of `data_type` made of the zero buffer alone, where the type allows.
    pub fn shared_null_array(&self, data_type: &DataType, len: usize) -> Option<ArrayRef> {
        if len > self.max_len {
            return None;
        }
        Some(match data_type {
            DataType::Int32 => self.primitive::<Int32Type>(len),
            DataType::Int64 => self.primitive::<Int64Type>(len),
            DataType::Float64 => self.primitive::<Float64Type>(len),
            DataType::Boolean => Arc::new(BooleanArray::new(self.bits(len), self.nulls(len))),
            DataType::Utf8 => {
                // `new` would check every offset against the values, as costly as the keys'
                // scan below.
                // SAFETY: every offset is 0, so every string is empty: within the empty values
                // buffer and valid UTF-8.
                Arc::new(unsafe {
                    StringArray::new_unchecked(self.offsets(len), Buffer::from(Vec::<u8>::new()), self.nulls(len))
                })
            }
            DataType::Dictionary(key, value) if **key == DataType::Int32 && **value == DataType::Utf8 => {
                let keys = PrimitiveArray::<Int32Type>::new(self.scalars::<Int32Type>(len), self.nulls(len));
                let values: ArrayRef = Arc::new(StringArray::from(Vec::<&str>::new()));
                // `try_new` would scan every key only to skip it as null, which costs more than
                // everything else done to a batch of millions of events.
                // SAFETY: every key is null (the validity bitmap is all zeros), and Arrow never
                // reads the key of a null slot, so none indexes the empty dictionary.
                Arc::new(unsafe { DictionaryArray::new_unchecked(keys, values) })
            }
            DataType::Map(entries, sorted) => {
                let entries_array = StructArray::from(arrow_array::new_empty_array(entries.data_type()).to_data());
                Arc::new(
                    MapArray::try_new(entries.clone(), self.offsets(len), entries_array, self.nulls(len), *sorted)
                        .expect("empty entries fit zero offsets"),
                )
            }
            _ => return None,
        })
    }

    /// `array` with every all-null column of a nullable field, at any depth of structs and
    /// lists, replaced by a view of the zero buffer (which frees the buffers it held).
    fn share_nulls(&self, array: &ArrayRef, nullable: bool) -> ArrayRef {
        if nullable
            && !array.is_empty()
            && array.null_count() == array.len()
            && let Some(shared) = self.shared_null_array(array.data_type(), array.len())
        {
            return shared;
        }
        if let Some(parent) = array.as_struct_opt() {
            let children = parent
                .fields()
                .iter()
                .zip(parent.columns())
                .map(|(field, child)| self.share_nulls(child, field.is_nullable()))
                .collect();
            let rebuilt = StructArray::try_new(parent.fields().clone(), children, parent.nulls().cloned());
            return rebuilt.map_or_else(|_| array.clone(), |rebuilt| Arc::new(rebuilt) as ArrayRef);
        }
        if let Some(list) = array.as_list_opt::<i32>()
            && let DataType::List(item) = list.data_type()
        {
            let values = self.share_nulls(list.values(), item.is_nullable());
            let rebuilt = ListArray::try_new(item.clone(), list.offsets().clone(), values, list.nulls().cloned());
            return rebuilt.map_or_else(|_| array.clone(), |rebuilt| Arc::new(rebuilt) as ArrayRef);
        }
        array.clone()
    }
}

/// Rows of the longest column of `batch`, counting the items of list columns.
pub(crate) fn longest_column(batch: &RecordBatch) -> usize {
    let items = batch.columns().iter().filter_map(|c| c.as_list_opt::<i32>()).map(|list| list.values().len());
    items.fold(batch.num_rows(), usize::max)
}

/// `batch` with its all-null optional columns sharing one zero buffer (see the module docs).
/// List columns must hold only their rows' items (as ingested and trimmed batches do).
pub(crate) fn share_null_columns(batch: &RecordBatch) -> RecordBatch {
    share_null_columns_over(batch, &Zeros::new(longest_column(batch)))
}

/// [`share_null_columns`] over `zeros`, which share every all-null column they are as long as.
pub(crate) fn share_null_columns_over(batch: &RecordBatch, zeros: &Zeros) -> RecordBatch {
    let schema = batch.schema();
    let columns = schema.fields().iter().zip(batch.columns()).map(|(f, c)| zeros.share_nulls(c, f.is_nullable()));
    RecordBatch::try_new(schema.clone(), columns.collect()).unwrap_or_else(|_| batch.clone())
}

#[cfg(test)]
mod tests {
    use arrow_array::Array;

    use super::*;
    use crate::store::schema::event_fields;

    #[test]
    fn shared_null_columns_equal_arrow_null_columns() {
        // The process-wide zeros, and an allocation of its own past them.
        for (zeros, lengths) in
            [(Zeros::new(100), [0, 1, 37, 100]), (Zeros::new(SHARED_ROWS + 9), [0, 1, 37, SHARED_ROWS + 9])]
        {
            null_columns_equal_arrow_null_columns(&zeros, &lengths);
        }
    }

    fn null_columns_equal_arrow_null_columns(zeros: &Zeros, lengths: &[usize]) {
        for field in event_fields().iter().filter(|f| f.is_nullable()) {
            for &len in lengths {
                let ours = zeros.null_array(field.data_type(), len);
                let arrow = new_null_array(field.data_type(), len);
                assert_eq!(ours.data_type(), arrow.data_type(), "{}", field.name());
                assert_eq!(ours.null_count(), len, "{}", field.name());
                assert_eq!(ours.to_data(), arrow.to_data(), "{}", field.name());
                ours.to_data().validate_full().expect("valid array");
            }
        }
    }

    #[test]
    fn zeroed_buffers_are_zero_and_aligned_for_every_native_type() {
        for bytes in [0, 1, 4096, 3 << 20] {
            let buffer = zeroed(bytes);
            assert_eq!(buffer.len(), bytes);
            assert!(buffer.as_slice().iter().all(|&b| b == 0));
            assert_eq!(buffer.as_ptr() as usize % 16, 0);
        }
    }

    #[test]
    fn all_null_columns_become_views_of_one_zero_buffer() {
        use arrow_schema::{Field, Schema};
        let schema = Arc::new(Schema::new(vec![
            Field::new("duration_s", DataType::Float64, true),
            Field::new("tokens", DataType::Int64, true),
            Field::new("id", DataType::Utf8, false),
        ]));
        let ids: ArrayRef = Arc::new(StringArray::from_iter_values((0..100).map(|i| format!("e{i}"))));
        let columns = vec![new_null_array(&DataType::Float64, 100), new_null_array(&DataType::Int64, 100), ids];
        let original = RecordBatch::try_new(schema, columns).unwrap();
        let shared = share_null_columns(&original);
        assert_eq!(shared, original);
        let values_of = |b: &RecordBatch, i: usize| b.column(i).to_data().buffers()[0].as_ptr();
        assert_eq!(values_of(&shared, 0), values_of(&shared, 1));
        assert_ne!(values_of(&original, 0), values_of(&original, 1));
        assert_eq!(values_of(&shared, 2), values_of(&original, 2), "present columns are kept as they are");
    }
}
