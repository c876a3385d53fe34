//! Hand-built traces with known answers, one per shape the metrics must get right.

use super::*;
use crate::trace::{Event, EventType, Trace};

/// Builds a trace event by event; every event carries 10 tokens unless told otherwise.
#[derive(Default)]
struct Build {
    events: Vec<Event>,
    edges: Vec<(u32, u32)>,
}

impl Build {
    fn event(&mut self, t: f64, event_type: EventType, agent: &str) -> u32 {
        let mut event = Event::new(format!("e{}", self.events.len()), t, event_type, agent);
        event.tokens = Some(10);
        self.events.push(event);
        self.events.len() as u32 - 1
    }

    /// An event addressed to `to` (a spawn's child, a return's parent, a message's reader).
    fn to(&mut self, t: f64, event_type: EventType, agent: &str, to: &str) -> u32 {
        let event = self.event(t, event_type, agent);
        self.events[event as usize].to = Some(to.into());
        event
    }

    fn edge(&mut self, src: u32, dst: u32) {
        self.edges.push((src, dst));
    }

    fn chain(&mut self, events: &[u32]) {
        for pair in events.windows(2) {
            self.edge(pair[0], pair[1]);
        }
    }

    fn trace(self) -> Trace {
        crate::trace_view::tests::trace("t", self.events, &self.edges)
    }
}

fn measure(trace: Trace) -> TraceMetrics {
    trace_metrics(&TraceBatch::from_traces(&[trace]).unwrap()).unwrap().remove(0)
}

/// An orchestrator that decides, spawns `steps.len()` workers at t = 1, and aggregates at
/// t = 10; worker k sends `steps[k] - 1` messages and returns.
fn fan_out(steps: &[u32]) -> Build {
    let mut build = Build::default();
    let decision = build.event(0.0, EventType::OrchestratorDecision, "orch");
    let mut returns = Vec::new();
    let mut spawns = Vec::new();
    for (k, _) in steps.iter().enumerate() {
        let spawn = build.to(1.0, EventType::Spawn, "orch", &format!("w{k}"));
        build.edge(decision, spawn);
        spawns.push(spawn);
    }
    for (k, &n) in steps.iter().enumerate() {
        let worker = format!("w{k}");
        let mut own: Vec<u32> = (1..n).map(|i| build.to(1.0 + i as f64, EventType::Message, &worker, "orch")).collect();
        for &message in &own {
            build.events[message as usize].content_ref = Some(format!("m{message}"));
        }
        own.push(build.to(9.0, EventType::Return, &worker, "orch"));
        build.edge(spawns[k], own[0]);
        build.chain(&own);
        returns.push(*own.last().unwrap());
    }
    let aggregate = build.event(10.0, EventType::Aggregate, "orch");
    for returned in returns {
        build.edge(returned, aggregate);
    }
    build
}

#[test]
fn serial_chain() {
    let mut build = Build::default();
    let events: Vec<u32> = (0..4).map(|i| build.event(i as f64, EventType::OrchestratorDecision, "orch")).collect();
    build.chain(&events);
    for event in &mut build.events {
        event.duration_s = Some(0.5);
    }
    let metrics = measure(build.trace());
    assert_eq!(
        metrics,
        TraceMetrics {
            n_events: 4,
            critical_path_steps: 4,
            critical_path_s: 2.0,
            total_work_steps: 4,
            parallelism_efficiency: 1.0,
            critical_steps: 4,
            finish_rate: None,
            idle_agents: 0,
            utilization: None,
            protocol_overhead: Some(0.0),
            message_redundancy: None,
            error_amplification: None,
            max_concurrent_agents: 1,
            spawn_count: 0,
            despawn_count: 0,
            spawn_depth: 0,
            spawn_branching: 0,
        }
    );
}

#[test]
fn perfect_fan_out() {
    let metrics = measure(fan_out(&[3, 3, 3]).trace());
    // decision, spawn, message, message, return, aggregate
    assert_eq!((metrics.critical_path_steps, metrics.critical_path_s), (6, 6.0));
    assert_eq!(metrics.total_work_steps, 14);
    assert_eq!(metrics.parallelism_efficiency, 14.0 / 6.0);
    // One stage: 5 orchestrator steps (decision, 3 spawns, aggregate) + 3 for the slowest worker.
    assert_eq!(metrics.critical_steps, 8);
    assert_eq!((metrics.finish_rate, metrics.utilization, metrics.idle_agents), (Some(1.0), Some(1.0), 0));
    // Protocol: 3 spawns and 6 messages of 14 events, all of 10 tokens.
    assert_eq!(metrics.protocol_overhead, Some(9.0 / 14.0));
    assert_eq!(metrics.message_redundancy, Some(0.0));
    assert_eq!(metrics.max_concurrent_agents, 4);
    assert_eq!((metrics.spawn_count, metrics.spawn_depth, metrics.spawn_branching), (3, 1, 3));
}

