//! Credit from branch rollouts. A branch is a trace whose `counterfactual_of` names a factual
//! trace of the batch and one of its events: the rollout that substituted that event, ablated
//! it, or did not spawn there. For each event with branches,
//! credit = R(factual) - mean R(branches). Its standard error treats the factual reward as
//! one more draw with the branches' variance, s * sqrt(1 + 1/n) (n >= 2), and is scaled by
//! t(n - 1) / 1.96 ([`z_scale`]) so that credit +- 1.96 stderr is the exact 95% interval under
//! Gaussian rollout noise: with s estimated from n branches the error is t-distributed, and
//! the unscaled interval covers 91% at n = 8, 86% at n = 4. Where the branches replicate one
//! intervention (`ablate`, `no_spawn`) this is calibrated; `substitute` branches each draw
//! another alternative, so their spread includes the alternatives' own and overstates the
//! factual reward's noise: those intervals are conservative.
//!
//! With [`Baseline::LeaveOneOut`] (C3), every alternative at the event (the factual and each
//! branch) is credited against the mean of the others, so the branches' own events (where a
//! branch still has the event) get credit too; the factual's credit is the same either way.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::ops::Range;

use arrow_array::cast::AsArray;
use arrow_array::{Array, StringArray, StructArray};
use foldhash::fast::FixedState;
use rayon::prelude::*;

use super::factual_index::FactualIndex;
use super::{Credit, Entry, ShiftedSums, head_word, mean_and_variance, unusable_reward};
use crate::error::{Result, ValidationError};
use crate::interrupt::checkpoint;
use crate::limit::in_range;
use crate::names::named_enum;
use crate::prefetch::prefetch;
use crate::store::schema::TraceColumns;
use crate::store::{ChannelReader, TraceBatch, same_text};
use crate::student_t::z_scale;

named_enum!(
    /// What a branch's reward is credited against (see the module comment).
    Baseline as "baseline" {
        Mean = "mean",
        LeaveOneOut = "loo",
    }
);

pub fn branch_credit(batch: &TraceBatch, channel: &str, baseline: Baseline) -> Result<Credit> {
    let columns = TraceColumns::new(batch.record_batch());
    let families = Families::new(batch, &columns, channel, baseline);
    checkpoint()?;
    let entries = match families.credit_contiguous() {
        Some(entries) => entries,
        None => {
            checkpoint()?;
            families.credit_scattered()?
        }
    };
    checkpoint()?;
    Ok(Credit::from_entries(entries))
}

/// Rows that [`Families::tally`] reads as one block (their picked offsets stay in L1).
const TALLY_BLOCK: usize = 2048;
/// How many of a block's picked rows ahead [`Families::tally`] requests a tally.
const TALLY_AHEAD: usize = 16;

/// Families whose events are warmed together ([`Families::warm_events`]).
const FAMILY_BATCH: usize = 16;
/// How many families ahead [`Families::credit_ranks`] requests what crediting one reads.
const EVENTS_AHEAD: usize = 16;

/// Rows per parallel task: a few tasks per thread, none tiny.
fn span_of(rows: usize) -> usize {
    rows.div_ceil(4 * rayon::current_num_threads()).max(1 << 14)
}

/// The results of parallel tasks in task order: the first error (in row order), or all entries.
fn first_error_or_all(parts: Vec<Result<Vec<Entry>>>) -> Result<Vec<Entry>> {
    let mut all = Vec::with_capacity(parts.iter().map(|part| part.as_ref().map_or(0, Vec::len)).sum());
    for part in parts {
        all.extend(part?);
    }
    Ok(all)
}

/// One branch rollout as credit reads it, copied out of the batch in a sequential pass so
/// that crediting its family never returns to the branch's row.
#[derive(Clone, Copy, Default)]
struct Branch {
    row: u32,
    /// NaN when the trace has no reward on the channel (an error once it is used).
    reward: f64,
    /// `counterfactual_of.event_id`, by length and first eight bytes (see [`head_word`]).
    event_len: u32,
    event_head: u64,
}

/// Marks a row that is no branch of a factual trace in the batch.
const NO_FAMILY: u32 = u32::MAX;

/// Per row of the batch, what [`Families::credit_scattered`] reads of a branch.
struct BranchRows {
    /// The factual trace's rank, or [`NO_FAMILY`].
    family: Vec<u32>,
    /// NaN when the trace has no reward on the channel.
    reward: Vec<f64>,
}

