//! Claude Code session transcripts -> one orchestration trace per session.
//!
//! Every transcript line with a `uuid` becomes zero or more events whose id is that uuid
//! (`uuid#k` for the k-th content block when a line holds several):
//!
//! - assistant `thinking` -> orchestrator_decision, `text` -> message, `tool_use` ->
//!   tool_call, or spawn when the tool is Task/Agent (the sub-agent's lines are its events);
//! - user `tool_result` -> tool_result joined to its call by tool_use_id (a `return` edge),
//!   or a return event by the sub-agent for a Task/Agent call; `is_error` (a failed tool or a
//!   failed or interrupted sub-agent) adds a safety_event by the caller;
//! - user text: the sub-agent's prompt is a message from its parent, text injected by the
//!   harness (meta lines, `<task-notification>`..., a sub-agent's other user text) a message
//!   from `harness` (a safety_event addressed to the agent of the blocked call when it reports
//!   a hook blocking a tool), the compaction summary a message from its compaction's side
//!   agent, the rest human_intervention by `human`;
//! - system `compact_boundary` -> aggregate by that compaction's side agent (the `acompact-*`
//!   agent whose request hangs on the boundary's logical parent); `stop_hook_summary` ->
//!   safety_event by `harness` when the hooks prevented continuation or failed, else counted
//!   in `ignored` (the hooks passed).
//!
//! Each event's `role` says what its author is to the session: `orchestrator` (the session's
//! own agent), `sub-agent`, `compaction` (a compaction side agent), `human`, `harness` or
//! `tool` (a tool result); `kind` tells the messages, safety events and aggregates of the
//! harness apart (`prompt`, `compaction_summary`, `hook_block`, `stop_hook`, `compaction`),
//! and a spawn carries the call's `subagent_type`. Each event's `content_ref` is `file:line`
//! (`#k` for block k), a pointer to the text it came from. Edges come from `parentUuid`
//! (causal, through lines that made no event), plus spawn, return, aggregate and safety_flow
//! edges. Token usage is counted once per message id (the largest value of each usage field:
//! lines of one message repeat a streaming snapshot) on the message's first event. Lines that
//! repeat or only narrate others (progress, snapshots, queue operations, turn durations) are
//! counted in the report's `ignored`; anything else unread lands in `unknown`. A spawned
//! sub-agent whose own lines are missing (no `subagents/` file, or records given without
//! them) is a report warning, and its agent_progress lines, then the only copy of its events,
//! are counted apart: events are not rebuilt from them.
//!
//! Two layouts are read: 2.1.x, where each sub-agent has `<session>/subagents/agent-<id>.jsonl`
//! and its lines carry `agentId`; and 2.0.x, where sub-agent lines sit in the main file marked
//! `isSidechain` and are matched to their Task call by prompt text.

use std::hash::Hash;

// Every line's uuid and each event's id is hashed a few times: foldhash, not SipHash.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

use serde_json::Value;

use super::builder::{Builder, Out, integer};
use super::iso_time;
use super::json::Keep;
use super::json::{Json, repr, repr_opt, str_opt};
use super::{ConversionError, Record, Report, Source};
use crate::trace::{EdgeType, EventType, Topology, Trace};

const MAIN_AGENT: &str = "main";
const HUMAN: &str = "human";
const HARNESS: &str = "harness";
const SPAWN_TOOLS: [&str; 2] = ["Task", "Agent"];
const USAGE_FIELDS: [&str; 4] =
    ["input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"];
/// User text that Claude Code itself writes into the conversation, not typed by a person.
const HARNESS_PREFIXES: [&str; 5] =
    ["<task-notification>", "<system-reminder>", "<command-", "<local-command-", "Caveat: "];
/// How the harness tells the model that a hook refused a tool call.
const HOOK_BLOCK: &str = "hook blocking error";

// Understood and deliberately not turned into events (counted in report.ignored).
const IGNORED_LINE_TYPES: [&str; 3] = ["file-history-snapshot", "queue-operation", "summary"];
const IGNORED_PROGRESS: [&str; 5] =
    ["agent_progress", "hook_progress", "bash_progress", "waiting_for_task", "mcp_progress"];
const IGNORED_SYSTEM: [&str; 1] = ["turn_duration"];
/// agent_progress lines of a sub-agent whose own transcript is missing: the only copy of its events.
const MISSING_SUBAGENT_PROGRESS: &str = "progress agent_progress (not repeated: sub-agent transcript missing)";
/// A line written twice (same uuid, same content): one copy is read.
const REPEATED_LINE: &str = "line repeating an earlier line (same uuid and content)";
/// Fields of a line that are looked up as ids or compared as names, and those read into.
const TEXT_FIELDS: [&str; 5] = ["uuid", "parentUuid", "logicalParentUuid", "parentToolUseID", "subtype"];
const OBJECT_FIELDS: [&str; 1] = ["compactMetadata"];

// Roles (the events' `role`): what the author is to the session. The metrics never take a
// human, the harness or a tool for the orchestrator.
const ORCHESTRATOR: &str = "orchestrator";
const SUB_AGENT: &str = "sub-agent";
const COMPACTION: &str = "compaction";
const TOOL: &str = "tool";

/// The parts of a line the converter reads (everything else is skipped unread).
const LINE: Keep = Keep::Fields(&[
    ("type", Keep::All),
    ("uuid", Keep::All),
    ("parentUuid", Keep::All),
    ("logicalParentUuid", Keep::All),
    ("parentToolUseID", Keep::All),
    ("subtype", Keep::All),
    ("timestamp", Keep::All),
    ("agentId", Keep::All),
    ("isSidechain", Keep::All),
    ("sessionId", Keep::All),
    ("version", Keep::All),
    ("isCompactSummary", Keep::All),
    ("isMeta", Keep::All),
    ("preventedContinuation", Keep::All),
    ("hookErrors", Keep::All),
    ("hookCount", Keep::All),
    ("compactMetadata", Keep::Fields(&[("trigger", Keep::All), ("preTokens", Keep::All)])),
    (
        "toolUseResult",
        Keep::Fields(&[
            ("agentId", Keep::All),
            ("totalDurationMs", Keep::All),
            ("status", Keep::All),
            ("totalTokens", Keep::All),
            ("totalToolUseCount", Keep::All),
        ]),
    ),
    ("data", Keep::Fields(&[("type", Keep::All), ("agentId", Keep::All)])),
    (
        "message",
        Keep::Fields(&[
            ("id", Keep::All),
            ("model", Keep::All),
            (
                "usage",
                Keep::Fields(&[
                    ("input_tokens", Keep::All),
                    ("output_tokens", Keep::All),
                    ("cache_creation_input_tokens", Keep::All),
                    ("cache_read_input_tokens", Keep::All),
                ]),
            ),
            ("content", Keep::Items(&BLOCK)),
        ]),
    ),
]);
const BLOCK: Keep = Keep::Fields(&[
    ("type", Keep::All),
    ("id", Keep::All),
    ("tool_use_id", Keep::All),
    ("name", Keep::All),
    ("text", Keep::All),
    ("is_error", Keep::All),
    ("input", Keep::Fields(&[("prompt", Keep::All), ("subagent_type", Keep::All)])),
]);