#[test]
fn straggler_sets_the_critical_steps() {
    let metrics = measure(fan_out(&[2, 2, 6]).trace());
    assert_eq!(metrics.critical_steps, 5 + 6);
    assert_eq!(metrics.critical_path_steps, 2 + 6 + 1);
    assert_eq!(metrics.parallelism_efficiency, 15.0 / 9.0);
}

#[test]
fn stages_add_up_and_nested_spawners_recurse() {
    let mut build = Build::default();
    build.event(0.0, EventType::OrchestratorDecision, "orch");
    build.to(1.0, EventType::Spawn, "orch", "w");
    build.to(2.0, EventType::Spawn, "w", "w.1");
    build.to(2.5, EventType::Spawn, "w", "w.2");
    for t in [3.0, 4.0, 5.0] {
        build.to(t, EventType::Message, "w.1", "w");
    }
    build.to(3.0, EventType::Return, "w.2", "w");
    build.event(6.0, EventType::Aggregate, "w");
    build.to(7.0, EventType::Return, "w", "orch");
    build.event(8.0, EventType::Aggregate, "orch");
    // A second stage of the orchestrator with no sub-agents: its decision alone.
    build.event(9.0, EventType::OrchestratorDecision, "orch");
    let metrics = measure(build.trace());
    // w: stage 1 = 3 own (spawn, spawn, aggregate) + max(3, 1); stage 2 = its return: 7.
    // orch: stage 1 = 3 own (decision, spawn, aggregate) + 7; stage 2 = 1.
    assert_eq!(metrics.critical_steps, 3 + 7 + 1);
    assert_eq!((metrics.spawn_depth, metrics.spawn_branching), (2, 2));
    // w.1 never returns: 3 of its steps are wasted among 3 + 1 + 4 sub-agent steps.
    assert_eq!(metrics.finish_rate, Some(2.0 / 3.0));
    assert_eq!(metrics.utilization, Some(5.0 / 8.0));
}

#[test]
fn unreturned_and_idle_spawns() {
    let mut build = Build::default();
    build.event(0.0, EventType::OrchestratorDecision, "orch");
    for worker in ["w1", "w2", "w3"] {
        build.to(1.0, EventType::Spawn, "orch", worker);
    }
    let first = build.to(2.0, EventType::Message, "w1", "orch");
    build.events[first as usize].content_ref = Some("same".into());
    let returned = build.event(3.0, EventType::Return, "w1");
    build.edge(first, returned);
    for (t, content) in [(2.0, "same"), (3.0, "other")] {
        let message = build.to(t, EventType::Message, "w2", "orch");
        build.events[message as usize].content_ref = Some(content.into());
    }
    build.to(20.0, EventType::Despawn, "orch", "w3");
    let aggregate = build.event(21.0, EventType::Aggregate, "orch");
    // w1's return names no parent: the edge into the orchestrator's aggregate says where it went.
    build.edge(returned, aggregate);
    let metrics = measure(build.trace());
    assert_eq!(metrics.finish_rate, Some(1.0 / 3.0));
    assert_eq!(metrics.idle_agents, 1);
    assert_eq!(metrics.utilization, Some(2.0 / 4.0));
    assert_eq!(metrics.message_redundancy, Some(1.0 - 2.0 / 3.0));
    assert_eq!((metrics.spawn_count, metrics.despawn_count), (3, 1));
    // w3 lives from its spawn (t = 1) to its despawn (t = 20), beside orch, w1 and w2.
    assert_eq!(metrics.max_concurrent_agents, 4);
}

