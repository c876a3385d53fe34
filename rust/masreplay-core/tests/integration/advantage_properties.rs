//! Properties of the advantage kernel and the batch path: normalised cells have mean 0 and
//! unit std, results ignore row order, constant shifts and the layout of groups, the trainer
//! modes keep their edge cases, sorted labels read in place agree with any other order (and
//! an infinite reward is an error on every path), stratified advantages follow a trace's events when the events
//! are permuted, and single-agent linear traces give plain GRPO under every stratum.

use masreplay_core::TraceBatch;
use masreplay_core::advantage::{
    BatchOptions, Compat, Estimator, ReturnKind, Rows, Scale, Spec, Stratum, Unit, batch_advantages, dense_codes,
    graph_returns, normalize, normalize_labels, trace_channel,
};
use masreplay_core::sim::{SimConfig, generate};
use masreplay_core::trace::{Edge, Trace};
use masreplay_core::validate::{ValidateOptions, trace_from_json};
use proptest::prelude::*;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_xoshiro::Xoshiro256PlusPlus;

fn native(estimator: Estimator, scale: Scale, eps: f64) -> Spec {
    Spec::new(estimator, scale, Some(eps), Compat::Native).unwrap()
}

fn rows<'a>(values: &'a [f64], groups: &'a [u32], strata: Option<&'a [u32]>) -> Rows<'a> {
    Rows {
        values,
        groups,
        n_groups: groups.iter().max().map_or(0, |&g| g as usize + 1),
        strata: strata.map(|s| (s, s.iter().max().map_or(0, |&m| m as usize + 1))),
        lengths: None,
        tokens: None,
    }
}

fn data() -> impl Strategy<Value = (Vec<f64>, Vec<u32>, Vec<u32>)> {
    (1usize..80).prop_flat_map(|n| {
        (
            proptest::collection::vec((-1000i32..1000).prop_map(|x| x as f64 / 8.0), n),
            proptest::collection::vec(0u32..5, n),
            proptest::collection::vec(0u32..3, n),
        )
    })
}

