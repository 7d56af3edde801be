//! No input can abort the process (issue 13, item 1): the real binary under `ulimit -v`, fed the inputs that
//! used to multiply its output by an identifier's length, keeps serving with every line within budget.

mod harness;

use harness::client::assert_same_bytes;
use harness::prelude::{send, sse_head, without_ids, Emulator, Process, Step, TestGateway};

/// Address space the gateway may map: its idle size is ~150 MiB (threads' stacks and malloc arenas, capped by
/// `MALLOC_ARENA_MAX`); an input that made it allocate gigabytes (a 4 MiB agent id repeated by 2,000 envelopes)
/// aborts under this limit.
const VIRTUAL_KIB: u64 = 1 << 20;

/// Starts the binary under `ulimit -v`.
fn start_limited(upstream: &str) -> Process {
    Process::start_with_ulimit(
        &format!("-v {VIRTUAL_KIB}"),
        &["--upstream", upstream],
        &[("MALLOC_ARENA_MAX", "2"), ("TOKIO_WORKER_THREADS", "2")],
    )
}

/// A meta_init whose agent id is `id_len` bytes, then `deltas` one-byte text deltas, all in one write.
fn amplifying_stream(id_len: usize, deltas: usize) -> Vec<u8> {
    let id = "a".repeat(id_len);
    let mut s = format!(
        "data: <meta_init data=\"{{&quot;format&quot;: &quot;xml&quot;, &quot;agent_uuid&quot;: &quot;{id}&quot;}}\"></meta_init>\n\n\
         data: <content-block-text>\n\n"
    );
    for _ in 0..deltas {
        s.push_str("data: x\n\n");
    }
    s.push_str("data: </content-block-text>\n\ndata: [DONE]\n\n");
    s.into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_amplifying_agent_id_cannot_abort_the_process_under_a_memory_limit() {
    let stream = amplifying_stream(4 << 20, 2000);
    let up = Emulator::start(move |_| vec![sse_head(), Step::WriteAll(stream.clone()), Step::EndChunks]).await;
    let mut gw = start_limited(&up.url());
    let url = format!("http://{}/agent/run", gw.addr);
    let long_header = "h".repeat(60_000);
    for round in 0..2 {
        let (parts, body) = send("POST", &url, &[("x-agent-id", long_header.as_str())], "{}").await;
        assert_eq!(parts.status, 200, "round {round}");
        let text = String::from_utf8(without_ids(&body)).expect("utf-8");
        assert!(text.ends_with("data: [DONE]\n\n"), "round {round}: stream cut short");
        assert!(text.contains("invalid_id"), "round {round}: the bad id is reported");
        let mut text_lines = 0;
        for line in text.split("\n\n").filter(|l| !l.is_empty()) {
            // meta_init is one item, cut natively; everything else stays within the budget.
            if line.starts_with(r#"data: {"type":"meta_init""#) {
                continue;
            }
            assert!(
                line.len() <= "data: ".len() + 2048,
                "round {round}: a line of {} bytes",
                line.len()
            );
            text_lines += usize::from(line.starts_with(r#"data: {"type":"text""#));
        }
        assert_eq!(text_lines, 2001, "round {round}: every delta and the final marker");
        assert!(gw.child.try_wait().expect("try_wait").is_none(), "the gateway exited");
    }
    gw.signal("TERM");
    let status = gw.wait().expect("exit after SIGTERM");
    assert!(status.success(), "exit status {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_carried_over_to_later_frames_is_the_whole_translation() {
    use sse_gateway::translate::{translate_all, Options};
    // 20,000 tiny deltas in one write: ~1.3 MB of envelopes from 180 KB, more than one frame's limit.
    let stream = amplifying_stream(36, 20_000);
    let want = translate_all(Options::default(), "fallback", &stream).0;
    let up = Emulator::start({
        let stream = stream.clone();
        move |_| vec![sse_head(), Step::WriteAll(stream.clone()), Step::EndChunks]
    })
    .await;
    let gw = TestGateway::start(&up.url(), |_| {}).await;
    let (parts, body) = send("POST", &gw.url("/agent/run"), &[("x-agent-id", "fallback")], "{}").await;
    assert_eq!(parts.status, 200);
    assert!(
        want.len() > 1 << 20,
        "the input does not amplify enough: {}",
        want.len()
    );
    assert_same_bytes(
        &without_ids(&body),
        &want,
        "the gateway's output against the translation",
    );
    gw.stop().await;
}
