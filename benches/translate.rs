//! Criterion benches of the translator core, side by side with the naive alternative (BENCHMARKS.md).
//!
//! Groups: `small_deltas` (upstream events/s, 1–4 KiB reads), `large` (input MB/s, 16 KiB reads),
//! `fixtures` (the golden fixtures, if `tests/fixtures/*.sse` exist), `dialects` (upstream events/s of each
//! dialect: one conversation written in each, `benches/inputs/dialects.rs`, and each dialect's fixtures). After
//! criterion's own report, a summary times ours and naive interleaved in the same process and prints the ratios,
//! and checks that both produce the same blocks, so the comparison is between two correct translators; when the
//! `dialects` group ran, a second summary times the dialects interleaved and checks that each carries the xml
//! stream's content. `dialect_parts` measures the input side of each dialect alone (SSE decoding, JSON parsing).
//! `frontend` (issue 35) translates the xml conversation to envelopes and encodes them for the AI SDK and AG-UI
//! (`sse_gateway::frontend::Encoder`), beside translation alone, the encoding alone and its envelope parsing
//! alone; its summary times them interleaved and prints the ratios (`BENCH_ONCE=frontend_<step>`: one pass, for
//! callgrind).

mod inputs;
#[path = "../tests/harness/legacy.rs"]
#[allow(dead_code)]
mod legacy;
mod naive;

use std::cell::Cell;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use serde_json::Value;
use sse_gateway::frontend::envelope::Envelope;
use sse_gateway::frontend::{Encoder, Protocol, Turn};
use sse_gateway::translate::{Dialect, Options, Translator};

use inputs::{escape, Input};
use naive::{Naive, NaiveOptions};

const AGENT: &str = "bench-agent";
/// Size of each large-payload input.
const LARGE_MIB: usize = 8;
/// Turns of the conversation the `dialects` group writes in each dialect (about 15,000 upstream events).
const DIALECT_ROUNDS: usize = 40;

/// The feed/finish shape shared by the core and the naive translator.
trait Stream {
    fn feed(&mut self, input: &[u8], out: &mut Vec<u8>);
    fn finish(&mut self, out: &mut Vec<u8>);
}

impl Stream for Translator {
    fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        Translator::feed(self, input, out)
    }
    fn finish(&mut self, out: &mut Vec<u8>) {
        Translator::finish(self, out);
    }
}

impl Stream for Naive {
    fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        Naive::feed(self, input, out)
    }
    fn finish(&mut self, out: &mut Vec<u8>) {
        Naive::finish(self, out)
    }
}

/// Feeds `input` read by read, clearing the output after each read as the proxy does when it hands a
/// frame on (or appending it to `keep`). Returns the output size.
fn drive<S: Stream>(mut s: S, input: &Input, out: &mut Vec<u8>, mut keep: Option<&mut Vec<u8>>) -> usize {
    let mut total = 0;
    for piece in input.pieces() {
        s.feed(piece, out);
        total += out.len();
        if let Some(k) = keep.as_deref_mut() {
            k.extend_from_slice(out);
        }
        out.clear();
    }
    s.finish(out);
    total += out.len();
    if let Some(k) = keep {
        k.extend_from_slice(out);
    }
    out.clear();
    total
}

#[inline(never)]
fn ours(input: &Input, out: &mut Vec<u8>) -> usize {
    drive(Translator::new(Options::default(), AGENT), input, out, None)
}

#[inline(never)]
fn naive(input: &Input, out: &mut Vec<u8>) -> usize {
    drive(Naive::new(NaiveOptions::default(), AGENT), input, out, None)
}

fn dialect_options(dialect: Dialect) -> Options {
    Options {
        dialect,
        ..Options::default()
    }
}

/// Ours with the dialect named, as a config or request names it.
#[inline(never)]
fn ours_as(dialect: Dialect, input: &Input, out: &mut Vec<u8>) -> usize {
    drive(Translator::new(dialect_options(dialect), AGENT), input, out, None)
}

/// SSE events in `bytes`: lines ending a non-empty run of lines (LF or CRLF).
fn sse_events(bytes: &[u8]) -> u64 {
    let mut events = 0;
    let mut in_event = false;
    for line in bytes.split(|&b| b == b'\n') {
        let blank = line.is_empty() || line == b"\r";
        if blank && in_event {
            events += 1;
        }
        in_event = !blank;
    }
    events
}

/// The `.sse` fixtures of `tests/<dir>` whose names start with `prefix`, each one read of its own stream (one
/// translator per fixture is set up in `ours_per_read`).
fn fixture_streams(name: &'static str, dir: &str, prefix: &str) -> Option<Input> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join(dir);
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "sse"))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .collect();
    paths.sort();
    let streams: Vec<Vec<u8>> = paths.iter().filter_map(|p| std::fs::read(p).ok()).collect();
    if streams.is_empty() {
        return None;
    }
    let reads = streams.iter().map(Vec::len).collect();
    let bytes = streams.concat();
    Some(Input {
        name,
        events: sse_events(&bytes),
        bytes,
        reads,
    })
}

