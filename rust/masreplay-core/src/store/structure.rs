//! Proof that Arrow input is well-formed before any kernel reads it: data imported through the
//! C interface or decoded from a file is only as sound as its producer. Everything
//! `ArrayData::validate_full` checks is checked (buffer sizes, offsets in bounds and monotonic,
//! UTF-8 text, dictionary keys inside their dictionaries, null counts), children in parallel.
//! The value checks of the layouts traces are made of (text, lists, maps, dictionaries) run as
//! branch-free passes over whole buffers, which the compiler vectorises; a buffer that fails its
//! pass goes through arrow's own check, which finds and names the first offence (or accepts it:
//! a dictionary key under a null slot may hold anything, and only arrow's check skips nulls).

use std::ops::Deref;

use arrow_array::{RecordBatch, make_array};
use arrow_buffer::{ArrowNativeType, BooleanBufferBuilder, Buffer, NullBuffer};
use arrow_data::ArrayData;
use arrow_schema::{ArrowError, DataType, SchemaRef};
use rayon::prelude::*;

use super::nulls::{Zeros, longest_column};
use super::schema::SCHEMA_VERSION_KEY;
use crate::error::MasreplayError;
use crate::parallel::min_piece;

/// Values per task of a parallel pass.
const PASS_CHUNK: usize = 1 << 16;

/// The batches of a source of `schema`, or one empty batch when it holds none: a source of no
/// rows still has its columns checked as a full one's are, and keeps its metadata (where a
/// saved empty buffer's settings live). A schema of no columns stays no batch.
pub fn batches_or_empty(mut batches: Vec<RecordBatch>, schema: SchemaRef) -> Vec<RecordBatch> {
    if batches.is_empty() && !schema.fields().is_empty() {
        batches.push(RecordBatch::new_empty(schema));
    }
    batches
}

/// Record batches proven well-formed Arrow, in a schema version this masreplay reads.
/// [`WellFormed::check`] is the only way to make one, so data that holds one was checked once,
/// and is not checked again on its way in (a Parquet file is checked where it is read, where
/// an error can name the file).
#[derive(Clone, Debug, Default)]
pub struct WellFormed {
    batches: Vec<RecordBatch>,
    /// The zero buffer the check put under all-null columns, long enough for all the batches
    /// together: ingest builds its null columns over it too, so that an input longer than the
    /// process-wide zeros has one zeroed allocation, not one per step.
    zeros: Zeros,
}

impl WellFormed {
    /// Checks `batches` (see module docs). Returns them with the nulls of struct columns pushed
    /// down into their fields (see [`checked`]).
    pub fn check(batches: &[RecordBatch]) -> Result<Self, MasreplayError> {
        let zeros = Zeros::new(batches.iter().map(longest_column).sum());
        let batches = batches.iter().map(|batch| check_batch(batch, &zeros)).collect::<Result<_, _>>()?;
        Ok(WellFormed { batches, zeros })
    }

    /// Adds the batches of `more` after these (keeping the longer zero buffer).
    pub fn append(&mut self, more: WellFormed) {
        self.batches.extend(more.batches);
        if more.zeros.max_len() > self.zeros.max_len() {
            self.zeros = more.zeros;
        }
    }

    /// Zeros for null columns as long as the longest column of all these batches together:
    /// the check's own where they cover it (they always do for a single check).
    pub(crate) fn zeros(&self) -> Zeros {
        self.zeros.covering(self.batches.iter().map(longest_column).sum())
    }
}

impl Deref for WellFormed {
    type Target = [RecordBatch];

    fn deref(&self) -> &[RecordBatch] {
        &self.batches
    }
}

