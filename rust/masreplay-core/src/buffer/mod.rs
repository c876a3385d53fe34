//! The graph-native replay buffer: whole traces in Arrow chunks, FIFO eviction of whole
//! traces, indexes by trace id and group, uniform / prioritized / group sampling, and graph
//! queries on stored traces.

mod gather;
mod persist;
mod route;
mod staleness;
mod sum_tree;

use std::collections::{HashMap, HashSet, VecDeque};

use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use arrow_select::concat::concat_batches;
use rand::RngExt;
use rand_xoshiro::Xoshiro256PlusPlus;

pub use crate::trace::Unit;
pub use gather::{Gather, Gathered, PadValue, Padded, PaddedNumbers};
pub use persist::{load, save};
pub use route::{UNRESOLVED, route_to_shards, shard_of_group};
pub use staleness::UNVERSIONED;
use staleness::fresh;
use sum_tree::SumTree;

use crate::bail;
use crate::error::{MasreplayError, Result, ValidationError};
use crate::names::named_enum;
use crate::rng::call_stream;
use crate::store::{TraceBatch, share_null_columns, trace_at, trim_lists, with_canonical_codes};
use crate::trace::Trace;
use crate::trace_view::BatchView;

named_enum!(
    /// How sampling picks traces.
    Sampler as "sampler" {
        Uniform = "uniform",
        Prioritized = "prioritized",
    }
);

/// Which stored traces a sample may draw from.
#[derive(Clone, Copy, Debug, Default)]
pub struct ShapeFilter {
    pub min_events: Option<usize>,
    pub max_events: Option<usize>,
}

impl ShapeFilter {
    fn accepts(&self, n_events: u32) -> bool {
        let n = n_events as usize;
        self.min_events.is_none_or(|min| n >= min) && self.max_events.is_none_or(|max| n <= max)
    }

    fn is_open(&self) -> bool {
        self.min_events.is_none() && self.max_events.is_none()
    }
}

/// A sample: the traces to gather, and for each its sampling probability (for importance
/// weights).
pub struct Sample {
    pub traces: Gather,
    pub probabilities: Vec<f64>,
}

/// What the buffer keeps of a stored trace besides its data (which [`GraphBuffer::locate`]
/// finds from the sequence number).
#[derive(Clone, Copy, Debug)]
struct Entry {
    n_events: u32,
    group: u32,
    /// For a branch rollout, the sequence number of its factual trace.
    factual: Option<u64>,
    /// The trace's policy_version, or [`UNVERSIONED`].
    version: i64,
    /// Evicted out of FIFO order (with its factual trace); dropped when it reaches the front.
    removed: bool,
}

/// Consecutive sequence numbers seen in the priority ring: `len` slots from `start` (going
/// on from slot 0 past the last), the tree's mass before `start`, the mass up to the ring's
/// end (`first_mass`) and in all.
struct Span {
    first_seq: u64,
    start: usize,
    len: usize,
    before: f64,
    first_mass: f64,
    mass: f64,
}

/// Chunks are not merged past this many events (about 30 MB of typical event data).
const MAX_MERGED_CHUNK_EVENTS: usize = 1 << 20;

/// How many of the newest chunks one merge joins (see [`GraphBuffer::merge_small_chunks`]).
const MERGE_FAN_IN: usize = 8;

/// Consecutive row ranges of at most `max_events` events each (a longer trace alone).
fn pieces_by_events(n_events: &[i32], max_events: usize) -> Vec<std::ops::Range<usize>> {
    let mut pieces = Vec::new();
    let (mut start, mut events) = (0, 0);
    for (row, &n) in n_events.iter().enumerate() {
        if row > start && events + n as usize > max_events {
            pieces.push(start..row);
            (start, events) = (row, 0);
        }
        events += n as usize;
    }
    if start < n_events.len() {
        pieces.push(start..n_events.len());
    }
    pieces
}

fn chunk_events(batch: &RecordBatch) -> usize {
    let events = batch.column_by_name("events").expect("canonical column").as_list::<i32>();
    events.values().len()
}

/// One added batch (or several small ones merged); dropped once every trace in it is evicted.
struct Chunk {
    /// Sequence number of the trace in row 0: a chunk holds consecutive sequence numbers
    /// (rows are appended in insertion order, merged onto the end, never removed).
    first_seq: u64,
    batch: RecordBatch,
    live: usize,
}

/// Groups kept indexable so one can be drawn uniformly in O(1). A group is known only while
/// it has a stored trace: a trainer may name a new group every step for days, so an emptied
/// group's id goes back to `free` for the next new name.
#[derive(Default)]
struct Groups {
    /// The name of each group id (empty for a free id).
    names: Vec<String>,
    index: HashMap<String, u32>,
    members: Vec<VecDeque<u64>>,
    /// Position of each group in `nonempty`, or u32::MAX.
    position: Vec<u32>,
    nonempty: Vec<u32>,
    /// Ids of emptied groups, given to new names first.
    free: Vec<u32>,
}

impl Groups {
    fn intern(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.index.get(name) {
            return id;
        }
        let id = match self.free.pop() {
            Some(id) => {
                self.names[id as usize] = name.to_owned();
                id
            }
            None => {
                self.names.push(name.to_owned());
                self.members.push(VecDeque::new());
                self.position.push(u32::MAX);
                self.names.len() as u32 - 1
            }
        };
        self.index.insert(name.to_owned(), id);
        id
    }

    fn push(&mut self, group: u32, seq: u64) {
        let members = &mut self.members[group as usize];
        if members.is_empty() {
            self.position[group as usize] = self.nonempty.len() as u32;
            self.nonempty.push(group);
        }
        members.push_back(seq);
    }

    /// Eviction is FIFO, so the evicted trace is usually the oldest member of its group; a
    /// branch evicted with its factual trace may sit anywhere in it.
    fn remove(&mut self, group: u32, seq: u64) {
        let members = &mut self.members[group as usize];
        if members.front() == Some(&seq) {
            members.pop_front();
        } else if let Some(at) = members.iter().position(|&m| m == seq) {
            members.remove(at);
        }
        if members.is_empty() {
            let at = self.position[group as usize] as usize;
            let last = *self.nonempty.last().expect("a nonempty group is listed");
            self.nonempty.swap_remove(at);
            if last != group {
                self.position[last as usize] = at as u32;
            }
            self.position[group as usize] = u32::MAX;
            self.index.remove(&self.names[group as usize]);
            // The id is reused with its name and member list emptied; a large group's list
            // must not keep its allocation behind a small one.
            self.names[group as usize] = String::new();
            self.members[group as usize] = VecDeque::new();
            self.free.push(group);
        }
    }