fn fixtures() -> Option<Input> {
    fixture_streams("fixtures", "fixtures", "")
}

/// Each dialect's fixtures: the golden `xml_` and `raw_` ones, and the recorded cogency (3.3 and 3.0) and Agent
/// SDK corpora of `tests/fixtures/dialects/` (not its `other_` inputs, which are no dialect).
fn dialect_fixtures() -> Vec<(Dialect, Input)> {
    [
        (Dialect::Xml, "fixtures_xml", "fixtures", "xml_"),
        (Dialect::Raw, "fixtures_raw", "fixtures", "raw_"),
        (Dialect::Cogency, "fixtures_cogency", "fixtures/dialects", "cogency"),
        (
            Dialect::AgentSdk,
            "fixtures_agent_sdk",
            "fixtures/dialects",
            "agent_sdk_",
        ),
    ]
    .into_iter()
    .filter_map(|(d, name, dir, prefix)| Some((d, fixture_streams(name, dir, prefix)?)))
    .collect()
}

/// Every fixture through its own translator (they are separate streams).
fn ours_per_read(opts: &Options, input: &Input, out: &mut Vec<u8>) -> usize {
    let mut total = 0;
    for piece in input.pieces() {
        let mut t = Translator::new(opts.clone(), AGENT);
        t.feed(piece, out);
        t.finish(out);
        total += out.len();
        out.clear();
    }
    total
}

/// Returns whether the group ran (criterion's filter may skip it).
fn bench_small(c: &mut Criterion, input: &Input) -> bool {
    let ran = Cell::new(false);
    let mut g = c.benchmark_group("small_deltas");
    g.sample_size(20);
    g.throughput(Throughput::Elements(input.events));
    let mut out = Vec::with_capacity(64 << 10);
    g.bench_function("ours", |b| {
        ran.set(true);
        b.iter(|| black_box(ours(black_box(input), &mut out)))
    });
    g.bench_function("naive", |b| b.iter(|| black_box(naive(black_box(input), &mut out))));
    g.finish();
    ran.get()
}

fn bench_large(c: &mut Criterion, large: &[Input]) {
    let mut g = c.benchmark_group("large");
    g.sample_size(10);
    let mut out = Vec::with_capacity(64 << 10);
    for input in large {
        g.throughput(Throughput::Bytes(input.bytes.len() as u64));
        g.bench_with_input(BenchmarkId::new("ours", input.name), input, |b, i| {
            b.iter(|| black_box(ours(i, &mut out)))
        });
        g.bench_with_input(BenchmarkId::new("naive", input.name), input, |b, i| {
            b.iter(|| black_box(naive(i, &mut out)))
        });
    }
    g.finish();
}

fn bench_fixtures(c: &mut Criterion, input: &Input) {
    let mut g = c.benchmark_group("fixtures");
    g.sample_size(20);
    g.throughput(Throughput::Bytes(input.bytes.len() as u64));
    let mut out = Vec::with_capacity(64 << 10);
    let opts = Options::default();
    g.bench_function("ours", |b| {
        b.iter(|| black_box(ours_per_read(&opts, black_box(input), &mut out)))
    });
    g.finish();
}

/// How far a dialect's input side goes before any translating: what the `dialect_parts` group measures.
#[derive(Clone, Copy)]
enum Part {
    /// SSE decoding, each event's data collected whole (as any JSON parser needs it).
    Sse,
    /// Then each event checked as JSON without building anything (`IgnoredAny`): the least a JSON dialect pays.
    JsonSkim,
    /// Then each event parsed into a `serde_json::Value` (owned strings, maps).
    JsonValue,
}

impl Part {
    const ALL: [Part; 3] = [Part::Sse, Part::JsonSkim, Part::JsonValue];

    fn name(self) -> &'static str {
        match self {
            Part::Sse => "sse",
            Part::JsonSkim => "sse+json_skim",
            Part::JsonValue => "sse+json_value",
        }
    }
}

/// Feeds `input` read by read through the SSE decoder alone, doing `part` with each complete event; returns the
/// events that parsed (so nothing is optimised away).
#[inline(never)]
fn input_side(part: Part, input: &Input, data: &mut Vec<u8>) -> usize {
    use sse_gateway::sse::{Decoder, DecoderOptions, SseEvent};
    let defaults = Options::default();
    let mut decoder = Decoder::new(DecoderOptions {
        line_ends: defaults.line_ends,
        framing: defaults.framing,
    });
    let mut parsed = 0;
    let mut sink = |ev: SseEvent<'_>| match ev {
        SseEvent::Data(piece) => data.extend_from_slice(piece),
        SseEvent::DataLine => {}
        SseEvent::Dispatch { .. } => {
            let ok = match part {
                Part::Sse => !data.is_empty(),
                Part::JsonSkim => serde_json::from_slice::<serde::de::IgnoredAny>(data).is_ok(),
                Part::JsonValue => serde_json::from_slice::<Value>(data).is_ok(),
            };
            parsed += usize::from(ok);
            data.clear();
        }
        SseEvent::Discard => data.clear(),
    };
    for piece in input.pieces() {
        decoder.feed(piece, &mut sink);
    }
    decoder.finish(&mut sink);
    parsed
}

