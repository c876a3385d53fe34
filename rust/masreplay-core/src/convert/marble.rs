//! MultiAgentBench (MARBLE) result logs -> one trace per episode (one JSON Lines record).
//!
//! Per iteration: `task_assignments` -> an orchestrator_decision by `planner` and a message to
//! each assigned agent; `communications` -> messages, parsed from their "From A to B:" lines;
//! `task_results` -> a return by each agent (MARBLE writes an entry either as
//! `{"agent_id": ..., "result": ...}` or, in its minecraft and discussion runs, as
//! `{"<agent>": "<result>"}`); `summary` -> an aggregate by the planner. The planner's events
//! have the role `orchestrator`, the agents' `sub-agent`.
//!
//! Episode scores become reward channels (`planning`, `communication`: the mean of the scored
//! rounds; `task_evaluation.<name>`, `code_quality.<name>`); a score of -1 means "not scored"
//! and is left out (listed in the trace's `missing_scores`). `agent_kpis` is the channel
//! `milestones.<agent>` and that agent's `milestones` reward on its last return; `token_usage`
//! is the trace's token cost. MARBLE logs have no timestamps: `t` is the event's position in
//! the episode and wall_clock_s is 0.
//!
//! The trace id is `<file stem>:<line>`, the task id `marble-` and the first 16 hex digits of
//! the task text's SHA-256: runs of one task share it, whatever file they are in.

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::builder::{Builder, Head, Out, set_reward};
use super::json::{Json, Keep, repr};
use super::{ConversionError, Record, Report, Source};
use crate::trace::{EdgeType, EventType, Topology, Trace};

const PLANNER: &str = "planner";
const ORCHESTRATOR: &str = "orchestrator";
const SUB_AGENT: &str = "sub-agent";
const EPISODE_KEYS: [&str; 10] = [
    "task",
    "coordination_mode",
    "iterations",
    "planning_scores",
    "communication_scores",
    "task_evaluation",
    "code_quality",
    "agent_kpis",
    "total_milestones",
    "token_usage",
];
const ITERATION_KEYS: [&str; 6] =
    ["iteration", "task_assignments", "task_results", "summary", "continue_simulation", "communications"];
const OUTSIDE_SPEAKER_LINES: &str = "communication text outside 'From A to B:' lines";

/// What the converter reads of an episode: every key (unknown ones are counted), but not the
/// long texts it only points at (assignments, results, summaries).
const EPISODE: Keep = Keep::Keys(&[
    ("task", Keep::All),
    ("coordination_mode", Keep::All),
    ("iterations", Keep::Items(&ITERATION)),
    ("planning_scores", Keep::All),
    ("communication_scores", Keep::All),
    ("task_evaluation", Keep::All),
    ("code_quality", Keep::All),
    ("agent_kpis", Keep::All),
    ("total_milestones", Keep::All),
    ("token_usage", Keep::All),
]);
const ITERATION: Keep = Keep::Keys(&[
    ("iteration", Keep::All),
    ("task_assignments", Keep::Keys(&[])),
    ("communications", Keep::All),
    ("task_results", Keep::Items(&RESULT)),
    ("continue_simulation", Keep::All),
]);
const RESULT: Keep = Keep::Keys(&[("agent_id", Keep::All)]);
/// Episodes per share of the parallel conversion: one takes 5-20 µs (its task's hash, its
/// events checked).
const EPISODES_PER_SHARE: usize = 2;

/// The episodes of a result log (JSON Lines), read for this converter.
pub fn read<'a>(name: &str, bytes: &'a [u8]) -> Result<Vec<Record<'a>>, ConversionError> {
    super::json_lines(name, bytes, &EPISODE)
}

/// Converts the episodes of `source`, one trace each in record order (in parallel). An episode
/// that cannot be read is the error before any trace the data contract refuses: every episode
/// is read, then every trace checked.
pub fn convert(source: &Source<'_>) -> Result<(Vec<Trace>, Report), Box<ConversionError>> {
    let stem = stem(&source.label);
    let outcomes =
        super::shared_map(&source.records, EPISODES_PER_SHARE, |record| Episode::new(source, stem, record)?.build());
    let mut report = Report { records: source.records.len(), ..Report::default() };
    let mut traces = Vec::with_capacity(outcomes.len());
    let mut invalid = None;
    for outcome in outcomes {
        match outcome {
            Ok(Built { trace: Ok(trace), unknown }) => {
                traces.push(trace);
                for name in unknown {
                    Report::count(&mut report.unknown, &[&name]);
                }
            }
            Ok(Built { trace: Err(error), .. }) => {
                invalid.get_or_insert(error);
            }
            Err(unreadable) => return Err(unreadable),
        }
    }
    match invalid {
        Some(error) => Err(error),
        None => Ok((traces, report)),
    }
}