#[test]
fn safety_event_and_untrusted_result_amplify_downstream() {
    let mut build = Build::default();
    let decision = build.event(0.0, EventType::OrchestratorDecision, "orch");
    let call = build.event(1.0, EventType::ToolCall, "orch");
    let result = build.event(2.0, EventType::ToolResult, "web.search");
    build.events[result as usize].trusted = Some(false);
    build.events[result as usize].tokens = Some(70);
    let next = build.event(3.0, EventType::OrchestratorDecision, "orch");
    let flag = build.event(2.5, EventType::SafetyEvent, "monitor");
    let last = build.event(4.0, EventType::Aggregate, "orch");
    build.chain(&[decision, call, result, next, last]);
    build.edge(result, flag);
    build.edge(flag, last);
    let trace = build.trace();
    let metrics = measure(trace.clone());
    // From the result: next, flag, last; from the flag: last. Three events over two sources.
    assert_eq!(metrics.error_amplification, Some(1.5));
    // A tool call is work on the task, not inter-agent protocol.
    assert_eq!(metrics.protocol_overhead, Some(0.0));
    // A trusted result is no source.
    let mut trusted = trace;
    trusted.events[result as usize].trusted = Some(true);
    assert_eq!(measure(trusted).error_amplification, Some(1.0));
}

#[test]
fn protocol_is_spawns_and_messages_to_another_agent() {
    let mut build = Build::default();
    build.event(0.0, EventType::OrchestratorDecision, "orch");
    // The agent's own text (no addressee, or itself) is content, as a tool call is.
    build.event(1.0, EventType::Message, "orch");
    build.to(2.0, EventType::Message, "orch", "orch");
    build.event(3.0, EventType::ToolCall, "orch");
    build.to(4.0, EventType::Spawn, "orch", "w");
    build.to(5.0, EventType::Message, "orch", "w");
    build.to(6.0, EventType::Despawn, "orch", "w");
    assert_eq!(measure(build.trace()).protocol_overhead, Some(3.0 / 7.0));
}

/// A session as converters write it: the person's prompt, the harness's note and a monitor's
/// flag come first, then the main agent decides, spawns a worker and answers; `roles` marks
/// the agents' events too.
fn session(roles: bool) -> Build {
    let mut build = Build::default();
    let role = |build: &mut Build, event: u32, role: &str| {
        if roles {
            build.events[event as usize].role = Some(role.into());
        }
    };
    let prompt = build.to(0.0, EventType::HumanIntervention, "human", "main");
    role(&mut build, prompt, "human");
    // The harness is marked whether or not the agents are: nothing else tells it apart.
    let note = build.to(0.5, EventType::Message, "harness", "main");
    build.events[note as usize].role = Some("harness".into());
    let blocked = build.event(0.7, EventType::SafetyEvent, "monitor");
    role(&mut build, blocked, "monitor");
    for t in [1.0, 2.0] {
        let own = build.event(t, EventType::OrchestratorDecision, "main");
        role(&mut build, own, "orchestrator");
    }
    let spawn = build.to(3.0, EventType::Spawn, "main", "w");
    role(&mut build, spawn, "orchestrator");
    for t in [4.0, 5.0] {
        let work = build.event(t, EventType::ToolCall, "w");
        role(&mut build, work, "sub-agent");
    }
    let returned = build.to(6.0, EventType::Return, "w", "main");
    role(&mut build, returned, "sub-agent");
    let answer = build.event(7.0, EventType::Message, "main");
    role(&mut build, answer, "orchestrator");
    build
}

#[test]
fn humans_harness_and_monitors_never_orchestrate() {
    for roles in [true, false] {
        let metrics = measure(session(roles).trace());
        // main: 2 decisions, the spawn, the answer + w's 3 steps.
        assert_eq!((metrics.critical_steps, metrics.spawn_depth), (4 + 3, 1), "roles: {roles}");
    }
    // Unmarked, the harness's message is an agent's step like any other: it orchestrates.
    let mut unmarked = session(false);
    unmarked.events[1].role = None;
    assert_eq!(measure(unmarked.trace()).critical_steps, 1);
}

#[test]
fn a_role_names_the_orchestrator_over_the_earliest_author() {
    let mut build = session(true);
    // An unspawned agent that acts first without a role does not outrank the named one.
    let early = build.event(0.1, EventType::OrchestratorDecision, "side");
    build.events[early as usize].role = Some("compaction".into());
    assert_eq!(measure(build.trace()).critical_steps, 7);
    // A spawn's role names the spawned agent (the seed example), so it is not read.
    let mut spawned_lead = Build::default();
    spawned_lead.event(0.0, EventType::OrchestratorDecision, "orch");
    let spawn = spawned_lead.to(1.0, EventType::Spawn, "w", "orch2");
    spawned_lead.events[spawn as usize].role = Some("lead".into());
    spawned_lead.event(2.0, EventType::OrchestratorDecision, "orch");
    assert_eq!(measure(spawned_lead.trace()).critical_steps, 2);
}

