//! The spawn tree: PARL's critical steps bottom-up, its depth and branching.

use super::{NONE, Scratch, TraceMetrics, prefix_sums, refill};

impl Scratch {
    /// PARL's critical steps over the spawn tree, bottom-up; also its depth and branching.
    /// An agent's own steps over all its stages add up to its step count, so its critical
    /// steps are that count plus, per stage, the largest among the sub-agents spawned then.
    pub(super) fn critical_steps(&mut self, metrics: &mut TraceMetrics) {
        let n_agents = self.agents.len();
        metrics.spawn_branching = self.agents.iter().map(|agent| agent.n_children).max().unwrap_or(0);
        let Some(root) = self.orchestrator() else { return };
        // Children grouped by parent.
        refill(&mut self.child_offsets, n_agents + 1, 0);
        for agent in self.agents.iter().filter(|a| a.parent != NONE) {
            self.child_offsets[agent.parent as usize + 1] += 1;
        }
        prefix_sums(&mut self.child_offsets);
        refill(&mut self.children, self.child_offsets[n_agents] as usize, 0);
        // `stage_base` serves as the fill cursor before it holds the stage slots.
        self.stage_base.clear();
        self.stage_base.extend_from_slice(&self.child_offsets[..n_agents]);
        for (child, agent) in self.agents.iter().enumerate().filter(|(_, a)| a.parent != NONE) {
            let slot = &mut self.stage_base[agent.parent as usize];
            self.children[*slot as usize] = child as u32;
            *slot += 1;
        }
        // Breadth-first from the orchestrator; a spawn cycle cannot loop (levels mark visits).
        self.tree.clear();
        self.tree.push(root);
        self.agents[root as usize].level = 0;
        let mut head = 0;
        while head < self.tree.len() {
            let agent = self.tree[head] as usize;
            head += 1;
            for slot in self.child_offsets[agent]..self.child_offsets[agent + 1] {
                let child = self.children[slot as usize];
                if self.agents[child as usize].level == NONE {
                    self.agents[child as usize].level = self.agents[agent].level + 1;
                    self.tree.push(child);
                }
            }
        }
        self.stage_base.clear();
        self.stage_base.push(0);
        for agent in &self.agents {
            self.stage_base.push(self.stage_base[self.stage_base.len() - 1] + agent.stage + 1);
        }
        refill(&mut self.stage_best, self.stage_base[n_agents] as usize, 0);
        // Children come after their parent in breadth-first order, so in reverse each agent
        // is complete before it is offered to its parent's stage.
        for &agent in self.tree.iter().rev() {
            let agent = agent as usize;
            let stages = self.stage_base[agent] as usize..self.stage_base[agent + 1] as usize;
            let this = &mut self.agents[agent];
            this.critical_steps = this.own_steps + self.stage_best[stages].iter().sum::<u32>();
            metrics.spawn_depth = metrics.spawn_depth.max(this.level);
            if agent != root as usize {
                let slot = (self.stage_base[this.parent as usize] + this.spawn_stage) as usize;
                self.stage_best[slot] = self.stage_best[slot].max(this.critical_steps);
            }
        }
        metrics.critical_steps = self.agents[root as usize].critical_steps;
    }

    /// The author of the earliest event whose role says orchestrator; without one, the
    /// author of the earliest candidate event among agents nobody spawned (among every
    /// candidate when all were spawned, as in a spawn cycle). None when no agent qualifies
    /// (a trace of human and safety events only): a human is never the orchestrator.
    pub(super) fn orchestrator(&self) -> Option<u32> {
        let agents = || (0..self.agents.len() as u32).map(|local| (local, &self.agents[local as usize]));
        agents()
            .filter(|(_, agent)| agent.orchestrator_event != NONE)
            .min_by_key(|(_, agent)| agent.orchestrator_event)
            .or_else(|| {
                agents()
                    .filter(|(_, agent)| agent.candidate_event != NONE)
                    .min_by_key(|(_, agent)| (agent.parent != NONE, agent.candidate_event))
            })
            .map(|(local, _)| local)
    }
}
