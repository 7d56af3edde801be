//! The native stream, byte for byte (DESIGN 4): the fields of every envelope type against the one table in
//! `EnvelopeKind::extras`, and the envelope boundaries of the four types frontends read whole, offline and through
//! the daemon, in both dialects.

mod harness;

use serde_json::{json, Value};
use sse_gateway::envelope::EnvelopeKind;
use sse_gateway::translate::{translate_all, Options, DEFAULT_BUDGET};

use harness::core::emitter::{
    emit, native_split, py_dumps, Args, Attr, Citation, ClientContent, EmitOpts, Emitted, Format, Image, Item,
    MetaInit, ServerContent,
};
use harness::core::envelopes::{check, parse, Envelope, Out, FALLBACK};
use harness::prelude::{send, sse_head, without_ids, Emulator, Step, TestGateway};

fn meta(format: Format, history: Option<Value>) -> Item {
    Item::MetaInit(MetaInit::new("agent-1", None, format, "q", history))
}

/// A run that produces all 13 envelope types.
fn every_type(format: Format) -> Vec<Item> {
    let cite = |t: &str, attrs: Vec<(&str, Attr)>| Citation::new(t, attrs, "cited");
    vec![
        meta(format, None),
        Item::thinking(["hmm"], true),
        Item::text(
            ["Hello"],
            true,
            vec![
                cite(
                    "char_location",
                    vec![
                        ("document_index", Attr::Num(0)),
                        ("document_title", Attr::Str("Doc".into())),
                        ("start_char_index", Attr::Num(1)),
                        ("end_char_index", Attr::Num(5)),
                        // Not in the protocol: the model's own fields, dropped natively.
                        ("start_block_index", Attr::Num(2)),
                        ("file_id", Attr::Str("file_1".into())),
                    ],
                ),
                cite(
                    "page_location",
                    vec![
                        ("document_index", Attr::Num(1)),
                        ("document_title", Attr::Str(String::new())),
                        ("start_page_number", Attr::Num(3)),
                        ("end_page_number", Attr::Num(4)),
                    ],
                ),
                cite(
                    "web_search_result_location",
                    vec![
                        ("url", Attr::Str("https://e.com".into())),
                        ("title", Attr::Str("E".into())),
                        ("encrypted_index", Attr::Str("Eo8B".into())),
                    ],
                ),
            ],
        ),
        Item::call(false, "toolu_01", "shot", Args::Json(json!({"a": 1}))),
        Item::call(true, "srvtoolu_01", "web_search", Args::Json(json!({"q": "x"}))),
        Item::result(
            "toolu_01",
            "shot",
            ClientContent::multimodal("taken", vec![Image::new("data:image/png;base64,iVBOR", "image/png")]),
        ),
        Item::server_result(
            "web_search_tool_result",
            "srvtoolu_01",
            None,
            ServerContent::Json(json!([{"url": "https://e.com"}])),
        ),
        Item::AwaitingFrontendTools(json!([{"tool_use_id": "toolu_02", "name": "ask", "input": {}}])),
        Item::MetaFiles(json!({"files": [{"file_id": "f1", "filename": "a.txt"}]})),
        Item::ContentError(r#"{"type": "overloaded_error", "message": "busy"}"#.into()),
        Item::MetaFinal(json!({"stop_reason": "end_turn"})),
        Item::Done,
    ]
}

/// Checks one envelope's fields against the type's row of the table: the four common fields, then exactly the
/// table's fields in its order, every required one present.
fn check_fields(e: &Envelope) -> Result<(), String> {
    let kind = EnvelopeKind::parse(&e.kind).ok_or_else(|| format!("unknown type {}", e.kind))?;
    let table = kind.extras();
    let got: Vec<&str> = e.extras.iter().map(|(k, _)| k.as_str()).collect();
    let mut want = Vec::new();
    for f in table {
        if !f.optional || got.contains(&f.name) {
            want.push(f.name);
        }
    }
    if got != want {
        return Err(format!(
            "{}: fields {got:?}, the table says {want:?}: {}",
            e.kind, e.json
        ));
    }
    for (k, v) in &e.extras {
        let f = table.iter().find(|f| f.name == k).ok_or("unreachable")?;
        let ok = if f.number { v.is_number() } else { v.is_string() };
        if !ok || v.is_null() {
            return Err(format!("{}: field {k} is {v}: {}", e.kind, e.json));
        }
    }
    Ok(())
}

#[test]
fn every_envelope_type_carries_exactly_the_fields_of_the_table_in_order() {
    for format in [Format::Xml, Format::Raw] {
        let em = emit(&every_type(format), &EmitOpts::default(), FALLBACK, 1);
        let (out, _) = translate_all(Options::default(), FALLBACK, &em.sse);
        let outs = parse(&out).expect("well-formed output");
        let mut seen = Vec::new();
        for o in &outs {
            let Out::Env(e) = o else { continue };
            if let Err(why) = check_fields(e) {
                panic!("{format:?}: {why}");
            }
            seen.push(e.kind.clone());
        }
        for k in EnvelopeKind::ALL {
            assert!(
                seen.iter().any(|s| s == k.as_str()),
                "{format:?}: no {k} envelope in {seen:?}"
            );
        }
        // And the whole stream is what the emitter, written from DESIGN, expects byte for byte.
        check(&em.expected, &out, DEFAULT_BUDGET).unwrap_or_else(|e| panic!("{format:?}: {e}"));
    }
}

#[test]
fn translation_doc_lists_each_types_fields_as_the_table_does() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/TRANSLATION.md")).expect("doc");
    for k in EnvelopeKind::ALL {
        let names: Vec<String> = k.extras().iter().map(|f| format!("`{}`", f.name)).collect();
        let fields = if names.is_empty() {
            "—".to_owned()
        } else {
            names.join(", ")
        };
        let row = format!("| `{}` | {fields} |", k.as_str());
        assert!(doc.contains(&row), "docs/TRANSLATION.md lacks the row {row}");
    }
}

