use arrow_array::Array;
use arrow_array::cast::AsArray;
use serde_json::json;

use super::*;
use crate::sim::SimConfig;
use crate::sim::branches::{BranchConfig, generate_with_branches};
use crate::validate::{ValidateOptions, trace_from_json};

fn trace(id: &str, reward: f64, events: &[&str], of: Option<(&str, &str, &str)>) -> crate::Trace {
    let events: Vec<_> = events
        .iter()
        .enumerate()
        .map(|(k, e)| json!({"id": e, "t": k as f64, "type": "message", "agent": "a"}))
        .collect();
    let mut value = json!({"trace_id": id, "task_id": "task", "events": events, "edges": [], "rewards": {"team": reward},
                           "costs": {"tokens": 0, "wall_clock_s": 0}});
    if let Some((trace_id, event_id, kind)) = of {
        value["counterfactual_of"] = json!({"trace_id": trace_id, "event_id": event_id, "kind": kind});
    }
    trace_from_json(&value, ValidateOptions::default()).unwrap()
}

fn batch(traces: &[crate::Trace]) -> TraceBatch {
    TraceBatch::from_traces(traces).unwrap()
}

/// Credit spread over every event of the batch, as the Python tables show it.
struct Aligned {
    credit: Vec<f64>,
    stderr: Vec<f64>,
    n_branches: Vec<u32>,
}

fn aligned(credit: Credit, batch: &TraceBatch) -> Aligned {
    let n_events = TraceColumns::new(batch.record_batch()).events.values().len();
    let mut out =
        Aligned { credit: vec![f64::NAN; n_events], stderr: vec![f64::NAN; n_events], n_branches: vec![0; n_events] };
    for (k, &event) in credit.event.iter().enumerate() {
        out.credit[event as usize] = credit.credit[k];
        out.stderr[event as usize] = credit.stderr[k];
        out.n_branches[event as usize] = credit.n_branches[k];
    }
    out
}

#[test]
fn branch_credit_by_hand() {
    let traces = [
        trace("f", 1.0, &["e0", "e1", "e2"], None),
        trace("b1", 0.2, &["e0", "e1", "e2"], Some(("f", "e1", "substitute"))),
        trace("b2", 0.4, &["e0", "e2"], Some(("f", "e1", "ablate"))),
    ];
    let batch = batch(&traces);
    let mean = aligned(branch_credit(&batch, "team", Baseline::Mean).unwrap(), &batch);
    assert!(mean.credit[0].is_nan() && mean.n_branches[0] == 0);
    assert!((mean.credit[1] - 0.7).abs() < 1e-12);
    // s^2 = var(0.2, 0.4) = 0.02, one degree of freedom: scaled by t(1) / 1.96.
    let t1_over_z = 12.706205 / crate::student_t::Z975;
    assert!((mean.stderr[1] - (0.02f64 * 1.5).sqrt() * t1_over_z).abs() < 1e-12);
    assert_eq!(mean.n_branches[1], 2);
    assert_eq!(mean.n_branches.iter().sum::<u32>(), 2, "only the factual event is credited");

    let loo = aligned(branch_credit(&batch, "team", Baseline::LeaveOneOut).unwrap(), &batch);
    assert_eq!(loo.credit[1], mean.credit[1]);
    // b1's own e1 (events 3..6 are b1's): 0.2 - mean(0.4, 1.0); b2 ablated e1, so nothing there.
    assert!((loo.credit[4] - (0.2 - 0.7)).abs() < 1e-12);
    assert_eq!(loo.n_branches[6..].iter().sum::<u32>(), 0);
}

#[test]
fn a_branch_naming_a_missing_event_is_an_error_naming_the_branch() {
    let traces = [trace("f", 1.0, &["e0"], None), trace("b", 0.0, &["e0"], Some(("f", "e9", "ablate")))];
    let error = branch_credit(&batch(&traces), "team", Baseline::Mean).unwrap_err().to_string();
    assert!(
        error.contains("\"b\"") && error.contains("/counterfactual_of/event_id") && error.contains("e9"),
        "{error}"
    );
    let traces = [trace("f", 1.0, &["e0"], None), trace("b", 0.0, &["e0"], Some(("f", "e0", "ablate")))];
    let error = branch_credit(&batch(&traces), "tool", Baseline::Mean).unwrap_err().to_string();
    assert!(error.contains("/rewards/tool"), "{error}");
}