fn close(a: &[f64], b: &[f64], tolerance: f64) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tolerance * (1.0 + x.abs().max(y.abs())))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn cells_have_mean_zero_and_unit_std((values, groups, strata) in data()) {
        let out: Vec<f64> = normalize(&rows(&values, &groups, Some(&strata)), &native(Estimator::Grpo, Scale::Group, 0.0)).unwrap();
        for g in 0..5 {
            for s in 0..3 {
                let cell: Vec<usize> = (0..values.len()).filter(|&i| groups[i] == g && strata[i] == s).collect();
                let distinct = cell.iter().any(|&i| values[i] != values[cell[0]]);
                if cell.len() < 2 || !distinct {
                    prop_assert!(cell.iter().all(|&i| out[i] == 0.0));
                    continue;
                }
                let n = cell.len() as f64;
                let mean = cell.iter().map(|&i| out[i]).sum::<f64>() / n;
                let var = cell.iter().map(|&i| (out[i] - mean).powi(2)).sum::<f64>() / (n - 1.0);
                prop_assert!(mean.abs() < 1e-9, "mean {mean}");
                prop_assert!((var - 1.0).abs() < 1e-9, "var {var}");
            }
        }
    }

    #[test]
    fn order_shift_and_layout_do_not_matter((values, groups, strata) in data(), seed in any::<u64>(), shift in -50i32..50) {
        let mut order: Vec<usize> = (0..values.len()).collect();
        order.shuffle(&mut Xoshiro256PlusPlus::seed_from_u64(seed));
        let pick = |v: &[u32]| order.iter().map(|&i| v[i]).collect::<Vec<u32>>();
        let permuted_values: Vec<f64> = order.iter().map(|&i| values[i]).collect();
        let shifted: Vec<f64> = values.iter().map(|x| x + shift as f64).collect();
        for estimator in [Estimator::Grpo, Estimator::Rloo, Estimator::Opo] {
            let spec = native(estimator, Scale::Group, 1e-6);
            let base: Vec<f64> = normalize(&rows(&values, &groups, Some(&strata)), &spec).unwrap();
            let permuted: Vec<f64> = normalize(&rows(&permuted_values, &pick(&groups), Some(&pick(&strata))), &spec).unwrap();
            let expected: Vec<f64> = order.iter().map(|&i| base[i]).collect();
            prop_assert!(close(&permuted, &expected, 1e-9));
            let moved: Vec<f64> = normalize(&rows(&shifted, &groups, Some(&strata)), &spec).unwrap();
            prop_assert!(close(&moved, &base, 1e-6));
        }
    }

    #[test]
    fn sorted_labels_read_in_place_agree_with_any_order(
        sizes in proptest::collection::vec(prop_oneof![1usize..12, Just(70usize)], 1..20),
        seed in any::<u64>(),
        agents in 1i64..70,
        holes in proptest::collection::vec(any::<bool>(), 4),
    ) {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        let groups: Vec<i64> = sizes.iter().enumerate().flat_map(|(g, &n)| std::iter::repeat_n(3 * g as i64 - 7, n)).collect();
        let n = groups.len();
        let strata: Vec<i64> = (0..n).map(|_| rand::RngExt::random_range(&mut rng, 0..agents)).collect();
        let mut values: Vec<f64> = (0..n).map(|_| rand::RngExt::random_range(&mut rng, -1000i32..1000) as f64 / 8.0).collect();
        if holes[0] {
            values[n / 2] = f64::NAN;
        }
        let mut order: Vec<usize> = (0..n).collect();
        order.shuffle(&mut rng);
        let pick = |v: &[i64]| order.iter().map(|&i| v[i]).collect::<Vec<i64>>();
        let shuffled: Vec<f64> = order.iter().map(|&i| values[i]).collect();
        for estimator in [Estimator::Grpo, Estimator::Rloo] {
            let spec = native(estimator, Scale::Group, 1e-6);
            for strata in [None, Some(strata.as_slice())] {
                let sorted: Vec<f64> = normalize_labels(&values, &groups, strata, None, None, &spec).unwrap();
                let any: Vec<f64> = normalize_labels(&shuffled, &pick(&groups), strata.map(pick).as_deref(), None, None, &spec).unwrap();
                let expected: Vec<f64> = order.iter().map(|&i| sorted[i]).collect();
                prop_assert!(close(&any, &expected, 1e-9), "{estimator:?} {:?}", strata.is_some());
                let mut infinite = values.clone();
                infinite[n - 1 - n / 3] = if holes[1] { f64::INFINITY } else { f64::NEG_INFINITY };
                prop_assert!(normalize_labels::<f32>(&infinite, &groups, strata, None, None, &spec).is_err());
            }
        }
    }

    #[test]
    fn dense_codes_keep_equality(keys in proptest::collection::vec(prop_oneof![0i64..10, any::<i64>()], 0..60)) {
        let (codes, n) = dense_codes(&keys);
        for i in 0..keys.len() {
            prop_assert!((codes[i] as usize) < n);
            for j in 0..keys.len() {
                prop_assert_eq!(keys[i] == keys[j], codes[i] == codes[j]);
            }
        }
    }

    #[test]
    fn compat_modes_keep_their_group_of_one_rules(x in -100i32..100, y in -100i32..100) {
        let values = [x as f64, y as f64, 3.0];
        let groups = [0u32, 0, 1];
        let run = |compat, estimator| -> Vec<f64> {
            let spec = Spec::new(estimator, Scale::Group, None, compat).unwrap();
            normalize::<f32>(&rows(&values, &groups, None), &spec).unwrap().into_iter().map(f64::from).collect()
        };
        prop_assert_eq!(run(Compat::Verl, Estimator::Grpo)[2], (3.0f32 / (1.0f32 + 1e-6f32)) as f64);
        prop_assert_eq!(run(Compat::Verl, Estimator::Rloo)[2], 3.0);
        prop_assert_eq!(run(Compat::Trl, Estimator::Grpo)[2], 0.0);
        prop_assert!(run(Compat::OpenRlhf, Estimator::Grpo)[2].is_nan());
        prop_assert_eq!(run(Compat::Native, Estimator::Grpo)[2], 0.0);
        if x == y {
            for compat in [Compat::Native, Compat::Verl, Compat::Trl, Compat::OpenRlhf] {
                prop_assert_eq!(&run(compat, Estimator::Grpo)[..2], &[0.0, 0.0]);
            }
        }
    }
}

