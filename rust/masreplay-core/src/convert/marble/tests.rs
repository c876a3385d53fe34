use super::*;

#[test]
#[ignore]
fn timing() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/marble/");
    let names = ["tree_research_Llama3.1_70B.jsonl", "coding_development_output_0208.jsonl"];
    let texts: Vec<Vec<u8>> = names.iter().map(|name| std::fs::read(format!("{root}{name}")).unwrap()).collect();
    let (mut read_t, mut conv_t, mut batch_t) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..300 {
        let (mut r, mut c, mut b) = (0.0, 0.0, 0.0);
        for (name, text) in names.iter().zip(&texts) {
            let t0 = std::time::Instant::now();
            let records = read(name, text).unwrap();
            let t1 = std::time::Instant::now();
            let source = Source { name: name.to_string(), label: name.to_string(), records };
            let (traces, _) = convert(&source).unwrap();
            let t2 = std::time::Instant::now();
            let batch = crate::TraceBatch::from_traces(&traces).unwrap();
            let t3 = std::time::Instant::now();
            std::hint::black_box(batch);
            r += (t1 - t0).as_secs_f64();
            c += (t2 - t1).as_secs_f64();
            b += (t3 - t2).as_secs_f64();
        }
        read_t.push(r);
        conv_t.push(c);
        batch_t.push(b);
    }
    for (name, mut v) in [("read", read_t), ("convert", conv_t), ("batch", batch_t)] {
        v.sort_by(f64::total_cmp);
        println!("{name}: median {:.1} us min {:.1} us", v[v.len() / 2] * 1e6, v[0] * 1e6);
    }
}

#[test]
#[ignore]
fn timing_convert_only() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/marble/");
    let names = ["tree_research_Llama3.1_70B.jsonl", "coding_development_output_0208.jsonl"];
    let texts: Vec<Vec<u8>> = names.iter().map(|name| std::fs::read(format!("{root}{name}")).unwrap()).collect();
    let sources: Vec<Source<'_>> = names
        .iter()
        .zip(&texts)
        .map(|(name, text)| Source { name: name.to_string(), label: name.to_string(), records: read(name, text).unwrap() })
        .collect();
    for _ in 0..3000 {
        for source in &sources {
            std::hint::black_box(convert(source).unwrap());
        }
    }
}