/// The input side of each dialect's conversation alone (`dialect_parts/<part>/<dialect>`), beside the whole
/// translation of the `dialects` group: where a dialect's time per event goes (envelope writing is the same
/// content in every dialect, so the differences between dialects are on this side).
fn bench_dialect_parts(c: &mut Criterion, conversations: &[(Dialect, Input)]) {
    let mut g = c.benchmark_group("dialect_parts");
    g.sample_size(20);
    let mut data = Vec::with_capacity(64 << 10);
    for part in Part::ALL {
        for (dialect, input) in conversations {
            if *dialect == Dialect::Xml && !matches!(part, Part::Sse) {
                continue;
            }
            g.throughput(Throughput::Elements(input.events));
            g.bench_with_input(BenchmarkId::new(part.name(), dialect.as_str()), input, |b, i| {
                b.iter(|| black_box(input_side(part, i, &mut data)))
            });
        }
    }
    g.finish();
}

/// Upstream events/s of each dialect, side by side: the one conversation written in each
/// (`dialects/conversation/<dialect>`), and each dialect's fixtures (`dialects/fixtures/<dialect>`), with the
/// dialect named in the options. Returns whether the group ran.
fn bench_dialects(c: &mut Criterion, conversations: &[(Dialect, Input)], fixtures: &[(Dialect, Input)]) -> bool {
    let ran = Cell::new(false);
    let mut g = c.benchmark_group("dialects");
    g.sample_size(20);
    let mut out = Vec::with_capacity(64 << 10);
    for (dialect, input) in conversations {
        g.throughput(Throughput::Elements(input.events));
        g.bench_with_input(BenchmarkId::new("conversation", dialect.as_str()), input, |b, i| {
            ran.set(true);
            b.iter(|| black_box(ours_as(*dialect, i, &mut out)))
        });
    }
    for (dialect, input) in fixtures {
        let opts = dialect_options(*dialect);
        g.throughput(Throughput::Elements(input.events));
        g.bench_with_input(BenchmarkId::new("fixtures", dialect.as_str()), input, |b, i| {
            ran.set(true);
            b.iter(|| black_box(ours_per_read(&opts, i, &mut out)))
        });
    }
    g.finish();
    ran.get()
}

/// One logical block of output: a streamed block up to its final marker, a buffered block's chunks, one
/// citation or one image.
#[derive(Debug, PartialEq)]
struct Block {
    kind: String,
    agent: String,
    extras: Vec<(String, Value)>,
    content: String,
}

/// Groups an output stream into blocks; also returns the number of lines over `budget` that are not
/// citations.
fn blocks(out: &[u8], budget: usize) -> (Vec<Block>, usize) {
    let text = String::from_utf8_lossy(out);
    let mut done = Vec::new();
    let mut open: Option<Block> = None;
    let mut over = 0;
    for ev in text.split("\n\n").filter(|e| !e.is_empty()) {
        let json = ev.strip_prefix("data: ").unwrap_or(ev);
        if json == "[DONE]" {
            done.extend(open.take());
            done.push(Block {
                kind: "[DONE]".into(),
                agent: String::new(),
                extras: Vec::new(),
                content: String::new(),
            });
            continue;
        }
        let Ok(Value::Object(m)) = serde_json::from_str::<Value>(json) else {
            done.push(Block {
                kind: "<invalid JSON>".into(),
                agent: String::new(),
                extras: Vec::new(),
                content: json.to_string(),
            });
            continue;
        };
        let kind = m.get("type").and_then(Value::as_str).unwrap_or_default().to_string();
        if json.len() > budget && kind != "citation" {
            over += 1;
        }
        let agent = m.get("agent").and_then(Value::as_str).unwrap_or_default().to_string();
        let is_final = m.get("final").and_then(Value::as_bool).unwrap_or(false);
        let delta = m.get("delta").and_then(Value::as_str).unwrap_or_default().to_string();
        let extras = legacy::extras(&m);
        if kind == "citation" || kind == "tool_result_image" {
            done.push(Block {
                kind,
                agent,
                extras,
                content: delta,
            });
            continue;
        }
        match &mut open {
            Some(b) if b.kind == kind && b.agent == agent && b.extras == extras => b.content.push_str(&delta),
            _ => {
                done.extend(open.take());
                open = Some(Block {
                    kind,
                    agent,
                    extras,
                    content: delta,
                });
            }
        }
        if is_final {
            done.extend(open.take());
        }
    }
    done.extend(open);
    (done, over)
}