// ------------------------------------------------------------- boundaries

/// Contents of a given byte size in three flavours: plain, quote-heavy (twice its size once escaped) and
/// multi-byte.
fn filler(size: usize, flavour: usize) -> String {
    let unit = ["plain words ", "\"q\" \\ \"\" ", "é😀漢字 "][flavour];
    let mut s = String::new();
    while s.len() + unit.len() <= size {
        s.push_str(unit);
    }
    while s.len() < size {
        s.push('x');
    }
    s
}

/// One of the four whole-read items with a payload of about `size` bytes.
fn whole_read(kind: usize, size: usize, flavour: usize, format: Format) -> Vec<Item> {
    let s = filler(size, flavour);
    let item = match kind {
        0 => return vec![meta(format, Some(json!([{"role": "user", "content": s}]))), Item::Done],
        1 => Item::AwaitingFrontendTools(json!([{"tool_use_id": "toolu_01", "name": "ask", "input": {"q": s}}])),
        2 if flavour == 0 => Item::ContentError(s),
        2 => Item::ContentError(py_dumps(&json!({"type": "error", "error": {"message": s}}), true)),
        _ => Item::MetaFiles(json!({"files": [{"file_id": "file_01", "filename": s}]})),
    };
    vec![meta(format, None), item, Item::Done]
}

fn sse_script(body: Vec<u8>) -> Vec<Step> {
    vec![sse_head(), Step::Write(body), Step::EndChunks]
}

const SIZES: [usize; 9] = [10, 900, 1500, 1800, 1950, 2000, 2100, 4500, 9000];

fn cases() -> Vec<(String, Emitted)> {
    let mut v = Vec::new();
    for format in [Format::Xml, Format::Raw] {
        for kind in 0..4 {
            for size in SIZES {
                for flavour in 0..3 {
                    let items = whole_read(kind, size, flavour, format);
                    let em = emit(&items, &EmitOpts::default(), FALLBACK, size as u64);
                    v.push((format!("{format:?} kind {kind} size {size} flavour {flavour}"), em));
                }
            }
        }
    }
    v
}

