//! Hand-built traces whose time order, agents, spawn tree, orchestrator and tool calls are
//! known, including events that tie in time and are stored out of (t, id) order.

use super::*;
use crate::trace::{Costs, Edge, EdgeType, Event, Trace};

fn event(id: &str, t: f64, event_type: EventType, agent: &str, to: Option<&str>) -> Event {
    let mut event = Event::new(id, t, event_type, agent);
    event.to = to.map(str::to_owned);
    event
}

/// A trace of `events` and causal `edges`, with a team reward and no costs.
pub(crate) fn trace(trace_id: &str, events: Vec<Event>, edges: &[(u32, u32)]) -> Trace {
    Trace {
        trace_id: trace_id.into(),
        task_id: "task".into(),
        group_id: None,
        system: None,
        topology: None,
        policy_version: None,
        counterfactual_of: None,
        events,
        edges: edges.iter().map(|&(src, dst)| Edge { src, dst, edge_type: EdgeType::Causal }).collect(),
        rewards: vec![("team".into(), 1.0)],
        costs: Costs { tokens: 0.0, wall_clock_s: 0.0, tool_calls: None, messages: None, other: Vec::new() },
        metrics: None,
        attributes: None,
    }
}

/// Rows out of time order, two spawns of `w` tied at t = 1 (the one with the smaller id,
/// by `orch`, is the earliest), and a tool call answered by a tool_result.
fn tied() -> Trace {
    use EventType::*;
    let events = vec![
        event("s2", 1.0, Spawn, "helper", Some("w")),        // 0
        event("s1", 1.0, Spawn, "orch", Some("w")),          // 1
        event("a", 0.0, OrchestratorDecision, "orch", None), // 2
        event("h", 0.5, Spawn, "orch", Some("helper")),      // 3
        event("c", 2.0, ToolCall, "w", None),                // 4
        event("r", 3.0, ToolResult, "search", None),         // 5
        event("z", 4.0, Return, "w", Some("orch")),          // 6
    ];
    trace("tied", events, &[(2, 3), (3, 0), (2, 1), (1, 4), (4, 5), (5, 6)])
}

#[test]
fn time_order_breaks_ties_by_id_not_by_row() {
    let batch = TraceBatch::from_traces(&[tied()]).unwrap();
    let view = BatchView::new(&batch);
    assert_eq!(view.time_order(0), vec![2, 3, 1, 0, 4, 5, 6]);
    assert!(view.earlier(1, 0).is_lt());
}

#[test]
fn earliest_spawn_by_time_then_id_names_the_parent() {
    let batch = TraceBatch::from_traces(&[tied()]).unwrap();
    let view = BatchView::new(&batch);
    let mut agents: TraceAgents = TraceAgents::new(view.n_agent_names());
    agents.read(&view, 0, &view.time_order(0));
    let local = |name: &str| {
        let number = (0..view.n_agent_names() as u32).find(|&a| view.agent_name(a) == name).unwrap();
        agents.lookup(number).unwrap()
    };
    let (orch, helper, w) = (local("orch"), local("helper"), local("w"));
    assert_eq!(agents.agents[w as usize].parent, orch);
    assert_eq!(agents.agents[w as usize].spawn_event, 1);
    assert_eq!(agents.agents[helper as usize].parent, orch);
    assert_eq!(agents.agents[orch as usize].parent, NONE);
    assert_eq!((agents.agents[orch as usize].n_children, agents.agents[helper as usize].n_children), (2, 0));
    // The tool names no agent here: a tool_result has no author.
    assert_eq!(view.n_agent_names(), 4);
    assert!((0..view.n_agent_names() as u32).all(|a| view.agent_name(a) != "search" || agents.lookup(a).is_none()));
    assert_eq!(agents.orchestrator(), Some(orch));
    agents.spawn_tree(orch);
    assert_eq!(agents.tree[0], orch);
    assert_eq!((agents.level[helper as usize], agents.level[w as usize]), (1, 1));
}

#[test]
fn a_tool_result_acts_for_the_author_of_its_call() {
    let batch = TraceBatch::from_traces(&[tied()]).unwrap();
    let view = BatchView::new(&batch);
    let calls = view.tool_calls(0);
    assert_eq!(calls[5], 4);
    assert!(calls.iter().enumerate().all(|(j, &c)| j == 5 || c == NONE));
    let acting: Vec<&str> = view.acting_agents(0).into_iter().map(|a| view.agent_name(a)).collect();
    assert_eq!(acting, ["helper", "orch", "orch", "orch", "w", "w", "w"]);
}