/// JSON payloads are equal as values, everything else byte for byte.
fn same_block(a: &Block, b: &Block) -> bool {
    let json_kind = matches!(
        a.kind.as_str(),
        "meta_init" | "meta_final" | "awaiting_frontend_tools" | "tool_call" | "server_tool_call" | "error"
    );
    let same_content = a.content == b.content
        || (json_kind
            && serde_json::from_str::<Value>(&a.content)
                .ok()
                .is_some_and(|v| serde_json::from_str::<Value>(&b.content).ok() == Some(v)));
    a.kind == b.kind && a.agent == b.agent && a.extras == b.extras && same_content
}

fn clip(s: &str) -> String {
    if s.len() <= 160 {
        return s.to_string();
    }
    let mut cut = 160;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… ({} bytes)", &s[..cut], s.len())
}

/// Checks that ours and naive agree block by block on `input`; prints the first difference.
fn agree(input: &Input) -> bool {
    let budget = Options::default().budget;
    let (mut ours_out, mut naive_out) = (Vec::new(), Vec::new());
    drive(
        Translator::new(Options::default(), AGENT),
        input,
        &mut Vec::new(),
        Some(&mut ours_out),
    );
    drive(
        Naive::new(NaiveOptions::default(), AGENT),
        input,
        &mut Vec::new(),
        Some(&mut naive_out),
    );
    dump(input, &[("ours", &ours_out), ("naive", &naive_out)]);
    let (a, over_a) = blocks(&ours_out, budget);
    let (b, over_b) = blocks(&naive_out, budget);
    if over_a + over_b > 0 {
        println!("  {}: lines over budget: ours {over_a}, naive {over_b}", input.name);
    }
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        if !same_block(x, y) {
            println!("  {}: block {i} differs", input.name);
            println!("    ours : {} {:?} {}", x.kind, x.extras, clip(&x.content));
            println!("    naive: {} {:?} {}", y.kind, y.extras, clip(&y.content));
            return false;
        }
    }
    if a.len() != b.len() {
        println!("  {}: ours {} blocks, naive {} blocks", input.name, a.len(), b.len());
        return false;
    }
    true
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Times ours and naive alternately (A B A B …) for `rounds` rounds; returns the two medians.
fn interleaved(input: &Input, rounds: usize) -> (Duration, Duration) {
    let mut out = Vec::with_capacity(64 << 10);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        black_box(ours(input, &mut out));
        a.push(t.elapsed());
        let t = Instant::now();
        black_box(naive(input, &mut out));
        b.push(t.elapsed());
    }
    (median(a), median(b))
}

fn summary(small: &Input, large: &[Input]) {
    println!("\n## Summary: ours vs naive, interleaved in one process (median of 15 rounds each)\n");
    println!("| input | size | reads | ours | naive | ours/naive | same blocks |");
    println!("|---|---|---|---|---|---|---|");
    let rate = |d: Duration, n: f64| n / d.as_secs_f64();
    let (a, b) = interleaved(small, 15);
    let ev = small.events as f64;
    println!(
        "| {} ({} events) | {:.1} MiB | 1–4 KiB | {:.2} M events/s | {:.2} M events/s | {:.2}× | {} |",
        small.name,
        small.events,
        small.bytes.len() as f64 / (1 << 20) as f64,
        rate(a, ev) / 1e6,
        rate(b, ev) / 1e6,
        b.as_secs_f64() / a.as_secs_f64(),
        if agree(small) { "yes" } else { "NO" }
    );
    for input in large {
        let (a, b) = interleaved(input, 15);
        let mb = input.bytes.len() as f64 / 1e6;
        println!(
            "| {} | {:.1} MiB | 16 KiB | {:.0} MB/s | {:.0} MB/s | {:.2}× | {} |",
            input.name,
            input.bytes.len() as f64 / (1 << 20) as f64,
            rate(a, mb),
            rate(b, mb),
            b.as_secs_f64() / a.as_secs_f64(),
            if agree(input) { "yes" } else { "NO" }
        );
    }
}

/// The content of an output that the dialects share, block by block: text and thinking byte for byte, tool calls
/// by name and arguments (as a JSON value), tool results by name and content. cogency's ids are the gateway's own
/// and its result is the batch's JSON array: compared by the one entry's `content`. Also the lines over budget.
fn shared_content(dialect: Dialect, out: &[u8]) -> (Vec<(String, String, String)>, usize) {
    let (blocks, over) = blocks(out, Options::default().budget);
    let name = |b: &Block| {
        b.extras
            .iter()
            .find(|(k, _)| k == "name")
            .and_then(|(_, v)| v.as_str())
            .unwrap_or_default()
            .to_string()
    };
    let content = blocks
        .iter()
        .filter_map(|b| {
            let content = match b.kind.as_str() {
                "text" | "thinking" => b.content.clone(),
                "tool_call" => {
                    serde_json::from_str::<Value>(&b.content).map_or_else(|_| b.content.clone(), |v| v.to_string())
                }
                "tool_result" if dialect == Dialect::Cogency => serde_json::from_str::<Value>(&b.content)
                    .ok()
                    .and_then(|v| v.get(0)?.get("content")?.as_str().map(str::to_string))
                    .unwrap_or_else(|| b.content.clone()),
                "tool_result" => b.content.clone(),
                _ => return None,
            };
            Some((b.kind.clone(), name(b), content))
        })
        .collect();
    (content, over)
}

