//! Null columns for the optional fields an input leaves out. Arrow gives every null column
//! full-width buffers; here all of them share one zeroed allocation (a zero validity bitmap is
//! "all null", zero offsets are empty lists and strings, zero keys are never read), so an
//! absent field costs nothing beyond the batch's one zero buffer.

use std::sync::Arc;

use arrow_array::types::{Float64Type, Int32Type, Int64Type};
use arrow_array::{ArrayRef, BooleanArray, DictionaryArray, MapArray, PrimitiveArray, StringArray, new_null_array};
use arrow_array::{ArrowPrimitiveType, StructArray};
use arrow_buffer::{BooleanBuffer, Buffer, MutableBuffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::DataType;

/// One zeroed allocation wide enough for any null column of up to `max_len` rows.
pub(crate) struct Zeros {
    buffer: Buffer,
    max_len: usize,
}

impl Zeros {
    pub fn new(max_len: usize) -> Self {
        // The widest buffer is 8 bytes a row (int64, float64); offsets need one row more.
        let buffer = MutableBuffer::from_len_zeroed(8 * (max_len + 1)).into();
        Zeros { buffer, max_len }
    }

    fn nulls(&self, len: usize) -> Option<NullBuffer> {
        Some(NullBuffer::new(BooleanBuffer::new(self.buffer.clone(), 0, len)))
    }

    fn scalars<T: ArrowPrimitiveType>(&self, len: usize) -> ScalarBuffer<T::Native> {
        ScalarBuffer::new(self.buffer.clone(), 0, len)
    }

    fn primitive<T: ArrowPrimitiveType>(&self, len: usize) -> ArrayRef {
        Arc::new(PrimitiveArray::<T>::new(self.scalars::<T>(len), self.nulls(len)))
    }

    fn offsets(&self, len: usize) -> OffsetBuffer<i32> {
        OffsetBuffer::new(self.scalars::<Int32Type>(len + 1))
    }

    /// An all-null array of `data_type`, sharing the zero buffer where the type allows.
    pub fn null_array(&self, data_type: &DataType, len: usize) -> ArrayRef {
        if len > self.max_len {
            return new_null_array(data_type, len);
        }
        match data_type {
            DataType::Int32 => self.primitive::<Int32Type>(len),
            DataType::Int64 => self.primitive::<Int64Type>(len),
            DataType::Float64 => self.primitive::<Float64Type>(len),
            DataType::Boolean => {
                Arc::new(BooleanArray::new(BooleanBuffer::new(self.buffer.clone(), 0, len), self.nulls(len)))
            }
            DataType::Utf8 => {
                Arc::new(StringArray::new(self.offsets(len), Buffer::from(Vec::<u8>::new()), self.nulls(len)))
            }
            DataType::Dictionary(key, value) if **key == DataType::Int32 && **value == DataType::Utf8 => {
                let keys = PrimitiveArray::<Int32Type>::new(self.scalars::<Int32Type>(len), self.nulls(len));
                let values: ArrayRef = Arc::new(StringArray::from(Vec::<&str>::new()));
                Arc::new(DictionaryArray::try_new(keys, values).expect("null keys index nothing"))
            }
            DataType::Map(entries, sorted) => {
                let entries_array = StructArray::from(arrow_array::new_empty_array(entries.data_type()).to_data());
                Arc::new(
                    MapArray::try_new(entries.clone(), self.offsets(len), entries_array, self.nulls(len), *sorted)
                        .expect("empty entries fit zero offsets"),
                )
            }
            _ => new_null_array(data_type, len),
        }
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::Array;

    use super::*;
    use crate::store::schema::event_fields;

    #[test]
    fn shared_null_columns_equal_arrow_null_columns() {
        let zeros = Zeros::new(100);
        for field in event_fields().iter().filter(|f| f.is_nullable()) {
            for len in [0, 1, 37, 100] {
                let ours = zeros.null_array(field.data_type(), len);
                let arrow = new_null_array(field.data_type(), len);
                assert_eq!(ours.data_type(), arrow.data_type(), "{}", field.name());
                assert_eq!(ours.null_count(), len, "{}", field.name());
                assert_eq!(ours.to_data(), arrow.to_data(), "{}", field.name());
                ours.to_data().validate_full().expect("valid array");
            }
        }
    }
}