/// Envelopes of the whole-read types in `out`, grouped into blocks (each ends with `final:true`).
fn whole_read_blocks(out: &[u8]) -> Vec<Vec<Envelope>> {
    let mut blocks = Vec::new();
    let mut cur = Vec::new();
    for o in parse(out).expect("well-formed output") {
        let Out::Env(e) = o else { continue };
        if !matches!(
            e.kind.as_str(),
            "meta_init" | "awaiting_frontend_tools" | "error" | "meta_files"
        ) {
            continue;
        }
        let fin = e.fin;
        cur.push(e);
        if fin {
            blocks.push(std::mem::take(&mut cur));
        }
    }
    blocks
}

/// Checks every case's output: the emitter's byte-exact expectation, then, for each whole-read block, the same
/// number of envelopes with the same deltas as the native rule computes from the block's content. Returns
/// (blocks sent whole although escaped over the budget, blocks cut in several).
fn check_cases(outputs: &[(String, Emitted, Vec<u8>)]) -> (usize, usize) {
    let (mut whole_over, mut cut) = (0, 0);
    for (name, em, out) in outputs {
        check(&em.expected, out, DEFAULT_BUDGET).unwrap_or_else(|e| panic!("{name}: {e}"));
        for block in whole_read_blocks(out) {
            let content: String = block.iter().map(|e| e.delta.as_str()).collect();
            // The native formatter measures the empty envelope with `"final":false`.
            let last = &block[block.len() - 1];
            let fixed = last.json.len() - (serde_json::to_string(&last.delta).map_or(2, |s| s.len()) - 2) + 1;
            let want = native_split(&content, fixed, DEFAULT_BUDGET);
            let got: Vec<String> = block.iter().map(|e| e.delta.clone()).collect();
            assert_eq!(
                got.len(),
                want.len(),
                "{name}: {} envelopes, natively {}",
                got.len(),
                want.len()
            );
            assert_eq!(got, want, "{name}: deltas differ from the native cut");
            if block.len() == 1 && last.len > DEFAULT_BUDGET {
                whole_over += 1;
            }
            if block.len() > 1 {
                cut += 1;
            }
        }
    }
    (whole_over, cut)
}

#[test]
fn whole_read_items_are_cut_where_the_native_formatter_cuts_them() {
    let outputs: Vec<_> = cases()
        .into_iter()
        .map(|(name, em)| {
            let (out, _) = translate_all(Options::default(), FALLBACK, &em.sse);
            (name, em, out)
        })
        .collect();
    let (whole_over, cut) = check_cases(&outputs);
    // The sizes straddle the budget: some items fit whole only by the native rule, some are cut.
    assert!(whole_over > 10, "only {whole_over} items sent whole over the budget");
    assert!(cut > 10, "only {cut} items cut");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_read_items_are_cut_natively_through_the_daemon() {
    let cases = cases();
    let streams: Vec<Vec<u8>> = cases.iter().map(|(_, em)| em.sse.clone()).collect();
    let up = Emulator::start(move |r| {
        let i: usize = r.target.trim_start_matches("/case/").parse().unwrap_or(0);
        sse_script(streams[i].clone())
    })
    .await;
    let gw = TestGateway::start(&up.url(), |_| {}).await;
    let mut outputs = Vec::new();
    for (i, (name, em)) in cases.into_iter().enumerate() {
        let (parts, body) = send(
            "POST",
            &gw.url(&format!("/case/{i}")),
            &[("x-agent-id", FALLBACK)],
            "{}",
        )
        .await;
        assert_eq!(parts.status, 200, "{name}");
        outputs.push((name, em, without_ids(&body)));
    }
    let (whole_over, cut) = check_cases(&outputs);
    assert!(
        whole_over > 10 && cut > 10,
        "{whole_over} whole over the budget, {cut} cut"
    );
    gw.stop().await;
}