/// The records of a transcript file (JSON Lines), read for this converter.
pub fn read<'a>(name: &str, bytes: &'a [u8]) -> Result<Vec<Record<'a>>, ConversionError> {
    super::json_lines(name, bytes, &LINE)
}

/// The records of several transcript files (name, text), parsed in one parallel pass.
pub fn read_files<'a>(files: &[(&str, &'a [u8])]) -> Result<Vec<Vec<Record<'a>>>, ConversionError> {
    super::json_lines_of(files, &LINE)
}

type Failure = Box<ConversionError>;
type Outcome<T> = Result<T, Failure>;

/// What the caller may set: `trace_id` defaults to the session id, `task_id` to the trace
/// id; `folder` is where the sub-agent files were looked for (named in warnings).
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub trace_id: Option<String>,
    pub task_id: Option<String>,
    pub folder: Option<String>,
}

/// Converts a session: `sources` are the main transcript first, then each sub-agent file.
pub fn convert(sources: &[Source<'_>], options: &Options) -> Result<(Trace, Report), Box<ConversionError>> {
    let mut report = Report { records: sources.iter().map(|source| source.records.len()).sum(), ..Report::default() };
    let main_source = sources.first().map_or(super::IN_MEMORY, |source| source.name.as_str());
    let session = Session::new(sources, options.folder.as_deref(), &mut report)?;
    let session_id = session.lines.iter().find_map(|line| line.record.str("sessionId"));
    let Some(trace_id) =
        options.trace_id.as_deref().filter(|id| !id.is_empty()).or(session_id).filter(|id| !id.is_empty())
    else {
        return Err(Box::new(ConversionError::new(
            main_source,
            None,
            "no sessionId in the transcript; pass trace_id=",
        )));
    };
    let version = session.lines.iter().find_map(|line| line.record.str("version"));
    let system = match version {
        Some(version) if !version.is_empty() => format!("claude-code {version}"),
        _ => "claude-code".to_owned(),
    };
    let mut converter = Converter::new(&session, trace_id, &mut report);
    converter.run()?;
    let task_id = options.task_id.as_deref().filter(|id| !id.is_empty()).unwrap_or(trace_id);
    match converter.builder.build((task_id, &system, Topology::Centralized), session.end - session.start, Vec::new()) {
        Ok(trace) => Ok((trace, report)),
        Err(cause) => Err(Box::new(ConversionError::invalid_trace(main_source, None, cause))),
    }
}

// ---- small ordered maps: Python dicts (insertion order, a repeated key keeps its place) ---

struct Ordered<K, V> {
    index: HashMap<K, usize>,
    entries: Vec<(K, V)>,
}

impl<K: Hash + Eq + Clone, V> Ordered<K, V> {
    fn new() -> Self {
        Ordered { index: HashMap::default(), entries: Vec::new() }
    }

    fn insert(&mut self, key: K, value: V) {
        match self.index.get(&key) {
            Some(&at) => self.entries[at].1 = value,
            None => {
                self.index.insert(key.clone(), self.entries.len());
                self.entries.push((key, value));
            }
        }
    }

    fn set_default(&mut self, key: K, value: V) {
        if !self.index.contains_key(&key) {
            self.insert(key, value);
        }
    }

    fn get(&self, key: &K) -> Option<&V> {
        self.index.get(key).map(|&at| &self.entries[at].1)
    }

    fn contains(&self, key: &K) -> bool {
        self.index.contains_key(key)
    }
}

// ---- lines ---------------------------------------------------------------------------------

struct Line<'r> {
    source: &'r Source<'r>,
    number: usize,
    /// What the converter reads of the record.
    record: &'r Json<'r>,
    /// The record as given.
    whole: &'r Record<'r>,
    agent: String,
    /// The line's time in seconds since the epoch, or why it has none.
    stamp: Result<f64, String>,
}

/// A content block, with the fields the converter reads (each checked for its type).
#[derive(Clone, Copy)]
struct Block<'r> {
    kind: Option<&'r str>,
    id: Option<&'r str>,
    tool_use_id: Option<&'r str>,
    name: Option<&'r str>,
    text: Option<&'r str>,
    input: Option<&'r Json<'r>>,
    is_error: Option<&'r Json<'r>>,
}

impl<'r> Line<'r> {
    fn new(source: &'r Source<'r>, whole: &'r Record<'r>) -> Self {
        let record = &whole.value;
        let stamp = match record.get("timestamp") {
            Some(Json::Str(stamp)) => {
                iso_time::seconds(stamp).ok_or_else(|| format!("timestamp {} is not an ISO-8601 time", repr(stamp)))
            }
            _ => Err("line without a timestamp".to_owned()),
        };
        Line { source, number: whole.line, record, whole, agent: MAIN_AGENT.to_owned(), stamp }
    }

    fn fail(&self, reason: impl Into<String>) -> Failure {
        Box::new(ConversionError::new(&self.source.name, Some(self.number), reason))
    }