/// Debugging aid, with `BENCH_DUMP=<dir>`: the input and its `outputs` (`<input>.<name>.sse` each) written to the
/// directory, to diff by hand.
fn dump(input: &Input, outputs: &[(&str, &[u8])]) {
    let Some(dir) = std::env::var_os("BENCH_DUMP") else {
        return;
    };
    let dir = std::path::Path::new(&dir);
    let _ = std::fs::create_dir_all(dir);
    let _ = std::fs::write(dir.join(format!("{}.sse", input.name)), &input.bytes);
    for (name, out) in outputs {
        let _ = std::fs::write(dir.join(format!("{}.{name}.sse", input.name)), out);
    }
}

/// Whether `dialect`'s output of `input` carries the content of xml's output `reference`; prints the first
/// difference.
fn same_content(dialect: Dialect, input: &Input, reference: &[(String, String, String)]) -> bool {
    let mut out = Vec::new();
    drive(
        Translator::new(dialect_options(dialect), AGENT),
        input,
        &mut Vec::new(),
        Some(&mut out),
    );
    dump(input, &[("out", &out)]);
    let (content, over) = shared_content(dialect, &out);
    if over > 0 {
        println!("  {}: {over} lines over budget", input.name);
        return false;
    }
    for (i, (x, y)) in content.iter().zip(reference).enumerate() {
        if x != y {
            println!("  {}: block {i} differs from xml's", input.name);
            println!("    {:<9}: {} {} {}", dialect.as_str(), x.0, x.1, clip(&x.2));
            println!("    xml      : {} {} {}", y.0, y.1, clip(&y.2));
            return false;
        }
    }
    if content.len() != reference.len() {
        println!("  {}: {} blocks, xml {}", input.name, content.len(), reference.len());
        return false;
    }
    true
}

/// Times the dialects' conversations alternately (xml raw cogency agent_sdk xml …) and prints events/s, the
/// ratios to xml, and whether each carries xml's content.
fn dialect_summary(conversations: &[(Dialect, Input)]) {
    const ROUNDS: usize = 15;
    println!(
        "\n## Summary: one conversation in each dialect, interleaved in one process (median of {ROUNDS} rounds)\n"
    );
    println!("| dialect | events | size | events/s | vs xml | time per conversation | vs xml | xml's content |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut out = Vec::with_capacity(64 << 10);
    let mut times = vec![Vec::new(); conversations.len()];
    for _ in 0..ROUNDS {
        for ((dialect, input), t) in conversations.iter().zip(&mut times) {
            let start = Instant::now();
            black_box(ours_as(*dialect, input, &mut out));
            t.push(start.elapsed());
        }
    }
    let medians: Vec<Duration> = times.into_iter().map(median).collect();
    let Some(((_, xml), xml_time)) = conversations
        .iter()
        .zip(&medians)
        .find(|((d, _), _)| *d == Dialect::Xml)
    else {
        return;
    };
    let mut reference = Vec::new();
    drive(
        Translator::new(dialect_options(Dialect::Xml), AGENT),
        xml,
        &mut Vec::new(),
        Some(&mut reference),
    );
    let (reference, _) = shared_content(Dialect::Xml, &reference);
    let xml_rate = xml.events as f64 / xml_time.as_secs_f64();
    for ((dialect, input), time) in conversations.iter().zip(&medians) {
        let rate = input.events as f64 / time.as_secs_f64();
        println!(
            "| {} | {} | {:.2} MiB | {:.2} M | {:.2}× | {:.2} ms | {:.2}× | {} |",
            dialect.as_str(),
            input.events,
            input.bytes.len() as f64 / (1 << 20) as f64,
            rate / 1e6,
            rate / xml_rate,
            time.as_secs_f64() * 1e3,
            time.as_secs_f64() / xml_time.as_secs_f64(),
            if same_content(*dialect, input, &reference) {
                "yes"
            } else {
                "NO"
            }
        );
    }
}

/// `BENCH_ONCE=dialect_<dialect>`: the `dialects` group's conversation in that dialect, `BENCH_REPEAT` times (default
/// 1), through ours with the dialect named; prints the best rate. For instruction counts:
/// `valgrind --tool=callgrind --toggle-collect='translate::ours_as' …`. With `BENCH_PART=sse|json_skim|json_value`,
/// only that much of the input side (`dialect_parts`; `--toggle-collect='translate::input_side'`).
fn once_dialect(name: &str) {
    let part = std::env::var("BENCH_PART").ok().map(|p| {
        Part::ALL
            .into_iter()
            .find(|x| x.name().ends_with(p.as_str()))
            .unwrap_or_else(|| panic!("no part named {p}"))
    });
    let Some((dialect, input)) = inputs::dialects::all(DIALECT_ROUNDS)
        .into_iter()
        .find(|(_, i)| i.name == name)
    else {
        panic!("no input named {name}");
    };
    let repeat: usize = std::env::var("BENCH_REPEAT")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1);
    let mut out = Vec::with_capacity(64 << 10);
    let mut best = Duration::MAX;
    for _ in 0..repeat {
        let t = Instant::now();
        match part {
            Some(part) => black_box(input_side(part, &input, &mut out)),
            None => black_box(ours_as(dialect, &input, &mut out)),
        };
        best = best.min(t.elapsed());
    }
    eprintln!(
        "{name}: {} events, best of {repeat} {:.2} M events/s",
        input.events,
        input.events as f64 / best.as_secs_f64() / 1e6
    );
}

