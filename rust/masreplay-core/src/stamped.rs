//! A table from dense keys (`0..n_keys`) to small numbers that forgets everything in O(1):
//! an entry is valid only where its stamp is the current generation, so clearing bumps the
//! generation instead of writing the whole table. Per-thread scratch space that is reused
//! from group to group or trace to trace keys its local numbering by it.

pub struct StampedIndex {
    stamp: Vec<u32>,
    value: Vec<u32>,
    generation: u32,
}

impl StampedIndex {
    pub fn new(n_keys: usize) -> Self {
        // Generation 1 from the start, so that the zeroed stamps are all invalid.
        StampedIndex { stamp: vec![0; n_keys], value: vec![0; n_keys], generation: 1 }
    }

    /// Forgets every entry.
    #[inline]
    pub fn clear(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.stamp.fill(0);
            self.generation = 1;
        }
    }

    #[inline]
    pub fn get(&self, key: u32) -> Option<u32> {
        (self.stamp[key as usize] == self.generation).then(|| self.value[key as usize])
    }

    #[inline]
    pub fn insert(&mut self, key: u32, value: u32) {
        self.stamp[key as usize] = self.generation;
        self.value[key as usize] = value;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clearing_forgets_every_entry_even_when_the_generation_wraps() {
        let mut index = StampedIndex::new(3);
        assert_eq!(index.get(1), None);
        index.insert(1, 7);
        assert_eq!((index.get(1), index.get(2)), (Some(7), None));
        index.clear();
        assert_eq!(index.get(1), None);
        index.insert(2, 5);
        index.generation = u32::MAX;
        index.insert(0, 4);
        index.clear();
        assert_eq!((index.get(0), index.get(1), index.get(2)), (None, None, None));
    }
}