    fn kind(&self) -> &'r str {
        self.record.str("type").unwrap_or_default()
    }

    fn uuid(&self) -> Option<&'r str> {
        self.record.str("uuid")
    }

    /// Python's `line.uuid` tested for truth: a non-empty uuid.
    fn truthy_uuid(&self) -> Option<&'r str> {
        self.uuid().filter(|uuid| !uuid.is_empty())
    }

    fn text_field(&self, key: &str) -> Option<&'r str> {
        self.record.str(key)
    }

    fn seconds(&self) -> Outcome<f64> {
        self.stamp.clone().map_err(|reason| self.fail(reason))
    }

    /// The fields the converter hashes or reads into are of the types it needs.
    fn check(&self) -> Outcome<()> {
        let record = self.record;
        if record.str("type").is_none() {
            return Err(self.fail("line without a string 'type'"));
        }
        for key in TEXT_FIELDS {
            if let Some(value) = record.field(key).filter(|value| value.as_str().is_none()) {
                return Err(self.fail(format!("{key} is {}, expected text", value.describe())));
            }
        }
        for key in OBJECT_FIELDS {
            if let Some(value) = record.field(key).filter(|value| !value.is_object()) {
                return Err(self.fail(format!("{key} is {}, expected an object", value.describe())));
            }
        }
        if let Some(message) = record.get("message").filter(|message| message.is_object()) {
            if let Some(id) = message.field("id").filter(|id| id.as_str().is_none()) {
                return Err(self.fail(format!("message.id is {}, expected text", id.describe())));
            }
            if let Some(usage) = message.field("usage").filter(|usage| !usage.is_object()) {
                return Err(self.fail(format!("message.usage is {}, expected an object", usage.describe())));
            }
        }
        Ok(())
    }

    /// The message's blocks (text as one text block), each checked for the types read from it.
    fn content(&self) -> Outcome<Vec<Block<'r>>> {
        let Some(message) = self.record.get("message").filter(|message| message.is_object()) else {
            return Err(self.fail(format!("{} line without a message object", self.kind())));
        };
        let blocks = match message.get("content") {
            Some(Json::Str(text)) => {
                return Ok(vec![Block {
                    kind: Some("text"),
                    id: None,
                    tool_use_id: None,
                    name: None,
                    text: Some(text),
                    input: None,
                    is_error: None,
                }]);
            }
            Some(Json::Array(blocks)) if blocks.iter().all(Json::is_object) => blocks,
            _ => return Err(self.fail("message.content is neither text nor a list of blocks")),
        };
        let mut out = Vec::with_capacity(blocks.len());
        for (index, block) in blocks.iter().enumerate() {
            let text = |key: &str| -> Outcome<Option<&'r str>> {
                match block.field(key) {
                    None => Ok(None),
                    Some(Json::Str(value)) => Ok(Some(value)),
                    Some(other) => {
                        Err(self.fail(format!("message.content/{index}/{key} is {}, expected text", other.describe())))
                    }
                }
            };
            let (kind, id, tool_use_id, name, text_value) =
                (text("type")?, text("id")?, text("tool_use_id")?, text("name")?, text("text")?);
            let input = block.field("input");
            if let Some(input) = input.filter(|input| !input.is_object()) {
                return Err(
                    self.fail(format!("message.content/{index}/input is {}, expected an object", input.describe()))
                );
            }
            out.push(Block { kind, id, tool_use_id, name, text: text_value, input, is_error: block.get("is_error") });
        }
        Ok(out)
    }

    /// The kind of a progress line (`data.type`), when it is text.
    fn progress_kind(&self) -> Option<&'r str> {
        if self.kind() != "progress" {
            return None;
        }
        self.record.get("data").filter(|data| data.is_object()).and_then(|data| data.str("type"))
    }
}

/// The text of the text blocks, joined.
fn joined_text(content: &[Block<'_>]) -> String {
    content.iter().filter(|block| block.kind == Some("text")).filter_map(|block| block.text).collect()
}

/// The role of an author: the session's own agent orchestrates; the person, the harness and
/// the compaction side agents are named as such; every other agent is a sub-agent.
fn role(agent: &str) -> &str {
    match agent {
        MAIN_AGENT => ORCHESTRATOR,
        HUMAN | HARNESS => agent,
        _ if agent.starts_with("acompact") || agent.starts_with("compaction") => COMPACTION,
        _ => SUB_AGENT,
    }
}

// ---- the session: every line, indexed the ways the edges need --------------------------

/// A tool call: the index of its line and its block.
type Call<'r> = (usize, Block<'r>);

struct Session<'r> {
    lines: Vec<Line<'r>>,
    by_uuid: HashMap<&'r str, usize>,
    start: f64,
    end: f64,
    calls: Ordered<Option<&'r str>, Call<'r>>,
    /// Task/Agent tool_use id -> the sub-agent it started.
    spawned: Ordered<&'r str, String>,
    parent_agent: HashMap<String, String>,
    missing_subagents: HashSet<String>,
    /// compact_boundary lines (indices), by time.
    boundaries: Vec<usize>,
    compaction_agents: Ordered<Option<&'r str>, String>,
    usage: Usage<'r>,
}

