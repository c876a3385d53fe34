//! Shapley credit on logged traces: each trace is its own game, its players taken from the
//! trace (agents, roles, events, or the values of any event column) and its spawn forest from
//! the spawn events.
//!
//! Conventions (the same as the orchestration metrics, from [`crate::trace_view`]): events in
//! time order ((t, id)); a sub-agent's spawn is its earliest; for agent players a tool_result
//! belongs to the agent it acts for, the author of the event that called it. An event's parent
//! event is the spawn that created its author; a player's parent is the player of the parent
//! event of its earliest event. Events whose key is null belong to no player.
//!
//! Values come from a caller's function over all traces at once: every trace's estimator
//! first runs on a recording game that collects the coalitions it will need (estimators pick
//! coalitions independently of the values when stopping by budget), the function values them
//! all in a few large batches, and the estimators run again on the looked-up values.
//!
//! Under noise (`options.noise`: every call of the function a fresh rollout) the recording
//! keeps every request, repeats included, in the order the estimator made them (a noisy
//! estimator asks sequentially); the function values each row once, so a coalition asked
//! for twice gets two draws, and the second pass replays the draws in the same order.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Mutex;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, StringArray};
use arrow_schema::DataType;
use rayon::prelude::*;

use super::coalition::{Coalitions, contains};
use super::game::Game;
use super::{ShapleyOptions, ShapleyResult, shapley};
use crate::error::{MasreplayError, Result};
use crate::limit::check_game_values;
use crate::store::TraceBatch;
use crate::store::schema::dictionary_text;
use crate::trace_view::{BatchView, NONE, TraceAgents};

/// The players of every trace of a batch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TracePlayers {
    /// Trace i owns players `offsets[i]..offsets[i + 1]`.
    pub offsets: Vec<usize>,
    pub labels: Vec<String>,
    /// Local index of each player's parent within its trace, or -1.
    pub parents: Vec<i64>,
    /// For each event of the batch (as in `TraceBatch::events`), the local index of its
    /// player, or -1.
    pub event_player: Vec<i64>,
    /// Each trace's id, for errors (empty where the players were not read from a batch).
    pub trace_ids: Vec<String>,
}

impl TracePlayers {
    /// Trace `t` as an error names it: its id where known, else its index in the batch.
    fn trace_name(&self, t: usize) -> String {
        self.trace_ids.get(t).map_or_else(|| format!("at index {t}"), |id| format!("{id:?}"))
    }
}

struct OneTrace {
    labels: Vec<String>,
    parents: Vec<i64>,
    event_player: Vec<i64>,
}

/// What a player is made of: the key of each event, events with the same key making one player.
enum Players<'a> {
    /// The agent each event acts for (a tool_result acts for its caller).
    Agent,
    Role,
    Event,
    /// The values of an event field as text, aligned with the batch's events.
    Field(&'a StringArray),
}

impl Players<'_> {
    /// The key of every event of `trace` (local index), None where it is null.
    fn keys<'v>(&self, view: &BatchView<'v>, trace: usize) -> Vec<Option<Cow<'v, str>>> {
        let range = view.events_of(trace);
        match self {
            Players::Agent => {
                view.acting_agents(trace).into_iter().map(|agent| Some(Cow::Borrowed(view.agent_name(agent)))).collect()
            }
            Players::Role => {
                range.map(|e| dictionary_text(view.events.role, view.column_row(e)).map(Cow::Borrowed)).collect()
            }
            Players::Event => (0..range.len()).map(|j| Some(Cow::Owned(j.to_string()))).collect(),
            Players::Field(text) => {
                range.map(|e| (!text.is_null(e)).then(|| Cow::Owned(text.value(e).to_owned()))).collect()
            }
        }
    }
}

