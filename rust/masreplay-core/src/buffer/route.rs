//! Which shard of a distributed buffer holds a trace: a stable hash of its group_id (64-bit
//! FNV-1a, the same in every process, machine and release), so a GRPO group lands whole in
//! one shard; a branch rollout goes wherever its factual trace goes, so a branch family is
//! never split either.

use std::collections::HashMap;

use arrow_array::Array;
use arrow_array::cast::AsArray;

use crate::bail;
use crate::error::Result;
use crate::store::TraceBatch;
use crate::store::schema::TraceColumns;

/// The shard of a branch rollout whose factual trace is neither in its batch nor known.
pub const UNRESOLVED: u32 = u32::MAX;

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3))
}

/// The shard (of `shards`) a group's traces go to.
pub fn shard_of_group(group_id: &str, shards: u32) -> u32 {
    (fnv1a(group_id.as_bytes()) % u64::from(shards.max(1))) as u32
}

/// The shard of every trace of `batch`: by its group_id, or for a branch rollout, the shard
/// of its factual trace, found in this batch or in `known` (trace id -> shard of traces
/// stored earlier); [`UNRESOLVED`] when it is in neither.
pub fn route_to_shards(batch: &TraceBatch, shards: u32, known: &HashMap<&str, u32>) -> Result<Vec<u32>> {
    if shards == 0 {
        bail!("a sharded buffer needs at least 1 shard");
    }
    let columns = TraceColumns::new(batch.record_batch());
    let factual_ids = columns.counterfactual_of.column_by_name("trace_id").expect("canonical field").as_string::<i32>();
    let row_of: HashMap<&str, usize> = (0..batch.len()).map(|row| (columns.trace_id.value(row), row)).collect();
    let mut shard: Vec<Option<u32>> = vec![None; batch.len()];
    for row in 0..batch.len() {
        // Follow the chain of factual traces inside the batch (a branch of a branch) to the
        // first trace whose shard is known; every trace on the way gets that shard.
        let mut chain = Vec::new();
        let mut at = row;
        let found = loop {
            if let Some(known_shard) = shard[at] {
                break known_shard;
            }
            chain.push(at);
            if !columns.counterfactual_of.is_valid(at) {
                break shard_of_group(columns.group_id.value(at), shards);
            }
            let factual = factual_ids.value(at);
            match row_of.get(factual) {
                // A chain longer than the batch is a cycle of branches, which no buffer stores.
                Some(&next) if chain.len() <= batch.len() => at = next,
                _ => break known.get(factual).copied().unwrap_or(UNRESOLVED),
            }
        };
        for at in chain {
            shard[at] = Some(found);
        }
    }
    Ok(shard.into_iter().map(|s| s.unwrap_or(UNRESOLVED)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{SimConfig, generate};
    use crate::trace::{CounterfactualKind, CounterfactualOf};

    #[test]
    fn groups_stay_whole_and_branches_follow_their_factual_trace() {
        let mut traces = generate(&SimConfig { n_traces: 40, seed: 3, group_size: 4, ..SimConfig::default() })
            .expect("valid config");
        // A branch (in another group) of trace 0, and a branch of that branch.
        for (k, of) in [(1, 0), (2, 40)] {
            let mut branch = traces[k].clone();
            branch.trace_id = format!("branch-{k}");
            branch.group_id = Some("elsewhere".into());
            branch.counterfactual_of = Some(CounterfactualOf {
                trace_id: traces[of].trace_id.clone(),
                event_id: branch.events[0].id.clone(),
                kind: CounterfactualKind::Ablate,
            });
            traces.push(branch);
        }
        let batch = TraceBatch::from_traces(&traces).expect("valid traces");
        let routes = route_to_shards(&batch, 3, &HashMap::new()).expect("shards > 0");
        for (row, trace) in traces.iter().enumerate().take(40) {
            assert_eq!(routes[row], shard_of_group(trace.group_id(), 3));
        }
        assert_eq!((routes[40], routes[41]), (routes[0], routes[0]));
        // A branch whose factual trace was added before: its shard comes from `known`.
        let alone = TraceBatch::from_traces(&traces[41..]).expect("valid trace");
        assert_eq!(route_to_shards(&alone, 3, &HashMap::new()).unwrap(), vec![UNRESOLVED]);
        let known = HashMap::from([("branch-1", 2)]);
        assert_eq!(route_to_shards(&alone, 3, &known).unwrap(), vec![2]);
        assert!(route_to_shards(&batch, 0, &known).is_err());
    }
}