/// Token counts by usage field, per message id (or line uuid).
type Usage<'r> = Ordered<Option<&'r str>, Vec<(&'static str, i128)>>;

impl<'r> Session<'r> {
    fn new(sources: &'r [Source<'r>], folder: Option<&str>, report: &mut Report) -> Outcome<Self> {
        let mut lines: Vec<Line<'r>> = Vec::new();
        let mut by_uuid: HashMap<&'r str, usize> = HashMap::default();
        for source in sources {
            for record in &source.records {
                let line = Line::new(source, record);
                line.check()?;
                let Some(uuid) = line.truthy_uuid() else {
                    lines.push(line);
                    continue;
                };
                match by_uuid.get(uuid) {
                    None => {
                        by_uuid.insert(uuid, lines.len());
                        lines.push(line);
                    }
                    Some(&first) if lines[first].whole.whole().py_eq(&record.whole()) => {
                        Report::count(&mut report.ignored, &[REPEATED_LINE])
                    }
                    Some(&first) => {
                        let first = &lines[first];
                        return Err(line.fail(format!(
                            "uuid {} is already the uuid of {}:{}, a different line",
                            repr(uuid),
                            first.source.name,
                            first.number
                        )));
                    }
                }
            }
        }
        let (mut start, mut end) = (f64::INFINITY, f64::NEG_INFINITY);
        for line in lines.iter().filter(|line| line.record.get("timestamp").is_some()) {
            let seconds = line.seconds()?;
            start = start.min(seconds);
            end = end.max(seconds);
        }
        if start > end {
            (start, end) = (0.0, 0.0);
        }
        let mut session = Session {
            lines,
            by_uuid,
            start,
            end,
            calls: Ordered::new(),
            spawned: Ordered::new(),
            parent_agent: HashMap::default(),
            missing_subagents: HashSet::default(),
            boundaries: Vec::new(),
            compaction_agents: Ordered::new(),
            usage: Ordered::new(),
        };
        session.assign_agents();
        session.calls = session.tool_calls()?;
        session.spawned = session.match_spawns()?;
        for (call, agent) in &session.spawned.entries {
            if let Some((line, _)) = session.calls.get(&Some(call)) {
                session.parent_agent.insert(agent.clone(), session.lines[*line].agent.clone());
            }
        }
        session.missing_subagents = session.report_missing_transcripts(folder, report);
        let mut boundaries = Vec::new();
        for (index, line) in session.lines.iter().enumerate() {
            if line.text_field("subtype") == Some("compact_boundary") {
                boundaries.push((line.seconds()?, index));
            }
        }
        boundaries.sort_by(|a, b| a.0.total_cmp(&b.0));
        session.boundaries = boundaries.into_iter().map(|(_, index)| index).collect();
        session.compaction_agents = session.match_compactions()?;
        session.usage = session.usage_per_message()?;
        Ok(session)
    }

    /// 2.1.x lines name their agent; a 2.0.x sidechain line inherits its parent's, and a
    /// sidechain root starts a new one.
    fn assign_agents(&mut self) {
        let mut roots = 0;
        for index in 0..self.lines.len() {
            let record = self.lines[index].record;
            if let Some(agent) = record.str("agentId") {
                self.lines[index].agent = agent.to_owned();
            } else if record.truthy_field("isSidechain").is_some() {
                let parent =
                    record.str("parentUuid").and_then(|uuid| self.by_uuid.get(uuid)).map(|&at| &self.lines[at]);
                match parent {
                    Some(parent) if parent.record.truthy_field("isSidechain").is_some() => {
                        self.lines[index].agent = parent.agent.clone();
                    }
                    _ => {
                        roots += 1;
                        self.lines[index].agent = format!("sidechain-{roots}");
                    }
                }
            }
        }
    }

    /// tool_use id -> (its line, its content block).
    fn tool_calls(&self) -> Outcome<Ordered<Option<&'r str>, Call<'r>>> {
        let mut calls = Ordered::new();
        for (index, line) in self.lines.iter().enumerate() {
            if line.kind() == "assistant" {
                for block in line.content()? {
                    if block.kind == Some("tool_use") && block.id.is_some() {
                        calls.insert(block.id, (index, block));
                    }
                }
            }
        }
        Ok(calls)
    }

    /// Task/Agent tool_use id -> the sub-agent it started: by the agentId its result or its
    /// progress lines name (2.1.x), else by the sub-agent's first prompt (2.0.x).
    fn match_spawns(&self) -> Outcome<Ordered<&'r str, String>> {
        let mut named: Ordered<Option<&'r str>, &'r str> = Ordered::new();
        for line in &self.lines {
            let record = line.record;
            match line.kind() {
                "user" => {
                    let Some(result) = record.get("toolUseResult").filter(|result| result.is_object()) else {
                        continue;
                    };
                    let agent = result.str("agentId");
                    for block in line.content()? {
                        if let (Some("tool_result"), Some(agent)) = (block.kind, agent) {
                            named.insert(block.tool_use_id, agent);
                        }
                    }
                }
                "progress" => {
                    let Some(data) = record.get("data").filter(|data| data.is_object()) else {
                        continue;
                    };
                    if data.str("type") == Some("agent_progress")
                        && let Some(agent) = data.str("agentId")
                    {
                        named.set_default(line.text_field("parentToolUseID"), agent);
                    }
                }
                _ => {}
            }
        }
        let spawn_calls: Vec<&'r str> = self
            .calls
            .entries
            .iter()
            .filter(|(_, (_, block))| block.name.is_some_and(|name| SPAWN_TOOLS.contains(&name)))
            .filter_map(|(id, _)| *id)
            .collect();
        let mut spawned = Ordered::new();
        for (call, agent) in &named.entries {
            if let Some(call) = call.filter(|call| spawn_calls.contains(call)) {
                spawned.insert(call, (*agent).to_owned());
            }
        }
        let taken: HashSet<&str> = spawned.entries.iter().map(|(_, agent)| agent.as_str()).collect();
        let mut roots: Ordered<&str, usize> = Ordered::new();
        for (index, line) in self.lines.iter().enumerate() {
            if line.agent.starts_with("sidechain-") && !taken.contains(line.agent.as_str()) {
                roots.set_default(line.agent.as_str(), index);
            }
        }
        let mut unmatched: Vec<(&str, usize)> = roots.entries;
        for call in spawn_calls {
            if spawned.contains(&call) {
                continue;
            }
            let prompt =
                self.calls.get(&Some(call)).and_then(|(_, block)| block.input).and_then(|input| input.get("prompt"));
            let mut found = None;
            for (position, &(agent, root)) in unmatched.iter().enumerate() {
                let root = &self.lines[root];
                if root.kind() == "user"
                    && prompt.and_then(Json::as_str) == Some(joined_text(&root.content()?).as_str())
                {
                    found = Some((position, agent));
                    break;
                }
            }
            if let Some((position, agent)) = found {
                spawned.insert(call, agent.to_owned());
                unmatched.remove(position);
            }
        }
        Ok(spawned)
    }

    /// The sub-agent an agent_progress line repeats an entry of.
    fn progress_agent(&self, line: &Line<'r>) -> Option<&str> {
        let named = line.record.truthy_field("data").and_then(|data| data.str("agentId"));
        named
            .or_else(|| line.text_field("parentToolUseID").and_then(|call| self.spawned.get(&call)).map(String::as_str))
    }

    /// Sub-agents that were spawned but whose own lines are not in the input: their events
    /// then survive only in the parent's agent_progress lines, which this converter does not
    /// rebuild events from, so the loss is reported, never silent.
    fn report_missing_transcripts(&self, folder: Option<&str>, report: &mut Report) -> HashSet<String> {
        let present: HashSet<&str> = self.lines.iter().map(|line| line.agent.as_str()).collect();
        let missing: HashSet<String> = self
            .spawned
            .entries
            .iter()
            .map(|(_, agent)| agent)
            .filter(|agent| !present.contains(agent.as_str()))
            .cloned()
            .collect();
        let mut progress: HashMap<Option<&str>, usize> = HashMap::default();
        for line in self.lines.iter().filter(|line| line.progress_kind() == Some("agent_progress")) {
            *progress.entry(self.progress_agent(line)).or_default() += 1;
        }
        let main = self.lines.first().map_or(super::IN_MEMORY, |line| line.source.name.as_str());
        for (call, agent) in &self.spawned.entries {
            if missing.contains(agent) {
                let place = match folder {
                    Some(folder) => format!("{folder}/agent-{agent}.jsonl"),
                    None => format!("agent-{agent}.jsonl (pass the session's path so its subagents/ folder is read)"),
                };
                report.warnings.push(format!(
                    "{main}: sub-agent {} spawned by tool call {} has no transcript ({place} missing); \
                     its events were not converted ({} agent_progress lines carry them)",
                    repr(agent),
                    repr(call),
                    progress.get(&Some(agent.as_str())).copied().unwrap_or(0)
                ));
            }
        }
        for (call, (line, block)) in &self.calls.entries {
            let Some(name) = block.name.filter(|name| SPAWN_TOOLS.contains(name)) else { continue };
            if !call.is_some_and(|call| self.spawned.contains(&call)) {
                let line = &self.lines[*line];
                report.warnings.push(format!(
                    "{}:{}: no sub-agent transcript found for {name} call {}; converted as a plain tool call",
                    line.source.name,
                    line.number,
                    repr_opt(*call)
                ));
            }
        }
        missing
    }

    /// compact_boundary uuid -> the side agent that compacted: the acompact agent whose
    /// compaction request hangs on the boundary's logical parent, else the earliest side agent
    /// left over; `compaction-<k>` when its transcript is not in the input.
    fn match_compactions(&self) -> Outcome<Ordered<Option<&'r str>, String>> {
        let mut requests: Ordered<Option<&'r str>, &str> = Ordered::new();
        for line in self.lines.iter().filter(|line| line.agent.starts_with("acompact")) {
            requests.insert(line.text_field("parentUuid"), line.agent.as_str());
        }
        let mut matched: Ordered<Option<&'r str>, String> = Ordered::new();
        for &boundary in &self.boundaries {
            let boundary = &self.lines[boundary];
            if let Some(agent) = requests.get(&boundary.text_field("logicalParentUuid")) {
                matched.insert(boundary.uuid(), (*agent).to_owned());
            }
        }
        let taken: HashSet<&str> = matched.entries.iter().map(|(_, agent)| agent.as_str()).collect();
        let mut started: Ordered<&str, f64> = Ordered::new();
        for line in &self.lines {
            if line.agent.starts_with("acompact")
                && !taken.contains(line.agent.as_str())
                && line.record.get("timestamp").is_some()
            {
                let seconds = line.seconds()?;
                let earliest = started.get(&line.agent.as_str()).map_or(seconds, |&known| known.min(seconds));
                started.insert(line.agent.as_str(), earliest);
            }
        }
        let mut left_over = started.entries;
        left_over.sort_by(|a, b| a.1.total_cmp(&b.1));
        let mut left_over = left_over.into_iter().map(|(agent, _)| agent);
        for (number, &boundary) in self.boundaries.iter().enumerate() {
            let uuid = self.lines[boundary].uuid();
            if !matched.contains(&uuid) {
                let agent = left_over.next().map_or_else(|| format!("compaction-{}", number + 1), str::to_owned);
                matched.insert(uuid, agent);
            }
        }
        Ok(matched)
    }

    /// The side agent of the compaction a summary follows: that of the boundary among its
    /// ancestors, else of the latest boundary before it.
    fn compaction_of_summary(&self, line: &Line<'r>) -> Outcome<String> {
        let mut seen = HashSet::default();
        let mut parent =
            line.text_field("parentUuid").and_then(|uuid| self.by_uuid.get(uuid)).map(|&at| &self.lines[at]);
        while let Some(ancestor) = parent {
            let uuid = ancestor.uuid();
            if seen.contains(&uuid) {
                break;
            }
            if let Some(agent) = self.compaction_agents.get(&uuid) {
                return Ok(agent.clone());
            }
            seen.insert(uuid);
            parent =
                ancestor.text_field("parentUuid").and_then(|uuid| self.by_uuid.get(uuid)).map(|&at| &self.lines[at]);
        }
        if self.boundaries.is_empty() {
            return Ok(COMPACTION.to_owned());
        }
        let seconds = line.seconds()?;
        let mut earlier = None;
        for &boundary in &self.boundaries {
            if self.lines[boundary].seconds()? <= seconds {
                earlier = Some(boundary);
            }
        }
        Ok(match earlier {
            Some(boundary) => self.compaction_agents.get(&self.lines[boundary].uuid()).cloned().unwrap_or_default(),
            None => COMPACTION.to_owned(),
        })
    }

    fn usage_per_message(&self) -> Outcome<Usage<'r>> {
        let mut usage: Usage<'r> = Ordered::new();
        for line in &self.lines {
            let Some(message) = line.record.get("message").filter(|message| message.is_object()) else { continue };
            if line.kind() != "assistant" {
                continue;
            }
            let key = message_key(line, message);
            let mut merged = usage.get(&key).cloned().unwrap_or_default();
            if let Some(counts) = message.get("usage") {
                for name in USAGE_FIELDS {
                    let Some(count) = counts.get(name).and_then(Json::as_integer) else { continue };
                    if count < 0 {
                        return Err(line.fail(format!("message.usage.{name} is negative ({count})")));
                    }
                    match merged.iter_mut().find(|(known, _)| *known == name) {
                        Some(entry) => entry.1 = entry.1.max(count),
                        None => merged.push((name, count)),
                    }
                }
            }
            usage.insert(key, merged);
        }
        Ok(usage)
    }

    fn t(&self, line: &Line<'r>) -> Outcome<f64> {
        Ok(line.seconds()? - self.start)
    }
}

