//! The frontends on several instances sharing one Redis (DESIGN 5.3, "the same chat continues the same backend
//! agent, on any instance"; issue 35): an AG-UI thread whose run ended awaiting a frontend tool is continued on the
//! other instance, which sends the answer to the backend's `tool_results` with the thread's agent and only the
//! awaited call; an AI SDK chat's running stream is resumed from the other instance's `<path>/<chat id>/stream`.
//! A real `redis-server` on 127.0.0.1, started here (skipped with a note when missing, except under `CI=true`).

mod harness;

use std::path::PathBuf;
use std::time::Duration;

use harness::agent_backend::{frontend_tool, slow, AgentBackend, FRONTEND_TOOL, GATEWAY_CONFIG, TOOL_RESULTS};
use harness::prelude::*;
use harness::redis_server::RedisServer;
use serde_json::{json, Value};

const KEY: &str = "frontends-instances-binding-key-0123456789";
/// How long the other instance may take to see a thread's record in Redis.
const RECORD_WAIT: Duration = Duration::from_secs(10);

/// Redis, the backend and two gateways on them.
struct Setup {
    _redis: RedisServer,
    backend: AgentBackend,
    a: Process,
    b: Process,
    config: PathBuf,
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.config);
    }
}

async fn setup(runs: Vec<harness::agent_backend::Run>) -> Option<Setup> {
    let redis = RedisServer::start()?;
    let backend = AgentBackend::start(runs, None).await;
    let config = std::env::temp_dir().join(format!("sse-gw-frontends-instances-{}.toml", std::process::id()));
    std::fs::write(&config, GATEWAY_CONFIG).expect("config");
    let url = redis.url();
    let env = [
        ("SSE_GATEWAY__RESUME__STORE", "redis"),
        ("SSE_GATEWAY__RESUME__REDIS_URL", url.as_str()),
        ("SSE_GATEWAY__RESUME__BINDING_KEY", KEY),
        ("RUST_LOG", "warn"),
    ];
    let (path, up) = (config.display().to_string(), backend.url());
    let args = ["--config", path.as_str(), "--upstream", up.as_str()];
    let a = Process::start(&args, &env);
    let b = Process::start(&args, &env);
    Some(Setup {
        _redis: redis,
        backend,
        a,
        b,
        config,
    })
}