/// Players of each trace: `players` is "agent", "role", "event" or the name of an event field.
pub fn trace_players(batch: &TraceBatch, players: &str) -> Result<TracePlayers> {
    let view = BatchView::new(batch);
    let field_text: ArrayRef;
    let kind = match players {
        "agent" => Players::Agent,
        "role" => Players::Role,
        "event" => Players::Event,
        name => {
            let field = batch.event_field(name)?;
            field_text = arrow_cast::cast(&field, &DataType::Utf8).map_err(|e| {
                MasreplayError::InvalidArgument(format!("players: event field {name:?} has no text form ({e})"))
            })?;
            Players::Field(field_text.as_string::<i32>())
        }
    };
    let per_trace: Vec<Result<OneTrace>> = (0..batch.len())
        .into_par_iter()
        .map_init(
            || (TraceAgents::new(view.n_agent_names()), Vec::new(), Vec::new()),
            |(agents, order, keys), trace| {
                view.time_order_into(trace, order, keys);
                agents.read(&view, trace, order);
                let one = players_of(&view, trace, &kind, agents, order);
                check_spawn_tree(&view, trace, players, one)
            },
        )
        .collect();
    let mut out = TracePlayers { offsets: vec![0], ..Default::default() };
    for one in per_trace {
        let one = one?;
        out.labels.extend(one.labels);
        out.parents.extend(one.parents);
        out.event_player.extend(one.event_player);
        out.offsets.push(out.labels.len());
    }
    out.trace_ids = (0..batch.len()).map(|t| view.trace_id.value(t).to_owned()).collect();
    Ok(out)
}

/// The players of one trace, numbered in order of their earliest event (in time order); a
/// player's parent is the player of the spawn that created the author of its earliest event.
fn players_of(view: &BatchView, trace: usize, kind: &Players, agents: &TraceAgents, order: &[u32]) -> OneTrace {
    let start = view.events_of(trace).start;
    let keys = kind.keys(view, trace);
    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut labels: Vec<String> = Vec::new();
    let mut first_event: Vec<u32> = Vec::new();
    let mut event_player = vec![-1i64; keys.len()];
    for &j in order {
        let Some(key) = keys[j as usize].as_deref() else { continue };
        let next = labels.len();
        let p = *index.entry(key).or_insert_with(|| {
            labels.push(key.to_owned());
            first_event.push(j);
            next
        });
        event_player[j as usize] = p as i64;
    }
    // The spawn that created an event's author (the author's own spawn is not its parent).
    let parent_event = |j: u32| {
        let author = agents.lookup(view.agent(start + j as usize))?;
        Some(agents.agents[author as usize].spawn_event).filter(|&spawn| spawn != NONE && spawn != j)
    };
    let parents = first_event
        .iter()
        .enumerate()
        .map(|(p, &j)| match parent_event(j).map(|spawn| event_player[spawn as usize]) {
            Some(q) if q >= 0 && q as usize != p => q,
            _ => -1,
        })
        .collect();
    OneTrace { labels, parents, event_player }
}

/// `one`, if its players' parents form a forest (the spawn tree `respect_spawn_tree` needs).
fn check_spawn_tree(view: &BatchView, trace: usize, players: &str, one: OneTrace) -> Result<OneTrace> {
    match super::Forest::new(&one.parents) {
        Ok(_) => Ok(one),
        Err(error) => {
            let trace_id = view.trace_id.value(trace);
            Err(MasreplayError::InvalidArgument(format!(
                "trace {trace_id:?}: the players ({players}) do not form a spawn tree ({error}); \
                 pass respect_spawn_tree=False"
            )))
        }
    }
}

/// Collects the coalitions an estimator asks for; every value reads 0.
struct Recorder {
    asked: Mutex<Coalitions>,
}

impl Recorder {
    /// Every coalition asked for, in order.
    fn asked(self) -> Coalitions {
        self.asked.into_inner().unwrap_or_else(|p| p.into_inner())
    }
}

impl Game for Recorder {
    fn n_players(&self) -> usize {
        self.asked.lock().unwrap_or_else(|p| p.into_inner()).n_players()
    }

    fn values(&self, coalitions: &Coalitions) -> Result<Vec<f64>> {
        let mut asked = self.asked.lock().unwrap_or_else(|p| p.into_inner());
        coalitions.iter().for_each(|set| asked.push(set));
        Ok(vec![0.0; coalitions.len()])
    }

    fn sequential(&self) -> bool {
        true
    }
}

/// The distinct coalitions of `all`, sorted.
fn sorted_distinct(all: &Coalitions) -> Coalitions {
    let mut order: Vec<usize> = (0..all.len()).collect();
    order.sort_unstable_by(|&a, &b| all.get(a).cmp(all.get(b)));
    order.dedup_by(|a, b| all.get(*a) == all.get(*b));
    let mut out = Coalitions::with_capacity(all.n_players(), order.len());
    order.into_iter().for_each(|i| out.push(all.get(i)));
    out
}