/// The errors of a scattered layout (each factual trace after its branches), for a family
/// credited from its tallies (one branched event) and one whose branches are gathered (two
/// events): the same errors, naming the same trace, as the adjacent layout reports.
#[test]
fn scattered_families_report_the_errors_of_the_adjacent_layout() {
    let mut no_reward = trace("b-none", 0.0, &["e0", "e1"], Some(("f", "e1", "ablate")));
    no_reward.rewards.clear();
    let missing_long = "an-event-id-longer-than-the-forty-bytes-a-tally-holds";
    let cases: [(&str, Vec<crate::Trace>, &[&str]); 6] = [
        (
            "one event, missing in the factual trace",
            vec![
                trace("b1", 0.0, &["e0"], Some(("f", "e0", "ablate"))),
                trace("b2", 0.0, &["e0"], Some(("f", "e0", "ablate"))),
            ],
            &["\"b1\"", "/counterfactual_of/event_id", "has no event \"e0\""],
        ),
        (
            "one event of a UUID's length, missing in the factual trace",
            vec![
                trace("b1", 0.0, &["e0"], Some(("f", "0b5e4a52-7f3c-4c1e-9a51-2d6f8e3b1c07", "ablate"))),
                trace("b2", 0.0, &["e0"], Some(("f", "0b5e4a52-7f3c-4c1e-9a51-2d6f8e3b1c07", "ablate"))),
            ],
            &["\"b1\"", "/counterfactual_of/event_id", "has no event \"0b5e4a52-"],
        ),
        (
            "one event longer than a tally holds, missing in the factual trace",
            vec![
                trace("b1", 0.0, &["e0"], Some(("f", missing_long, "ablate"))),
                trace("b2", 0.0, &["e0"], Some(("f", missing_long, "ablate"))),
            ],
            &["\"b1\"", "/counterfactual_of/event_id", missing_long],
        ),
        (
            "two events, one missing in the factual trace",
            vec![
                trace("b1", 0.0, &["e1"], Some(("f", "e1", "ablate"))),
                trace("b2", 0.0, &["e1"], Some(("f", "e7", "ablate"))),
            ],
            &["\"b2\"", "/counterfactual_of/event_id", "e7"],
        ),
        (
            "one event, a branch without the reward",
            vec![trace("b1", 0.5, &["e1"], Some(("f", "e1", "ablate"))), no_reward.clone()],
            &["\"b-none\"", "/rewards/team"],
        ),
        (
            "two events, a branch without the reward",
            vec![trace("b1", 0.5, &["e2"], Some(("f", "e2", "ablate"))), no_reward],
            &["\"b-none\"", "/rewards/team"],
        ),
    ];
    for (case, branches, expected) in cases {
        let factual = trace("f", 1.0, &["e1", "e2"], None);
        let adjacent = batch(&[vec![factual.clone()], branches.clone()].concat());
        let scattered = batch(&[branches, vec![factual]].concat());
        for layout in [&adjacent, &scattered] {
            let error = branch_credit(layout, "team", Baseline::Mean).unwrap_err().to_string();
            assert!(expected.iter().all(|part| error.contains(part)), "{case}: {error}");
        }
    }
}