/// What [`Families::tally`] keeps of one family while it reads the rows, updated at every
/// branch row: 40 bytes, and `R` more that hold the first branch's event id where the
/// batch's event ids are longer than eight bytes (see [`REST`]). What is read once per
/// family (its first branch's row, a gathered family's next place) lives in other arrays.
#[derive(Clone, Copy)]
struct Tally<const R: usize> {
    /// The branches' rewards, in row order (see [`ShiftedSums`]).
    sums: ShiftedSums,
    /// The event the first branch branches at, by first eight bytes and length (see
    /// [`head_word`]); its length is [`GATHERED`] for a family whose branches are gathered.
    event_head: u64,
    n: u32,
    event_len: u32,
    /// Bytes 8.. of the first branch's event id where it has at most 8 + `R`; where it is
    /// longer, the first eight bytes say where it was copied among the task's texts.
    rest: [u8; R],
}

impl<const R: usize> Default for Tally<R> {
    fn default() -> Self {
        Tally { sums: ShiftedSums::default(), event_head: 0, n: 0, event_len: 0, rest: [0; R] }
    }
}

/// Bytes of the first branch's event id past its first eight that a [`Tally`] holds where a
/// batch has event ids longer than eight bytes. Each later branch is compared with its
/// family's first: with ids of up to 40 bytes (UUIDs among them) that reads only the tally,
/// already requested ahead; a copy elsewhere, or the first branch's row, is a cache miss per
/// branch in a scattered batch (it took 45 of 57 ms of the tally on 800,000 branches with
/// UUID event ids, at one thread). Batches of shorter ids keep 40-byte tallies: the wider
/// ones cost them 10%.
const REST: usize = 32;

/// A [`Tally::event_len`] no event id has (Arrow's offsets are `i32`): the family's branches are
/// gathered and credited one by one, as they branch at more than one event, a reward is
/// missing, or the baseline is leave-one-out.
const GATHERED: u32 = u32::MAX;

impl<const R: usize> Tally<R> {
    fn gathered(&self) -> bool {
        self.event_len == GATHERED
    }

    /// Keeps the text of the first branch's event id `event` (longer than eight bytes: only
    /// wide tallies, `R` = [`REST`], meet those; see [`Families::credit_scattered`]).
    fn keep_event(&mut self, event: &str, texts: &mut String) {
        let bytes = event.as_bytes();
        if bytes.len() <= 8 + R {
            self.rest[..bytes.len() - 8].copy_from_slice(&bytes[8..]);
        } else {
            self.rest[..8].copy_from_slice(&(texts.len() as u64).to_le_bytes());
            texts.push_str(event);
        }
    }

    /// Whether `event` (longer than eight bytes, of the first branch's length and first eight
    /// bytes) is the first branch's event id.
    fn is_first_event(&self, event: &str, texts: &str) -> bool {
        let bytes = event.as_bytes();
        if bytes.len() <= 8 + R {
            return bytes[8..] == self.rest[..bytes.len() - 8];
        }
        let at = u64::from_le_bytes(self.rest[..8].try_into().expect("eight bytes")) as usize;
        same_text(&texts[at..at + bytes.len()], event)
    }

    /// Whether `id` (of head word `head`, see [`head_word`]) is the first branch's event id
    /// (a very long one's copy is in `texts`).
    fn names(&self, id: &str, head: u64, texts: &str) -> bool {
        id.len() == self.event_len as usize
            && head == self.event_head
            && (id.len() <= 8 || self.is_first_event(id, texts))
    }

    /// The family's first branch, of row `row`, as credit reads it (its reward is not needed).
    fn first_branch(&self, row: u32) -> Branch {
        Branch { row, reward: f64::NAN, event_len: self.event_len, event_head: self.event_head }
    }
}

/// A task's families as [`Families::tally`] leaves them: the per-family state by rank from
/// the task's first, each family's first branch row (read once per family), and the first
/// branches' event ids too long for a tally (see [`Tally::keep_event`]).
struct Tallies<const R: usize> {
    tallies: Vec<Tally<R>>,
    first_row: Vec<u32>,
    texts: String,
}

impl<const R: usize> Tallies<R> {
    /// The first branch of family `k` (see [`Tally::first_branch`]).
    fn first_branch(&self, k: usize) -> Branch {
        self.tallies[k].first_branch(self.first_row[k])
    }
}

/// The entry of an event credited against the mean of its `n` branches' rewards.
fn mean_entry(event: usize, factual: &Factual, mean: f64, variance: f64, n: usize) -> Entry {
    (event as u64, factual.row as u32, factual.reward - mean, stderr_of(variance, n), n as u32)
}