/// A file name without its extension, as Python's `os.path.splitext` cuts it (a name that is
/// only dots before its last dot keeps it).
fn stem(file: &str) -> &str {
    match file.rfind('.') {
        Some(dot) if file[..dot].bytes().any(|byte| byte != b'.') => &file[..dot],
        _ => file,
    }
}

type Failure = Box<ConversionError>;
type Outcome<T> = Result<T, Failure>;

/// An episode read: its trace, or why the data contract refuses it; the unknown keys it had.
struct Built {
    trace: Result<Trace, Failure>,
    unknown: Vec<String>,
}

/// The JSON types the converter asks a field to be, by the words its errors use.
#[derive(Clone, Copy)]
enum Kind {
    Text,
    Object,
    List,
    Number,
}

impl Kind {
    fn holds(self, value: &Json<'_>) -> bool {
        match self {
            Kind::Text => matches!(value, Json::Str(_)),
            Kind::Object => value.is_object(),
            Kind::List => matches!(value, Json::Array(_)),
            Kind::Number => value.as_finite().is_some(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Text => "text",
            Kind::Object => "an object",
            Kind::List => "a list",
            Kind::Number => "a finite number",
        }
    }
}

/// A score of -1 (Python's `score == -1`): not scored.
fn unscored(value: &Json<'_>) -> bool {
    matches!(value, Json::Int(-1)) || matches!(value, Json::Float(x) if *x == -1.0)
}

/// An event before it is checked: the episode's scores, read last, may still add a reward.
struct Draft<'r> {
    kind: EventType,
    agent: &'r str,
    /// Whom a message or a return goes to (it comes from `agent`).
    to: Option<&'r str>,
    /// What it came from: the record's name and line, and the JSON pointer of the part.
    content_ref: String,
    extra: Vec<(&'static str, Out<'r>)>,
    milestones: Option<f64>,
}

impl<'r> Draft<'r> {
    fn new(kind: EventType, agent: &'r str, to: Option<&'r str>, content_ref: String) -> Self {
        Draft { kind, agent, to, content_ref, extra: Vec::new(), milestones: None }
    }

    fn with(mut self, key: &'static str, value: Out<'r>) -> Self {
        self.extra.push((key, value));
        self
    }
}

struct Episode<'r> {
    source: &'r Source<'r>,
    stem: &'r str,
    number: usize,
    /// The start of every content reference: `<label>:<line>#`.
    origin: String,
    record: &'r Json<'r>,
    task: &'r str,
    mode: Option<&'r str>,
    drafts: Vec<Draft<'r>>,
    edges: Vec<(usize, usize, EdgeType)>,
    /// Each agent's latest event, for causal edges.
    last: Vec<(&'r str, usize)>,
    unknown: Vec<String>,
}

impl<'r> Episode<'r> {
    fn new(source: &'r Source<'r>, stem: &'r str, whole: &'r Record<'r>) -> Outcome<Self> {
        let record = &whole.value;
        let fail = |reason: String| Box::new(ConversionError::new(&source.name, Some(whole.line), reason));
        let (Some(Json::Str(task)), Some(Json::Array(_))) = (record.get("task"), record.get("iterations")) else {
            return Err(fail("a MARBLE episode needs 'task' (text) and 'iterations' (a list)".to_owned()));
        };
        let mut episode = Episode {
            source,
            stem,
            number: whole.line,
            origin: format!("{}:{}#", source.label, whole.line),
            record,
            task,
            mode: None,
            drafts: Vec::new(),
            edges: Vec::new(),
            last: Vec::new(),
            unknown: Vec::new(),
        };
        episode.mode = episode.field(record, "coordination_mode", Kind::Text, "")?.and_then(Json::as_str);
        Ok(episode)
    }