/// A factual trace held twice (a draw with replacement) is one trace: both copies get the
/// credit measured against every branch of its id, in any layout, by tallies and by gathered
/// branches alike; copies that differ in reward or lack the event are errors naming the trace.
#[test]
fn every_copy_of_a_repeated_factual_trace_gets_the_credit_of_all_its_branches() {
    let traces = [
        trace("b1", 0.5, &["e0"], Some(("f", "e0", "ablate"))),
        trace("f", 3.0, &["e0", "e1"], None),
        trace("b2", 1.5, &["e0", "e1"], Some(("f", "e0", "ablate"))),
        trace("f", 3.0, &["e0", "e1"], None),
        trace("b3", 2.0, &["e1"], Some(("f", "e1", "substitute"))),
    ];
    // f's events are 1..3 and 5..7.
    let credit = branch_credit(&batch(&traces[..4]), "team", Baseline::Mean).unwrap();
    assert_eq!((credit.event, credit.trace, credit.credit), (vec![1, 5], vec![1, 3], vec![2.0, 2.0]));
    let credit = branch_credit(&batch(&traces), "team", Baseline::Mean).unwrap();
    assert_eq!(
        (&credit.event, &credit.trace, &credit.credit),
        (&vec![1, 2, 5, 6], &vec![1, 1, 3, 3], &vec![2.0, 1.0, 2.0, 1.0])
    );
    assert_eq!(credit.n_branches, vec![2, 1, 2, 1]);
    // The same traces with each copy followed by a branch (the adjacent layout's shape).
    let adjacent = [&traces[1], &traces[0], &traces[3], &traces[2]].map(Clone::clone);
    let credit = branch_credit(&batch(&adjacent), "team", Baseline::Mean).unwrap();
    assert_eq!((credit.event, credit.credit, credit.n_branches), (vec![0, 3], vec![2.0, 2.0], vec![2, 2]));

    let mut differ = traces.clone();
    differ[3] = trace("f", 4.0, &["e0", "e1"], None);
    let error = branch_credit(&batch(&differ), "team", Baseline::Mean).unwrap_err().to_string();
    assert!(
        error.contains("\"f\"") && error.contains("/rewards/team") && error.contains("different rewards"),
        "{error}"
    );
    differ[3] = trace("f", 3.0, &["e0"], None);
    let error = branch_credit(&batch(&differ), "team", Baseline::Mean).unwrap_err().to_string();
    assert!(error.contains("\"f\"") && error.contains("/events") && error.contains("\"e1\""), "{error}");
    // The adjacent layout (each copy followed by a branch) reports the same error.
    let adjacent = [&traces[1], &traces[0], &differ[3], &traces[4]].map(Clone::clone);
    let adjacent_error = branch_credit(&batch(&adjacent), "team", Baseline::Mean).unwrap_err().to_string();
    assert!(adjacent_error.contains("\"f\"") && adjacent_error.contains("/events"), "{adjacent_error}");
}

#[test]
fn branch_credit_covers_the_true_effects() {
    let config = BranchConfig {
        base: SimConfig { n_traces: 300, seed: 9, ..SimConfig::default() },
        branches: 8,
        branch_points: 3,
        noise: 0.2,
    };
    let truth = generate_with_branches(&config).unwrap();
    let batch = batch(&truth.traces);
    let credit = aligned(branch_credit(&batch, "team", Baseline::Mean).unwrap(), &batch);
    let columns = TraceColumns::new(batch.record_batch());
    let ids = columns.event_columns().id;
    let offsets = columns.events.value_offsets();
    let row_of: std::collections::HashMap<&str, usize> =
        (0..batch.len()).map(|row| (columns.trace_id.value(row), row)).collect();
    let mut covered = 0;
    for effect in &truth.effects {
        let row = row_of[effect.trace_id.as_str()];
        let k = (offsets[row] as usize..offsets[row + 1] as usize).find(|&k| ids.value(k) == effect.event_id).unwrap();
        assert_eq!(credit.n_branches[k], 8);
        if (credit.credit[k] - effect.effect).abs() <= 3.0 * credit.stderr[k] {
            covered += 1;
        }
    }
    let share = covered as f64 / truth.effects.len() as f64;
    assert!(share >= 0.95, "{covered} of {} effects within 3 standard errors", truth.effects.len());
    let credited = credit.n_branches.iter().filter(|&&n| n > 0).count();
    assert_eq!(credited, truth.effects.len(), "credit only where branches exist");
}