/// The standard error of a credit whose baseline is the mean of `n` rewards of sample
/// variance `variance` (see the module comment).
fn stderr_of(variance: f64, n: usize) -> f64 {
    (variance * (1.0 + 1.0 / n as f64)).sqrt() * z_scale(n - 1)
}

/// A factual trace as credit reads it.
struct Factual {
    row: usize,
    /// Its events, as positions among the batch's events.
    events: Range<usize>,
    /// NaN when the trace has no reward on the channel (an error once it has branches).
    reward: f64,
}

/// The factual traces of a batch, ranked in row order. Read in row order here, so that
/// crediting a family in a scattered layout needs none of the lookups that lead from a row to
/// its events.
struct Factuals {
    traces: Vec<Factual>,
    /// Where the text of each one's first event id starts among the event ids' bytes.
    first_event_text: Vec<usize>,
}

impl Factuals {
    /// The factual traces of `families` (their `rows`), given every row's reward.
    fn new(families: &Families, rows: &[usize], reward: &[f64]) -> Self {
        let traces: Vec<Factual> =
            rows.par_iter().map(|&row| Factual { row, events: families.events_of(row), reward: reward[row] }).collect();
        let id_offsets = families.event_ids.value_offsets();
        let first_event_text = traces.par_iter().map(|factual| id_offsets[factual.events.start] as usize).collect();
        Factuals { traces, first_event_text }
    }

    fn len(&self) -> usize {
        self.traces.len()
    }

    /// Requests what crediting the factual trace of rank `rank` reads of its events.
    fn warm_events(&self, families: &Families, rank: usize) {
        let (id_offsets, id_bytes) = (families.event_ids.value_offsets(), families.event_ids.value_data());
        prefetch(&id_offsets[self.traces[rank].events.start]);
        if let Some(byte) = id_bytes.get(self.first_event_text[rank]) {
            prefetch(byte);
        }
    }
}

/// A factual trace with its branch rollouts: the unit of branch credit.
struct Families<'a> {
    batch: &'a TraceBatch,
    columns: &'a TraceColumns<'a>,
    event_ids: &'a StringArray,
    event_offsets: &'a [i32],
    of: &'a StructArray,
    of_trace: &'a StringArray,
    of_event: &'a StringArray,
    rewards: ChannelReader<'a>,
    channel: &'a str,
    baseline: Baseline,
}

/// What one task of [`Families::credit_contiguous`] found: its entries, and the factual
/// traces it credited as (hash of the id, row).
#[derive(Default)]
struct SpanCredit {
    entries: Vec<Entry>,
    factual_ids: Vec<(u64, u32)>,
}

/// Per-task scratch space: one family's branches and one event's rewards.
#[derive(Default)]
struct Scratch {
    branches: Vec<Branch>,
    rewards: Vec<f64>,
}

impl<'a> Families<'a> {
    fn new(batch: &'a TraceBatch, columns: &'a TraceColumns<'a>, channel: &'a str, baseline: Baseline) -> Self {
        let of = columns.counterfactual_of;
        Families {
            batch,
            columns,
            event_ids: columns.event_columns().id,
            event_offsets: columns.events.value_offsets(),
            of,
            of_trace: of.column_by_name("trace_id").expect("canonical field").as_string::<i32>(),
            of_event: of.column_by_name("event_id").expect("canonical field").as_string::<i32>(),
            rewards: ChannelReader::new(columns, channel),
            channel,
            baseline,
        }
    }

    fn is_factual(&self, row: usize) -> bool {
        self.of.is_null(row)
    }

    /// The rows of factual traces, ascending, read from the validity bits of
    /// `counterfactual_of` a word at a time (a parallel filter row by row cost ~5 ms on a
    /// batch of 900k traces).
    fn factual_rows(&self) -> Vec<usize> {
        match self.of.nulls() {
            Some(valid) => (!valid.inner()).set_indices().collect(),
            None => Vec::new(),
        }
    }

    /// The branch of row `row` with reward `reward`, its event read from the batch.
    fn branch(&self, row: usize, reward: f64) -> Branch {
        let event = self.of_event.value(row);
        Branch { row: row as u32, reward, event_len: event.len() as u32, event_head: head_word(event) }
    }

