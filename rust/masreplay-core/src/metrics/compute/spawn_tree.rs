//! PARL's critical steps over the spawn tree, and the tree's depth and branching.

use super::{Scratch, TraceMetrics, refill};

impl Scratch {
    /// PARL's critical steps over the spawn tree, bottom-up; also its depth and branching.
    /// An agent's own steps over all its stages add up to its step count, so its critical
    /// steps are that count plus, per stage, the largest among the sub-agents spawned then.
    pub(super) fn critical_steps(&mut self, metrics: &mut TraceMetrics) {
        let n_agents = self.table.len();
        metrics.spawn_branching = self.table.agents.iter().map(|agent| agent.n_children).max().unwrap_or(0);
        let Some(root) = self.table.orchestrator() else { return };
        self.table.spawn_tree(root);
        self.stage_base.clear();
        self.stage_base.push(0);
        for agent in &self.table.agents {
            self.stage_base.push(self.stage_base[self.stage_base.len() - 1] + agent.data.stage + 1);
        }
        refill(&mut self.stage_best, self.stage_base[n_agents] as usize, 0);
        // Children come after their parent in breadth-first order, so in reverse each agent
        // is complete before it is offered to its parent's stage.
        for &agent in self.table.tree.iter().rev() {
            let agent = agent as usize;
            let stages = self.stage_base[agent] as usize..self.stage_base[agent + 1] as usize;
            let record = &mut self.table.agents[agent];
            let this = &mut record.data;
            this.critical_steps = this.own_steps + self.stage_best[stages].iter().sum::<u32>();
            metrics.spawn_depth = metrics.spawn_depth.max(self.table.level[agent]);
            if agent != root as usize {
                let slot = (self.stage_base[record.parent as usize] + this.spawn_stage) as usize;
                self.stage_best[slot] = self.stage_best[slot].max(this.critical_steps);
            }
        }
        metrics.critical_steps = self.table.agents[root as usize].data.critical_steps;
    }
}
