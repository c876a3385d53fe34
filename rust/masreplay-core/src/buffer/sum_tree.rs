//! A sum tree over slots: set a slot's weight and draw a slot with probability proportional to
//! its weight, both in O(log n). Proportional prioritized replay samples through it.

#[derive(Clone, Debug)]
pub struct SumTree {
    /// Number of leaves, a power of two; node i has children 2i and 2i+1, leaves start at `leaves`.
    leaves: usize,
    nodes: Vec<f64>,
}

impl SumTree {
    pub fn new(min_slots: usize) -> Self {
        let leaves = min_slots.max(1).next_power_of_two();
        SumTree { leaves, nodes: vec![0.0; 2 * leaves] }
    }

    pub fn slots(&self) -> usize {
        self.leaves
    }

    pub fn total(&self) -> f64 {
        self.nodes[1]
    }

    pub fn get(&self, slot: usize) -> f64 {
        self.nodes[self.leaves + slot]
    }

    pub fn set(&mut self, slot: usize, weight: f64) {
        let mut node = self.leaves + slot;
        self.nodes[node] = weight;
        while node > 1 {
            node /= 2;
            self.nodes[node] = self.nodes[2 * node] + self.nodes[2 * node + 1];
        }
    }

    /// The total weight of the slots before `slot` (all of them when `slot` is past the end).
    pub fn prefix(&self, slot: usize) -> f64 {
        if slot >= self.leaves {
            return self.total();
        }
        let (mut node, mut sum) = (self.leaves + slot, 0.0);
        while node > 1 {
            if node % 2 == 1 {
                sum += self.nodes[node - 1];
            }
            node /= 2;
        }
        sum
    }

    /// The slot whose cumulative weight range holds `mass` (0 <= mass < total). Rounding at
    /// the edges never lands on a zero-weight slot: the walk prefers the side with weight.
    pub fn find(&self, mut mass: f64) -> usize {
        let mut node = 1;
        while node < self.leaves {
            let left = 2 * node;
            if mass < self.nodes[left] || self.nodes[left + 1] <= 0.0 {
                node = left;
            } else {
                mass -= self.nodes[left];
                node = left + 1;
            }
        }
        node - self.leaves
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_and_lookup() {
        let mut tree = SumTree::new(5);
        assert_eq!(tree.slots(), 8);
        for (slot, weight) in [(0, 1.0), (2, 2.0), (4, 3.0)] {
            tree.set(slot, weight);
        }
        assert_eq!(tree.total(), 6.0);
        assert_eq!(tree.find(0.5), 0);
        assert_eq!(tree.find(1.0), 2);
        assert_eq!(tree.find(2.99), 2);
        assert_eq!(tree.find(3.0), 4);
        assert_eq!(tree.find(5.999), 4);
        assert_eq!([0, 1, 2, 3, 4, 5, 8].map(|slot| tree.prefix(slot)), [0.0, 1.0, 1.0, 3.0, 3.0, 6.0, 6.0]);
        tree.set(2, 0.0);
        assert_eq!(tree.total(), 4.0);
        assert_eq!(tree.find(1.0), 4);
    }

    #[test]
    fn rounding_never_picks_an_empty_slot() {
        let mut tree = SumTree::new(4);
        tree.set(1, 0.1);
        tree.set(2, 0.2);
        let slot = tree.find(tree.total());
        assert!(tree.get(slot) > 0.0);
    }
}