    fn event_of(&self, branch: &Branch) -> &'a str {
        self.of_event.value(branch.row as usize)
    }

    /// The events of trace `row`, as positions among the batch's events.
    fn events_of(&self, row: usize) -> Range<usize> {
        self.event_offsets[row] as usize..self.event_offsets[row + 1] as usize
    }

    /// Position of the event `branch` branches at among `events`: ids compared by length and
    /// first eight bytes, their text read only for longer ids (in a scattered layout the
    /// branch's row is a cache miss away).
    fn event_in(&self, mut events: Range<usize>, branch: &Branch) -> Option<usize> {
        events.find(|&k| {
            let id = self.event_ids.value(k);
            id.len() == branch.event_len as usize
                && head_word(id) == branch.event_head
                && (id.len() <= 8 || same_text(id, self.event_of(branch)))
        })
    }

    /// Position of the event the family of `tally` branches at among `events`, compared with
    /// the tally's copy of its id ([`Tally::is_first_event`]; a very long one's is in `texts`):
    /// in a scattered layout the first branch's row is a cache miss away.
    fn tallied_event<const R: usize>(&self, mut events: Range<usize>, tally: &Tally<R>, texts: &str) -> Option<usize> {
        events.find(|&k| {
            let id = self.event_ids.value(k);
            tally.names(id, head_word(id), texts)
        })
    }

    /// Whether two branches branch at the same event id (their texts are read only for ids
    /// longer than eight bytes).
    fn same_event(&self, a: &Branch, b: &Branch) -> bool {
        a.event_len == b.event_len
            && a.event_head == b.event_head
            && (a.event_len <= 8 || same_text(self.event_of(a), self.event_of(b)))
    }

    /// Credit when every factual trace is directly followed by all its branches (the layout
    /// of `sim.branches`): one parallel pass, each family credited as soon as its rows end.
    /// None when a branch sits anywhere else, a factual id repeats or a family fails, for
    /// [`Self::credit_scattered`] to handle.
    fn credit_contiguous(&self) -> Option<Vec<Entry>> {
        let rows = self.batch.len();
        let span = span_of(rows);
        // Task boundaries moved forward to the next factual row, so no family straddles two.
        // One not found within a span leaves the boundary on a branch row: that task then
        // declines, as a layout with branches away from their factual trace must.
        let mut starts = vec![0];
        starts.extend(
            (span..rows)
                .step_by(span)
                .map(|start| (start..(start + span).min(rows)).find(|&r| self.is_factual(r)).unwrap_or(start)),
        );
        starts.push(rows);
        starts.dedup();
        let parts: Vec<Option<Result<SpanCredit>>> =
            starts.par_windows(2).map(|bounds| self.credit_span(bounds[0]..bounds[1])).collect();
        // Errors are left to the scattered pass too, so that every layout reports the same
        // one (here a copy of a factual trace could fail before its repeat is seen).
        let Some(Ok(parts)) = parts.into_iter().collect::<Option<Result<Vec<SpanCredit>>>>() else {
            return None;
        };
        // Copies of a factual trace share their branches wherever these are stored, which
        // only the scattered pass brings together.
        if self.repeats_a_factual_id(parts.iter().flat_map(|part| &part.factual_ids)) {
            return None;
        }
        let mut entries = Vec::with_capacity(parts.iter().map(|part| part.entries.len()).sum());
        for part in parts {
            entries.extend(part.entries);
        }
        Some(entries)
    }

    /// Whether two factual traces of `ids` ((hash of the id, row)) have the same id. The
    /// hashes mark a bitmap (16 bits per id: it stays in cache where a sort or a table of ids
    /// would not); only ids whose bit another id marked too are compared, by hash and text.
    fn repeats_a_factual_id<'i>(&self, ids: impl Iterator<Item = &'i (u64, u32)> + Clone) -> bool {
        let trace_id = self.columns.trace_id;
        let mask = (16 * ids.clone().count()).next_power_of_two() - 1;
        let place = |hash: u64| ((hash as usize & mask) / 64, 1u64 << (hash & 63));
        let (mut marked, mut twice) = (vec![0u64; mask / 64 + 1], vec![0u64; mask / 64 + 1]);
        for &(hash, _) in ids.clone() {
            let (word, bit) = place(hash);
            twice[word] |= marked[word] & bit;
            marked[word] |= bit;
        }
        let mut suspects: Vec<(u64, u32)> = ids
            .filter(|&&(hash, _)| {
                let (word, bit) = place(hash);
                twice[word] & bit != 0
            })
            .copied()
            .collect();
        suspects.sort_unstable();
        suspects.chunk_by(|a, b| a.0 == b.0).any(|run| {
            run.iter().enumerate().any(|(k, a)| {
                run[k + 1..].iter().any(|b| same_text(trace_id.value(a.1 as usize), trace_id.value(b.1 as usize)))
            })
        })
    }

    /// [`Self::credit_contiguous`] over the rows of one task (which starts at a factual row
    /// unless it is the first).
    fn credit_span(&self, rows: Range<usize>) -> Option<Result<SpanCredit>> {
        let (mut credit, mut scratch) = (SpanCredit::default(), Scratch::default());
        // Families whose rows have ended, as (factual row, end of its branch rows).
        let mut ended: Vec<(usize, usize)> = Vec::with_capacity(FAMILY_BATCH);
        let mut family: Option<usize> = None;
        let end = rows.end;
        let hasher = FixedState::default();
        for row in rows.chain([end]) {
            if row == end || self.is_factual(row) {
                if let Some(factual) = family.filter(|&factual| factual + 1 < row) {
                    ended.push((factual, row));
                    // Its id was just compared with its branches': hashed while in cache.
                    credit.factual_ids.push((hasher.hash_one(self.columns.trace_id.value(factual)), factual as u32));
                }
                if ended.len() == FAMILY_BATCH || row == end {
                    if let Err(error) = self.credit_families(&mut credit.entries, &mut scratch, &ended) {
                        return Some(Err(error));
                    }
                    ended.clear();
                }
                family = Some(row);
            } else if !family.is_some_and(|f| same_text(self.columns.trace_id.value(f), self.of_trace.value(row))) {
                return None;
            }
        }
        Some(Ok(credit))
    }

    /// Loads the first event ids of these factual traces (offsets and text) together: the cache
    /// misses of finding each family's branched event then overlap instead of stalling family after family.
    fn warm_events(&self, factuals: impl Iterator<Item = usize>) {
        let (id_offsets, id_bytes) = (self.event_ids.value_offsets(), self.event_ids.value_data());
        let first_byte = |factual: usize| {
            let at = id_offsets[self.event_offsets[factual] as usize] as usize;
            id_bytes.get(at).copied().unwrap_or(0)
        };
        std::hint::black_box(factuals.fold(0, |acc, factual| acc ^ first_byte(factual)));
    }

    /// Credits families given as (factual row, end of its branch rows), their events warmed
    /// together ([`Self::warm_events`]).
    fn credit_families(
        &self,
        entries: &mut Vec<Entry>,
        scratch: &mut Scratch,
        families: &[(usize, usize)],
    ) -> Result<()> {
        self.warm_events(families.iter().map(|&(factual, _)| factual));
        for &(factual, end) in families {
            let Scratch { branches, rewards } = scratch;
            branches.clear();
            branches.extend((factual + 1..end).map(|row| self.branch(row, self.rewards.at(row))));
            let factual = Factual { row: factual, events: self.events_of(factual), reward: self.rewards.at(factual) };
            self.credit_family(entries, rewards, &factual, branches)?;
        }
        Ok(())
    }

    /// Credit for any layout. A pass over the rows (parallel by span) finds each branch's
    /// factual trace by a hash of its id ([`FactualIndex`]) and reads its reward into two
    /// columns by row. Then each task takes a range of factual ranks and reads those columns
    /// in row order ([`Self::tally`]), summing each family's rewards and their squares
    /// ([`ShiftedSums`]), so a family whose branches all branch at one event is credited
    /// without its branches ever being gathered. The others (branches at several events, a
    /// missing reward, the leave-one-out baseline) have their branches gathered in row order
    /// ([`Self::gather`]) and go through [`Self::credit_family`], which sums them the same
    /// way: the same figures for any task count and layout that keeps a family's branches
    /// in order. Branches whose factual trace is not in the batch are left out.
    fn credit_scattered(&self) -> Result<Vec<Entry>> {
        let factual_rows = self.factual_rows();
        let find = || {
            let trace_id = self.columns.trace_id;
            let index = FactualIndex::new(&factual_rows.iter().map(|&row| trace_id.value(row)).collect::<Vec<_>>());
            let family = self.find_families(&index);
            (index, family)
        };
        // The index's inserts are serial: the rewards, then what credit reads of each factual
        // trace, are read beside them.
        let read = || {
            let reward = self.reward_by_row();
            let factuals = Factuals::new(self, &factual_rows, &reward);
            (reward, factuals)
        };
        let ((reward, factuals), (index, family)) = rayon::join(read, find);
        let rows = BranchRows { family, reward };
        let long_events = self.of_event.value_offsets().windows(2).any(|ends| ends[1] - ends[0] > 8);
        let tasks = rayon::current_num_threads().min(factuals.len()).max(1);
        let per_task = factuals.len().div_ceil(tasks).max(1);
        let parts: Vec<Result<Vec<Entry>>> = (0..factuals.len().div_ceil(per_task))
            .into_par_iter()
            .map(|task| {
                let ranks = task * per_task..((task + 1) * per_task).min(factuals.len());
                if long_events {
                    self.credit_task::<REST>(&factuals, &rows, ranks)
                } else {
                    self.credit_task::<0>(&factuals, &rows, ranks)
                }
            })
            .collect();
        let mut entries = first_error_or_all(parts)?;
        self.credit_copies(&factuals, index.repeats(), &mut entries)?;
        Ok(entries)
    }

    /// A factual trace stored more than once (a sample drawn with replacement holds copies)
    /// is one trace: its branches were tallied under its first copy, whose credit every later
    /// copy gets at its own event of the same id. Copies that disagree on the reward, or lack
    /// the event, are an error naming the trace. `repeats` are the (rank, rank of the first
    /// trace with its id) of the copies ([`FactualIndex::repeats`]).
    fn credit_copies(&self, factuals: &Factuals, repeats: &[(u32, u32)], entries: &mut Vec<Entry>) -> Result<()> {
        if repeats.is_empty() {
            return Ok(());
        }
        // Copies by the row of the first trace with their id.
        let mut copies: HashMap<u32, Vec<&Factual>> = HashMap::new();
        for &(copy, first) in repeats {
            copies.entry(factuals.traces[first as usize].row as u32).or_default().push(&factuals.traces[copy as usize]);
        }
        let mut credited = Vec::new();
        for entry in entries.iter() {
            let Some(copies) = copies.get(&entry.1) else { continue };
            let (first_reward, first_events) = (self.rewards.at(entry.1 as usize), self.events_of(entry.1 as usize));
            let event_id = self.event_ids.value(entry.0 as usize);
            for copy in copies {
                let id = self.columns.trace_id.value(copy.row);
                if copy.reward.to_bits() != first_reward.to_bits() {
                    let reason = format!(
                        "the batch holds this factual trace more than once with different rewards ({first_reward} and {}): its branches cannot tell which one they branch from",
                        copy.reward
                    );
                    return Err(ValidationError::new(Some(id), format!("/rewards/{}", self.channel), reason).into());
                }
                let offset = entry.0 as usize - first_events.start;
                let same_place = copy.events.start + offset;
                let event =
                    if copy.events.contains(&same_place) && same_text(self.event_ids.value(same_place), event_id) {
                        Some(same_place)
                    } else {
                        copy.events.clone().find(|&k| same_text(self.event_ids.value(k), event_id))
                    };
                let Some(event) = event else {
                    let reason = format!(
                        "the batch holds this factual trace more than once, and this copy (row {}) lacks the event {event_id:?} that its branches branch at",
                        copy.row
                    );
                    return Err(ValidationError::new(Some(id), "/events", reason).into());
                };
                credited.push((event as u64, copy.row as u32, entry.2, entry.3, entry.4));
            }
        }
        entries.extend(credited);
        Ok(())
    }

    /// Every row's reward on the channel, read in one sequential pass (NaN where missing).
    fn reward_by_row(&self) -> Vec<f64> {
        (0..self.batch.len()).into_par_iter().map(|row| self.rewards.at(row)).collect()
    }

    /// Each row's factual rank: [`NO_FAMILY`] for factual traces and branches whose factual
    /// trace is absent.
    fn find_families(&self, index: &FactualIndex) -> Vec<u32> {
        let n = self.batch.len();
        let mut family = vec![NO_FAMILY; n];
        let span = span_of(n);
        family.par_chunks_mut(span).enumerate().for_each(|(part, family)| {
            let start = part * span;
            let branches = (start..start + family.len())
                .filter(|&row| !self.is_factual(row))
                .map(|row| (row, self.of_trace.value(row)));
            index.find_each(branches, |row, rank| family[row - start] = rank.unwrap_or(NO_FAMILY));
        });
        family
    }

    /// Credit for the families of factual ranks `ranks`, with tallies of `R` bytes of event
    /// id (see [`REST`]).
    fn credit_task<const R: usize>(
        &self,
        factuals: &Factuals,
        rows: &BranchRows,
        ranks: Range<usize>,
    ) -> Result<Vec<Entry>> {
        let tallies = self.tally::<R>(factuals, rows, ranks.clone());
        let gathered = self.gather(rows, ranks.start, &tallies.tallies);
        self.credit_ranks(factuals, ranks.start, &tallies, gathered)
    }

    /// A task's pass over the rows: for factual ranks `ranks`, each family's branch count,
    /// rewards summed in row order, and whether its branches all branch at the event of its
    /// first one. The rows are read in blocks of [`TALLY_BLOCK`]. When tasks split the ranks,
    /// a block of a scattered layout mixes the rows of every task at random, and a branch on
    /// whether each row is this task's mispredicts about half the time (it cost more than the
    /// tallies' cache misses at two tasks). Such a block is first narrowed to this task's rows
    /// without a branch, then tallied with each tally requested [`TALLY_AHEAD`] rows ahead.
    /// Blocks of this task's rows only (or nearly), and every block when one task takes all
    /// ranks, are tallied directly; blocks without any of its rows are skipped.
    fn tally<const R: usize>(&self, factuals: &Factuals, rows: &BranchRows, ranks: Range<usize>) -> Tallies<R> {
        let mut tallies = vec![Tally::default(); ranks.len()];
        let mut first_row = vec![0; ranks.len()];
        let mut texts = String::new();
        let (start, count) = (ranks.start as u32, ranks.len() as u32);
        let is_mine = |family: u32| family.wrapping_sub(start) < count;
        let split = ranks.len() < factuals.len();
        let mut mine = [0u32; TALLY_BLOCK];
        for (block, families) in rows.family.chunks(TALLY_BLOCK).enumerate() {
            let first = block * TALLY_BLOCK;
            let n_mine =
                if split { families.iter().filter(|&&family| is_mine(family)).count() } else { families.len() };
            if n_mine == 0 {
                continue;
            }
            if n_mine >= families.len() - families.len() / 8 {
                for (i, &family) in families.iter().enumerate().filter(|&(_, &family)| is_mine(family)) {
                    let (row, k) = (first + i, (family - start) as usize);
                    self.add_to_tally(&mut tallies[k], &mut first_row[k], &mut texts, row, rows.reward[row]);
                }
                continue;
            }
            let mut n = 0;
            for (i, &family) in families.iter().enumerate() {
                mine[n] = i as u32;
                n += usize::from(is_mine(family));
            }
            let mine = &mine[..n];
            for (j, &i) in mine.iter().enumerate() {
                if let Some(&ahead) = mine.get(j + TALLY_AHEAD) {
                    let tally = &tallies[(families[ahead as usize] - start) as usize];
                    prefetch(tally);
                    // A wide tally spans two cache lines.
                    if let Some(last) = tally.rest.last() {
                        prefetch(last);
                    }
                }
                let (row, k) = (first + i as usize, (families[i as usize] - start) as usize);
                self.add_to_tally(&mut tallies[k], &mut first_row[k], &mut texts, row, rows.reward[row]);
            }
        }
        for (tally, factual) in tallies.iter_mut().zip(&factuals.traces[ranks]) {
            if tally.sums.may_be_unusable() || !in_range(factual.reward) || self.baseline == Baseline::LeaveOneOut {
                tally.event_len = GATHERED;
            }
        }
        Tallies { tallies, first_row, texts }
    }

    /// Adds branch row `row`, of reward `reward`, to its family's `tally`, whose first
    /// branch's row is `first_row` (set here when this is the first, its long event id
    /// copied into `texts`).
    #[inline(always)]
    fn add_to_tally<const R: usize>(
        &self,
        tally: &mut Tally<R>,
        first_row: &mut u32,
        texts: &mut String,
        row: usize,
        reward: f64,
    ) {
        let first = tally.n == 0;
        let branch = self.branch(row, reward);
        if first {
            (tally.event_head, tally.event_len, *first_row) = (branch.event_head, branch.event_len, branch.row);
            if branch.event_len > 8 {
                tally.keep_event(self.event_of(&branch), texts);
            }
        } else if !tally.gathered() && !tally.names(self.event_of(&branch), branch.event_head, texts) {
            tally.event_len = GATHERED;
        }
        tally.n += 1;
        tally.sums.add(reward, first);
    }

    /// The branches of the families [`Tally::gathered`] marks, copied out family after
    /// family in row order (a counting sort): a second pass over the rows, made only when a
    /// family of the task is gathered.
    fn gather<const R: usize>(&self, rows: &BranchRows, first: usize, tallies: &[Tally<R>]) -> Vec<Branch> {
        if !tallies.iter().any(Tally::gathered) {
            return Vec::new();
        }
        // Where each gathered family's next branch goes among the gathered.
        let mut next = vec![0u32; tallies.len()];
        let mut total = 0;
        for (next, tally) in next.iter_mut().zip(tallies).filter(|(_, tally)| tally.gathered()) {
            *next = total;
            total += tally.n;
        }
        let mut gathered = vec![Branch::default(); total as usize];
        for (row, (&family, &reward)) in rows.family.iter().zip(&rows.reward).enumerate() {
            let Some(k) = (family as usize).checked_sub(first).filter(|&k| k < tallies.len()) else {
                continue;
            };
            if tallies[k].gathered() {
                gathered[next[k] as usize] = self.branch(row, reward);
                next[k] += 1;
            }
        }
        gathered
    }

    /// Credits the families of factual ranks from `first` in rank order: from their tallies,
    /// or from their `gathered` branches (see [`Self::gather`]).
    fn credit_ranks<const R: usize>(
        &self,
        factuals: &Factuals,
        first: usize,
        tallies: &Tallies<R>,
        mut gathered: Vec<Branch>,
    ) -> Result<Vec<Entry>> {
        let families = &tallies.tallies;
        let (mut entries, mut rewards) = (Vec::with_capacity(families.len()), Vec::new());
        let ranks: Vec<usize> = (0..families.len()).filter(|&k| families[k].n > 0).collect();
        // Each family's events are requested EVENTS_AHEAD families before it is credited:
        // requested a group at a time, the first families of each group waited for them.
        let warm = |k: usize| factuals.warm_events(self, first + k);
        ranks.iter().take(EVENTS_AHEAD).for_each(|&k| warm(k));
        let mut at = 0;
        for (j, &k) in ranks.iter().enumerate() {
            if let Some(&ahead) = ranks.get(j + EVENTS_AHEAD) {
                warm(ahead);
            }
            let (tally, factual) = (&families[k], &factuals.traces[first + k]);
            let n = tally.n as usize;
            if tally.gathered() {
                let branches = &mut gathered[at..at + n];
                at += n;
                self.credit_family(&mut entries, &mut rewards, factual, branches)?;
            } else {
                let event = match self.tallied_event(factual.events.clone(), tally, &tallies.texts) {
                    Some(event) => event,
                    None => self.branched_event(factual, &tallies.first_branch(k))?,
                };
                let (mean, variance) = tally.sums.mean_and_variance(n);
                entries.push(mean_entry(event, factual, mean, variance, n));
            }
        }
        Ok(entries)
    }

    /// Position of the event `branch` branches at among its factual trace's events, or the
    /// error naming the branch when the factual trace has no such event.
    fn branched_event(&self, factual: &Factual, branch: &Branch) -> Result<usize> {
        self.event_in(factual.events.clone(), branch).ok_or_else(|| {
            let branch_id = self.columns.trace_id.value(branch.row as usize);
            let factual_id = self.columns.trace_id.value(factual.row);
            let event_id = self.event_of(branch);
            let reason = format!("the factual trace {factual_id:?} has no event {event_id:?}");
            ValidationError::new(Some(branch_id), "/counterfactual_of/event_id", reason).into()
        })
    }

    /// Credits the alternatives of one factual trace into `entries`; `branches` are in row
    /// order.
    fn credit_family(
        &self,
        entries: &mut Vec<Entry>,
        rewards: &mut Vec<f64>,
        factual: &Factual,
        branches: &mut [Branch],
    ) -> Result<()> {
        let factual_reward = factual.reward;
        // Branches of one factual trace, grouped by the event they branch at.
        if !branches.iter().all(|branch| self.same_event(branch, &branches[0])) {
            branches.sort_by(|a, b| self.event_of(a).cmp(self.event_of(b)).then(a.row.cmp(&b.row)));
        }
        if !in_range(factual_reward) {
            return Err(unusable_reward(self.batch, factual.row, self.channel, factual_reward));
        }
        for group in branches.chunk_by(|a, b| self.same_event(a, b)) {
            let event = self.branched_event(factual, &group[0])?;
            rewards.clear();
            for branch in group {
                if !in_range(branch.reward) {
                    return Err(unusable_reward(self.batch, branch.row as usize, self.channel, branch.reward));
                }
                rewards.push(branch.reward);
            }
            let (mean, variance, n) = mean_and_variance(rewards.iter().copied());
            entries.push(mean_entry(event, factual, mean, variance, n));
            if self.baseline == Baseline::LeaveOneOut {
                for (i, branch) in group.iter().enumerate() {
                    let Some(own) = self.event_in(self.events_of(branch.row as usize), branch) else {
                        continue; // ablated: the branch has no such event to credit
                    };
                    let others = rewards.iter().enumerate().filter(|&(j, _)| j != i).map(|(_, &r)| r);
                    let (mean, variance, n_others) = mean_and_variance(others.chain([factual_reward]));
                    let stderr = stderr_of(variance, n_others);
                    entries.push((own as u64, branch.row, rewards[i] - mean, stderr, n_others as u32));
                }
            }
        }
        Ok(())
    }
}