/// Groups scattered over many rows take the in-place tables (several chunks here); a trivial
/// stratum sends the same rows through the gathered path. Both agree, and the tables give
/// the same bits at any thread count.
#[test]
fn scattered_groups_agree_with_gathered_at_any_thread_count() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(11);
    let n = 200_000;
    let groups: Vec<u32> = (0..n).map(|_| rand::RngExt::random_range(&mut rng, 0u32..5000)).collect();
    let mut values: Vec<f64> = (0..n).map(|_| rand::RngExt::random_range(&mut rng, -1e3..1e3)).collect();
    values[17] = f64::NAN;
    let one_stratum = vec![0u32; n];
    let specs = [
        (Estimator::Grpo, Scale::Group),
        (Estimator::Grpo, Scale::Batch),
        (Estimator::Grpo, Scale::None),
        (Estimator::Rloo, Scale::Group),
    ];
    for (estimator, scale) in specs {
        {
            let spec = native(estimator, scale, 1e-6);
            let in_place: Vec<f64> = normalize(&rows(&values, &groups, None), &spec).unwrap();
            let gathered: Vec<f64> = normalize(&rows(&values, &groups, Some(&one_stratum)), &spec).unwrap();
            assert!(close(&in_place, &gathered, 1e-12), "{estimator:?} {scale:?}");
            assert_eq!(in_place[17], 0.0);
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                let again: Vec<f64> = pool.install(|| normalize(&rows(&values, &groups, None), &spec).unwrap());
                assert!(again.iter().zip(&in_place).all(|(a, b)| a.to_bits() == b.to_bits()), "{threads} threads");
            }
        }
    }
}

/// `n_groups` groups of 1 to `max_size` rows (keys `g * 7 - 100`), group g's values drawn
/// around `cells[g % 4]` = (offset, spread), rows shuffled: groups interleaved at random.
fn shuffled_groups(seed: u64, n_groups: i64, max_size: usize, cells: &[(f64, f64); 4]) -> (Vec<i64>, Vec<f64>) {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut rows: Vec<(i64, f64)> = Vec::new();
    for g in 0..n_groups {
        let size = rand::RngExt::random_range(&mut rng, 1..=max_size);
        let (offset, spread) = cells[g as usize % 4];
        for _ in 0..size {
            rows.push((g * 7 - 100, offset + spread * rand::RngExt::random_range(&mut rng, -1.0..1.0)));
        }
    }
    rows.shuffle(&mut rng);
    rows.into_iter().unzip()
}

/// Integer keys over a narrow range (read as `key - min`) and wide 62-bit keys (hashed), both
/// scattered at random over 10^5 rows with groups of 1-64 rows, values far from zero and some
/// groups constant or nearly so: the in-place tables agree with the gathered path (a trivial
/// stratum) to 1e-12 plus the rounding of the inputs relative to the group's spread, give 0 to constant groups, NaN rows and groups of one, and
/// the same bits at 1, 2 and 3 threads and for either form of key.
#[test]
fn scattered_keys_agree_with_gathered_at_any_thread_count() {
    scattered_keys_agree(12, 3200);
}

/// The same over 1.3 million rows: three chunks of the first pass, every group's moments
/// merged across them.
#[test]
fn scattered_keys_over_several_chunks_agree_with_gathered_at_any_thread_count() {
    scattered_keys_agree(14, 40_000);
}

fn scattered_keys_agree(seed: u64, n_groups: i64) {
    let class = |key: i64| (key + 100) / 7 % 4;
    let cells = [(1e6, 1.0), (-3.0, 1e-7), (42.0, 0.0), (0.0, 1e3)];
    let (groups, mut values) = shuffled_groups(seed, n_groups, 64, &cells);
    let last = values.len() - 1;
    values[5] = f64::NAN;
    values[last] = f64::NAN;
    let wide: Vec<i64> = groups.iter().map(|&g| (g as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) as i64 >> 2).collect();
    let one_stratum = vec![0i64; groups.len()];
    for (estimator, scale) in
        [(Estimator::Grpo, Scale::Group), (Estimator::Grpo, Scale::Batch), (Estimator::Rloo, Scale::Group)]
    {
        let spec = native(estimator, scale, 0.0);
        let run = |keys: &[i64], strata: Option<&[i64]>| -> Vec<f64> {
            normalize_labels(&values, keys, strata, None, None, &spec).unwrap()
        };
        let in_place = run(&groups, None);
        let gathered = run(&groups, Some(&one_stratum));
        for (i, (a, b)) in in_place.iter().zip(&gathered).enumerate() {
            // The inputs' own rounding (max|x| 2^-52) relative to the spread (std >= 0.3 of it).
            let inputs = [64.0 * f64::EPSILON * 1e6 / 0.3, 64.0 * f64::EPSILON * 3.0 / 0.3e-7, 0.0, 0.0]
                [class(groups[i]) as usize];
            assert!((a - b).abs() <= 1e-12 * (1.0 + a.abs()) + inputs, "{estimator:?} {scale:?} row {i}: {a} {b}");
        }
        assert_eq!((in_place[5], in_place[last]), (0.0, 0.0));
        for (i, &x) in in_place.iter().enumerate() {
            if class(groups[i]) == 2 {
                assert_eq!(x.to_bits(), 0.0f64.to_bits(), "a constant group gives +0");
            }
        }
        let same_bits = |other: &[f64]| other.iter().zip(&in_place).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same_bits(&run(&wide, None)), "hashed keys");
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            assert!(same_bits(&pool.install(|| run(&groups, None))), "{threads} threads");
            assert!(same_bits(&pool.install(|| run(&wide, None))), "{threads} threads, hashed keys");
        }
    }
    for at in [100, last] {
        let mut infinite = values.clone();
        infinite[at] = f64::INFINITY;
        let spec = native(Estimator::Grpo, Scale::Group, 0.0);
        assert!(normalize_labels::<f64>(&infinite, &groups, None, None, None, &spec).is_err(), "row {at}");
    }
}