/// Plays back the draws of a noisy function in the order they were recorded: the k-th
/// coalition asked for gets the k-th draw.
struct Replay<'a> {
    coalitions: &'a Coalitions,
    values: Vec<f64>,
    next: Mutex<usize>,
}

impl Game for Replay<'_> {
    fn n_players(&self) -> usize {
        self.coalitions.n_players()
    }

    fn values(&self, coalitions: &Coalitions) -> Result<Vec<f64>> {
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        let range = *next..*next + coalitions.len();
        let same = range.end <= self.coalitions.len()
            && coalitions.iter().zip(range.clone()).all(|(set, k)| self.coalitions.get(k) == set);
        if !same {
            return Err(MasreplayError::InvalidArgument(
                "a noisy estimator asked for coalitions in another order than it had announced".into(),
            ));
        }
        *next = range.end;
        Ok(self.values[range].to_vec())
    }

    fn sequential(&self) -> bool {
        true
    }
}

/// Plays back the values the caller's function gave, found by binary search in the sorted
/// coalitions of the recording pass (no hashing, no allocation per coalition).
struct Lookup<'a> {
    coalitions: &'a Coalitions,
    values: Vec<f64>,
}

impl Game for Lookup<'_> {
    fn n_players(&self) -> usize {
        self.coalitions.n_players()
    }

    fn values(&self, coalitions: &Coalitions) -> Result<Vec<f64>> {
        let known = self.coalitions;
        coalitions
            .iter()
            .map(|set| {
                let slot = partition_point(known.len(), |i| known.get(i) < set);
                (slot < known.len() && known.get(slot) == set).then(|| self.values[slot]).ok_or_else(|| {
                    MasreplayError::InvalidArgument("an estimator asked for a coalition it had not announced".into())
                })
            })
            .collect()
    }
}

/// The first index in 0..len where `before` turns false (it must be true, then false).
fn partition_point(len: usize, before: impl Fn(usize) -> bool) -> usize {
    let (mut low, mut high) = (0, len);
    while low < high {
        let middle = (low + high) / 2;
        if before(middle) { low = middle + 1 } else { high = middle }
    }
    low
}

/// Per trace: its Shapley result (None for a trace without players).
pub struct TraceShapley {
    pub results: Vec<Option<ShapleyResult>>,
    /// Coalitions valued by the caller's function, over all traces.
    pub evaluations: u64,
}

/// Players of every trace that are always present (`fixed`: an orchestrator, a harness) or
/// never (`exclude`), by label; a label a trace lacks is ignored there.
#[derive(Clone, Debug, Default)]
pub struct FixedPlayers {
    pub fixed: Vec<String>,
    pub exclude: Vec<String>,
}

impl FixedPlayers {
    /// The local indices of `labels` (one trace's) that are fixed, and those excluded.
    fn of(&self, labels: &[String]) -> (Vec<u32>, Vec<u32>) {
        let pick = |wanted: &[String]| {
            labels.iter().enumerate().filter(|(_, l)| wanted.contains(l)).map(|(p, _)| p as u32).collect()
        };
        (pick(&self.fixed), pick(&self.exclude))
    }
}

/// A batch-wide callback over coalitions of many traces: `(trace_index, masks, width)`, masks
/// row-major with `width` booleans per row (players beyond a trace's count are false).
pub trait TraceCallback<T>: FnMut(&[u32], &[bool], usize) -> Result<Vec<T>> {}
impl<T, F: FnMut(&[u32], &[bool], usize) -> Result<Vec<T>>> TraceCallback<T> for F {}