#[test]
fn a_trace_without_agents_has_no_orchestrator() {
    let mut build = Build::default();
    build.event(0.0, EventType::HumanIntervention, "human");
    build.event(1.0, EventType::SafetyEvent, "monitor");
    let metrics = measure(build.trace());
    assert_eq!((metrics.critical_steps, metrics.spawn_depth), (0, 0));
}

/// `trace` with its events stored in reverse and its edges in an order that is not
/// topological: the metrics must take the slow paths and find the same values.
fn stored_backwards(mut trace: Trace) -> Trace {
    let last = trace.events.len() as u32 - 1;
    trace.events.reverse();
    for edge in &mut trace.edges {
        (edge.src, edge.dst) = (last - edge.src, last - edge.dst);
    }
    trace.edges.reverse();
    trace
}

#[test]
fn stored_order_of_events_and_edges_does_not_matter() {
    let nested = {
        let mut build = fan_out(&[2, 4]);
        let worker = build.to(1.5, EventType::Spawn, "w1", "w1.sub");
        let sub = build.event(2.5, EventType::Return, "w1.sub");
        build.edge(worker, sub);
        build.edge(sub, 6);
        build.events[sub as usize].content_ref = Some("m3".into());
        build.trace()
    };
    for trace in [fan_out(&[3, 1, 5]).trace(), nested] {
        assert_eq!(measure(stored_backwards(trace.clone())), measure(trace));
    }
}

#[test]
fn same_table_at_any_thread_count() {
    let traces =
        crate::sim::generate(&crate::sim::SimConfig { n_traces: 300, depth: 2, ..Default::default() }).unwrap();
    let batch = TraceBatch::from_traces(&traces).unwrap();
    let run = |threads| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| metrics_table(&batch).unwrap())
    };
    let one = run(1);
    assert_eq!(one, run(3));
    assert_eq!(one.num_rows(), 300);
}

/// `trace` with its events and its edges each stored in a random order (edges renumbered
/// to follow their events), and its times rounded down to multiples of `tick` where `tick`
/// is positive: ties that only ids break, and edges between events of one instant whose
/// ids may order them against the edge (the metrics then need Kahn's order).
fn restored(mut trace: Trace, seed: u64, tick: f64) -> (Trace, Trace) {
    use rand::seq::SliceRandom;
    if tick > 0.0 {
        for event in &mut trace.events {
            event.t = (event.t / tick).floor() * tick;
        }
    }
    let mut rng = crate::rng::stream(seed, 0);
    let mut order: Vec<usize> = (0..trace.events.len()).collect();
    order.shuffle(&mut rng);
    let mut place = vec![0u32; order.len()];
    for (new, &old) in order.iter().enumerate() {
        place[old] = new as u32;
    }
    let mut shuffled = trace.clone();
    shuffled.events = order.iter().map(|&old| trace.events[old].clone()).collect();
    for edge in &mut shuffled.edges {
        (edge.src, edge.dst) = (place[edge.src as usize], place[edge.dst as usize]);
    }
    shuffled.edges.shuffle(&mut rng);
    (trace, shuffled)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// Every metric column is the same, bit for bit, whatever order a trace's events and
    /// edges are stored in (the time sort, the time-order check and Kahn's order agree).
    #[test]
    fn any_storage_order_gives_the_same_table(
        sim_seed in 0u64..1_000,
        seed in proptest::prelude::any::<u64>(),
        depth in 1usize..4,
        tick in proptest::prop_oneof![proptest::strategy::Just(0.0), 0.05f64..3.0],
    ) {
        let config = crate::sim::SimConfig { n_traces: 12, depth, seed: sim_seed, ..Default::default() };
        let (stored, shuffled): (Vec<Trace>, Vec<Trace>) = crate::sim::generate(&config)
            .unwrap()
            .into_iter()
            .enumerate()
            .map(|(i, trace)| restored(trace, seed ^ i as u64, tick))
            .unzip();
        let table = |traces: &[Trace]| metrics_table(&TraceBatch::from_traces(traces).unwrap()).unwrap();
        proptest::prop_assert_eq!(table(&shuffled), table(&stored));
    }
}