    /// Lists the nonempty groups in `other`'s order (the same groups, by name).
    fn list_as(&mut self, other: &Groups) -> Result<()> {
        let mut listed = Vec::with_capacity(other.nonempty.len());
        for &group in &other.nonempty {
            let name = &other.names[group as usize];
            let Some(&id) = self.index.get(name) else { bail!("group {name:?} is not stored") };
            listed.push(id);
        }
        if listed.len() != self.nonempty.len() {
            bail!("{} groups are stored, not {}", self.nonempty.len(), listed.len());
        }
        for (at, &id) in listed.iter().enumerate() {
            self.position[id as usize] = at as u32;
        }
        self.nonempty = listed;
        Ok(())
    }

    /// Group ids in use or free: the most groups stored at once.
    #[cfg(test)]
    fn ids(&self) -> usize {
        self.names.len()
    }
}

pub struct GraphBuffer {
    capacity: usize,
    unit: Unit,
    seed: u64,
    /// Sampling calls so far; each call draws from its own stream derived from (seed, calls),
    /// which makes a saved and reloaded buffer continue with the same samples.
    calls: u64,
    chunks: VecDeque<Chunk>,
    /// Stored traces in insertion order; `entries[k]` has sequence number `first_seq + k`.
    /// Entries marked `removed` are gone already and only hold their place.
    entries: VecDeque<Entry>,
    first_seq: u64,
    /// Traces stored (entries not removed).
    live: usize,
    /// The branch rollouts of each stored factual trace, by sequence number.
    branches: HashMap<u64, Vec<u64>>,
    by_id: HashMap<String, u64>,
    groups: Groups,
    priorities: SumTree,
    max_priority: f64,
    num_events: usize,
    /// The trainer's current policy version; staleness is counted back from it.
    policy_version: i64,
    /// The staleness bound a sample uses when its call gives none.
    max_staleness: Option<u64>,
    /// The newest sequence number whose version is older than its predecessor's: while it
    /// has left the buffer, versions rise along insertion order and the traces fresh enough
    /// for a sample are a suffix of it.
    newest_inversion: Option<u64>,
}

/// The largest priority: the sum of up to 2^32 of them stays finite, so the sum tree never
/// overflows to infinity (which would make prioritized sampling draw by zero probabilities).
pub const MAX_PRIORITY: f64 = f64::MAX / 4_294_967_296.0;

/// A priority is a finite number in `0..=MAX_PRIORITY`.
pub(crate) fn check_priority(priority: f64) -> std::result::Result<(), String> {
    if priority.is_finite() && (0.0..=MAX_PRIORITY).contains(&priority) {
        Ok(())
    } else {
        Err(format!("{priority:?} is not a priority; priorities are finite numbers from 0 to {MAX_PRIORITY:e}"))
    }
}