/// What a step of the `frontend` group does with the xml conversation.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Front {
    /// Translation alone: the envelope stream (`X-Stream-Format: json`).
    Json,
    /// Translation, then each read's envelopes encoded (`X-Stream-Format: ai-sdk | ag-ui`), as `body::encode` does.
    Translated(Protocol),
    /// The encoding alone, of the envelope frames translated beforehand.
    Encoded(Protocol),
    /// Of the encoding, only each envelope read back (`frontend::envelope::Envelope::parse`: serde) from the frames.
    Parsed,
}

impl Front {
    const ALL: [Front; 6] = [
        Front::Json,
        Front::Translated(Protocol::AiSdk),
        Front::Translated(Protocol::AgUi),
        Front::Parsed,
        Front::Encoded(Protocol::AiSdk),
        Front::Encoded(Protocol::AgUi),
    ];

    fn name(self) -> String {
        match self {
            Front::Json => "translate/json".into(),
            Front::Translated(p) => format!("translate+encode/{}", p.as_str()),
            Front::Encoded(p) => format!("encode/{}", p.as_str()),
            Front::Parsed => "parse_envelopes".into(),
        }
    }
}

/// The turn of a response-only encoding (`X-Stream-Format`), as `frontend::serve::Read::fresh` makes it.
fn fresh_turn() -> Turn {
    let id = "5f1c2e4a7b3d4c8e9a102b3c4d5e6f70".to_string();
    Turn {
        message_id: id.clone(),
        thread_id: id.clone(),
        run_id: id.clone(),
        prefix: id,
        ..Turn::default()
    }
}

/// Hands one read's output on: encoded when there is an encoder (cleared after, as the proxy hands each frame on).
fn hand_on(encoder: &mut Option<Encoder>, out: &mut Vec<u8>, enc: &mut Vec<u8>) -> usize {
    let n = match encoder {
        Some(e) => {
            e.frame(out, enc);
            let n = enc.len();
            enc.clear();
            n
        }
        None => out.len(),
    };
    out.clear();
    n
}

/// The xml conversation translated read by read, each read's envelopes encoded for `protocol` (none: the envelope
/// stream); returns the bytes that would go to the client.
#[inline(never)]
fn frontend_pass(protocol: Option<Protocol>, input: &Input, out: &mut Vec<u8>, enc: &mut Vec<u8>) -> usize {
    let mut t = Translator::new(Options::default(), AGENT);
    let mut encoder = protocol.map(|p| Encoder::new(p, fresh_turn()));
    let mut total = 0;
    for piece in input.pieces() {
        t.feed(piece, out);
        total += hand_on(&mut encoder, out, enc);
    }
    t.finish(out);
    total += hand_on(&mut encoder, out, enc);
    if let Some(e) = &mut encoder {
        e.finish(enc);
        total += enc.len();
        enc.clear();
    }
    total
}

/// The envelope frames of `input`, one per read, as the translator hands them on.
fn envelope_frames(input: &Input) -> Vec<Vec<u8>> {
    let mut t = Translator::new(Options::default(), AGENT);
    let mut frames = Vec::new();
    let mut out = Vec::new();
    for piece in input.pieces() {
        t.feed(piece, &mut out);
        frames.push(std::mem::take(&mut out));
    }
    t.finish(&mut out);
    frames.push(out);
    frames.retain(|f| !f.is_empty());
    frames
}

/// The encoding alone: `frames` (envelopes) encoded for `protocol`.
#[inline(never)]
fn encode_only(protocol: Protocol, frames: &[Vec<u8>], enc: &mut Vec<u8>) -> usize {
    let mut e = Encoder::new(protocol, fresh_turn());
    let mut total = 0;
    for f in frames {
        e.frame(f, enc);
        total += enc.len();
        enc.clear();
    }
    e.finish(enc);
    total += enc.len();
    enc.clear();
    total
}