fn check_batch(batch: &RecordBatch, zeros: &Zeros) -> Result<RecordBatch, MasreplayError> {
    if let Some(version) = batch.schema().metadata().get(SCHEMA_VERSION_KEY) {
        let reason = match version.trim().parse::<i64>() {
            Ok(version) => crate::validate::check_schema_version(version).err(),
            Err(_) => Some(format!("schema metadata {SCHEMA_VERSION_KEY:?} is {version:?}, not a version number")),
        };
        if let Some(reason) = reason {
            return Err(MasreplayError::Arrow(ArrowError::InvalidArgumentError(reason)));
        }
    }
    let columns = batch
        .columns()
        .par_iter()
        .with_min_len(min_piece(longest_column(batch)))
        .map(|column| Ok(make_array(checked(column.to_data(), zeros)?)))
        .collect::<Result<Vec<_>, ArrowError>>()?;
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

/// `data` validated in full, with each struct's null slots marked null in its fields too. What
/// a field holds under a null struct slot means nothing, and writers leave anything there
/// (pyarrow leaves dictionary keys into an empty dictionary): marked null, it is neither
/// checked nor read. The layout of a node is checked before its null bitmaps are combined, so
/// that they are the right size. A node whose every slot is null holds nothing to read either:
/// it is replaced by nulls over `zeros` (see [`Zeros`]) where its type allows.
fn checked(data: ArrayData, zeros: &Zeros) -> Result<ArrayData, ArrowError> {
    data.validate()?;
    if let Some(nulls) = all_null_stand_in(&data, zeros) {
        return Ok(nulls);
    }
    let parent_nulls = match data.data_type() {
        DataType::Struct(_) => data.nulls().filter(|nulls| nulls.null_count() > 0).cloned(),
        _ => None,
    };
    let longest_child = data.child_data().iter().map(ArrayData::len).max().unwrap_or(0);
    let children = data
        .child_data()
        .par_iter()
        .with_min_len(min_piece(longest_child))
        .map(|child| {
            let Some(parent) = &parent_nulls else { return checked(child.clone(), zeros) };
            child.validate()?;
            // Struct slot j is field slot offset + j.
            let mut valid = BooleanBufferBuilder::new(child.len());
            valid.append_n(data.offset(), true);
            valid.append_buffer(parent.inner());
            valid.append_n(child.len().saturating_sub(data.offset() + data.len()), true);
            let mut combined = NullBuffer::new(valid.finish());
            if let Some(own) = child.nulls() {
                combined = NullBuffer::new(combined.inner() & own.inner());
            }
            // SAFETY: only the validity of slots changes, on a layout just checked; the
            // result is validated in full before it is returned.
            checked(unsafe { child.clone().into_builder().nulls(Some(combined)).build_unchecked() }, zeros)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let data = if parent_nulls.is_none() && children.iter().zip(data.child_data()).all(|(new, old)| new.ptr_eq(old)) {
        data
    } else {
        // SAFETY: the same layout with more slots null; its own values are checked below.
        unsafe { data.into_builder().child_data(children).build_unchecked() }
    };
    data.validate_nulls()?;
    if !values_proven(&data) {
        data.validate_values()?;
    }
    Ok(data)
}

/// For a node of valid layout whose validity bitmap marks every slot null, the same nulls over
/// the zero buffer (whose offsets and keys are known good), if its type has such a form.
fn all_null_stand_in(data: &ArrayData, zeros: &Zeros) -> Option<ArrayData> {
    let nulls = data.nulls()?;
    // The bitmap itself is counted: a declared null count proves nothing.
    let all_null = !data.is_empty() && nulls.null_count() == data.len() && nulls.inner().count_set_bits() == 0;
    all_null.then(|| zeros.shared_null_array(data.data_type(), data.len())).flatten().map(|array| array.to_data())
}

/// Whether a fast pass proves what `ArrayData::validate_values` checks, for a node whose layout
/// is valid (`ArrayData::validate`). `false` proves nothing: arrow's check decides.
fn values_proven(data: &ArrayData) -> bool {
    match data.data_type() {
        DataType::Utf8 => {
            let text = &data.buffers()[1];
            offsets(data).is_some_and(|offsets| offsets_in_bounds(offsets, text.len()) && utf8_at(text, offsets))
        }
        DataType::Binary => offsets(data).is_some_and(|offsets| offsets_in_bounds(offsets, data.buffers()[1].len())),
        DataType::List(_) | DataType::Map(_, _) => {
            offsets(data).is_some_and(|offsets| offsets_in_bounds(offsets, data.child_data()[0].len()))
        }
        DataType::Dictionary(key, _) => {
            let entries = data.child_data()[0].len();
            match key.as_ref() {
                DataType::Int8 => keys_in_bounds::<i8>(data, entries),
                DataType::Int16 => keys_in_bounds::<i16>(data, entries),
                DataType::Int32 => keys_in_bounds::<i32>(data, entries),
                DataType::Int64 => keys_in_bounds::<i64>(data, entries),
                DataType::UInt8 => keys_in_bounds::<u8>(data, entries),
                DataType::UInt16 => keys_in_bounds::<u16>(data, entries),
                DataType::UInt32 => keys_in_bounds::<u32>(data, entries),
                DataType::UInt64 => keys_in_bounds::<u64>(data, entries),
                _ => false,
            }
        }
        _ => false,
    }
}

/// The `len + 1` 32-bit offsets of a node in view (`None` where the buffer is shorter; an
/// empty node may have no offsets at all).
fn offsets(data: &ArrayData) -> Option<&[i32]> {
    let buffer = &data.buffers()[0];
    if data.is_empty() && buffer.is_empty() {
        return Some(&[]);
    }
    typed(buffer, data.offset(), data.len().checked_add(1)?)
}

/// `len` values of type `T` from `start` in `buffer`, if the buffer is aligned for `T` and
/// holds them (arrow's `typed_data` would panic instead).
fn typed<T: ArrowNativeType>(buffer: &Buffer, start: usize, len: usize) -> Option<&[T]> {
    // SAFETY: arrow's native types are plain integers and floats: every bit pattern is a value.
    let (before, values, _) = unsafe { buffer.as_slice().align_to::<T>() };
    if !before.is_empty() {
        return None;
    }
    values.get(start..start.checked_add(len)?)
}

/// Every offset in `0..=limit`, and none smaller than the one before.
fn offsets_in_bounds(offsets: &[i32], limit: usize) -> bool {
    let (Some(&first), Some(&last)) = (offsets.first(), offsets.last()) else { return true };
    first >= 0 && last as usize <= limit && every_pair_in_order(offsets)
}

fn every_pair_in_order(offsets: &[i32]) -> bool {
    let pairs = offsets.len().saturating_sub(1);
    (0..pairs.div_ceil(PASS_CHUNK)).into_par_iter().all(|chunk| {
        let start = chunk * PASS_CHUNK;
        let window = &offsets[start..(start + PASS_CHUNK).min(pairs) + 1];
        window[..window.len() - 1].iter().zip(&window[1..]).fold(true, |ok, (before, after)| ok & (before <= after))
    })
}

/// Whether the text between the first and the last of `offsets` (in bounds, in order) is UTF-8
/// cut at character boundaries only, so that every value is UTF-8. ASCII text (the usual ids
/// and names) has a boundary at every byte.
fn utf8_at(text: &[u8], offsets: &[i32]) -> bool {
    let (Some(&first), Some(&last)) = (offsets.first(), offsets.last()) else { return true };
    let (first, last) = (first as usize, last as usize);
    let used = &text[first..last];
    // An OR of every byte, which vectorises on any x86-64 (`is_ascii` goes a word at a time).
    let ascii = used.par_chunks(PASS_CHUNK).all(|chunk| chunk.iter().fold(0u8, |bits, &byte| bits | byte) < 0x80);
    ascii
        || std::str::from_utf8(used).is_ok()
            && offsets.par_chunks(PASS_CHUNK).all(|chunk| {
                // A byte that is not a UTF-8 continuation byte (0b10xx_xxxx) starts a character.
                chunk.iter().fold(true, |ok, &o| ok & (o as usize == last || (text[o as usize] as i8) >= -0x40))
            })
}

/// Every key of a dictionary node, null slots included, indexes its `entries` values. Keys are
/// compared in their own type (a comparison of usize does not vectorise without SSE4.2).
fn keys_in_bounds<K: ArrowNativeType>(data: &ArrayData, entries: usize) -> bool {
    let Some(keys) = typed::<K>(&data.buffers()[0], data.offset(), data.len()) else { return false };
    // A dictionary longer than the key type reaches: every non-negative key indexes it.
    let limit = K::from_usize(entries);
    let zero = K::default();
    keys.par_chunks(PASS_CHUNK).all(|chunk| match limit {
        Some(limit) => chunk.iter().fold(true, |ok, &key| ok & (key >= zero) & (key < limit)),
        None => chunk.iter().fold(true, |ok, &key| ok & (key >= zero)),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_schema::Field;
    use proptest::prelude::*;

    use super::*;

    /// A node built without checks, as a broken producer would hand it over.
    fn unchecked(data_type: DataType, len: usize, buffers: Vec<Buffer>, child: Option<ArrayData>) -> ArrayData {
        let builder = ArrayData::builder(data_type).len(len).buffers(buffers).child_data(child.into_iter().collect());
        // SAFETY: only inspected by `validate` and the passes under test, never read as an array.
        unsafe { builder.build_unchecked() }
    }

    /// The fast pass agrees with arrow wherever it answers: what it proves, arrow accepts;
    /// what it cannot prove is left to arrow. `expect_proven` says the pass must answer.
    fn agrees(data: &ArrayData, expect_proven: bool) {
        if data.validate().is_err() {
            return;
        }
        let proven = values_proven(data);
        if proven {
            assert!(data.validate_values().is_ok(), "proven but arrow refuses: {data:?}");
        }
        if expect_proven {
            assert!(proven, "a well-formed node the pass should prove: {data:?}");
        }
    }

    fn text_pieces() -> impl Strategy<Value = Vec<Vec<u8>>> {
        let piece = prop_oneof![
            "[a-z0-9]{0,4}".prop_map(String::into_bytes),
            "[é€😀a]{0,3}".prop_map(String::into_bytes),
            prop::collection::vec(any::<u8>(), 0..4),
        ];
        prop::collection::vec(piece, 0..12)
    }

    proptest! {
        #[test]
        fn text_offsets_agree_with_arrow(
            pieces in text_pieces(),
            cut in 0usize..20,
            nudge in -3i32..4,
            skip in 0usize..3,
        ) {
            let text: Vec<u8> = pieces.concat();
            let mut offsets = vec![0i32];
            for piece in &pieces {
                offsets.push(offsets.last().unwrap() + piece.len() as i32);
            }
            let whole_utf8 = pieces.iter().all(|p| std::str::from_utf8(p).is_ok());
            let len = offsets.len() - 1;
            // As written, then with one offset moved (out of order, out of bounds, mid-character).
            let mut moved = offsets.clone();
            if len > 0 {
                moved[cut % (len + 1)] += nudge;
            }
            for (offsets, written) in [(offsets, true), (moved, nudge == 0)] {
                let shown = len.saturating_sub(skip);
                let buffers = vec![Buffer::from_slice_ref(&offsets), Buffer::from_vec(text.clone())];
                let utf8 = unchecked(DataType::Utf8, len, buffers.clone(), None);
                agrees(&utf8, written && whole_utf8);
                agrees(&utf8.slice(skip.min(len), shown), written && whole_utf8);
                agrees(&unchecked(DataType::Binary, len, buffers, None), written);
            }
        }

        #[test]
        fn list_offsets_agree_with_arrow(lengths in prop::collection::vec(0i32..4, 0..10), at in 0usize..11, nudge in -2i32..3) {
            let mut offsets = vec![0i32];
            for length in &lengths {
                offsets.push(offsets.last().unwrap() + length);
            }
            let items = *offsets.last().unwrap() as usize;
            let child = ArrayData::new_null(&DataType::Int32, items);
            let item = Arc::new(Field::new("item", DataType::Int32, true));
            let moved = {
                let mut moved = offsets.clone();
                moved[at % offsets.len()] += nudge;
                moved
            };
            for (offsets, written) in [(offsets, true), (moved, nudge == 0)] {
                let list = unchecked(
                    DataType::List(item.clone()),
                    lengths.len(),
                    vec![Buffer::from_slice_ref(&offsets)],
                    Some(child.clone()),
                );
                agrees(&list, written);
            }
        }

        #[test]
        fn dictionary_keys_agree_with_arrow(
            keys in prop::collection::vec(prop_oneof![-3i32..12, -3i32..300], 0..40),
            // Dictionaries longer than an 8-bit key reaches too.
            entries in prop_oneof![0usize..10, 100usize..300],
            nulls in prop::collection::vec(any::<bool>(), 40),
        ) {
            let values = ArrayData::new_null(&DataType::Utf8, entries);
            // Each key type with the keys as that type reads them.
            let as_i8: Vec<i8> = keys.iter().map(|&k| k as i8).collect();
            let as_u8: Vec<u8> = keys.iter().map(|&k| k as u8).collect();
            let as_i64: Vec<i64> = keys.iter().map(|&k| i64::from(k)).collect();
            let read = |key_type: &DataType| -> Vec<i64> {
                match key_type {
                    DataType::Int8 => as_i8.iter().map(|&k| i64::from(k)).collect(),
                    DataType::UInt8 => as_u8.iter().map(|&k| i64::from(k)).collect(),
                    _ => as_i64.clone(),
                }
            };
            for (key_type, buffer) in [
                (DataType::Int32, Buffer::from_slice_ref(&keys)),
                (DataType::Int64, Buffer::from_slice_ref(&as_i64)),
                (DataType::Int8, Buffer::from_slice_ref(&as_i8)),
                (DataType::UInt8, Buffer::from_slice_ref(&as_u8)),
            ] {
                let dictionary = DataType::Dictionary(Box::new(key_type.clone()), Box::new(DataType::Utf8));
                let expect = read(&key_type).iter().all(|&k| k >= 0 && (k as usize) < entries);
                let plain = unchecked(dictionary.clone(), keys.len(), vec![buffer.clone()], Some(values.clone()));
                agrees(&plain, expect);
                // Null slots: arrow skips them; the pass does not, and then leaves it to arrow.
                let validity = NullBuffer::from(nulls[..keys.len()].to_vec());
                let with_nulls = plain.into_builder().nulls(Some(validity));
                // SAFETY: as in `unchecked`.
                agrees(&unsafe { with_nulls.build_unchecked() }, expect);
            }
        }
    }

    #[test]
    fn all_null_nodes_become_clean_nulls_whatever_their_buffers_hold() {
        let zeros = Zeros::new(8);
        let all_null = || Some(NullBuffer::new_null(3));
        // The layout holds (the first and last offsets bound the text), nothing between does.
        let garbage_text = || {
            let offsets = Buffer::from_slice_ref([0i32, 900, -4, 2]);
            unchecked(DataType::Utf8, 3, vec![offsets, Buffer::from_vec(vec![0xffu8; 2])], None)
        };
        let dictionary = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
        let keys = unchecked(
            dictionary,
            3,
            vec![Buffer::from_slice_ref([-1i32, 99, 5])],
            Some(ArrayData::new_empty(&DataType::Utf8)),
        );
        for (garbage, arrow_refuses) in [(garbage_text(), true), (keys, false)] {
            // SAFETY: as in `unchecked`.
            let garbage = unsafe { garbage.into_builder().nulls(all_null()).build_unchecked() };
            assert_eq!(garbage.validate_full().is_err(), arrow_refuses);
            let clean = checked(garbage.clone(), &zeros).expect("nothing to read");
            clean.validate_full().expect("a valid stand-in");
            assert_eq!((clean.data_type(), clean.len(), clean.null_count()), (garbage.data_type(), 3, 3));
        }
        // A bitmap that is not all null, whatever null count it declares, is checked as usual.
        // SAFETY: as in `unchecked`.
        let lying = unsafe {
            garbage_text().into_builder().null_bit_buffer(Some(Buffer::from([0b001u8]))).null_count(3).build_unchecked()
        };
        assert!(checked(lying, &zeros).is_err());
    }

    #[test]
    fn ingest_gets_the_zeros_the_check_put_under_all_null_columns() {
        use arrow_array::{Array, Int64Array, new_null_array};

        use crate::store::nulls::SHARED_ROWS;
        // Longer than the process-wide zeros: the check makes its own, and hands them on.
        let len = SHARED_ROWS + 3;
        let present: Arc<dyn Array> = Arc::new(Int64Array::from(vec![7; len]));
        let batch =
            RecordBatch::try_from_iter([("absent", new_null_array(&DataType::Int64, len)), ("present", present)])
                .expect("a batch");
        let zeros_under = |checked: &WellFormed| checked[0].column(0).to_data().buffers()[0].data_ptr();
        let checked = WellFormed::check(std::slice::from_ref(&batch)).expect("well-formed");
        let handed = checked.zeros().null_array(&DataType::Int64, len).to_data();
        assert_eq!(handed.buffers()[0].data_ptr(), zeros_under(&checked));
        assert_eq!(checked.zeros().max_len(), len);
        // Batches appended after their checks: zeros for all of them together.
        let mut both = checked.clone();
        both.append(WellFormed::check(&[batch]).expect("well-formed"));
        assert_eq!(both.len(), 2);
        assert!(both.zeros().max_len() >= 2 * len);
        both.zeros().null_array(&DataType::Int64, 2 * len).to_data().validate_full().expect("valid nulls");
    }

    #[test]
    fn short_or_misaligned_buffers_are_left_to_arrow() {
        // Three offsets for a node of length 2, one byte short of the third.
        let short = Buffer::from_vec(vec![0u8; 11]);
        assert!(offsets(&unchecked(DataType::Binary, 2, vec![short, Buffer::from_vec(vec![0u8; 4])], None)).is_none());
        let misaligned = Buffer::from_vec(vec![0u32; 5]).slice(1);
        assert!(typed::<i32>(&misaligned, 0, 1).is_none());
    }
}