    /// The content reference of the part of the record at the JSON pointer spelled by `parts`.
    fn content_ref(&self, parts: &[&str]) -> String {
        let mut text = String::with_capacity(self.origin.len() + parts.iter().map(|part| part.len()).sum::<usize>());
        text.push_str(&self.origin);
        parts.iter().for_each(|part| text.push_str(part));
        text
    }

    fn fail(&self, reason: impl Into<String>) -> Failure {
        Box::new(ConversionError::new(&self.source.name, Some(self.number), reason))
    }

    /// `object[key]` when it is of `kind`; `None` when absent or null; anything else fails,
    /// naming `place/key`.
    fn field(&self, object: &'r Json<'r>, key: &str, kind: Kind, place: &str) -> Outcome<Option<&'r Json<'r>>> {
        match object.field(key) {
            Some(value) if !kind.holds(value) => {
                Err(self.fail(format!("{place}/{key} is {}, expected {}", value.describe(), kind.name())))
            }
            value => Ok(value),
        }
    }

    fn count_unknown(&mut self, object: &Json<'_>, known: &[&str], what: &str) {
        if let Json::Object(entries) = object {
            for (key, _) in entries.iter().filter(|(key, _)| !known.contains(&key.as_ref())) {
                self.unknown.push(format!("{what} key {key}"));
            }
        }
    }

    /// Adds an event after those of `after` (edges of type `edge`); it becomes the latest of
    /// its agent and of whom it goes to.
    fn add(&mut self, draft: Draft<'r>, after: &[Option<usize>], edge: EdgeType) -> usize {
        let event = self.drafts.len();
        for name in std::iter::once(draft.agent).chain(draft.to) {
            match self.last.iter_mut().find(|(known, _)| *known == name) {
                Some(entry) => entry.1 = event,
                None => self.last.push((name, event)),
            }
        }
        self.drafts.push(draft);
        self.edges.extend(after.iter().flatten().map(|&src| (src, event, edge)));
        event
    }

    fn latest(&self, agent: &str) -> Option<usize> {
        self.last.iter().find(|(known, _)| *known == agent).map(|&(_, event)| event)
    }

    fn build(mut self) -> Outcome<Built> {
        let record = self.record;
        self.count_unknown(record, &EPISODE_KEYS, "episode");
        let mut previous = None;
        if let Some(Json::Array(iterations)) = record.get("iterations") {
            for (index, iteration) in iterations.iter().enumerate() {
                if !iteration.is_object() {
                    return Err(self.fail(format!("/iterations/{index} is not an object")));
                }
                previous = self.iteration(index, iteration, previous)?;
            }
        }
        if self.drafts.is_empty() {
            return Err(self.fail("an episode without iterations has no events"));
        }
        let (mut rewards, missing) = self.scores()?;
        if let Some(Json::Object(kpis)) = self.field(record, "agent_kpis", Kind::Object, "")? {
            for (agent, milestones) in kpis {
                let Some(milestones) = milestones.as_finite() else {
                    return Err(self
                        .fail(format!("/agent_kpis/{agent} is {}, expected a finite number", milestones.describe())));
                };
                // Kept per trace for every agent (some never return), and on the agent's last
                // return for credit assignment.
                set_reward(&mut rewards, format!("milestones.{agent}"), milestones);
                let last_return =
                    self.drafts.iter_mut().rev().find(|draft| draft.kind == EventType::Return && draft.agent == agent);
                if let Some(draft) = last_return {
                    draft.milestones = Some(milestones);
                }
            }
        }
        let total = self.field(record, "total_milestones", Kind::Number, "")?.and_then(Json::as_finite);
        let tokens = self.field(record, "token_usage", Kind::Number, "")?.and_then(Json::as_finite);
        let mut attributes = Map::new();
        if let Some(mode) = self.mode {
            attributes.insert("coordination_mode".into(), Value::from(mode));
        }
        if !missing.is_empty() {
            attributes.insert("missing_scores".into(), Value::from(missing));
        }
        let head = Head {
            task_id: &task_id(self.task),
            system: "marble",
            topology: match self.mode {
                Some("star") => Topology::Centralized,
                Some("tree") => Topology::Hierarchical,
                Some("graph") => Topology::Swarm,
                _ => Topology::Unknown,
            },
            wall_clock_s: 0.0,
            tokens: Some(Value::from(tokens.unwrap_or(0.0))),
            rewards,
            metrics: total.map(|total| vec![("total_milestones".to_owned(), total)]),
            attributes,
        };
        let trace = self.trace(head);
        Ok(Built { trace, unknown: self.unknown })
    }

