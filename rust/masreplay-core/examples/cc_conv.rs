use masreplay_core::convert::{Source, claude_code};
fn main() {
    let dir = "tests/data/claude_code/fa812bfe-b295-4cca-9c2f-fdf01028cb46";
    let mut files = vec![format!("{dir}.jsonl")];
    let mut subs: Vec<_> = std::fs::read_dir(format!("{dir}/subagents")).unwrap().map(|e| e.unwrap().path().display().to_string()).collect();
    subs.sort(); files.extend(subs);
    let bytes: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    let mut read = Vec::new();
    for (f, b) in files.iter().zip(&bytes) { read.push(Source { name: f.clone(), label: f.clone(), records: claude_code::read(f, b).unwrap() }); }
    let t = std::time::Instant::now();
    for _ in 0..300 { let (trace, _r) = claude_code::convert(&read, &Default::default()).unwrap(); std::hint::black_box(trace); }
    println!("{:?}", t.elapsed() / 300);
}