impl GraphBuffer {
    pub fn new(capacity: usize, unit: Unit, seed: u64) -> Result<Self> {
        if capacity == 0 {
            bail!("capacity must be at least 1");
        }
        Ok(GraphBuffer {
            capacity,
            unit,
            seed,
            calls: 0,
            chunks: VecDeque::new(),
            entries: VecDeque::new(),
            first_seq: 0,
            live: 0,
            branches: HashMap::new(),
            by_id: HashMap::new(),
            groups: Groups::default(),
            priorities: SumTree::new(16),
            max_priority: 1.0,
            num_events: 0,
            policy_version: 0,
            max_staleness: None,
            newest_inversion: None,
        })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn unit(&self) -> Unit {
        self.unit
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Sequence numbers of the stored traces, in insertion order.
    fn stored_seqs(&self) -> impl Iterator<Item = u64> + '_ {
        self.entries.iter().enumerate().filter(|(_, e)| !e.removed).map(|(k, _)| self.first_seq + k as u64)
    }

    pub fn num_events(&self) -> usize {
        self.num_events
    }

    /// Bytes of memory the stored traces hold (each shared allocation once).
    pub fn nbytes(&self) -> usize {
        crate::store::allocated_bytes(self.chunks.iter().map(|c| &c.batch))
    }

    pub fn num_groups(&self) -> usize {
        self.groups.nonempty.len()
    }

    pub fn contains(&self, trace_id: &str) -> bool {
        self.by_id.contains_key(trace_id)
    }

    fn used(&self) -> usize {
        match self.unit {
            Unit::Traces => self.live,
            Unit::Events => self.num_events,
        }
    }

    fn slot(&self, seq: u64) -> usize {
        (seq as usize) & (self.priorities.slots() - 1)
    }

    fn entry(&self, seq: u64) -> &Entry {
        &self.entries[(seq - self.first_seq) as usize]
    }

    /// (index in `chunks`, row) of the trace with sequence number `seq`: a binary search over
    /// the chunks' first sequence numbers (few, and in cache), where reading the trace's entry
    /// would be a cache miss in a large buffer.
    fn locate(&self, seq: u64) -> (usize, usize) {
        let k = self.chunks.partition_point(|chunk| chunk.first_seq <= seq) - 1;
        (k, (seq - self.chunks[k].first_seq) as usize)
    }

    /// Which traces of `batch` cannot be added: ids already stored or repeated in the batch,
    /// and traces larger than the whole capacity.
    pub fn check_addable(&self, batch: &TraceBatch) -> Vec<(usize, ValidationError)> {
        let mut seen = HashSet::new();
        let columns = crate::store::schema::TraceColumns::new(batch.record_batch());
        let of = columns.counterfactual_of;
        let factual_ids = of.column_by_name("trace_id").expect("canonical field").as_string::<i32>();
        let n_events = batch.record_batch().column_by_name("n_events").expect("canonical column");
        let n_events = n_events.as_primitive::<arrow_array::types::Int32Type>();
        let mut problems = Vec::new();
        // Traces of this batch that will be added: a branch may follow its factual trace only
        // if that one is added (a rejected factual would leave the branch orphaned).
        let mut accepted = HashSet::new();
        for (position, trace_id) in batch.trace_ids().into_iter().enumerate() {
            let problem = if self.by_id.contains_key(trace_id) {
                Some(("/trace_id", "a trace with this id is already stored in the buffer".to_owned()))
            } else if !seen.insert(trace_id) {
                Some(("/trace_id", "this trace id appears twice in the added batch".to_owned()))
            } else if of.is_valid(position)
                && !self.by_id.contains_key(factual_ids.value(position))
                && !accepted.contains(factual_ids.value(position))
            {
                let reason = "a branch rollout is kept with its factual trace, which is neither stored nor added earlier in this batch";
                Some(("/counterfactual_of/trace_id", reason.to_owned()))
            } else if self.max_staleness.is_some() && columns.policy_version.is_null(position) {
                let reason =
                    "the buffer bounds staleness (max_staleness is set), so every trace must carry a policy_version";
                Some(("/policy_version", reason.to_owned()))
            } else if self.unit == Unit::Events && n_events.value(position) as usize > self.capacity {
                let reason = format!(
                    "the trace has {} events, more than the buffer's whole capacity of {} events",
                    n_events.value(position),
                    self.capacity
                );
                Some(("/events", reason))
            } else {
                None
            };
            match problem {
                Some((path, reason)) => problems.push((position, ValidationError::new(Some(trace_id), path, reason))),
                None => {
                    accepted.insert(trace_id);
                }
            }
        }
        problems
    }

    /// Adds every trace of `batch` (which must pass [`Self::check_addable`]; call it first),
    /// then evicts the oldest traces while over capacity. Returns the number added.
    pub fn add(&mut self, batch: &TraceBatch) -> Result<usize> {
        if let Some((_, error)) = self.check_addable(batch).into_iter().next() {
            return Err(error.into());
        }
        self.add_with_priorities(batch, None)
    }

    /// Adds the traces of `batch` that can be added (see [`Self::check_addable`]) and leaves
    /// out the others, reported as (position in `batch`, why), in order.
    pub fn add_valid(&mut self, batch: &TraceBatch) -> Result<(usize, Vec<(usize, ValidationError)>)> {
        let problems = self.check_addable(batch);
        if problems.is_empty() {
            return Ok((self.add_with_priorities(batch, None)?, problems));
        }
        let keep: Vec<usize> =
            (0..batch.len()).filter(|i| problems.binary_search_by_key(i, |p| p.0).is_err()).collect();
        Ok((self.add(&batch.take(&keep)?)?, problems))
    }

    fn add_with_priorities(&mut self, batch: &TraceBatch, priorities: Option<&[f64]>) -> Result<usize> {
        if batch.is_empty() {
            return Ok(0);
        }
        let record = batch.record_batch();
        let columns = crate::store::schema::TraceColumns::new(record);
        let n_events = record.column_by_name("n_events").expect("canonical column");
        let n_events = n_events.as_primitive::<arrow_array::types::Int32Type>();
        let factual_ids = columns.counterfactual_of.column_by_name("trace_id").expect("canonical field");
        let factual_ids = factual_ids.as_string::<i32>();
        self.reserve_slots(self.entries.len() + batch.len());
        let batch_first_seq = self.first_seq + self.entries.len() as u64;
        let pieces = pieces_by_events(n_events.values(), MAX_MERGED_CHUNK_EVENTS);
        // A piece of a large batch keeps only its own rows' data, and absent fields share the
        // process-wide zero buffer rather than the whole batch's (built before anything changes).
        let piece_batches = pieces
            .iter()
            .map(|rows| Ok(share_null_columns(&trim_lists(&record.slice(rows.start, rows.len()))?)))
            .collect::<Result<Vec<RecordBatch>>>()?;
        for rows in &pieces {
            for row in rows.clone() {
                let seq = self.first_seq + self.entries.len() as u64;
                let group = self.groups.intern(columns.group_id.value(row));
                self.groups.push(group, seq);
                self.by_id.insert(columns.trace_id.value(row).to_owned(), seq);
                let events = n_events.value(row) as u32;
                let factual = columns
                    .counterfactual_of
                    .is_valid(row)
                    .then(|| self.by_id.get(factual_ids.value(row)).copied())
                    .flatten();
                if let Some(factual) = factual {
                    self.branches.entry(factual).or_default().push(seq);
                }
                let version =
                    if columns.policy_version.is_valid(row) { columns.policy_version.value(row) } else { UNVERSIONED };
                if self.entries.back().is_some_and(|previous| previous.version > version) {
                    self.newest_inversion = Some(seq);
                }
                self.entries.push_back(Entry { n_events: events, group, factual, version, removed: false });
                self.live += 1;
                self.num_events += events as usize;
                let priority = priorities.map_or(self.max_priority, |p| p[row]);
                let slot = self.slot(seq);
                self.priorities.set(slot, priority);
            }
        }
        for (batch, rows) in piece_batches.into_iter().zip(&pieces) {
            let first_seq = batch_first_seq + rows.start as u64;
            self.chunks.push_back(Chunk { first_seq, live: batch.num_rows(), batch });
        }
        while self.used() > self.capacity {
            self.evict_oldest();
        }
        self.merge_small_chunks();
        Ok(batch.len())
    }

    /// Training loops add a few traces per step; left alone, that makes one chunk per step,
    /// and a sample then gathers from hundreds of chunks. The newest chunks are merged like
    /// the digits of a counter in base [`MERGE_FAN_IN`]: once the newest `MERGE_FAN_IN`
    /// chunks are of comparable size, they become one chunk in one concatenation. A merge costs
    /// about the same for 2 or 16 small chunks (its cost is per column, and the canonical
    /// layout has ~18 nested ones), so this pays it once per `MERGE_FAN_IN - 1` adds where
    /// pairs (a binary counter) paid it at every add, and copies each event fewer times.
    /// Merged chunks stop growing at a size cap that bounds the cost of one merge and the
    /// memory evicted traces keep alive in a chunk not yet wholly evicted (at most an eighth
    /// of the capacity); near it, pairs still merge while they fit, so chunks stay few.
    fn merge_small_chunks(&mut self) {
        while let Some(count) = self.chunks_to_merge() {
            let newest = self.chunks.len() - count;
            let batches: Vec<&RecordBatch> = self.chunks.range(newest..).map(|c| &c.batch).collect();
            // Merging only saves work later: if it cannot be done (offsets would overflow),
            // the chunks simply stay apart.
            // Concatenation writes out null columns in full: they go back to the shared zeros.
            let Ok(merged) = concat_batches(&batches[0].schema(), batches)
                .map_err(MasreplayError::from)
                .and_then(|joined| with_canonical_codes(&joined))
                .map(|recoded| share_null_columns(&recoded))
            else {
                break;
            };
            // The chunks hold consecutive sequence numbers, and now consecutive rows.
            let first_seq = self.chunks[newest].first_seq;
            self.chunks.truncate(newest);
            self.chunks.push_back(Chunk { first_seq, live: merged.num_rows(), batch: merged });
        }
    }

    /// How many of the newest chunks to merge now: [`MERGE_FAN_IN`] of them, unless the oldest
    /// holds more than twice the events of the largest newer one (a large added batch is not
    /// copied along with small ones); where those would pass the size cap, the newest two if
    /// they fit. Chunks with evicted traces are left alone.
    fn chunks_to_merge(&self) -> Option<usize> {
        let similar = |window: &[&Chunk]| {
            let events: Vec<usize> = window.iter().map(|c| chunk_events(&c.batch)).collect();
            window.iter().all(|c| c.live == c.batch.num_rows())
                && events[0] <= 2 * events[1..].iter().copied().max().unwrap_or(0)
        };
        let fits = |window: &[&Chunk]| {
            let events: usize = window.iter().map(|c| chunk_events(&c.batch)).sum();
            let units = match self.unit {
                Unit::Traces => window.iter().map(|c| c.batch.num_rows()).sum(),
                Unit::Events => events,
            };
            events <= MAX_MERGED_CHUNK_EVENTS && units <= self.capacity / 8
        };
        let window: Vec<&Chunk> = self.chunks.range(self.chunks.len().checked_sub(MERGE_FAN_IN)?..).collect();
        if !similar(&window) {
            return None;
        }
        if fits(&window) {
            return Some(MERGE_FAN_IN);
        }
        let pair = &window[MERGE_FAN_IN - 2..];
        (similar(pair) && fits(pair)).then_some(2)
    }

    /// Grows the priority ring (a power of two) so `needed` consecutive sequence numbers fit.
    fn reserve_slots(&mut self, needed: usize) {
        if needed <= self.priorities.slots() {
            return;
        }
        let mut grown = SumTree::new(needed);
        for k in 0..self.entries.len() {
            let seq = self.first_seq + k as u64;
            let weight = self.priorities.get(self.slot(seq));
            grown.set((seq as usize) & (grown.slots() - 1), weight);
        }
        self.priorities = grown;
    }

    /// Evicts the oldest stored trace, with the branch rollouts kept for it (never orphaned).
    fn evict_oldest(&mut self) {
        let seq = self.first_seq;
        self.forget(seq);
        self.drop_removed_front();
    }

    /// Takes trace `seq` and, transitively, its branches out of every index; their entries
    /// stay as removed placeholders until they reach the front.
    fn forget(&mut self, seq: u64) {
        let mut pending = vec![seq];
        while let Some(seq) = pending.pop() {
            let k = (seq - self.first_seq) as usize;
            let entry = self.entries[k];
            self.entries[k].removed = true;
            self.live -= 1;
            let slot = self.slot(seq);
            self.priorities.set(slot, 0.0);
            self.num_events -= entry.n_events as usize;
            self.groups.remove(entry.group, seq);
            let (k, row) = self.locate(seq);
            let chunk = &mut self.chunks[k];
            let trace_id = chunk.batch.column(0).as_string::<i32>().value(row).to_owned();
            chunk.live -= 1;
            self.by_id.remove(&trace_id);
            if let Some(siblings) = entry.factual.and_then(|factual| self.branches.get_mut(&factual)) {
                siblings.retain(|&b| b != seq);
            }
            pending.extend(self.branches.remove(&seq).unwrap_or_default());
        }
    }

    /// Drops removed entries at the front, and the chunks no entry refers to any more.
    fn drop_removed_front(&mut self) {
        while self.entries.front().is_some_and(|e| e.removed) {
            self.entries.pop_front();
            self.first_seq += 1;
        }
        while let Some(chunk) = self.chunks.front() {
            // The front entry's trace (seq first_seq) may still be in this chunk.
            let referenced =
                !self.entries.is_empty() && self.first_seq < chunk.first_seq + chunk.batch.num_rows() as u64;
            if chunk.live > 0 || referenced {
                break;
            }
            self.chunks.pop_front();
        }
    }

    /// Picks the traces with the given sequence numbers, in that order. Only the chunks that
    /// hold them take part (so the cost follows the sample, not the number of chunks stored),
    /// and the pick owns them: copying can run after a lock on the buffer is let go.
    fn gather(&self, seqs: &[u64]) -> Gather {
        let mut position_of_chunk: HashMap<usize, usize, foldhash::fast::RandomState> = HashMap::default();
        let mut chunks: Vec<RecordBatch> = Vec::new();
        let picks: Vec<(usize, usize)> = seqs
            .iter()
            .map(|&seq| {
                let (k, row) = self.locate(seq);
                let position = *position_of_chunk.entry(k).or_insert_with(|| {
                    chunks.push(self.chunks[k].batch.clone());
                    chunks.len() - 1
                });
                (position, row)
            })
            .collect();
        Gather::new(chunks, picks)
    }

    /// Every stored trace, in insertion order.
    pub fn to_batch(&self) -> Result<TraceBatch> {
        let seqs: Vec<u64> = self.stored_seqs().collect();
        self.gather(&seqs).collect()
    }

    fn seq_of(&self, trace_id: &str) -> Result<u64> {
        self.by_id.get(trace_id).copied().ok_or_else(|| MasreplayError::TraceNotFound(trace_id.to_owned()))
    }

    pub fn get(&self, trace_id: &str) -> Result<TraceBatch> {
        self.gather(&[self.seq_of(trace_id)?]).collect()
    }

    fn trace(&self, trace_id: &str) -> Result<Trace> {
        let (k, row) = self.locate(self.seq_of(trace_id)?);
        Ok(trace_at(&self.chunks[k].batch, row))
    }

    fn priority_of_seq(&self, seq: u64) -> f64 {
        self.priorities.get(self.slot(seq))
    }

    pub fn priorities_in_order(&self) -> Vec<f64> {
        self.stored_seqs().map(|seq| self.priority_of_seq(seq)).collect()
    }

    /// Sets the priorities of stored traces; all or nothing. An id that is not stored is
    /// refused, or with `skip_missing` left out (a trace drawn, then evicted by a producer
    /// before the learner's update). Returns how many priorities were set.
    pub fn update_priorities(&mut self, trace_ids: &[&str], priorities: &[f64], skip_missing: bool) -> Result<usize> {
        if trace_ids.len() != priorities.len() {
            bail!("{} trace ids but {} priorities: give one priority per trace", trace_ids.len(), priorities.len());
        }
        let mut updates = Vec::with_capacity(trace_ids.len());
        for (trace_id, &priority) in trace_ids.iter().zip(priorities) {
            check_priority(priority)
                .map_err(|reason| MasreplayError::InvalidArgument(format!("priority of {trace_id:?}: {reason}")))?;
            match self.seq_of(trace_id) {
                Ok(seq) => updates.push((seq, priority)),
                Err(_) if skip_missing => {}
                // An id among the arguments: refused as a bad argument (a ValueError in
                // Python), as the sharded buffer refuses it, not as a lookup.
                Err(absent) => return Err(MasreplayError::InvalidArgument(absent.to_string())),
            }
        }
        for &(seq, priority) in &updates {
            let slot = self.slot(seq);
            self.priorities.set(slot, priority);
            self.max_priority = self.max_priority.max(priority);
        }
        Ok(updates.len())
    }

    /// The random stream of a draw: `seed`'s own, else the buffer's next one, which only a
    /// draw that succeeds takes (`take_stream`): a refused call leaves the buffer as it was,
    /// and the draws after it are those of a buffer that never saw it.
    fn stream(&self, seed: Option<u64>) -> Xoshiro256PlusPlus {
        match seed {
            Some(seed) => call_stream(seed, u64::MAX),
            None => call_stream(self.seed, self.calls.wrapping_add(1)),
        }
    }

    fn take_stream(&mut self, seed: Option<u64>) {
        if seed.is_none() {
            self.calls = self.calls.wrapping_add(1);
        }
    }

    /// The stored traces a draw may pick: those the shape filter accepts, no older than `bound`.
    /// O(traces scanned): the fresh suffix when versions arrive in order, else every trace.
    fn candidates(&self, filter: &ShapeFilter, bound: Option<i64>) -> Vec<u64> {
        self.search_range(bound)
            .filter(|&seq| {
                let entry = self.entry(seq);
                !entry.removed && filter.accepts(entry.n_events) && fresh(entry.version, bound)
            })
            .collect()
    }

    /// Draws `batch_size` traces with replacement among those no more than `max_staleness`
    /// policy versions old (the buffer's own bound when None). With `with_branches`, the
    /// stored branch rollouts of the drawn traces that are fresh enough follow the draws, each
    /// once and none that was drawn itself (probability NaN: they were not drawn).
    pub fn sample(
        &mut self,
        batch_size: usize,
        sampler: Sampler,
        filter: ShapeFilter,
        seed: Option<u64>,
        with_branches: bool,
        max_staleness: Option<u64>,
    ) -> Result<Sample> {
        if self.is_empty() {
            bail!("cannot sample from an empty buffer");
        }
        let bound = self.version_bound(max_staleness);
        let mut rng = self.stream(seed);
        let (seqs, probabilities) = match sampler {
            Sampler::Uniform => self.draw_uniform(&mut rng, batch_size, &filter, bound)?,
            Sampler::Prioritized => self.draw_prioritized(&mut rng, batch_size, &filter, bound)?,
        };
        let (mut seqs, mut probabilities) = (seqs, probabilities);
        if with_branches {
            // Each stored branch once, and none that was drawn itself: credit counts every
            // row of a branch as one more rollout.
            let mut present: HashSet<u64> = seqs.iter().copied().collect();
            let branches: Vec<u64> = seqs
                .iter()
                .flat_map(|seq| self.branch_seqs(*seq))
                .copied()
                .filter(|&branch| fresh(self.entry(branch).version, bound) && present.insert(branch))
                .collect();
            probabilities.extend(std::iter::repeat_n(f64::NAN, branches.len()));
            seqs.extend(branches);
        }
        self.take_stream(seed);
        Ok(Sample { traces: self.gather(&seqs), probabilities })
    }

    /// How many stored traces a sample with this filter and staleness bound may draw, and
    /// their total priority: O(log n) when versions arrive in order and nothing was removed
    /// out of order, else one scan.
    pub fn eligible(&self, filter: &ShapeFilter, max_staleness: Option<u64>) -> (usize, f64) {
        let bound = self.version_bound(max_staleness);
        if filter.is_open()
            && let Some(range) = self.fresh_range(bound)
        {
            let count = if self.live == self.entries.len() {
                (range.end - range.start) as usize
            } else {
                range.clone().filter(|&seq| !self.entry(seq).removed).count()
            };
            return (count, self.span(range).mass);
        }
        let pool = self.candidates(filter, bound);
        let mass = pool.iter().map(|&seq| self.priority_of_seq(seq)).sum();
        (pool.len(), mass)
    }

    fn branch_seqs(&self, seq: u64) -> &[u64] {
        self.branches.get(&seq).map_or(&[], Vec::as_slice)
    }

    /// The stored branch rollouts of `trace_id` (only those at `event_id`, when given), in
    /// insertion order.
    pub fn branches_of(&self, trace_id: &str, event_id: Option<&str>) -> Result<TraceBatch> {
        let seqs: Vec<u64> = self
            .branch_seqs(self.seq_of(trace_id)?)
            .iter()
            .copied()
            .filter(|&seq| {
                event_id.is_none_or(|wanted| {
                    let (k, row) = self.locate(seq);
                    let of = self.chunks[k].batch.column_by_name("counterfactual_of").expect("canonical");
                    let ids = of.as_struct().column_by_name("event_id").expect("canonical field").as_string::<i32>();
                    ids.value(row) == wanted
                })
            })
            .collect();
        self.gather(&seqs).collect()
    }

    fn no_match(&self, filter: &ShapeFilter, bound: Option<i64>) -> MasreplayError {
        let staleness = bound.map_or(String::new(), |bound| format!(" and a policy_version of at least {bound}"));
        MasreplayError::InvalidArgument(format!(
            "no stored trace has between {} and {} events{staleness}",
            filter.min_events.unwrap_or(0),
            filter.max_events.map_or("any number of".to_owned(), |m| m.to_string())
        ))
    }

    fn draw_uniform(
        &self,
        rng: &mut Xoshiro256PlusPlus,
        count: usize,
        filter: &ShapeFilter,
        bound: Option<i64>,
    ) -> Result<(Vec<u64>, Vec<f64>)> {
        // Without removed placeholders, the k-th trace of a range is simply its start + k: the
        // draw costs O(count) whatever the buffer holds.
        let direct = (filter.is_open() && self.live == self.entries.len()).then(|| self.fresh_range(bound)).flatten();
        if let Some(range) = direct {
            let n = (range.end - range.start) as usize;
            if n == 0 {
                return Err(self.no_match(filter, bound));
            }
            let seqs = (0..count).map(|_| range.start + rng.random_range(0..n) as u64).collect();
            return Ok((seqs, vec![1.0 / n as f64; count]));
        }
        let pool = self.candidates(filter, bound);
        if pool.is_empty() {
            return Err(self.no_match(filter, bound));
        }
        let seqs = (0..count).map(|_| pool[rng.random_range(0..pool.len())]).collect();
        Ok((seqs, vec![1.0 / pool.len() as f64; count]))
    }

    fn draw_prioritized(
        &self,
        rng: &mut Xoshiro256PlusPlus,
        count: usize,
        filter: &ShapeFilter,
        bound: Option<i64>,
    ) -> Result<(Vec<u64>, Vec<f64>)> {
        if filter.is_open() {
            if bound.is_none() {
                let first_seq = self.first_seq;
                let mask = self.priorities.slots() - 1;
                let base = (first_seq as usize) & mask;
                let seq_of_slot = |slot| first_seq + ((slot + mask + 1 - base) & mask) as u64;
                return self.draw_from_tree(rng, count, &self.priorities, seq_of_slot);
            }
            if let Some(range) = self.fresh_range(bound)
                && let Some(draws) = self.draw_prioritized_in(rng, count, range)
            {
                return Ok(draws);
            }
        }
        let pool = self.candidates(filter, bound);
        if pool.is_empty() {
            return Err(self.no_match(filter, bound));
        }
        let mut subtree = SumTree::new(pool.len());
        for (i, &seq) in pool.iter().enumerate() {
            subtree.set(i, self.priority_of_seq(seq));
        }
        self.draw_from_tree(rng, count, &subtree, |i| pool[i])
    }

    /// Where the consecutive sequence numbers `range` lie in the priority ring, and their mass.
    fn span(&self, range: std::ops::Range<u64>) -> Span {
        let tree = &self.priorities;
        let (start, len) = (self.slot(range.start), (range.end - range.start) as usize);
        let before = tree.prefix(start);
        // A range that runs past the ring's last slot goes on from slot 0.
        let (first_mass, mass) = if start + len <= tree.slots() {
            let mass = tree.prefix(start + len) - before;
            (mass, mass)
        } else {
            let first_mass = tree.total() - before;
            (first_mass, first_mass + tree.prefix(start + len - tree.slots()))
        };
        Span { first_seq: range.start, start, len, before, first_mass, mass }
    }

    /// Draws by priority among the consecutive sequence numbers `range`, through the whole
    /// priority tree: O(log n) a draw. None when the range has no mass or float rounding at
    /// its edges keeps landing outside it (a range holding a vanishing part of the total
    /// priority); the caller then draws from a tree of the range alone.
    fn draw_prioritized_in(
        &self,
        rng: &mut Xoshiro256PlusPlus,
        count: usize,
        range: std::ops::Range<u64>,
    ) -> Option<(Vec<u64>, Vec<f64>)> {
        let span = self.span(range);
        if span.mass <= 0.0 {
            return None;
        }
        let tree = &self.priorities;
        let mask = tree.slots() - 1;
        let mut seqs = Vec::with_capacity(count);
        let mut probabilities = Vec::with_capacity(count);
        for _ in 0..count {
            let (seq, weight) = (0..8).find_map(|_| {
                let u = rng.random::<f64>() * span.mass;
                let mass = if u < span.first_mass { span.before + u } else { u - span.first_mass };
                let slot = tree.find(mass);
                let offset = (slot + mask + 1 - span.start) & mask;
                let weight = tree.get(slot);
                (offset < span.len && weight > 0.0).then_some((span.first_seq + offset as u64, weight))
            })?;
            seqs.push(seq);
            probabilities.push(weight / span.mass);
        }
        Some((seqs, probabilities))
    }

    fn draw_from_tree(
        &self,
        rng: &mut Xoshiro256PlusPlus,
        count: usize,
        tree: &SumTree,
        seq_of_slot: impl Fn(usize) -> u64,
    ) -> Result<(Vec<u64>, Vec<f64>)> {
        let total = tree.total();
        if total <= 0.0 {
            bail!("every candidate trace has priority 0; nothing can be sampled by priority");
        }
        let mut seqs = Vec::with_capacity(count);
        let mut probabilities = Vec::with_capacity(count);
        for _ in 0..count {
            let slot = tree.find(rng.random::<f64>() * total);
            seqs.push(seq_of_slot(slot));
            probabilities.push(tree.get(slot) / total);
        }
        Ok((seqs, probabilities))
    }

    /// The groups a group sample may draw: at least `group_size` traces (when given), and
    /// every trace no older than `bound`. O(groups) when versions arrive in order (a group's
    /// first trace is then its oldest), else O(stored traces).
    fn eligible_groups(&self, group_size: Option<usize>, bound: Option<i64>) -> Vec<u32> {
        let in_order = self.versions_in_order();
        let is_fresh = |seq: &u64| fresh(self.entry(*seq).version, bound);
        self.groups
            .nonempty
            .iter()
            .copied()
            .filter(|&g| {
                let members = &self.groups.members[g as usize];
                group_size.is_none_or(|size| members.len() >= size)
                    && (bound.is_none()
                        || if in_order { members.front().is_some_and(is_fresh) } else { members.iter().all(is_fresh) })
            })
            .collect()
    }

    /// How many groups [`Self::sample_groups`] may draw from.
    pub fn eligible_group_count(&self, group_size: Option<usize>, max_staleness: Option<u64>) -> usize {
        self.eligible_groups(group_size, self.version_bound(max_staleness)).len()
    }

    /// Draws `num_groups` distinct groups uniformly; each comes whole, or as `group_size`
    /// of its members drawn without replacement (then only groups that large are eligible).
    /// With a staleness bound (`max_staleness`, else the buffer's own), a group is eligible
    /// only when every one of its traces is fresh enough. Traces keep insertion order within
    /// their group.
    pub fn sample_groups(
        &mut self,
        num_groups: usize,
        group_size: Option<usize>,
        seed: Option<u64>,
        max_staleness: Option<u64>,
    ) -> Result<Gather> {
        let bound = self.version_bound(max_staleness);
        let mut rng = self.stream(seed);
        let eligible = self.eligible_groups(group_size, bound);
        if eligible.len() < num_groups {
            bail!(
                "asked for {num_groups} groups but the buffer holds {} group(s){}{}",
                eligible.len(),
                group_size.map_or(String::new(), |s| format!(" with at least {s} traces")),
                bound.map_or(String::new(), |b| format!(" whose traces all have a policy_version of at least {b}"))
            );
        }
        let chosen = rand::seq::index::sample(&mut rng, eligible.len(), num_groups);
        let mut seqs = Vec::new();
        for position in chosen.iter() {
            let members = &self.groups.members[eligible[position] as usize];
            match group_size {
                None => seqs.extend(members.iter().copied()),
                Some(size) => {
                    let mut picked: Vec<usize> = rand::seq::index::sample(&mut rng, members.len(), size).into_vec();
                    picked.sort_unstable();
                    seqs.extend(picked.into_iter().map(|i| members[i]));
                }
            }
        }
        self.take_stream(seed);
        Ok(self.gather(&seqs))
    }

    fn event_index(trace: &Trace, event_id: &str) -> Result<u32> {
        trace.events.iter().position(|e| e.id == event_id).map(|i| i as u32).ok_or_else(|| {
            MasreplayError::InvalidArgument(format!("trace {:?} has no event {event_id:?}", trace.trace_id))
        })
    }

    /// Ids of the events reachable from `event_id` along edges (against them when
    /// `upstream`), read from the stored columns through the trace's view.
    fn reach(&self, trace_id: &str, event_id: &str, upstream: bool) -> Result<Vec<String>> {
        let (k, row) = self.locate(self.seq_of(trace_id)?);
        let view = BatchView::of_record_batch(&self.chunks[k].batch);
        let start = view
            .event_index(row, event_id)
            .ok_or_else(|| MasreplayError::InvalidArgument(format!("trace {trace_id:?} has no event {event_id:?}")))?;
        let graph = if upstream { view.graph_in(row) } else { view.graph(row) };
        let first = view.events_of(row).start;
        Ok(graph.descendants(start).into_iter().map(|j| view.id(first + j as usize).to_owned()).collect())
    }

    /// Ids of the events with a path to `event_id`, in event order.
    pub fn ancestors(&self, trace_id: &str, event_id: &str) -> Result<Vec<String>> {
        self.reach(trace_id, event_id, true)
    }

    /// Ids of the events reachable from `event_id`, in event order.
    pub fn descendants(&self, trace_id: &str, event_id: &str) -> Result<Vec<String>> {
        self.reach(trace_id, event_id, false)
    }

    /// The trace restricted to the given events (kept in their original order) and the edges
    /// between them.
    pub fn subgraph(&self, trace_id: &str, event_ids: &[&str]) -> Result<TraceBatch> {
        let trace = self.trace(trace_id)?;
        let mut keep = vec![false; trace.events.len()];
        for event_id in event_ids {
            keep[Self::event_index(&trace, event_id)? as usize] = true;
        }
        TraceBatch::from_traces(&[restrict(trace, &keep)])
    }

    /// The events of one agent (and the edges between them) as a one-trace batch.
    pub fn agent_view(&self, trace_id: &str, agent: &str) -> Result<TraceBatch> {
        let trace = self.trace(trace_id)?;
        let keep: Vec<bool> = trace.events.iter().map(|e| e.agent == agent).collect();
        if !keep.iter().any(|&k| k) {
            bail!("trace {trace_id:?} has no event by agent {agent:?}");
        }
        TraceBatch::from_traces(&[restrict(trace, &keep)])
    }
}

/// Keeps the marked events and the edges between them, renumbering edge endpoints.
fn restrict(mut trace: Trace, keep: &[bool]) -> Trace {
    let mut new_index = vec![u32::MAX; keep.len()];
    let mut next = 0;
    for (i, &kept) in keep.iter().enumerate() {
        if kept {
            new_index[i] = next;
            next += 1;
        }
    }
    trace.edges.retain(|e| keep[e.src as usize] && keep[e.dst as usize]);
    for edge in &mut trace.edges {
        edge.src = new_index[edge.src as usize];
        edge.dst = new_index[edge.dst as usize];
    }
    let mut position = 0;
    trace.events.retain(|_| {
        position += 1;
        keep[position - 1]
    });
    trace
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{SimConfig, generate};

    fn traces(n_traces: usize, seed: u64) -> TraceBatch {
        let config = SimConfig { n_traces, seed, ..SimConfig::default() };
        TraceBatch::from_traces(&generate(&config).expect("valid config")).expect("valid traces")
    }

    #[test]
    fn small_adds_are_merged_into_few_chunks_without_changing_what_is_stored() {
        let all = traces(800, 1);
        // 6000: nothing evicted; 600: eviction interleaves with merging.
        for capacity in [6000, 600] {
            let mut one_add = GraphBuffer::new(capacity, Unit::Traces, 7).unwrap();
            one_add.add(&all).unwrap();
            let mut small_adds = GraphBuffer::new(capacity, Unit::Traces, 7).unwrap();
            for start in (0..800).step_by(4) {
                small_adds.add(&all.take(&(start..start + 4).collect::<Vec<_>>()).unwrap()).unwrap();
            }
            let (chunks, most) = (small_adds.chunks.len(), small_adds.chunks.iter().map(|c| c.batch.num_rows()).max());
            assert!(chunks < 30, "{chunks} chunks after 200 adds");
            assert!(most.unwrap() <= capacity / 8, "a merged chunk of {most:?} traces");
            assert_eq!(small_adds.to_batch().unwrap().record_batch(), one_add.to_batch().unwrap().record_batch());
            let sampled = |b: &mut GraphBuffer| {
                let pick = b.sample(64, Sampler::Uniform, ShapeFilter::default(), Some(3), false, None).unwrap();
                pick.traces.collect().unwrap().record_batch().clone()
            };
            assert_eq!(sampled(&mut small_adds), sampled(&mut one_add));
        }
    }

    #[test]
    fn small_chunks_merge_eight_at_a_time_and_leave_a_large_one_alone() {
        let mut buffer = GraphBuffer::new(100_000, Unit::Traces, 7).unwrap();
        buffer.add(&traces(2000, 3)).unwrap();
        let small = traces(8 * 64, 4);
        for start in (0..small.len()).step_by(8) {
            buffer.add(&small.take(&(start..start + 8).collect::<Vec<_>>()).unwrap()).unwrap();
        }
        // The large batch stays apart; 64 small adds end in few chunks, none copied 64 times.
        let rows: Vec<usize> = buffer.chunks.iter().map(|c| c.batch.num_rows()).collect();
        assert_eq!((rows[0], rows.iter().sum::<usize>()), (2000, 2000 + 8 * 64), "{rows:?}");
        assert!(rows.len() <= 1 + 2 * (MERGE_FAN_IN - 1), "{rows:?}");
    }

    #[test]
    fn sampled_event_fields_equal_the_collected_batch_for_any_size() {
        let mut buffer = GraphBuffer::new(3000, Unit::Traces, 5).unwrap();
        for seed in 0..3 {
            buffer.add(&traces(1000, 20 + seed)).unwrap(); // three chunks
        }
        // A few picks (copied by one thread) and tens of thousands (copied by every thread).
        for (count, seed) in [(7, 1), (60_000, 2)] {
            let pick = buffer.sample(count, Sampler::Uniform, ShapeFilter::default(), Some(seed), false, None).unwrap();
            let whole = pick.traces.collect().unwrap();
            let n_events = whole.event_field("t").unwrap().len();
            assert_eq!(count > 1000, n_events * 8 >= gather::PARALLEL_COPY_BYTES, "{n_events} events");
            for name in ["t", "tokens", "duration_s", "logprob", "id", "agent"] {
                assert_eq!(pick.traces.event_field(name).unwrap().as_ref(), whole.event_field(name).unwrap().as_ref());
            }
            let offsets = whole.record_batch().column_by_name("events").unwrap().as_list::<i32>().value_offsets();
            let expected: Vec<i64> = offsets.iter().map(|&o| (o - offsets[0]) as i64).collect();
            assert_eq!(pick.traces.event_offsets(), expected);
        }
    }

    #[test]
    fn evicted_groups_are_forgotten() {
        // Every add names new groups (one per trace), as a trainer naming each step's prompts.
        let mut buffer = GraphBuffer::new(100, Unit::Traces, 7).unwrap();
        for seed in 0..50 {
            let config = SimConfig { n_traces: 40, seed, group_size: 1, ..SimConfig::default() };
            buffer.add(&TraceBatch::from_traces(&generate(&config).unwrap()).unwrap()).unwrap();
        }
        assert_eq!(buffer.num_groups(), 100);
        assert!(buffer.groups.ids() <= 140, "{} group ids for 100 stored groups", buffer.groups.ids());
        assert_eq!(buffer.groups.index.len(), 100);
        // A group emptied and named again is one group again.
        let again = TraceBatch::from_traces(
            &generate(&SimConfig { n_traces: 4, seed: 0, group_size: 1, ..SimConfig::default() }).unwrap(),
        )
        .unwrap();
        buffer.add(&again).unwrap();
        let drawn = buffer.sample_groups(100, None, Some(1), None).unwrap().collect().unwrap();
        assert_eq!(drawn.len(), 100);
    }

    #[test]
    fn priorities_of_traces_no_longer_stored_are_refused_or_skipped() {
        let mut buffer = GraphBuffer::new(100, Unit::Traces, 7).unwrap();
        buffer.add(&versioned(3, 1, None)).unwrap();
        let stored = buffer.to_batch().unwrap();
        let [first, second, third] = stored.trace_ids()[..] else { panic!("three traces") };
        let before = buffer.priorities_in_order();
        let refused = buffer.update_priorities(&[first, "evicted", second], &[5.0, 6.0, 7.0], false);
        assert!(matches!(refused, Err(MasreplayError::InvalidArgument(_))));
        assert_eq!(buffer.priorities_in_order(), before, "a refused update changes nothing");
        assert_eq!(buffer.update_priorities(&[first, "evicted", second], &[5.0, 6.0, 7.0], true).unwrap(), 2);
        assert_eq!(buffer.priorities_in_order(), vec![5.0, 7.0, before[2]], "{third} keeps its priority");
        // A bad priority is refused even for an id that would be skipped.
        assert!(buffer.update_priorities(&["evicted"], &[f64::NAN], true).is_err());
    }

    /// `n_traces` simulated traces, all of `version` (None: without policy_version).
    fn versioned(n_traces: usize, seed: u64, version: Option<i64>) -> TraceBatch {
        let mut made = generate(&SimConfig { n_traces, seed, group_size: 2, ..SimConfig::default() }).unwrap();
        made.iter_mut().for_each(|trace| trace.policy_version = version);
        TraceBatch::from_traces(&made).unwrap()
    }

    #[test]
    fn a_compacted_buffer_draws_what_the_buffer_would_have() {
        let mut buffer = GraphBuffer::new(1_000_000, Unit::Traces, 7).unwrap();
        buffer.add(&versioned(3, 0, None)).unwrap();
        for version in 1..40 {
            buffer.add(&versioned(10, version as u64, Some(version))).unwrap();
            let drawn = buffer.sample(8, Sampler::Uniform, ShapeFilter::default(), None, false, None).unwrap();
            let ids = drawn.traces.trace_ids();
            buffer.update_priorities(&ids, &vec![version as f64; ids.len()], false).unwrap();
        }
        buffer.advance(39).unwrap();
        buffer.evict_stale(Some(20)).unwrap(); // placeholders, too few to compact
        let mut compacted = buffer.compacted().unwrap();
        assert_eq!(compacted.entries.len(), buffer.len());
        assert!(buffer.entries.len() > buffer.len());
        for seed in [None, Some(1), Some(2)] {
            for sampler in [Sampler::Uniform, Sampler::Prioritized] {
                for staleness in [None, Some(10)] {
                    let draw = |b: &mut GraphBuffer| {
                        let drawn = b.sample(32, sampler, ShapeFilter::default(), seed, true, staleness).unwrap();
                        // NaN (a branch's) compares by its bits.
                        let bits: Vec<u64> = drawn.probabilities.iter().map(|p| p.to_bits()).collect();
                        (drawn.traces.collect().unwrap().record_batch().clone(), bits)
                    };
                    assert_eq!(draw(&mut compacted), draw(&mut buffer));
                }
            }
            let groups = |b: &mut GraphBuffer| b.sample_groups(5, None, seed, None).unwrap().collect().unwrap();
            assert_eq!(groups(&mut compacted).record_batch(), groups(&mut buffer).record_batch());
        }
    }

    #[test]
    fn traces_removed_behind_one_never_stale_are_let_go() {
        // A demonstration (no policy_version: never stale) stays first while a trainer adds
        // traces of each new version and evicts the stale ones, far below capacity.
        let mut buffer = GraphBuffer::new(1_000_000, Unit::Traces, 7).unwrap();
        buffer.add(&versioned(1, 0, None)).unwrap();
        let mut most_entries = 0;
        for version in 1..400 {
            buffer.add(&versioned(20, version as u64, Some(version))).unwrap();
            buffer.advance(version).unwrap();
            buffer.evict_stale(Some(2)).unwrap();
            most_entries = most_entries.max(buffer.entries.len());
        }
        assert_eq!(buffer.len(), 1 + 3 * 20);
        assert!(most_entries <= 2 * staleness::COMPACT_AFTER, "{most_entries} entries for {} traces", buffer.len());
        assert!(buffer.chunks.iter().map(|c| c.batch.num_rows()).sum::<usize>() <= 2 * staleness::COMPACT_AFTER);
        let stored: Vec<i64> = buffer.stored_seqs().map(|seq| buffer.entry(seq).version).collect();
        assert_eq!(stored[0], UNVERSIONED);
        assert!(stored[1..].iter().all(|&version| version >= 397), "{stored:?}");
        let drawn = buffer.sample(64, Sampler::Prioritized, ShapeFilter::default(), Some(3), true, Some(2)).unwrap();
        assert_eq!(drawn.traces.collect().unwrap().len(), 64);
    }

    #[test]
    fn large_batches_are_stored_in_pieces_of_bounded_events() {
        assert_eq!(pieces_by_events(&[3, 3, 3, 10, 1], 6), vec![0..2, 2..3, 3..4, 4..5]);
        assert_eq!(pieces_by_events(&[1, 1], 6), vec![0..2]);
        assert!(pieces_by_events(&[], 6).is_empty());
    }
}