    /// The checked trace of the drafted events.
    fn trace(&mut self, head: Head<'_>) -> Result<Trace, Failure> {
        let trace_id = format!("{}:{}", self.stem, self.number);
        let mut builder = Builder::new(&trace_id);
        for (index, draft) in std::mem::take(&mut self.drafts).into_iter().enumerate() {
            let role = if draft.agent == PLANNER { ORCHESTRATOR } else { SUB_AGENT };
            let mut fields = Vec::with_capacity(draft.extra.len() + 5);
            fields.push(("role", Out::Text(role.to_owned())));
            fields.push(("content_ref", Out::Text(draft.content_ref)));
            if let Some(to) = draft.to {
                fields.push(("from", Out::Text(draft.agent.to_owned())));
                fields.push(("to", Out::Text(to.to_owned())));
            }
            fields.extend(draft.extra);
            if let Some(milestones) = draft.milestones {
                fields.push(("reward", Out::Value(json!({ "milestones": milestones }))));
            }
            builder.event(format!("e{index}"), index as f64, draft.kind, draft.agent, fields);
        }
        for &(src, dst, kind) in &self.edges {
            builder.edge(Some(src), Some(dst), kind);
        }
        builder
            .build(head)
            .map_err(|cause| Box::new(ConversionError::invalid_trace(&self.source.name, Some(self.number), cause)))
    }

    /// Reads iteration `index`; returns the event the next iteration follows.
    fn iteration(&mut self, index: usize, iteration: &'r Json<'r>, previous: Option<usize>) -> Outcome<Option<usize>> {
        let at = format!("/iterations/{index}");
        self.count_unknown(iteration, &ITERATION_KEYS, "iteration");
        let assignments = self.field(iteration, "task_assignments", Kind::Object, &at)?;
        let decision =
            Draft::new(EventType::OrchestratorDecision, PLANNER, None, self.content_ref(&[&at, "/task_assignments"]))
                .with("iteration", Out::Raw(iteration.get("iteration")));
        let decision = self.add(decision, &[previous], EdgeType::Causal);
        if let Some(Json::Object(assignments)) = assignments {
            for (agent, _) in assignments {
                if agent.is_empty() {
                    return Err(self
                        .fail(format!("{at}/task_assignments has a key that is not an agent name: {}", repr(agent))));
                }
                let content_ref = self.content_ref(&[&at, "/task_assignments/", agent]);
                let message = Draft::new(EventType::Message, PLANNER, Some(agent.as_ref()), content_ref)
                    .with("kind", Out::Text("assignment".to_owned()));
                self.add(message, &[Some(decision)], EdgeType::Causal);
            }
        }
        if let Some(Json::Array(texts)) = self.field(iteration, "communications", Kind::List, &at)? {
            for (number, text) in texts.iter().enumerate() {
                self.communication(&format!("{at}/communications/{number}"), text)?;
            }
        }
        let mut returns = Vec::new();
        if let Some(Json::Array(results)) = self.field(iteration, "task_results", Kind::List, &at)? {
            for (number, result) in results.iter().enumerate() {
                let place = format!("{at}/task_results/{number}");
                let agents = self.result_agents(result, &place)?;
                for &agent in &agents {
                    let content_ref = if agents.len() == 1 {
                        self.content_ref(&[&place])
                    } else {
                        self.content_ref(&[&place, "/", agent])
                    };
                    let after = [self.latest(agent)];
                    let draft = Draft::new(EventType::Return, agent, Some(PLANNER), content_ref);
                    returns.push(self.add(draft, &after, EdgeType::Causal));
                }
            }
        }
        if iteration.get("summary").is_none() {
            return Ok(Some(returns.last().copied().unwrap_or(decision)));
        }
        let after: Vec<Option<usize>> =
            if returns.is_empty() { vec![Some(decision)] } else { returns.into_iter().map(Some).collect() };
        let summary = Draft::new(EventType::Aggregate, PLANNER, None, self.content_ref(&[&at, "/summary"]))
            .with("continue_simulation", Out::Raw(iteration.get("continue_simulation")));
        Ok(Some(self.add(summary, &after, EdgeType::Aggregate)))
    }