/// Calls `call` on every coalition of every trace, `chunk` rows at a time, expecting
/// `per_row` outputs a row; returns each trace's outputs in order.
fn in_chunks<T>(
    sets: &[Option<Coalitions>],
    width: usize,
    chunk: usize,
    per_row: usize,
    what: &str,
    call: &mut dyn TraceCallback<T>,
) -> Result<Vec<Vec<T>>> {
    let mut out: Vec<Vec<T>> =
        sets.iter().map(|c| Vec::with_capacity(c.as_ref().map_or(0, |c| c.len() * per_row))).collect();
    let mut rows_index: Vec<u32> = Vec::with_capacity(chunk);
    let mut rows_masks = Vec::with_capacity(chunk * width);
    let mut flush = |rows_index: &mut Vec<u32>, rows_masks: &mut Vec<bool>, out: &mut Vec<Vec<T>>| -> Result<()> {
        if rows_index.is_empty() {
            return Ok(());
        }
        let got = call(rows_index, rows_masks, width)?;
        if got.len() != rows_index.len() * per_row {
            return Err(MasreplayError::InvalidArgument(format!(
                "{what} returned {} values for {} coalitions",
                got.len(),
                rows_index.len()
            )));
        }
        let mut got = got.into_iter();
        for &trace in rows_index.iter() {
            out[trace as usize].extend(got.by_ref().take(per_row));
        }
        rows_index.clear();
        rows_masks.clear();
        Ok(())
    };
    for (t, coalitions) in sets.iter().enumerate() {
        let Some(coalitions) = coalitions else { continue };
        for set in coalitions.iter() {
            rows_index.push(t as u32);
            rows_masks.extend((0..width).map(|p| p < coalitions.n_players() && contains(set, p)));
            if rows_index.len() == chunk {
                flush(&mut rows_index, &mut rows_masks, &mut out)?;
            }
        }
    }
    flush(&mut rows_index, &mut rows_masks, &mut out)?;
    Ok(out)
}

/// Per trace: the distinct canonical forms of its recorded coalitions (sorted) and, for each
/// recorded coalition, the index of its form.
struct Forms {
    distinct: Vec<Option<Coalitions>>,
    index: Vec<Vec<usize>>,
}

impl Forms {
    /// Each recorded coalition's form, in request order (under noise every request is a
    /// draw of its own).
    fn in_request_order(&self) -> Vec<Option<Coalitions>> {
        self.distinct
            .iter()
            .zip(&self.index)
            .map(|(distinct, index)| {
                distinct.as_ref().map(|distinct| {
                    let mut out = Coalitions::with_capacity(distinct.n_players(), index.len());
                    index.iter().for_each(|&i| out.push(distinct.get(i)));
                    out
                })
            })
            .collect()
    }
}

/// The canonical form of every recorded coalition, from the caller's `canonical`.
fn canonical_forms(
    recorded: &[Option<Coalitions>],
    width: usize,
    chunk: usize,
    canonical: &mut dyn TraceCallback<bool>,
) -> Result<Forms> {
    let masks = in_chunks(recorded, width, chunk, width, "canonical", canonical)?;
    recorded
        .iter()
        .zip(masks)
        .map(|(coalitions, masks)| -> Result<(Option<Coalitions>, Vec<usize>)> {
            let Some(coalitions) = coalitions else { return Ok((None, Vec::new())) };
            let n = coalitions.n_players();
            let mut forms = Coalitions::with_capacity(n, coalitions.len());
            for row in masks.chunks_exact(width) {
                if row[n..].iter().any(|&present| present) {
                    return Err(MasreplayError::InvalidArgument(format!(
                        "canonical added a player beyond the trace's {n} players"
                    )));
                }
                forms.push_players(row.iter().enumerate().filter(|(_, present)| **present).map(|(p, _)| p));
            }
            let distinct = sorted_distinct(&forms);
            let index = forms.iter().map(|set| partition_point(distinct.len(), |i| distinct.get(i) < set)).collect();
            Ok((Some(distinct), index))
        })
        .collect::<Result<Vec<_>>>()
        .map(|pairs| {
            let (distinct, index) = pairs.into_iter().unzip();
            Forms { distinct, index }
        })
}

