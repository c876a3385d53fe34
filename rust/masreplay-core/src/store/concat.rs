//! Joining the chunks of one Arrow input, interruptibly. Arrow's concat copies every column of
//! every event in one call (seconds at millions of events); this one builds the same array
//! column by column, as Arrow does for structs and lists, and polls the call's stop flag
//! before each column.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, ListArray, StructArray};
use arrow_buffer::{BooleanBufferBuilder, NullBuffer, OffsetBuffer};
use arrow_schema::DataType;

use crate::error::MasreplayError;
use crate::interrupt::checkpoint;

/// Inputs smaller than this are joined by one call of Arrow's concat: under about 0.2 s cold,
/// short enough not to poll, and Arrow's own path where the stepped join is not needed.
const JOINED_AT_ONCE_BELOW: usize = 64 << 20;

/// `arrow_select::concat::concat(arrays)`; past [`JOINED_AT_ONCE_BELOW`] bytes column by
/// column, polling the stop flag between two columns.
pub(crate) fn concat_polled(arrays: &[&dyn Array]) -> Result<ArrayRef, MasreplayError> {
    checkpoint()?;
    // The bytes each array covers (a slice of a large table reports the table's whole buffers
    // in get_array_memory_size); one that cannot say counts as large.
    let bytes = arrays
        .iter()
        .map(|array| array.to_data().get_slice_memory_size().unwrap_or(usize::MAX))
        .fold(0, usize::saturating_add);
    if bytes < JOINED_AT_ONCE_BELOW {
        return Ok(arrow_select::concat::concat(arrays)?);
    }
    concat_in_steps(arrays)
}

fn concat_in_steps(arrays: &[&dyn Array]) -> Result<ArrayRef, MasreplayError> {
    checkpoint()?;
    let same_type = arrays.windows(2).all(|pair| pair[0].data_type() == pair[1].data_type());
    match arrays.first().map(|first| first.data_type()) {
        Some(DataType::Struct(fields)) if arrays.len() > 1 && same_type => {
            let structs: Vec<&StructArray> = arrays.iter().map(|array| array.as_struct()).collect();
            let columns = (0..fields.len())
                .map(|i| concat_in_steps(&structs.iter().map(|part| part.column(i).as_ref()).collect::<Vec<_>>()))
                .collect::<Result<Vec<_>, _>>()?;
            let len = arrays.iter().map(|array| array.len()).sum();
            Ok(Arc::new(StructArray::try_new_with_length(fields.clone(), columns, joined_nulls(arrays), len)?))
        }
        Some(DataType::List(field)) if arrays.len() > 1 && same_type => {
            let lists: Vec<&ListArray> = arrays.iter().map(|array| array.as_list::<i32>()).collect();
            let values: Vec<ArrayRef> = lists
                .iter()
                .map(|list| {
                    let (first, last) = (list.offsets()[0] as usize, *list.offsets().last().unwrap_or(&0) as usize);
                    list.values().slice(first, last - first)
                })
                .collect();
            let values = concat_in_steps(&values.iter().map(|part| part.as_ref()).collect::<Vec<_>>())?;
            let offsets = OffsetBuffer::from_lengths(lists.iter().flat_map(|list| list.offsets().lengths()));
            Ok(Arc::new(ListArray::try_new(field.clone(), offsets, values, joined_nulls(arrays))?))
        }
        _ => Ok(arrow_select::concat::concat(arrays)?),
    }
}

/// The validity of `arrays` one after another; none where no array holds a null (as Arrow).
fn joined_nulls(arrays: &[&dyn Array]) -> Option<NullBuffer> {
    arrays.iter().any(|array| array.null_count() > 0).then(|| {
        let mut joined = BooleanBufferBuilder::new(arrays.iter().map(|array| array.len()).sum());
        for array in arrays {
            match array.nulls() {
                Some(nulls) => joined.append_buffer(nulls.inner()),
                None => joined.append_n(array.len(), true),
            }
        }
        NullBuffer::new(joined.finish())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TraceBatch;
    use crate::interrupt::StopFlag;
    use crate::sim::{SimConfig, generate};

    fn chunks() -> Vec<ArrayRef> {
        let config = SimConfig { n_traces: 40, ..SimConfig::default() };
        let batch = TraceBatch::from_traces(&generate(&config).unwrap()).unwrap();
        let whole: ArrayRef = Arc::new(StructArray::from(batch.record_batch().clone()));
        // Uneven pieces, one empty, one sliced from the middle (offsets not from zero).
        [(0, 7), (7, 0), (7, 20), (27, 13)].iter().map(|&(offset, len)| whole.slice(offset, len)).collect()
    }

    #[test]
    fn the_same_array_as_arrow_builds() {
        let chunks = chunks();
        let refs: Vec<&dyn Array> = chunks.iter().map(|chunk| chunk.as_ref()).collect();
        let ours = concat_in_steps(&refs).unwrap();
        let arrows = arrow_select::concat::concat(&refs).unwrap();
        assert_eq!(ours.to_data(), arrows.to_data());
        assert_eq!(ours.as_ref(), arrows.as_ref());
    }

    #[test]
    fn stops_once_the_flag_is_raised() {
        let chunks = chunks();
        let refs: Vec<&dyn Array> = chunks.iter().map(|chunk| chunk.as_ref()).collect();
        let raised = StopFlag::new();
        raised.raise();
        assert!(matches!(raised.run(|| concat_in_steps(&refs)), Err(MasreplayError::Interrupted)));
        assert!(matches!(raised.run(|| concat_polled(&refs)), Err(MasreplayError::Interrupted)));
    }
}
