//! Gathering texts at positions far apart (the ids of credited events, a few among millions):
//! a plain take waits for each position's offsets, then its bytes, one position after the
//! other. Here both are requested ahead, so the misses of consecutive positions overlap.

use arrow_array::{Array, StringArray};
use arrow_buffer::{Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use rayon::prelude::*;

use crate::error::{MasreplayError, Result};
use crate::prefetch::prefetch;

/// How many positions ahead a position's offsets are requested.
const OFFSETS_AHEAD: usize = 32;
/// How many positions ahead a position's bytes are requested (its offsets having arrived).
const TEXT_AHEAD: usize = 16;
/// Positions per parallel task: each gathers its texts into its own buffer, and the buffers
/// are joined after (a copy of the taken bytes only, far less than the misses it spreads).
const TASK: usize = 1 << 14;

/// The texts of `texts` at `positions`, in that order (nulls stay null).
pub fn take_texts(texts: &StringArray, positions: &[u64]) -> Result<StringArray> {
    if let Some(&past) = positions.iter().find(|&&position| position >= texts.len() as u64) {
        return Err(MasreplayError::InvalidArgument(format!(
            "position {past} is past the last of {} texts",
            texts.len()
        )));
    }
    let too_long =
        || MasreplayError::InvalidArgument(format!("the {} texts taken hold more than 2 GiB", positions.len()));
    let parts: Vec<(Vec<u8>, Vec<usize>)> = positions.par_chunks(TASK).map(|chunk| gather(texts, chunk)).collect();
    let mut taken = Vec::with_capacity(parts.iter().map(|(bytes, _)| bytes.len()).sum());
    let mut ends = Vec::with_capacity(positions.len() + 1);
    ends.push(0i32);
    for (bytes, part_ends) in parts {
        let base = taken.len();
        taken.extend_from_slice(&bytes);
        i32::try_from(taken.len()).map_err(|_| too_long())?;
        ends.extend(part_ends.iter().map(|&end| (base + end) as i32));
    }
    let nulls = texts
        .nulls()
        .map(|nulls| positions.iter().map(|&position| nulls.is_valid(position as usize)).collect::<NullBuffer>());
    Ok(StringArray::try_new(OffsetBuffer::new(ScalarBuffer::from(ends)), Buffer::from_vec(taken), nulls)?)
}

/// The bytes of `texts` at `positions` (all within `texts`), one after the other, and where
/// each one ends among them.
fn gather(texts: &StringArray, positions: &[u64]) -> (Vec<u8>, Vec<usize>) {
    let (offsets, bytes) = (texts.value_offsets(), texts.value_data());
    let mut taken = Vec::with_capacity(positions.len() * 8);
    let mut ends = Vec::with_capacity(positions.len());
    for (k, &position) in positions.iter().enumerate() {
        if let Some(&ahead) = positions.get(k + OFFSETS_AHEAD) {
            prefetch(&offsets[ahead as usize]);
        }
        if let Some(byte) = positions.get(k + TEXT_AHEAD).and_then(|&ahead| bytes.get(offsets[ahead as usize] as usize))
        {
            prefetch(byte);
        }
        taken.extend_from_slice(texts.value(position as usize).as_bytes());
        ends.push(taken.len());
    }
    (taken, ends)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_texts_at_any_positions() {
        let texts: StringArray = (0..1000).map(|k| Some(format!("text-{}", "x".repeat(k % 23)))).collect();
        let positions: Vec<u64> = (0..1000).step_by(7).chain([999, 0, 0, 500]).collect();
        let taken = take_texts(&texts, &positions).unwrap();
        let expected: Vec<&str> = positions.iter().map(|&p| texts.value(p as usize)).collect();
        assert_eq!(taken.iter().map(Option::unwrap).collect::<Vec<_>>(), expected);
        assert_eq!(take_texts(&texts, &[]).unwrap().len(), 0);
    }

    /// Positions enough for several parallel tasks: their texts joined in order, nulls kept.
    #[test]
    fn takes_texts_across_tasks() {
        let texts: StringArray = (0..5000).map(|k| (k % 11 != 3).then(|| format!("t{}", "y".repeat(k % 17)))).collect();
        let positions: Vec<u64> = (0..3 * TASK as u64 + 5).map(|k| k * 7919 % 5000).collect();
        let taken = take_texts(&texts, &positions).unwrap();
        let expected: Vec<Option<&str>> =
            positions.iter().map(|&p| texts.is_valid(p as usize).then(|| texts.value(p as usize))).collect();
        assert_eq!(taken.iter().collect::<Vec<_>>(), expected);
    }

    #[test]
    fn keeps_nulls_and_refuses_positions_past_the_end() {
        let texts = StringArray::from(vec![Some("a"), None, Some("ccc")]);
        let taken = take_texts(&texts, &[2, 1, 0]).unwrap();
        assert_eq!(taken.iter().collect::<Vec<_>>(), [Some("ccc"), None, Some("a")]);
        let error = take_texts(&texts, &[1, 3]).unwrap_err();
        assert!(error.to_string().contains("position 3 is past the last of 3 texts"), "{error}");
    }
}