/// Shapley values of every trace. `value_fn(trace_index, masks, width)` values a batch of
/// coalitions (see [`TraceCallback`]) and returns one value per row. It is called in batches
/// of at most `chunk` rows, on the calling thread. `canonical`, when given, maps coalitions
/// the same way (one mask per row) to the coalition each plays as; coalitions of a trace
/// with the same form are valued once.
pub fn trace_shapley(
    players: &TracePlayers,
    respect_spawn_tree: bool,
    fixed: &FixedPlayers,
    options: &ShapleyOptions,
    chunk: usize,
    value_fn: &mut dyn TraceCallback<f64>,
    canonical: Option<&mut dyn TraceCallback<bool>>,
) -> Result<TraceShapley> {
    if options.target_stderr.is_some() {
        return Err(MasreplayError::InvalidArgument(
            "trace_shapley stops by budget only: target_stderr is not supported here".into(),
        ));
    }
    if options.parents.is_some() || options.unions.is_some() {
        return Err(MasreplayError::InvalidArgument(
            "trace_shapley takes the players' parents from the traces; pass respect_spawn_tree instead of parents/unions".into(),
        ));
    }
    if !options.fixed.is_empty() || !options.exclude.is_empty() {
        return Err(MasreplayError::InvalidArgument(
            "trace_shapley fixes and excludes players by label: pass them as FixedPlayers".into(),
        ));
    }
    if chunk == 0 {
        return Err(MasreplayError::InvalidArgument("chunk_size must be at least 1".into()));
    }
    if options.method == super::Method::Stratified {
        // Its second phase follows the values of its first, which a recording pass cannot know.
        return Err(MasreplayError::InvalidArgument(
            "trace_shapley: method='stratified' adapts to the values as it samples; use another method".into(),
        ));
    }
    let n_traces = players.offsets.len() - 1;
    let noisy = options.noise.is_some();
    let options_of = |t: usize| {
        let range = players.offsets[t]..players.offsets[t + 1];
        let mut local = options.clone();
        local.n_threads = None;
        // The recording pass values nothing: what it records must not depend on values.
        local.adaptive = false;
        (local.fixed, local.exclude) = fixed.of(&players.labels[range.clone()]);
        if respect_spawn_tree {
            local.parents = Some(players.parents[range].to_vec());
        }
        local
    };
    let width = (0..n_traces).map(|t| players.offsets[t + 1] - players.offsets[t]).max().unwrap_or(0);
    let recorded: Vec<Option<Coalitions>> = super::in_pool(options.n_threads, || {
        (0..n_traces)
            .into_par_iter()
            .map(|t| -> Result<Option<Coalitions>> {
                let n = players.offsets[t + 1] - players.offsets[t];
                if n == 0 {
                    return Ok(None);
                }
                let recorder = Recorder { asked: Mutex::new(Coalitions::new(n)) };
                shapley(&recorder, &options_of(t))?;
                let asked = recorder.asked();
                Ok(Some(if noisy { asked } else { sorted_distinct(&asked) }))
            })
            .collect::<Result<_>>()
    })??;
    let forms = canonical.map(|canonical| canonical_forms(&recorded, width, chunk, canonical)).transpose()?;
    let valued: Cow<[Option<Coalitions>]> = match &forms {
        None => Cow::Borrowed(&recorded),
        Some(forms) if noisy => Cow::Owned(forms.in_request_order()),
        Some(forms) => Cow::Borrowed(&forms.distinct),
    };
    let mut all_values = in_chunks(&valued, width, chunk, 1, "value_fn", value_fn)?;
    for (t, values) in all_values.iter().enumerate() {
        check_game_values(values, "value_fn", &format!("a coalition of trace {}", players.trace_name(t)))?;
    }
    let evaluations = all_values.iter().map(|values| values.len() as u64).sum();
    if let Some(forms) = forms.as_ref().filter(|_| !noisy) {
        for (values, index) in all_values.iter_mut().zip(&forms.index) {
            *values = index.iter().map(|&i| values[i]).collect();
        }
    }
    let per_trace_evaluations: Vec<u64> = valued.iter().map(|c| c.as_ref().map_or(0, |c| c.len() as u64)).collect();
    let results = super::in_pool(options.n_threads, || {
        recorded
            .into_par_iter()
            .zip(all_values)
            .enumerate()
            .map(|(t, (coalitions, values))| -> Result<Option<ShapleyResult>> {
                let Some(coalitions) = coalitions else { return Ok(None) };
                let mut result = if noisy {
                    shapley(&Replay { coalitions: &coalitions, values, next: Mutex::new(0) }, &options_of(t))?
                } else {
                    shapley(&Lookup { coalitions: &coalitions, values }, &options_of(t))?
                };
                result.evaluations = per_trace_evaluations[t];
                Ok(Some(result))
            })
            .collect::<Result<_>>()
    })??;
    Ok(TraceShapley { results, evaluations })
}