/// Integer keys whose first rows (the 2^14 the scattered path probes) span less than all of
/// them: groups only after the probe below its range, above it, on both sides of it within
/// its window, and keys within the window whose whole range is too wide for a table (most
/// groups of one row). Each gives the
/// bits of its dense codes (`key - min`, a path whose decisions see every key first), natively
/// and in the trainers' arithmetic, at 1 and 2 threads.
#[test]
fn keys_beyond_the_probe_give_the_bits_of_their_dense_codes() {
    const PROBE: usize = 1 << 14;
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(21);
    let mut draw = |n: usize, keys: std::ops::Range<i64>| -> Vec<i64> {
        (0..n).map(|_| rand::RngExt::random_range(&mut rng, keys.clone())).collect()
    };
    let (early, late) = (draw(PROBE + 30_000, 1000..4000), draw(20_000, 0..1000));
    let below: Vec<i64> = early.iter().chain(&late).copied().collect();
    let above: Vec<i64> = below.iter().map(|&k| 5000 - k).collect();
    let inside: Vec<i64> = early.iter().copied().chain(draw(20_000, 700..4300)).collect();
    let too_wide: Vec<i64> = draw(PROBE, 0..18_000).into_iter().chain(draw(38_000 - PROBE, 0..19_500)).collect();
    let specs = [
        native(Estimator::Grpo, Scale::Group, 1e-6),
        native(Estimator::Rloo, Scale::Group, 1e-6),
        Spec::new(Estimator::Grpo, Scale::Group, None, Compat::Verl).unwrap(),
        Spec::new(Estimator::Grpo, Scale::Group, None, Compat::Trl).unwrap(),
        Spec::new(Estimator::Rloo, Scale::Group, None, Compat::OpenRlhf).unwrap(),
        Spec::new(Estimator::Grpo, Scale::Group, None, Compat::OpenRlhf).unwrap(),
    ];
    let layouts = [("below", &below), ("above", &above), ("inside", &inside), ("too wide", &too_wide)];
    for (layout, keys) in layouts {
        let mut values: Vec<f64> = (0..keys.len()).map(|i| ((i * 7919 % 1000) as f64 - 500.0) / 64.0).collect();
        values[PROBE + 5] = f64::NAN;
        let min = keys.iter().min().copied().unwrap_or(0);
        let codes: Vec<u32> = keys.iter().map(|&k| (k - min) as u32).collect();
        for spec in &specs {
            let dense: Vec<f64> = normalize(&rows(&values, &codes, None), spec).unwrap();
            for threads in [1, 2] {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                let labelled: Vec<f64> =
                    pool.install(|| normalize_labels(&values, keys, None, None, None, spec).unwrap());
                let same = labelled.iter().zip(&dense).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{layout}, {:?} {:?}, {threads} threads", spec.estimator, spec.compat);
            }
        }
    }
}

/// The trace with its events shuffled and edges renumbered; returns the new position of each
/// old event.
fn permuted(trace: &Trace, seed: u64) -> (Trace, Vec<usize>) {
    let mut order: Vec<usize> = (0..trace.events.len()).collect();
    order.shuffle(&mut Xoshiro256PlusPlus::seed_from_u64(seed));
    let mut position = vec![0usize; order.len()];
    for (at, &old) in order.iter().enumerate() {
        position[old] = at;
    }
    let mut shuffled = trace.clone();
    shuffled.events = order.iter().map(|&old| trace.events[old].clone()).collect();
    shuffled.edges = trace
        .edges
        .iter()
        .map(|edge| Edge { src: position[edge.src as usize] as u32, dst: position[edge.dst as usize] as u32, ..*edge })
        .collect();
    (shuffled, position)
}