#[test]
fn same_prefix_credits_where_siblings_diverge() {
    // Group "task": two traces go e0 -> x, two go e0 -> y; rewards 1, 3 (x) and 0, 0 (y).
    let mut traces = vec![
        trace("t1", 1.0, &["e0", "x"], None),
        trace("t2", 3.0, &["e0", "x"], None),
        trace("t3", 0.0, &["e0", "y"], None),
        trace("t4", 0.0, &["e0", "y"], None),
    ];
    for (t, content) in traces.iter_mut().zip(["x", "x", "y", "y"]) {
        t.events[1].content_ref = Some(content.into());
    }
    let batch = batch(&traces);
    let credit = aligned(same_prefix_credit(&batch, "team", &Signature::default(), true).unwrap(), &batch);
    // V = 1; Q(x) = 2, Q(y) = 0. Events are 2 per trace: e0 shared (no credit), then the fork.
    assert_eq!([credit.credit[1], credit.credit[3], credit.credit[5], credit.credit[7]], [1.0, 1.0, -1.0, -1.0]);
    assert!(credit.credit[0].is_nan() && credit.n_branches[0] == 0);
    assert_eq!(credit.n_branches[1], 3);
    // Noise pooled within the alternatives: (var(1, 3) + var(0, 0)) / 2 = 1 with 4 - 2 degrees
    // of freedom; stderr = sqrt(1 * (1/2 - 1/4)), scaled by t(2) / 1.96.
    let t2_over_z = 4.302653 / crate::student_t::Z975;
    assert!((credit.stderr[1] - 0.25f64.sqrt() * t2_over_z).abs() < 1e-12);
    assert_eq!(credit.stderr[1], credit.stderr[5], "one noise for every alternative of a node");
    assert!(Signature::new(vec!["colour".into()]).is_err());
}

/// Credit keyed by (trace id, event id), so batches holding the same traces in another
/// order can be compared.
fn keyed(credit: &Credit, batch: &TraceBatch) -> std::collections::BTreeMap<(String, String), (f64, f64, u32)> {
    let columns = TraceColumns::new(batch.record_batch());
    let ids = columns.event_columns().id;
    (0..credit.event.len())
        .map(|k| {
            let trace_id = columns.trace_id.value(credit.trace[k] as usize).to_owned();
            let event_id = ids.value(credit.event[k] as usize).to_owned();
            ((trace_id, event_id), (credit.credit[k], credit.stderr[k], credit.n_branches[k]))
        })
        .collect()
}

#[test]
fn branch_credit_does_not_depend_on_where_branches_are_stored() {
    // Big enough that families straddle the parallel tasks' nominal boundaries.
    let config = BranchConfig {
        base: SimConfig { n_traces: 3000, seed: 4, ..SimConfig::default() },
        branches: 5,
        branch_points: 3,
        noise: 0.2,
    };
    let truth = generate_with_branches(&config).unwrap();
    let stored = batch(&truth.traces);
    let n = stored.len();
    let reversed = stored.take(&(0..n).rev().collect::<Vec<_>>()).unwrap();
    let rotated = stored.take(&(0..n).map(|row| (row + n / 2 + 3) % n).collect::<Vec<_>>()).unwrap();
    for baseline in [Baseline::Mean, Baseline::LeaveOneOut] {
        let expected = keyed(&branch_credit(&stored, "team", baseline).unwrap(), &stored);
        assert!(expected.len() > 8000, "about 3 branched events per factual trace");
        for other in [&reversed, &rotated] {
            let found = keyed(&branch_credit(other, "team", baseline).unwrap(), other);
            assert!(found.keys().eq(expected.keys()), "the same events are credited");
            // Reordered branches are summed in another order: equal up to rounding.
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 || (a.is_nan() && b.is_nan());
            let differing = expected
                .iter()
                .filter(|&(key, &(c, s, n))| !(close(c, found[key].0) && close(s, found[key].1) && n == found[key].2))
                .count();
            assert_eq!(differing, 0, "{differing} of {} credited events differ", expected.len());
        }
    }
}

#[test]
fn only_traces_that_take_part_need_the_reward() {
    let mut lone = trace("lone", 0.0, &["e0"], None);
    lone.rewards.clear();
    let traces = [
        trace("f", 1.0, &["e0"], None),
        trace("b", 0.0, &["e0"], Some(("f", "e0", "substitute"))),
        lone,
        trace("orphan", 0.5, &["e0"], Some(("missing", "e0", "ablate"))),
    ];
    let credit = branch_credit(&batch(&traces), "team", Baseline::Mean).unwrap();
    assert_eq!(
        (credit.event.as_slice(), credit.trace.as_slice(), credit.credit.as_slice()),
        (&[0u64][..], &[0u32][..], &[1.0][..])
    );
}