/// The encoders' first step alone: each `data:` line of `frames` read back as an envelope (as `Encoder::frame`
/// splits them); returns the envelopes read.
#[inline(never)]
fn parse_envelopes(frames: &[Vec<u8>]) -> usize {
    let mut n = 0;
    for f in frames {
        for line in f.split(|&b| b == b'\n') {
            if let Some(data) = line.strip_prefix(b"data: ") {
                n += usize::from(black_box(Envelope::parse(data)).is_some());
            }
        }
    }
    n
}

fn front_run(step: Front, input: &Input, frames: &[Vec<u8>], out: &mut Vec<u8>, enc: &mut Vec<u8>) -> usize {
    match step {
        Front::Json => frontend_pass(None, input, out, enc),
        Front::Translated(p) => frontend_pass(Some(p), input, out, enc),
        Front::Encoded(p) => encode_only(p, frames, enc),
        Front::Parsed => parse_envelopes(frames),
    }
}

/// The xml conversation of the `dialects` group: thinking, text, tool calls and results over 40 model turns.
fn frontend_input() -> Input {
    inputs::dialects::all(DIALECT_ROUNDS)
        .into_iter()
        .find(|(d, _)| *d == Dialect::Xml)
        .map(|(_, i)| i)
        .expect("the xml conversation")
}

/// `frontend/<step>`: upstream events/s of each step. Returns whether the group ran.
fn bench_frontend(c: &mut Criterion, input: &Input, frames: &[Vec<u8>]) -> bool {
    let ran = Cell::new(false);
    let mut g = c.benchmark_group("frontend");
    g.sample_size(20);
    g.throughput(Throughput::Elements(input.events));
    let (mut out, mut enc) = (Vec::with_capacity(64 << 10), Vec::with_capacity(64 << 10));
    for step in Front::ALL {
        g.bench_function(step.name(), |b| {
            ran.set(true);
            b.iter(|| black_box(front_run(step, black_box(input), frames, &mut out, &mut enc)))
        });
    }
    g.finish();
    ran.get()
}

/// Whether `protocol`'s encoding of the conversation ends its run cleanly and carries every text delta.
fn frontend_check(protocol: Protocol, input: &Input) -> String {
    let frames = envelope_frames(input);
    let mut all = Vec::new();
    let mut e = Encoder::new(protocol, fresh_turn());
    for f in &frames {
        e.frame(f, &mut all);
    }
    e.finish(&mut all);
    let text = String::from_utf8_lossy(&all);
    let count = |s: &str| text.matches(s).count();
    let envelopes = frames
        .iter()
        .map(|f| String::from_utf8_lossy(f).matches("\"type\":\"text\"").count())
        .sum::<usize>();
    let (deltas, ended, failed) = match protocol {
        Protocol::AiSdk => (
            count("\"type\":\"text-delta\""),
            text.ends_with("data: [DONE]\n\n") && count("\"type\":\"finish\"") == 1,
            count("\"type\":\"error\""),
        ),
        Protocol::AgUi => (
            count("\"type\":\"TEXT_MESSAGE_CONTENT\""),
            count("\"type\":\"RUN_FINISHED\"") == 1,
            count("\"type\":\"RUN_ERROR\""),
        ),
    };
    let ok = ended && failed == 0 && deltas >= envelopes.saturating_sub(envelopes / 10);
    format!(
        "{} ({deltas} text deltas for {envelopes} text envelopes, {:.2} MiB)",
        if ok { "yes" } else { "NO" },
        all.len() as f64 / (1 << 20) as f64
    )
}

/// Times the steps alternately and prints events/s, time per conversation and the ratios to translation alone.
fn frontend_summary(input: &Input, frames: &[Vec<u8>]) {
    const ROUNDS: usize = 15;
    println!(
        "\n## Summary: frontend encoding of the xml conversation ({} upstream events, {} envelope frames), \
         interleaved in one process (median of {ROUNDS} rounds)\n",
        input.events,
        frames.len()
    );
    println!("| step | events/s | time per conversation | vs translate/json | bytes out | run ends cleanly |");
    println!("|---|---|---|---|---|---|");
    let (mut out, mut enc) = (Vec::with_capacity(64 << 10), Vec::with_capacity(64 << 10));
    let mut times = vec![Vec::new(); Front::ALL.len()];
    let mut sizes = vec![0; Front::ALL.len()];
    for _ in 0..ROUNDS {
        for (i, step) in Front::ALL.into_iter().enumerate() {
            let t = Instant::now();
            sizes[i] = black_box(front_run(step, input, frames, &mut out, &mut enc));
            times[i].push(t.elapsed());
        }
    }
    let medians: Vec<Duration> = times.into_iter().map(median).collect();
    let base = medians[0].as_secs_f64();
    for (i, step) in Front::ALL.into_iter().enumerate() {
        let d = medians[i].as_secs_f64();
        let check = match step {
            Front::Translated(p) => frontend_check(p, input),
            _ => "—".into(),
        };
        println!(
            "| {} | {:.2} M | {:.2} ms | {:.3}× | {} | {check} |",
            step.name(),
            input.events as f64 / d / 1e6,
            d * 1e3,
            d / base,
            if matches!(step, Front::Parsed) {
                format!("{} envelopes", sizes[i])
            } else {
                format!("{:.2} MiB", sizes[i] as f64 / (1 << 20) as f64)
            },
        );
    }
}