/// The AG-UI events of a response body.
fn events(body: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(body)
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).expect("an event"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ag_ui_thread_awaiting_a_frontend_tool_is_continued_on_the_other_instance() {
    let Some(s) = setup(vec![frontend_tool("Where am I?")]).await else {
        return;
    };
    let user = json!({"id": "u1", "role": "user", "content": "Where am I?"});
    let first = json!({"threadId": "thread-1", "runId": "run-1", "messages": [user], "tools": [], "context": []});
    let headers = [("content-type", "application/json"), ("accept", "text/event-stream")];
    let url_a = format!("http://{}/agui", s.a.addr);
    let (parts, body) = send("POST", &url_a, &headers, first.to_string()).await;
    assert_eq!(parts.status, 200, "{}", String::from_utf8_lossy(&body));
    let evs = events(&body);
    let last = evs.last().expect("events");
    assert_eq!(last["type"], "RUN_FINISHED", "{evs:#?}");
    let pending = last["outcome"]["pendingToolCallIds"].clone();
    assert_eq!(pending, json!(["toolu_loc"]));
    // The client answers its tool and runs again; the load balancer sends it to B.
    let call = json!({"id": "toolu_loc", "type": "function", "function": {"name": FRONTEND_TOOL, "arguments": "{}"}});
    let answer = json!({"id": "t1", "role": "tool", "toolCallId": "toolu_loc", "content": r#"{"city":"Paris"}"#});
    let search =
        json!({"id": "toolu_search", "type": "function", "function": {"name": "search_docs", "arguments": "{}"}});
    let search_result =
        json!({"id": "t0", "role": "tool", "toolCallId": "toolu_search", "content": "needs a location"});
    let messages = json!([user, {"id": "a1", "role": "assistant", "toolCalls": [search, call]}, search_result, answer]);
    let second = json!({"threadId": "thread-1", "runId": "run-2", "messages": messages, "tools": [], "context": []});
    let url_b = format!("http://{}/agui", s.b.addr);
    // The first instance writes the thread's record to Redis as its stream ends: give it the moment it takes,
    // which a loaded CI machine stretches past 2 s.
    let deadline = std::time::Instant::now() + RECORD_WAIT;
    let (parts, body) = loop {
        let (parts, body) = send("POST", &url_b, &headers, second.to_string()).await;
        if parts.status != 400 || std::time::Instant::now() >= deadline {
            break (parts, body);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(parts.status, 200, "{}", String::from_utf8_lossy(&body));
    let evs = events(&body);
    assert_eq!(
        evs.last().map(|e| e["type"].clone()),
        Some(json!("RUN_FINISHED")),
        "{evs:#?}"
    );
    let text: String = evs
        .iter()
        .filter(|e| e["type"] == "TEXT_MESSAGE_CONTENT")
        .map(|e| e["delta"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(text, "You are in Paris: it is sunny.");
    let sent: Vec<Value> = s
        .backend
        .recorded()
        .iter()
        .filter(|r| r.target == TOOL_RESULTS)
        .map(|r| serde_json::from_slice(&r.body).expect("JSON"))
        .collect();
    assert_eq!(sent.len(), 1, "one tool_results");
    let agent = s.backend.first_agent().expect("the first run's agent");
    assert_eq!(
        sent[0]["agent_uuid"],
        agent.as_str(),
        "the thread's agent, from the other instance"
    );
    let results = sent[0]["tool_results"].as_array().expect("tool_results");
    assert_eq!(results.len(), 1, "only the awaited call: {results:?}");
    assert_eq!(results[0]["tool_use_id"], "toolu_loc");
    assert!(s.backend.problems().is_empty(), "{:?}", s.backend.problems());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ai_sdk_chat_running_on_one_instance_is_resumed_from_the_other() {
    let Some(s) = setup(vec![slow("Tell me slowly", 30, Duration::from_millis(100))]).await else {
        return;
    };
    let body = json!({"id": "chat-9", "trigger": "submit-message", "messages": [
        {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "Tell me slowly"}]}
    ]});
    let url_a = format!("http://{}/api/chat", s.a.addr);
    let first = tokio::spawn(async move {
        send(
            "POST",
            &url_a,
            &[("content-type", "application/json")],
            body.to_string(),
        )
        .await
    });
    // B finds the chat's stream in Redis once A holds it, and replays it from the start to its end.
    let url_b = format!("http://{}/api/chat/chat-9/stream", s.b.addr);
    let mut resumed = None;
    for _ in 0..40 {
        let (parts, body) = send("GET", &url_b, &[], Vec::new()).await;
        if parts.status == 200 {
            resumed = Some((parts, body));
            break;
        }
        assert_eq!(parts.status, 204);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (parts, body) = resumed.expect("B resumes the chat's stream while it runs");
    assert_eq!(
        parts
            .headers
            .get("x-vercel-ai-ui-message-stream")
            .map(|v| v.to_str().unwrap_or("")),
        Some("v1")
    );
    let text = String::from_utf8_lossy(&body).to_string();
    let deltas: String = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).expect("a chunk"))
        .filter(|c| c["type"] == "text-delta")
        .map(|c| c["delta"].as_str().unwrap_or("").to_owned())
        .collect();
    let want: String = (0..30).map(|i| format!("piece{i} ")).collect();
    assert_eq!(deltas, want, "the whole message, replayed from the start");
    assert!(text.ends_with("data: [DONE]\n\n"));
    let (parts, _) = first.await.expect("the first read");
    assert_eq!(parts.status, 200);
}