/// The key usage is merged under: the message id, else the line's uuid.
fn message_key<'r>(line: &Line<'r>, message: &'r Json<'r>) -> Option<&'r str> {
    message.str("id").filter(|id| !id.is_empty()).or_else(|| line.uuid())
}

// ---- the conversion ------------------------------------------------------------------------

struct Converter<'s, 'r> {
    session: &'s Session<'r>,
    report: &'s mut Report,
    builder: Builder<'s>,
    /// Event indices of each line (the session's lines stay shared).
    events: Vec<Vec<usize>>,
    counted_messages: HashSet<Option<&'r str>>,
    /// Sub-agent -> its first user line (the prompt), filled as lines are read.
    roots: HashMap<String, Option<usize>>,
    call_events: HashMap<Option<&'r str>, usize>,
    spawn_events: HashMap<String, usize>,
}

impl<'s, 'r> Converter<'s, 'r> {
    fn new(session: &'s Session<'r>, trace_id: &'s str, report: &'s mut Report) -> Self {
        Converter {
            session,
            report,
            builder: Builder::new(trace_id),
            events: vec![Vec::new(); session.lines.len()],
            counted_messages: HashSet::default(),
            roots: session.parent_agent.keys().map(|agent| (agent.clone(), None)).collect(),
            call_events: HashMap::default(),
            spawn_events: HashMap::default(),
        }
    }