#[test]
fn the_graph_both_ways_and_the_ranges_of_each_trace() {
    let batch = TraceBatch::from_traces(&[tied(), tied()]).unwrap();
    let view = BatchView::new(&batch);
    assert_eq!((view.n_traces(), view.n_events()), (2, 14));
    assert_eq!((view.events_of(1), view.edges_of(1)), (7..14, 6..12));
    let (out, into) = (view.graph(1), view.graph_in(1));
    assert_eq!(out.successors(2), &[3, 1]);
    assert_eq!(into.successors(4), &[1]);
    assert_eq!(out.descendants(3), into.reversed().descendants(3));
    assert_eq!(view.event_index(1, "r"), Some(5));
    assert_eq!(view.event_index(1, "nope"), None);
}

#[test]
fn turns_count_each_agents_events_in_time_order() {
    let batch = TraceBatch::from_traces(&[tied()]).unwrap();
    let view = BatchView::new(&batch);
    // orch: a (0.0), h (0.5), s1 (1.0); w: c, z; helper: s2; search: r.
    assert_eq!(view.turns(0), vec![0, 2, 0, 1, 0, 0, 1]);
}

#[test]
fn the_orchestrator_is_never_a_human_and_a_role_outranks_time() {
    use EventType::*;
    let mut events = vec![
        event("a", 0.0, HumanIntervention, "user", None),
        event("b", 1.0, OrchestratorDecision, "early", None),
        event("c", 2.0, OrchestratorDecision, "boss", None),
    ];
    events[2].role = Some("lead".into());
    let batch = TraceBatch::from_traces(&[trace("roles", events.clone(), &[])]).unwrap();
    let view = BatchView::new(&batch);
    let mut agents: TraceAgents = TraceAgents::new(view.n_agent_names());
    agents.read(&view, 0, &view.time_order(0));
    assert_eq!(agents.orchestrator().map(|a| view.agent_name(agents.agents[a as usize].agent)), Some("boss"));
    // Without the role, the earliest event an agent could have decided; never the human's.
    events[2].role = None;
    events[0].role = Some("human".into());
    let batch = TraceBatch::from_traces(&[trace("roles", events, &[])]).unwrap();
    let view = BatchView::new(&batch);
    agents = TraceAgents::new(view.n_agent_names());
    agents.read(&view, 0, &view.time_order(0));
    assert_eq!(agents.orchestrator().map(|a| view.agent_name(agents.agents[a as usize].agent)), Some("early"));
}

/// Shuffled traces of every length around the rank sort's limit, with times that tie (only
/// ids order them), times that differ in the last bits only, and times across magnitudes:
/// the time order is the order of a plain sort by (t, id).
#[test]
fn time_order_of_shuffled_events_is_a_plain_sort_by_time_then_id() {
    use rand::RngExt;
    use rand::seq::SliceRandom;
    let mut rng = crate::rng::stream(11, 0);
    let lengths = [2, 3, 7, 8, 9, 50, 127, 128, 129, 300];
    for (k, &n) in lengths.iter().cycle().take(4 * lengths.len()).enumerate() {
        let time = |i: usize, rng: &mut rand_xoshiro::Xoshiro256PlusPlus| -> f64 {
            match k % 4 {
                0 => rng.random_range(0..4) as f64,
                1 => 1.7e9 + (rng.random_range(0..1 << 20) as f64) * 1e-6,
                2 => rng.random::<f64>() * 10f64.powi(rng.random_range(-300..300)),
                _ => i as f64 * 0.25,
            }
        };
        let mut events: Vec<Event> = (0..n)
            .map(|i| {
                event(
                    &format!("e{}", rng.random_range(0..1_000_000u32) * 1000 + i as u32),
                    time(i, &mut rng),
                    EventType::ToolCall,
                    "a",
                    None,
                )
            })
            .collect();
        events.shuffle(&mut rng);
        let batch = TraceBatch::from_traces(&[trace("t", events.clone(), &[])]).unwrap();
        let view = BatchView::new(&batch);
        let mut expected: Vec<u32> = (0..n as u32).collect();
        expected.sort_by(|&a, &b| {
            let (a, b) = (&events[a as usize], &events[b as usize]);
            a.t.total_cmp(&b.t).then_with(|| a.id.cmp(&b.id))
        });
        assert_eq!(view.time_order(0), expected, "{n} events, times of kind {}", k % 4);
    }
}
