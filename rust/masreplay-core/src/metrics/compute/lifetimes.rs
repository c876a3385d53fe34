//! Agent lifetimes: the most agents alive at one instant.

use super::Scratch;
use crate::trace_view::total_order_key;

impl Scratch {
    /// The largest number of agent lifetimes that overlap at one instant: the most births
    /// so far less deaths strictly before, at any birth (intervals are closed, so lifetimes
    /// touching at an instant overlap).
    pub(super) fn max_concurrent(&mut self) -> u32 {
        self.births.clear();
        self.deaths.clear();
        for agent in &self.table.agents {
            let (born, gone) = agent.data.lifetime();
            self.births.push(total_order_key(born));
            self.deaths.push(total_order_key(gone));
        }
        self.births.sort_unstable();
        self.deaths.sort_unstable();
        // Each agent dies no earlier than it is born, so fewer deaths than births precede a
        // birth and `gone` stays in range.
        let mut gone = 0;
        let mut most = 0;
        for (born_so_far, &born) in self.births.iter().enumerate() {
            while self.deaths[gone] < born {
                gone += 1;
            }
            most = most.max(born_so_far + 1 - gone);
        }
        most as u32
    }
}