    fn run(&mut self) -> Outcome<()> {
        for index in 0..self.session.lines.len() {
            let line = &self.session.lines[index];
            match line.kind() {
                "assistant" => self.assistant(index)?,
                "user" => self.user(index)?,
                "system" => self.system(index)?,
                "progress" => self.progress(index),
                kind => {
                    let bucket = if IGNORED_LINE_TYPES.contains(&kind) {
                        &mut self.report.ignored
                    } else {
                        &mut self.report.unknown
                    };
                    Report::count(bucket, &["line type ", kind]);
                }
            }
        }
        self.edges()
    }

    #[allow(clippy::too_many_arguments)]
    fn new_event(
        &mut self,
        index: usize,
        block: usize,
        blocks: usize,
        kind: EventType,
        agent: &str,
        suffix: &str,
        fields: Vec<(&str, Out<'r>)>,
    ) -> Outcome<usize> {
        let line = &self.session.lines[index];
        let Some(uuid) = line.truthy_uuid() else {
            return Err(line.fail(format!("{} line without a uuid", line.kind())));
        };
        let (id, content_ref) = if blocks == 1 {
            (format!("{uuid}{suffix}"), format!("{}:{}", line.source.label, line.number))
        } else {
            (format!("{uuid}#{block}{suffix}"), format!("{}:{}#{block}", line.source.label, line.number))
        };
        let role = if kind == EventType::ToolResult { TOOL } else { role(agent) };
        let t = self.session.t(line)?;
        let mut all = Vec::with_capacity(fields.len() + 2);
        all.push(("role", Out::Text(role.to_owned())));
        all.push(("content_ref", Out::Text(content_ref)));
        all.extend(fields);
        let event = self.builder.event(id, t, kind, agent, all);
        self.events[index].push(event);
        Ok(event)
    }

    // ---- line types ----------------------------------------------------------------------
    fn assistant(&mut self, index: usize) -> Outcome<()> {
        let line = &self.session.lines[index];
        let content = line.content()?;
        let Some(message) = line.record.get("message") else { return Ok(()) };
        let agent = line.agent.as_str();
        for (position, block) in content.iter().enumerate() {
            let mut fields = self.usage_fields(index, message);
            match block.kind {
                Some("thinking" | "redacted_thinking") => {
                    self.new_event(index, position, content.len(), EventType::OrchestratorDecision, agent, "", fields)?;
                }
                Some("text") => {
                    fields.insert(0, ("from", Out::Text(agent.to_owned())));
                    self.new_event(index, position, content.len(), EventType::Message, agent, "", fields)?;
                }
                Some("tool_use") => {
                    let name = block.name.map(str::to_owned);
                    let spawned = block.id.and_then(|id| self.session.spawned.get(&id));
                    let event = if let Some(sub) = spawned {
                        let subagent_type = block.input.and_then(|input| input.get("subagent_type"));
                        let mut spawn = vec![
                            ("to", Out::Text(sub.clone())),
                            ("subagent_type", Out::Raw(subagent_type)),
                            ("tool", Out::Value(name.map_or(Value::Null, Value::String))),
                            ("tool_use_id", Out::Value(block.id.map_or(Value::Null, Value::from))),
                        ];
                        spawn.retain(|(_, value)| !matches!(value, Out::Value(Value::Null)));
                        spawn.extend(fields);
                        let event =
                            self.new_event(index, position, content.len(), EventType::Spawn, agent, "", spawn)?;
                        self.spawn_events.insert(sub.clone(), event);
                        event
                    } else {
                        let mut call = Vec::with_capacity(fields.len() + 2);
                        if let Some(name) = name {
                            call.push(("tool", Out::Text(name)));
                        }
                        if let Some(id) = block.id {
                            call.push(("tool_use_id", Out::Text(id.to_owned())));
                        }
                        call.extend(fields);
                        self.new_event(index, position, content.len(), EventType::ToolCall, agent, "", call)?
                    };
                    self.call_events.insert(block.id, event);
                }
                kind => Report::count(&mut self.report.unknown, &["assistant content block ", str_opt(kind)]),
            }
        }
        Ok(())
    }

    /// Tokens and model for the first event of a message id; nothing for the rest.
    fn usage_fields(&mut self, index: usize, message: &'r Json<'r>) -> Vec<(&'static str, Out<'r>)> {
        let key = message_key(&self.session.lines[index], message);
        if !self.counted_messages.insert(key) {
            return Vec::new();
        }
        let usage = self.session.usage.get(&key).map(Vec::as_slice).unwrap_or_default();
        let mut fields = vec![("tokens", Out::Value(integer(usage.iter().map(|(_, count)| count).sum())))];
        if !usage.is_empty() {
            let counts = usage.iter().map(|(name, count)| ((*name).to_owned(), integer(*count))).collect();
            fields.push(("usage", Out::Value(Value::Object(counts))));
        }
        fields.push(("model", Out::Raw(message.get("model"))));
        fields.push(("message_id", Out::Raw(message.get("id"))));
        fields
    }

    fn user(&mut self, index: usize) -> Outcome<()> {
        let content = self.session.lines[index].content()?;
        for (position, block) in content.iter().enumerate() {
            match block.kind {
                Some("tool_result") => self.tool_result(index, position, content.len(), block)?,
                Some("text" | "image") => self.user_text(index, position, content.len(), block)?,
                kind => Report::count(&mut self.report.unknown, &["user content block ", str_opt(kind)]),
            }
        }
        Ok(())
    }

    fn tool_result(&mut self, index: usize, position: usize, blocks: usize, block: &Block<'r>) -> Outcome<()> {
        let session = self.session;
        let line = &session.lines[index];
        let call_id = block.tool_use_id;
        let call = session.calls.get(&call_id);
        let (tool, duration) = match call {
            None => {
                self.report.warnings.push(format!(
                    "{}:{}: tool_result for {} has no tool_use",
                    line.source.name,
                    line.number,
                    repr_opt(call_id)
                ));
                ("unknown_tool", None)
            }
            Some((call_line, call_block)) => {
                let name = call_block.name.filter(|name| !name.is_empty()).unwrap_or("unknown_tool");
                let duration = session.t(line)? - session.t(&session.lines[*call_line])?;
                (name, Some(duration.max(0.0)))
            }
        };
        let spawned = call_id.and_then(|id| session.spawned.get(&id));
        match (spawned, call) {
            (Some(sub), Some((call_line, _))) => {
                let caller = session.lines[*call_line].agent.as_str();
                self.subagent_return(index, position, blocks, block, sub, caller)?;
            }
            _ => {
                let mut fields = vec![("tool", Out::Text(tool.to_owned()))];
                if let Some(id) = call_id {
                    fields.push(("tool_use_id", Out::Text(id.to_owned())));
                }
                fields.push(("is_error", Out::Raw(block.is_error)));
                if let Some(duration) = duration {
                    fields.push(("duration_s", Out::Float(duration)));
                }
                self.new_event(index, position, blocks, EventType::ToolResult, tool, "", fields)?;
            }
        }
        if block.is_error.is_some_and(Json::truthy) {
            // A failed or interrupted sub-agent is flagged like any failed tool.
            let caller = call.map_or(line.agent.as_str(), |(call_line, _)| session.lines[*call_line].agent.as_str());
            let fields = vec![("tool", Out::Text(tool.to_owned())), ("reason", Out::Text("tool_error".to_owned()))];
            self.new_event(index, position, blocks, EventType::SafetyEvent, caller, "!error", fields)?;
        }
        Ok(())
    }

    fn subagent_return(
        &mut self,
        index: usize,
        position: usize,
        blocks: usize,
        block: &Block<'r>,
        sub: &str,
        caller: &str,
    ) -> Outcome<()> {
        let line = &self.session.lines[index];
        let result = line.record.get("toolUseResult").filter(|result| result.is_object());
        let from_result = |key: &str| Out::Raw(result.and_then(|result| result.get(key)));
        let mut fields = vec![("from", Out::Text(sub.to_owned())), ("to", Out::Text(caller.to_owned()))];
        if let Some(id) = block.tool_use_id {
            fields.push(("tool_use_id", Out::Text(id.to_owned())));
        }
        fields.push(("is_error", Out::Raw(block.is_error)));
        if let Some(milliseconds) = result.and_then(|result| result.get("totalDurationMs")).and_then(Json::as_number) {
            fields.push(("duration_s", Out::Float(milliseconds / 1000.0)));
        }
        fields.push(("status", from_result("status")));
        fields.push(("reported_total_tokens", from_result("totalTokens")));
        fields.push(("reported_tool_uses", from_result("totalToolUseCount")));
        self.new_event(index, position, blocks, EventType::Return, sub, "", fields)?;
        Ok(())
    }

    fn user_text(&mut self, index: usize, position: usize, blocks: usize, block: &Block<'r>) -> Outcome<()> {
        let session = self.session;
        let line = &session.lines[index];
        let record = line.record;
        let text = block.text.unwrap_or_default();
        let agent = line.agent.as_str();
        let parent = session.parent_agent.get(agent);
        let message = |from: &str, kind: Option<&str>| {
            let mut fields = vec![("from", Out::Text(from.to_owned())), ("to", Out::Text(agent.to_owned()))];
            if let Some(kind) = kind {
                fields.push(("kind", Out::Text(kind.to_owned())));
            }
            fields
        };
        if record.truthy_field("isCompactSummary").is_some() {
            let author = session.compaction_of_summary(line)?;
            let fields = message(&author, Some("compaction_summary"));
            self.new_event(index, position, blocks, EventType::Message, &author, "", fields)?;
        } else if let Some(parent) = parent.filter(|_| self.roots.get(agent).is_none_or(Option::is_none)) {
            self.roots.insert(agent.to_owned(), Some(index));
            self.new_event(index, position, blocks, EventType::Message, parent, "", message(parent, Some("prompt")))?;
        } else if text.contains(HOOK_BLOCK) {
            // Addressed to the agent whose tool call was blocked: the note may be written into
            // another agent's file (a compaction agent's, in the sample).
            let blocked = line.text_field("parentUuid").and_then(|uuid| session.by_uuid.get(uuid));
            let to = blocked.map_or(agent, |&at| session.lines[at].agent.as_str());
            let fields = vec![("to", Out::Text(to.to_owned())), ("kind", Out::Text("hook_block".to_owned()))];
            self.new_event(index, position, blocks, EventType::SafetyEvent, HARNESS, "", fields)?;
        } else if record.truthy_field("isMeta").is_some()
            || HARNESS_PREFIXES.iter().any(|prefix| text.starts_with(prefix))
            || agent != MAIN_AGENT
        {
            // Only the session's own conversation has a person in it; a sub-agent's other
            // user text (the compaction request, reminders) comes from the harness.
            self.new_event(index, position, blocks, EventType::Message, HARNESS, "", message(HARNESS, None))?;
        } else {
            self.new_event(index, position, blocks, EventType::HumanIntervention, HUMAN, "", message(HUMAN, None))?;
        }
        Ok(())
    }

    fn system(&mut self, index: usize) -> Outcome<()> {
        let line = &self.session.lines[index];
        let record = line.record;
        let subtype = line.text_field("subtype");
        let blocked =
            || record.truthy_field("preventedContinuation").is_some() || record.truthy_field("hookErrors").is_some();
        match subtype {
            Some("compact_boundary") => {
                let metadata = record.get("compactMetadata").filter(|metadata| metadata.is_object());
                let agent = self.session.compaction_agents.get(&line.uuid()).cloned().unwrap_or_default();
                let fields = vec![
                    ("kind", Out::Text("compaction".to_owned())),
                    ("trigger", Out::Raw(metadata.and_then(|metadata| metadata.get("trigger")))),
                    ("pre_tokens", Out::Raw(metadata.and_then(|metadata| metadata.get("preTokens")))),
                ];
                self.new_event(index, 0, 1, EventType::Aggregate, &agent, "", fields)?;
            }
            Some("stop_hook_summary") if !blocked() => {
                // The stop hooks ran and let the turn end as it would have: nothing was blocked.
                Report::count(&mut self.report.ignored, &["system subtype stop_hook_summary (hooks passed)"]);
            }
            Some("stop_hook_summary") => {
                let fields = vec![
                    ("kind", Out::Text("stop_hook".to_owned())),
                    ("prevented_continuation", Out::Raw(record.get("preventedContinuation"))),
                    ("hook_errors", Out::Raw(record.get("hookErrors"))),
                    ("hook_count", Out::Raw(record.get("hookCount"))),
                ];
                self.new_event(index, 0, 1, EventType::SafetyEvent, HARNESS, "", fields)?;
            }
            _ => {
                let bucket = if subtype.is_some_and(|subtype| IGNORED_SYSTEM.contains(&subtype)) {
                    &mut self.report.ignored
                } else {
                    &mut self.report.unknown
                };
                Report::count(bucket, &["system subtype ", str_opt(subtype)]);
            }
        }
        Ok(())
    }

    fn progress(&mut self, index: usize) {
        let line = &self.session.lines[index];
        let kind = line.progress_kind();
        if kind == Some("agent_progress")
            && self.session.progress_agent(line).is_some_and(|agent| self.session.missing_subagents.contains(agent))
        {
            Report::count(&mut self.report.ignored, &[MISSING_SUBAGENT_PROGRESS]);
            return;
        }
        let bucket = if kind.is_some_and(|kind| IGNORED_PROGRESS.contains(&kind)) {
            &mut self.report.ignored
        } else {
            &mut self.report.unknown
        };
        Report::count(bucket, &["progress ", str_opt(kind)]);
    }

    // ---- edges ---------------------------------------------------------------------------
    /// The last event of the nearest ancestor line that made one.
    fn event_parent(&mut self, index: usize) -> Option<usize> {
        let session = self.session;
        let parent_of = |line: &Line<'r>| {
            line.record
                .truthy_field("parentUuid")
                .or_else(|| line.record.truthy_field("logicalParentUuid"))
                .and_then(Json::as_str)
        };
        let line = &session.lines[index];
        // Ancestor chains are short: a list is the cheapest set.
        let mut seen: Vec<&str> = Vec::new();
        let mut uuid = parent_of(line);
        while let Some(current) = uuid.filter(|uuid| !seen.contains(uuid)) {
            seen.push(current);
            let Some(&parent) = session.by_uuid.get(current) else {
                self.report.warnings.push(format!(
                    "{}:{}: parentUuid {} names no line",
                    line.source.name,
                    line.number,
                    repr(current)
                ));
                return None;
            };
            if let Some(&last) = self.events[parent].last() {
                return Some(last);
            }
            uuid = parent_of(&session.lines[parent]);
        }
        None
    }