    /// The agents a task_results entry reports: its `agent_id`, or the keys of the
    /// `{"<agent>": "<result>"}` form.
    fn result_agents(&self, result: &'r Json<'r>, place: &str) -> Outcome<Vec<&'r str>> {
        let Json::Object(entries) = result else {
            return Err(self.fail(format!("{place} is {}, expected an object", result.describe())));
        };
        if entries.is_empty() {
            return Err(self.fail(format!("{place} is empty: it names no agent")));
        }
        if let Some(agent) = result.get("agent_id") {
            return match agent {
                Json::Str(name) if !name.is_empty() => Ok(vec![name.as_ref()]),
                _ => Err(self.fail(format!("{place}/agent_id is {}, expected an agent name", agent.describe()))),
            };
        }
        if let Some((agent, _)) = entries.iter().find(|(agent, _)| agent.is_empty()) {
            return Err(self.fail(format!("{place} has a key that is not an agent name: {}", repr(agent))));
        }
        Ok(entries.iter().map(|(agent, _)| agent.as_ref()).collect())
    }

    fn communication(&mut self, at: &str, text: &'r Json<'r>) -> Outcome<()> {
        let Json::Str(text) = text else {
            return Err(self.fail(format!("{at} is not text")));
        };
        let (before, turns) = speaker_turns(text);
        if !is_session_header(before) {
            self.unknown.push(OUTSIDE_SPEAKER_LINES.to_owned());
        }
        for (turn, (sender, receiver)) in turns.into_iter().enumerate() {
            let after = [self.latest(sender), self.latest(receiver)];
            let message =
                Draft::new(EventType::Message, sender, Some(receiver), self.content_ref(&[at, "/", &turn.to_string()]));
            self.add(message, &after, EdgeType::Causal);
        }
        Ok(())
    }

    /// The episode's reward channels, and the names of the scores that were not given.
    fn scores(&self) -> Outcome<Scores> {
        let record = self.record;
        let mut rewards = Vec::new();
        let mut missing = Vec::new();
        for (key, channel) in [("planning_scores", "planning"), ("communication_scores", "communication")] {
            let Some(Json::Array(values)) = self.field(record, key, Kind::List, "")? else { continue };
            if let Some((index, value)) = values.iter().enumerate().find(|(_, value)| value.as_finite().is_none()) {
                return Err(self.fail(format!("/{key}/{index} is {}, expected a finite number", value.describe())));
            }
            let scored: Vec<&Json<'_>> = values.iter().filter(|value| !unscored(value)).collect();
            missing.extend(
                values.iter().enumerate().filter(|(_, value)| unscored(value)).map(|(i, _)| format!("{key}/{i}")),
            );
            if !scored.is_empty() {
                set_reward(&mut rewards, channel.to_owned(), mean(&scored));
            }
        }
        for key in ["task_evaluation", "code_quality"] {
            let named: Vec<(&str, &Json<'_>)> = match record.field(key) {
                None => Vec::new(),
                Some(Json::Object(entries)) => entries.iter().map(|(name, score)| (name.as_ref(), score)).collect(),
                Some(score) => vec![("", score)],
            };
            for (name, score) in named {
                let channel = if name.is_empty() { key.to_owned() } else { format!("{key}.{name}") };
                if unscored(score) {
                    missing.push(channel);
                } else if let Some(score) = score.as_finite() {
                    set_reward(&mut rewards, channel, score);
                }
            }
        }
        Ok((rewards, missing))
    }
}

/// Reward channels, and the names of the scores that were not given.
type Scores = (Vec<(String, f64)>, Vec<String>);

/// `marble-` and the first 16 hex digits of the SHA-256 of the task's UTF-8 text.
fn task_id(task: &str) -> String {
    let digest = Sha256::digest(task.as_bytes());
    let mut id = String::with_capacity(23);
    id.push_str("marble-");
    for byte in &digest[..8] {
        id.extend([byte >> 4, byte & 15].map(|digit| char::from(b"0123456789abcdef"[usize::from(digit)])));
    }
    id
}

