//! The demo's cogency run (`--demo-dialect cogency`): the events cogency 3.3's agent yields in its default event
//! mode, as a backend frames them: `json.dumps(event)` (Python's defaults: `, ` and `: `, non-ASCII as
//! `\uXXXX`), one SSE event each (tests/fixtures/dialects/cogency_call_result.sse is the recorded shape).
//!
//! Two iterations with a tool call each (the `call` before the `think` that preceded it in the model's text,
//! since cogency flushes `think` at `execute`; `metric` after `execute` and after `result`; a `result` whose
//! content is the batch's JSON array), then the answer, `end`, and the late `metric` after it.

use serde_json::{json, Value};

use crate::envelope::pyjson;
use crate::protocol::PyStyle;

/// One iteration with a tool: what the model called and thought, and what the tool returned.
struct Step<'a> {
    tool: &'a str,
    args: Value,
    think: &'a str,
    result: &'a str,
}

/// The run's SSE events for `query`, timestamps from `t0` (seconds since the epoch).
pub fn stream(query: &str, t0: f64) -> Vec<String> {
    let steps = [
        Step {
            tool: "web_search",
            args: json!({"query": "weather Paris today"}),
            think: "The user asks about the weather in Paris. I should search the web first.",
            result: "Paris weather (weather.example, 1 hour ago): 18 \u{b0}C, sunny, light wind.",
        },
        Step {
            tool: "calculator",
            args: json!({"expression": "18*9/5+32"}),
            think: "Readers may want Fahrenheit too: 18 \u{b0}C is 18*9/5+32.",
            result: "64.4",
        },
    ];
    let mut clock = Clock(t0);
    let (mut input, mut output, mut duration) = (0u64, 0u64, 0.0f64);
    let mut metric = |clock: &mut Clock, step_in: u64, step_out: u64, step_secs: f64| {
        (input, output, duration) = (input + step_in, output + step_out, duration + step_secs);
        json!({
            "type": "metric",
            "step": {"input": step_in, "output": step_out, "duration": step_secs},
            "total": {"input": input, "output": output, "duration": duration},
            "timestamp": clock.tick(),
        })
    };
    let mut events = vec![json!({"type": "user", "content": query, "timestamp": clock.tick()})];
    for (i, s) in steps.iter().enumerate() {
        let call = pyjson::to_string(&json!({"name": s.tool, "args": s.args}), PyStyle::Ascii);
        events.push(json!({"type": "call", "content": call, "timestamp": clock.tick()}));
        events.push(json!({"type": "think", "content": s.think, "timestamp": clock.tick()}));
        events.push(json!({"type": "execute", "timestamp": clock.tick()}));
        events.push(metric(&mut clock, 280 + 40 * i as u64, 12, 1.0));
        let content = json!([{"tool": s.tool, "status": "success", "content": s.result}]);
        events.push(json!({
            "type": "result",
            "payload": {"tools_executed": 1, "success_count": 1, "failure_count": 0},
            "content": pyjson::to_string(&content, PyStyle::Ascii),
            "timestamp": clock.tick(),
        }));
        events.push(metric(&mut clock, 0, 0, 0.125));
    }
    events.push(json!({
        "type": "respond",
        "content": "It is 18 \u{b0}C (64.4 \u{b0}F) and sunny in Paris right now, with a light wind.",
        "timestamp": clock.tick(),
    }));
    events.push(json!({"type": "end", "timestamp": clock.tick()}));
    events.push(metric(&mut clock, 360, 24, 0.875));
    events
        .iter()
        .map(|e| format!("data: {}\n\n", pyjson::to_string(e, PyStyle::Ascii)))
        .collect()
}

/// cogency's timestamps: `time.time()` at each event, here an eighth of a second apart.
struct Clock(f64);

impl Clock {
    fn tick(&mut self) -> f64 {
        self.0 += 0.125;
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_python_json_of_the_cogency_3_3_shapes() {
        let events = stream("Caf\u{e9}?", 1_750_000_000.0);
        let types: Vec<String> = events
            .iter()
            .map(|e| {
                let body = e.strip_prefix("data: ").and_then(|e| e.strip_suffix("\n\n")).unwrap();
                assert!(body.is_ascii() && body.contains("\", \""), "{body}");
                let v: Value = serde_json::from_str(body).unwrap();
                v["type"].as_str().unwrap().to_owned()
            })
            .collect();
        let call = ["call", "think", "execute", "metric", "result", "metric"];
        let want: Vec<&str> = ["user"]
            .into_iter()
            .chain(call)
            .chain(call)
            .chain(["respond", "end", "metric"])
            .collect();
        assert_eq!(types, want);
        assert!(events[0]
            .starts_with("data: {\"type\": \"user\", \"content\": \"Caf\\u00e9?\", \"timestamp\": 1750000000.125}"));
        assert!(events[1].contains(r#""{\"name\": \"web_search\", \"args\": {\"query\": \"weather Paris today\"}}""#));
        assert!(events
            .last()
            .unwrap()
            .contains(r#""total": {"input": 960, "output": 48, "duration": 3.125}"#));
    }
}