/// `BENCH_ONCE=frontend_<json|ai-sdk|ag-ui|encode_ai-sdk|encode_ag-ui|parse>`: one step over the xml conversation,
/// `BENCH_REPEAT` times (default 1). For instruction counts: `valgrind --tool=callgrind
/// --toggle-collect='translate::frontend_pass'` (or `encode_only`, `parse_envelopes`).
fn once_frontend(name: &str) {
    let step = match name.strip_prefix("frontend_").unwrap_or_default() {
        "json" => Front::Json,
        "ai-sdk" => Front::Translated(Protocol::AiSdk),
        "ag-ui" => Front::Translated(Protocol::AgUi),
        "encode_ai-sdk" => Front::Encoded(Protocol::AiSdk),
        "encode_ag-ui" => Front::Encoded(Protocol::AgUi),
        "parse" => Front::Parsed,
        other => panic!("no frontend step named {other}"),
    };
    let input = frontend_input();
    let frames = envelope_frames(&input);
    let repeat: usize = std::env::var("BENCH_REPEAT")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1);
    let (mut out, mut enc) = (Vec::with_capacity(64 << 10), Vec::with_capacity(64 << 10));
    let mut best = Duration::MAX;
    for _ in 0..repeat {
        let t = Instant::now();
        black_box(front_run(step, &input, &frames, &mut out, &mut enc));
        best = best.min(t.elapsed());
    }
    eprintln!(
        "{name}: {} upstream events, best of {repeat} {:.2} M events/s",
        input.events,
        input.events as f64 / best.as_secs_f64() / 1e6
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo test --benches` runs each bench once in test mode: skip the summary there.
    let bench_mode = args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--list");
    if let Ok(name) = std::env::var("BENCH_ONCE") {
        if name.starts_with("dialect_") {
            once_dialect(&name);
            return;
        }
        if name.starts_with("frontend_") {
            once_frontend(&name);
            return;
        }
        // One run of each translator over one input, for instruction counts that the machine's load
        // does not disturb: valgrind --tool=callgrind --toggle-collect='translate::ours' (or naive).
        let input = inputs::by_name(&name, LARGE_MIB).unwrap_or_else(|| panic!("no input named {name}"));
        // BENCH_WHICH=ours|naive limits the run to one of them and BENCH_REPEAT=N repeats it, for a profile
        // of just that one.
        let which = std::env::var("BENCH_WHICH").unwrap_or_default();
        let mut out = Vec::with_capacity(64 << 10);
        let repeat: usize = std::env::var("BENCH_REPEAT")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(1);
        let (mut best_ours, mut best_naive) = (Duration::MAX, Duration::MAX);
        for _ in 0..repeat {
            if which != "naive" {
                let t = Instant::now();
                black_box(ours(&input, &mut out));
                best_ours = best_ours.min(t.elapsed());
            }
            if which != "ours" {
                let t = Instant::now();
                black_box(naive(&input, &mut out));
                best_naive = best_naive.min(t.elapsed());
            }
        }
        let mb = input.bytes.len() as f64 / 1e6;
        for (who, best) in [("ours", best_ours), ("naive", best_naive)] {
            if best != Duration::MAX {
                eprintln!("{name} {who}: best of {repeat} {:.0} MB/s", mb / best.as_secs_f64());
            }
        }
        return;
    }
    let small = inputs::small_deltas();
    let large = inputs::large(LARGE_MIB);
    let conversations = inputs::dialects::all(DIALECT_ROUNDS);
    let mut c = Criterion::default().configure_from_args();
    let small_ran = bench_small(&mut c, &small);
    bench_large(&mut c, &large);
    if let Some(fx) = fixtures() {
        bench_fixtures(&mut c, &fx);
    }
    let dialects_ran = bench_dialects(&mut c, &conversations, &dialect_fixtures());
    bench_dialect_parts(&mut c, &conversations);
    let front = frontend_input();
    let front_frames = envelope_frames(&front);
    let frontend_ran = bench_frontend(&mut c, &front, &front_frames);
    c.final_summary();
    if bench_mode && std::env::var_os("BENCH_NO_SUMMARY").is_none() {
        println!("(set BENCH_DUMP=DIR to write each input and both outputs there)");
        if small_ran {
            summary(&small, &large);
        }
        if dialects_ran {
            dialect_summary(&conversations);
        }
        if frontend_ran {
            frontend_summary(&front, &front_frames);
        }
    }
}
