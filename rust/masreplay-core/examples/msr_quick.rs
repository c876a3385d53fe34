// Scratch comparison (not committed).
use masreplay_core::shapley::games::{SoumGame, WeightedVotingGame};
use masreplay_core::shapley::{Game, Method, ShapleyOptions, shapley};

fn voting_truth(w: &[f64], quota: f64) -> Vec<f64> {
    let n = w.len();
    let total: usize = w.iter().map(|&x| x as usize).sum();
    let mut phi = vec![0.0; n];
    let lf: Vec<f64> = (0..=n).map(|k| (1..=k).map(|j| (j as f64).ln()).sum()).collect();
    for i in 0..n {
        let mut c = vec![vec![0.0f64; total + 1]; n];
        c[0][0] = 1.0;
        for j in (0..n).filter(|&j| j != i) {
            let wj = w[j] as usize;
            for s in (1..n).rev() {
                for t in (wj..=total).rev() {
                    c[s][t] += c[s - 1][t - wj];
                }
            }
        }
        for s in 0..n {
            let weight = (lf[s] + lf[n - s - 1] - lf[n]).exp();
            for t in 0..=total {
                if (t as f64) < quota && t as f64 + w[i] >= quota {
                    phi[i] += c[s][t] * weight;
                }
            }
        }
    }
    phi
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let ns: Vec<usize> = args[1].split(',').map(|x| x.parse().unwrap()).collect();
    let budgets: Vec<u64> = args[2].split(',').map(|x| x.parse().unwrap()).collect();
    let methods: Vec<Method> = args[3].split(',').map(|x| Method::parse(x).unwrap()).collect();
    let fams: Vec<&str> = args.get(4).map_or("low,full,voting,pairwise", |s| s.as_str()).split(',').collect();
    for &n in &ns {
        for fam in &fams {
            let games: Vec<(Box<dyn Game>, Vec<f64>)> = (0..5u64)
                .map(|seed| -> (Box<dyn Game>, Vec<f64>) {
                    match *fam {
                        "voting" => {
                            let w: Vec<f64> = (0..n).map(|i| 1.0 + ((i as u64 * 7 + seed * 13) % 5) as f64).collect();
                            let q = 0.6 * w.iter().sum::<f64>();
                            let t = voting_truth(&w, q);
                            (Box::new(WeightedVotingGame::new(w, q).unwrap()), t)
                        }
                        "pairwise" => {
                            let mut terms: Vec<(Vec<u32>, f64)> =
                                (0..n as u32).map(|i| (vec![i], ((i as u64 * 31 + seed) % 17) as f64 / 17.0)).collect();
                            for i in 0..n as u32 {
                                for j in i + 1..n as u32 {
                                    terms.push((
                                        vec![i, j],
                                        (((i * 7 + j * 3) as u64 + seed) % 11) as f64 / 5.5 / n as f64 - 1.0 / n as f64,
                                    ));
                                }
                            }
                            let g = SoumGame::new(n, terms).unwrap();
                            let t = g.shapley_values();
                            (Box::new(g), t)
                        }
                        f => {
                            let g = SoumGame::random(n, 100, if f == "low" { 3 } else { n }, 1000 + seed).unwrap();
                            let t = g.shapley_values();
                            (Box::new(g), t)
                        }
                    }
                })
                .collect();
            for &b in &budgets {
                let mut line = format!("n={n} {fam:8} {b:6}");
                for &m in &methods {
                    let (mut mae, mut cov, mut cnt) = (0.0, 0.0, 0.0);
                    let t0 = std::time::Instant::now();
                    for (seed, (g, truth)) in games.iter().enumerate() {
                        let r = shapley(
                            g.as_ref(),
                            &ShapleyOptions { method: m, budget: Some(b), seed: seed as u64, ..Default::default() },
                        )
                        .unwrap();
                        for i in 0..n {
                            let e = (r.values[i] - truth[i]).abs();
                            mae += e;
                            cnt += 1.0;
                            if e <= 1.96 * r.stderr[i] + 1e-12 {
                                cov += 1.0;
                            }
                        }
                    }
                    line += &format!(
                        " | {} {:.4} c{:.2} {}ms",
                        &m.as_str()[..4.min(m.as_str().len())],
                        mae / cnt,
                        cov / cnt,
                        t0.elapsed().as_millis() / 5
                    );
                }
                println!("{line}");
            }
        }
    }
}