/// `order` with the branches of each factual trace put back in their original relative order,
/// in the positions `order` gave them: families are scattered and each factual trace may come
/// before or after its branches, but every event's branch rewards are summed in the same order,
/// so credit must not change by a single bit.
fn family_stable(batch: &TraceBatch, mut order: Vec<usize>) -> Vec<usize> {
    let columns = TraceColumns::new(batch.record_batch());
    let of = columns.counterfactual_of;
    let of_trace = of.column_by_name("trace_id").unwrap().as_string::<i32>();
    let mut families: std::collections::BTreeMap<&str, Vec<usize>> = Default::default();
    for (position, &row) in order.iter().enumerate() {
        if of.is_valid(row) {
            families.entry(of_trace.value(row)).or_default().push(position);
        }
    }
    for positions in families.values() {
        let mut rows: Vec<usize> = positions.iter().map(|&p| order[p]).collect();
        rows.sort_unstable();
        for (&position, row) in positions.iter().zip(rows) {
            order[position] = row;
        }
    }
    order
}

/// Credit keyed by (trace id, event id), compared bit for bit (NaN equal to NaN).
fn assert_same_bits(found: &Credit, found_batch: &TraceBatch, expected: &Credit, expected_batch: &TraceBatch) {
    let bits = |credit: &Credit, batch: &TraceBatch| {
        keyed(credit, batch)
            .into_iter()
            .map(|(key, (c, s, n))| (key, (c.to_bits(), s.to_bits(), n)))
            .collect::<Vec<_>>()
    };
    assert_eq!(bits(found, found_batch), bits(expected, expected_batch));
}

#[test]
fn scattered_and_two_pass_layouts_give_the_adjacent_layouts_credit_bit_for_bit() {
    // Over 2048 factual traces: the paired path's bins by factual rank hold more than one.
    let config = BranchConfig {
        base: SimConfig { n_traces: 2500, seed: 5, ..SimConfig::default() },
        branches: 4,
        branch_points: 2,
        noise: 0.2,
    };
    let truth = generate_with_branches(&config).unwrap();
    let adjacent = batch(&truth.traces);
    let n = adjacent.len();
    let scrambled: Vec<usize> = {
        let mut rows: Vec<usize> = (0..n).collect();
        rows.sort_by_key(|&row| (row as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(23));
        rows
    };
    let shuffled = adjacent.take(&family_stable(&adjacent, scrambled)).unwrap();
    let columns = TraceColumns::new(adjacent.record_batch());
    let (factual, branches): (Vec<usize>, Vec<usize>) = (0..n).partition(|&row| columns.counterfactual_of.is_null(row));
    let two_pass = adjacent.take(&[factual, branches].concat()).unwrap();
    for baseline in [Baseline::Mean, Baseline::LeaveOneOut] {
        let expected = branch_credit(&adjacent, "team", baseline).unwrap();
        assert!(expected.event.len() > 4000, "most factual traces have 2 branched events");
        for layout in [&shuffled, &two_pass] {
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                let found = pool.install(|| branch_credit(layout, "team", baseline)).unwrap();
                assert_same_bits(&found, layout, &expected, &adjacent);
            }
        }
    }
}

/// One family for the property test: (events of the factual trace, branches as
/// (index of the branched event, reward)), and whether the factual trace is left out of the
/// batch (its branches are then orphans, never credited).
type Family = (usize, Vec<(usize, f64)>, bool);

/// Event ids of up to eight bytes, longer ones that share their first eight bytes, and ones
/// longer than a wide tally holds (40 bytes) that share their first 47, so that every way of
/// telling ids apart is exercised (the head word; the tally's copy; the task's texts).
fn event_name(k: usize) -> String {
    match k % 3 {
        0 => format!("e{k}"),
        1 => format!("event-id-{k}"),
        _ => format!("event-id-with-a-prefix-longer-than-forty-bytes-{k}"),
    }
}