/// Python's `sum(values) / len(values)` of finite numbers (at least one), as Python 3.11
/// computes it: integers added exactly until the first float, then each value added as a
/// float, left to right; an integer total divided with a single rounding (`int / int`).
fn mean(values: &[&Json<'_>]) -> f64 {
    let mut exact: i128 = 0;
    let mut float: Option<f64> = None;
    for value in values {
        float = match (float, value.as_integer()) {
            (None, Some(n)) => match exact.checked_add(n) {
                Some(sum) => {
                    exact = sum;
                    None
                }
                // Past 2^127: no longer exact (Python's would be; no score gets there).
                None => Some(exact as f64 + n as f64),
            },
            (None, None) => Some(exact as f64 + value.as_number().unwrap_or(0.0)),
            (Some(total), _) => Some(total + value.as_number().unwrap_or(0.0)),
        };
    }
    match float {
        Some(total) => total / values.len() as f64,
        None => ratio(exact, values.len() as u64),
    }
}

/// `a / b` (b > 0) correctly rounded to the nearest float, ties to even (Python's `int / int`).
fn ratio(a: i128, b: u64) -> f64 {
    const EXACT: u128 = 1 << 53;
    let (negative, a, b) = (a < 0, a.unsigned_abs(), u128::from(b));
    let magnitude = if a <= EXACT && b <= EXACT {
        // Both exact as floats: one division, one rounding.
        a as f64 / b as f64
    } else {
        // a scaled to 128 bits over b < 2^64 leaves a quotient of at least 64 bits: keep 53,
        // rounded by the bits dropped and the remainder.
        let shift = a.leading_zeros();
        let scaled = a << shift;
        let (quotient, remainder) = (scaled / b, scaled % b);
        let dropped = 128 - quotient.leading_zeros() - 53;
        let mut mantissa = quotient >> dropped;
        let (rest, half) = (quotient & ((1u128 << dropped) - 1), 1u128 << (dropped - 1));
        if rest > half || (rest == half && (remainder != 0 || mantissa & 1 == 1)) {
            mantissa += 1;
        }
        mantissa as f64 * 2f64.powi(dropped as i32 - shift as i32)
    };
    if negative { -magnitude } else { magnitude }
}

/// Python's `str.isspace()` for one character (what `\s` matches in a `re` pattern on text):
/// Unicode White_Space and the four information separators U+001C..U+001F.
fn python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// `re.split(r"^From (\S+) to (\S+?): ", text, flags=re.MULTILINE)`: the text before the first
/// speaker line, and each speaker line's (sender, receiver). A speaker line starts the text
/// or follows a "\n"; its sender is the run of non-space characters after "From ", followed by
/// " to "; its receiver the next run less the ":" that ends it, followed by a space.
fn speaker_turns(text: &str) -> (&str, Vec<(&str, &str)>) {
    let mut turns = Vec::new();
    let mut before = text;
    let mut start = Some(0);
    while let Some(line) = start {
        let matched = text[line..].strip_prefix("From ").and_then(|rest| {
            let sender = &rest[..rest.find(python_space).unwrap_or(rest.len())];
            let after = rest[sender.len()..].strip_prefix(" to ")?;
            let run = &after[..after.find(python_space).unwrap_or(after.len())];
            let receiver = run.strip_suffix(':').filter(|receiver| !receiver.is_empty() && !sender.is_empty())?;
            after[run.len()..].starts_with(' ').then_some((sender, receiver, text.len() - after.len() + run.len() + 1))
        });
        if let Some((sender, receiver, end)) = matched {
            if turns.is_empty() {
                before = &text[..line];
            }
            turns.push((sender, receiver));
            start = text[end..].find('\n').map(|newline| end + newline + 1);
        } else {
            start = text[line..].find('\n').map(|newline| line + newline + 1);
        }
    }
    (before, turns)
}

/// Whether the text before the speaker lines is only MARBLE's session header:
/// `re.match(r"^\s*(In Session \S+\s*)?$", text)`.
fn is_session_header(text: &str) -> bool {
    let rest = text.trim_start_matches(python_space);
    if rest.is_empty() {
        return true;
    }
    let Some(session) = rest.strip_prefix("In Session ") else { return false };
    let name = session.find(python_space).unwrap_or(session.len());
    name > 0 && session[name..].chars().all(python_space)
}

#[cfg(test)]
mod tests;