fn options<'a>(values: &'a [f64], groups: &'a [u32], by: &'a [Stratum], unit: Unit) -> BatchOptions<'a> {
    BatchOptions {
        trace_values: values,
        event_values: None,
        groups,
        n_groups: groups.iter().max().map_or(0, |&g| g as usize + 1),
        normalize_by: by,
        unit,
        spec: native(Estimator::Grpo, Scale::Group, 1e-6),
        weight_by: &[],
    }
}

const STRATA: [Stratum; 5] = [Stratum::Agent, Stratum::Role, Stratum::Depth, Stratum::Turn, Stratum::EventType];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn stratified_advantages_follow_permuted_events(seed in 0u64..10_000, shuffle in any::<u64>(), stratum in 0usize..5) {
        let traces = generate(&SimConfig { n_traces: 8, group_size: 4, agents: (1, 5), seed, ..SimConfig::default() }).unwrap();
        let batch = TraceBatch::from_traces(&traces).unwrap();
        let mut shuffled = Vec::new();
        let mut positions = Vec::new();
        for (k, trace) in traces.iter().enumerate() {
            let (trace, position) = permuted(trace, shuffle.wrapping_add(k as u64));
            shuffled.push(trace);
            positions.push(position);
        }
        let other = TraceBatch::from_traces(&shuffled).unwrap();
        let values = trace_channel(&batch, "team");
        let groups: Vec<u32> = (0..8).map(|i| i / 4).collect();
        let by = [STRATA[stratum]];
        for unit in [Unit::Traces, Unit::Events] {
            let a = batch_advantages(&batch, &options(&values, &groups, &by, unit)).unwrap();
            let b = batch_advantages(&other, &options(&values, &groups, &by, unit)).unwrap();
            let offsets = batch.event_offsets();
            for (t, position) in positions.iter().enumerate() {
                for (old, &new) in position.iter().enumerate() {
                    let (x, y) = (a.per_event[offsets[t] as usize + old], b.per_event[offsets[t] as usize + new]);
                    prop_assert!((x - y).abs() < 1e-9, "{x} vs {y}");
                    let (u, v) = (a.weights[offsets[t] as usize + old], b.weights[offsets[t] as usize + new]);
                    prop_assert!((u - v).abs() < 1e-12);
                }
            }
            prop_assert!(close(&a.per_trace, &b.per_trace, 1e-9));
        }
    }

    #[test]
    fn single_agent_linear_traces_are_plain_grpo(rewards in proptest::collection::vec(0u8..5, 2..12), length in 1usize..5, group_size in 1usize..4) {
        let traces: Vec<Trace> = rewards
            .iter()
            .enumerate()
            .map(|(i, &r)| {
                let events: Vec<_> = (0..length)
                    .map(|k| serde_json::json!({"id": format!("e{k}"), "t": k as f64, "type": "orchestrator_decision", "agent": "solo", "role": "r"}))
                    .collect();
                let edges: Vec<_> =
                    (1..length).map(|k| serde_json::json!({"src": format!("e{}", k - 1), "dst": format!("e{k}"), "type": "causal"})).collect();
                let value = serde_json::json!({
                    "trace_id": format!("t{i}"), "task_id": "task", "events": events, "edges": edges,
                    "rewards": {"team": r as f64}, "costs": {"tokens": 0, "wall_clock_s": 0}
                });
                trace_from_json(&value, ValidateOptions::default()).unwrap()
            })
            .collect();
        let batch = TraceBatch::from_traces(&traces).unwrap();
        let values = trace_channel(&batch, "team");
        let groups: Vec<u32> = (0..rewards.len() as u32).map(|i| i / group_size as u32).collect();
        let plain = batch_advantages(&batch, &options(&values, &groups, &[], Unit::Traces)).unwrap();
        for stratum in STRATA {
            let by = [stratum];
            let got = batch_advantages(&batch, &options(&values, &groups, &by, Unit::Traces)).unwrap();
            prop_assert!(close(&got.per_event, &plain.per_event, 1e-12), "{stratum:?}");
            prop_assert!(close(&got.per_trace, &plain.per_trace, 1e-12), "{stratum:?}");
        }
    }

    #[test]
    fn returns_of_a_chain_are_discounted_suffix_sums(rewards in proptest::collection::vec(-10i32..10, 1..12), gamma in 0.0f64..1.0) {
        let events: Vec<_> = (0..rewards.len())
            .map(|k| serde_json::json!({"id": format!("e{k}"), "t": k as f64, "type": "message", "agent": "a"}))
            .collect();
        let edges: Vec<_> =
            (1..rewards.len()).map(|k| serde_json::json!({"src": format!("e{}", k - 1), "dst": format!("e{k}"), "type": "causal"})).collect();
        let value = serde_json::json!({"trace_id": "c", "task_id": "task", "events": events, "edges": edges,
            "rewards": {"team": 1.0}, "costs": {"tokens": 0, "wall_clock_s": 0}});
        let batch = TraceBatch::from_traces(&[trace_from_json(&value, ValidateOptions::default()).unwrap()]).unwrap();
        let r: Vec<f64> = rewards.iter().map(|&x| x as f64).collect();
        let mut expected = vec![0.0; r.len()];
        let mut running = 0.0;
        for k in (0..r.len()).rev() {
            running = r[k] + gamma * running;
            expected[k] = running;
        }
        for kind in [ReturnKind::Descendants, ReturnKind::Tree, ReturnKind::Turns] {
            prop_assert!(close(&graph_returns(&batch, &r, gamma, kind).unwrap(), &expected, 1e-12), "{kind:?}");
        }
    }
}