    fn edges(&mut self) -> Outcome<()> {
        let session = self.session;
        // The last event made from an agent's own lines (its return and the summary it hands
        // back are written into its parent's lines, so they are not counted as its own).
        let mut by_time: Vec<(f64, usize)> = Vec::new();
        for (index, line) in session.lines.iter().enumerate() {
            if !self.events[index].is_empty() {
                by_time.push((session.t(line)?, index));
            }
        }
        by_time.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut last_event: HashMap<&str, usize> = HashMap::default();
        for &(_, index) in &by_time {
            if let Some(&last) = self.events[index].last() {
                last_event.insert(session.lines[index].agent.as_str(), last);
            }
        }
        for index in 0..session.lines.len() {
            let line = &session.lines[index];
            let events = self.events[index].clone();
            for pair in events.windows(2) {
                let kind = if self.builder.events[pair[1]].id.ends_with("!error") {
                    EdgeType::SafetyFlow
                } else {
                    EdgeType::Causal
                };
                self.builder.edge(Some(pair[0]), Some(pair[1]), kind);
            }
            let Some(&first) = events.first() else { continue };
            if line.kind() == "user" {
                for block in line.content()? {
                    let call_id = block.tool_use_id;
                    if let Some(sub) = call_id.and_then(|id| session.spawned.get(&id)) {
                        self.builder.edge(last_event.get(sub.as_str()).copied(), Some(first), EdgeType::Return);
                    }
                    self.builder.edge(self.call_events.get(&call_id).copied(), Some(first), EdgeType::Return);
                }
            }
            if line.text_field("subtype") == Some("compact_boundary") {
                let agent = session.compaction_agents.get(&line.uuid()).map(String::as_str).unwrap_or_default();
                self.builder.edge(last_event.get(agent).copied(), Some(first), EdgeType::Aggregate);
            }
            if self.roots.get(line.agent.as_str()).copied().flatten() == Some(index) {
                self.builder.edge(self.spawn_events.get(&line.agent).copied(), Some(first), EdgeType::Spawn);
            }
            let parent = self.event_parent(index);
            self.builder.edge(parent, Some(first), EdgeType::Causal);
        }
        Ok(())
    }
}