fn families_batch(families: &[Family]) -> (Vec<crate::Trace>, TraceBatch) {
    let mut traces = Vec::new();
    for (f, (n_events, branches, orphaned)) in families.iter().enumerate() {
        let names: Vec<String> = (0..*n_events).map(event_name).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let factual = format!("factual-{f}");
        if !orphaned {
            traces.push(trace(&factual, f as f64 * 0.25 - 1.0, &names, None));
        }
        for (b, &(event, reward)) in branches.iter().enumerate() {
            let of = Some((factual.as_str(), names[event % names.len()], "substitute"));
            traces.push(trace(&format!("branch-{f}-{b}"), reward, &names, of));
        }
    }
    let batch = batch(&traces);
    (traces, batch)
}

/// Families whose branches branch at two event ids that differ only past their first eight
/// bytes (one family), or only past the 40 a wide tally holds (another), stored apart from
/// their factual traces: each event is credited on its own, as in the adjacent layout.
#[test]
fn ids_alike_in_their_first_bytes_are_told_apart_when_scattered() {
    let long = vec![(2, 0.5), (5, 1.0), (2, 0.7), (5, 0.1)];
    let inline = vec![(1, 0.2), (4, 0.9), (1, 0.3), (4, 0.4)];
    let (traces, adjacent) =
        families_batch(&[(6, long, false), (6, inline, false), (3, vec![(1, 0.6), (1, -0.2)], false)]);
    // The factual traces last, so that no branch follows its factual trace.
    let factual = |row: &usize| traces[*row].counterfactual_of.is_none();
    let order: Vec<usize> =
        (0..traces.len()).filter(|row| !factual(row)).chain((0..traces.len()).filter(factual)).collect();
    let moved = adjacent.take(&order).unwrap();
    let expected = branch_credit(&adjacent, "team", Baseline::Mean).unwrap();
    assert_eq!(expected.n_branches, [2; 5]);
    assert_same_bits(&branch_credit(&moved, "team", Baseline::Mean).unwrap(), &moved, &expected, &adjacent);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    #[test]
    fn any_layout_gives_the_adjacent_credit(
        families in proptest::collection::vec(
            (1usize..7, proptest::collection::vec((0usize..7, -3.0f64..3.0), 0..6), proptest::bool::weighted(0.1)),
            1..12,
        ),
        seed in proptest::prelude::any::<u64>(),
        two_pass in proptest::prelude::any::<bool>(),
    ) {
        let (traces, adjacent) = families_batch(&families);
        let n = traces.len();
        let order: Vec<usize> = if two_pass {
            let (factual, branches): (Vec<usize>, Vec<usize>) =
                (0..n).partition(|&row| traces[row].counterfactual_of.is_none());
            [factual, branches].concat()
        } else {
            let mut rows: Vec<usize> = (0..n).collect();
            rows.sort_by_key(|&row| (row as u64 ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29));
            family_stable(&adjacent, rows)
        };
        let moved = adjacent.take(&order).unwrap();
        for baseline in [Baseline::Mean, Baseline::LeaveOneOut] {
            let expected = branch_credit(&adjacent, "team", baseline).unwrap();
            let found = branch_credit(&moved, "team", baseline).unwrap();
            assert_same_bits(&found, &moved, &expected, &adjacent);
        }
    }
}

/// With its length, a text of up to eight bytes is told apart by its head word alone: every
/// text of up to four bytes over an alphabet with a zero byte, and texts of five to eight
/// bytes that differ in one byte only, each byte in turn.
#[test]
fn head_word_tells_short_texts_apart() {
    let alphabet = [0u8, b'a', b'b', 0xff];
    let mut texts: Vec<Vec<u8>> = vec![Vec::new()];
    for len in 1..=4 {
        texts.extend(
            (0..alphabet.len().pow(len))
                .map(|code| (0..len).map(|k| alphabet[code / alphabet.len().pow(k) % alphabet.len()]).collect()),
        );
    }
    for len in 5..=8 {
        let base: Vec<u8> = (0..len as u8).map(|k| b'0' + k).collect();
        texts.push(base.clone());
        texts.extend((0..len).map(|k| {
            let mut text = base.clone();
            text[k] = b'x';
            text
        }));
    }
    let mut seen = std::collections::HashMap::new();
    for text in &texts {
        let other = seen.insert((text.len(), head_word(text)), text);
        assert!(other.is_none(), "{other:?} and {text:?} share a head word");
    }
}