/// The trainer modes over scattered groups (gathered by a counting sort in chunks of rows,
/// then written from a table per group) give the bits of the gathered path (a trivial
/// stratum: each cell's rows in row order, the operations of a cell), for narrow keys, wide
/// keys and dense codes, at 1, 2 and 3 threads (1 to 3 chunks). Groups of 1-100 rows take
/// every shape of torch's sum (fewer than 8 values, lanes with a tail, more than 64).
#[test]
fn trainer_modes_over_scattered_groups_give_the_gathered_bits() {
    let cells = [(1e3, 1.0), (-3.0, 1e-4), (42.0, 0.0), (0.0, 1e2)];
    let (groups, mut values) = shuffled_groups(13, 3000, 100, &cells);
    values[5] = f64::NAN;
    values[900] = f64::NAN;
    let wide: Vec<i64> = groups.iter().map(|&g| (g as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) as i64 >> 2).collect();
    let (codes, _) = dense_codes(&groups);
    let one_stratum = vec![0i64; groups.len()];
    let same =
        |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits() || x.is_nan() && y.is_nan());
    let modes = [
        (Compat::Verl, Estimator::Grpo, Scale::Group),
        (Compat::Verl, Estimator::Grpo, Scale::None),
        (Compat::Verl, Estimator::Rloo, Scale::Group),
        (Compat::Trl, Estimator::Grpo, Scale::Group),
        (Compat::Trl, Estimator::Grpo, Scale::Batch),
        (Compat::Trl, Estimator::Grpo, Scale::None),
        (Compat::OpenRlhf, Estimator::Grpo, Scale::Group),
        (Compat::OpenRlhf, Estimator::Rloo, Scale::Group),
    ];
    for (compat, estimator, scale) in modes {
        let spec = Spec::new(estimator, scale, None, compat).unwrap();
        let run = |keys: &[i64], strata: Option<&[i64]>| -> Vec<f32> {
            normalize_labels(&values, keys, strata, None, None, &spec).unwrap()
        };
        let gathered = run(&groups, Some(&one_stratum));
        assert_eq!(gathered[5], 0.0);
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let label = format!("{compat:?} {estimator:?} {scale:?}, {threads} threads");
            assert!(same(&pool.install(|| run(&groups, None)), &gathered), "{label}");
            assert!(same(&pool.install(|| run(&wide, None)), &gathered), "{label}, wide keys");
            let rows = rows(&values, &codes, None);
            assert!(same(&pool.install(|| normalize::<f32>(&rows, &spec).unwrap()), &gathered), "{label}, codes");
        }
    }
    let mut infinite = values.clone();
    infinite[100] = f64::INFINITY;
    let spec = Spec::new(Estimator::Grpo, Scale::Group, None, Compat::Verl).unwrap();
    assert!(normalize_labels::<f32>(&infinite, &groups, None, None, None, &spec).is_err());
}
