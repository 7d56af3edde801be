//! Agent scopes (DESIGN 3.5): which agent each envelope belongs to.
//!
//! The stream's agent comes from the first `meta_init` (or the caller's
//! fallback). A nested `meta_init` whose parent is the current agent opens a
//! child scope; the child's `meta_final` closes it, and so does a tool result
//! answering a tool call made in an outer scope (the parent's
//! `spawn_subagent` call returning).

/// Deepest nesting kept; deeper children are attributed to the deepest.
pub const MAX_DEPTH: usize = 64;
/// Tool call ids remembered per scope; the oldest are forgotten beyond it.
pub const MAX_CALLS_PER_SCOPE: usize = 1024;

#[derive(Debug)]
struct Scope {
    agent: String,
    /// Tool calls made in this scope and not yet answered.
    calls: Vec<String>,
}

/// What a `meta_init` did to the scopes.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    /// The stream's own agent is now known.
    Root,
    /// A child scope was opened.
    Child,
    /// A child was opened, but its parent is not the current agent (parallel
    /// subagents): attributed best-effort, counted as a conflict.
    Conflict,
    /// The same agent announced itself again.
    Same,
}

#[derive(Debug)]
pub struct Scopes {
    stack: Vec<Scope>,
    /// The root agent came from a `meta_init`, not the fallback.
    root_known: bool,
}

impl Scopes {
    pub fn new(fallback_agent: &str) -> Self {
        Self {
            stack: vec![Scope {
                agent: fallback_agent.to_owned(),
                calls: Vec::new(),
            }],
            root_known: false,
        }
    }

    /// The agent of the current scope.
    pub fn agent(&self) -> &str {
        // The root scope is never popped.
        self.stack.last().map_or("", |s| s.agent.as_str())
    }

    /// The stream's agent once a `meta_init` settled it (it never changes after that).
    pub fn root_agent(&self) -> Option<&str> {
        self.root_known
            .then(|| self.stack.first().map(|s| s.agent.as_str()))
            .flatten()
    }

    #[cfg(test)]
    pub fn depth(&self) -> usize {
        self.stack.len()
    }

    pub fn meta_init(&mut self, agent: Option<&str>, parent: Option<&str>) -> Opened {
        let Some(agent) = agent.filter(|a| !a.is_empty()) else {
            return Opened::Same;
        };
        if !self.root_known && self.stack.len() == 1 && parent != Some(self.agent()) {
            // The first meta_init names the stream's agent, unless it is a
            // child of the fallback agent (a resumed run spawning one).
            self.root_known = true;
            self.stack[0].agent = agent.to_owned();
            return Opened::Root;
        }
        self.root_known = true;
        if agent == self.agent() {
            return Opened::Same;
        }
        let outcome = if parent == Some(self.agent()) {
            Opened::Child
        } else {
            Opened::Conflict
        };
        if self.stack.len() < MAX_DEPTH {
            self.stack.push(Scope {
                agent: agent.to_owned(),
                calls: Vec::new(),
            });
        }
        outcome
    }

    /// `meta_final` closes the current child scope (never the root).
    pub fn meta_final(&mut self) {
        if self.stack.len() > 1 {
            self.stack.pop();
        }
    }

    pub fn tool_call(&mut self, id: &str) {
        if id.is_empty() {
            return;
        }
        if let Some(scope) = self.stack.last_mut() {
            if scope.calls.len() == MAX_CALLS_PER_SCOPE {
                scope.calls.remove(0);
            }
            scope.calls.push(id.to_owned());
        }
    }

    /// Makes `child` the current agent, directly under the root (`None`: the root). Dialects whose every message
    /// names its agent (the Agent SDK's `parent_tool_use_id`) set it per message instead of nesting.
    pub fn enter(&mut self, child: Option<&str>) {
        let child = child.filter(|c| !c.is_empty() && *c != self.stack[0].agent);
        match child {
            Some(c) if self.stack.len() == 2 && self.stack[1].agent == c => {}
            Some(c) => {
                self.stack.truncate(1);
                self.stack.push(Scope {
                    agent: c.to_owned(),
                    calls: Vec::new(),
                });
            }
            None => self.stack.truncate(1),
        }
    }

    /// A tool result: if it answers a call of an outer scope, the scopes
    /// inside that one are closed.
    pub fn tool_result(&mut self, id: &str) {
        let Some(level) = self.stack.iter().rposition(|s| s.calls.iter().any(|c| c == id)) else {
            return;
        };
        self.stack.truncate(level + 1);
        let calls = &mut self.stack[level].calls;
        calls.retain(|c| c != id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_open_on_meta_init_and_close_on_the_parents_tool_result() {
        let mut s = Scopes::new("fallback");
        assert_eq!(s.agent(), "fallback");
        assert_eq!(s.meta_init(Some("root"), None), Opened::Root);
        s.tool_call("spawn-1");
        assert_eq!(s.meta_init(Some("child"), Some("root")), Opened::Child);
        assert_eq!(s.agent(), "child");
        s.tool_call("child-call");
        s.tool_result("child-call");
        assert_eq!(s.agent(), "child");
        s.tool_result("spawn-1");
        assert_eq!(s.agent(), "root");
        assert_eq!(s.depth(), 1);
    }

    #[test]
    fn a_resumed_run_keeps_its_agent_when_a_child_names_it_as_parent() {
        let mut s = Scopes::new("resumed");
        assert_eq!(s.meta_init(Some("child"), Some("resumed")), Opened::Child);
        assert_eq!(s.agent(), "child");
        s.meta_final();
        assert_eq!(s.agent(), "resumed");
    }

    /// Scopes with `root` named and its child `child` open.
    fn nested(root: &str, child: &str) -> Scopes {
        let mut s = Scopes::new("f");
        s.meta_init(Some(root), None);
        s.meta_init(Some(child), Some(root));
        s
    }

    #[test]
    fn meta_final_closes_a_child_but_never_the_root() {
        let mut s = nested("root", "child");
        s.meta_final();
        assert_eq!(s.agent(), "root");
        s.meta_final();
        assert_eq!(s.agent(), "root");
    }

    #[test]
    fn a_sibling_started_inside_a_child_is_a_conflict() {
        let mut s = nested("root", "a");
        assert_eq!(s.meta_init(Some("b"), Some("root")), Opened::Conflict);
        assert_eq!(s.agent(), "b");
    }

    #[test]
    fn depth_is_bounded() {
        let mut s = Scopes::new("f");
        s.meta_init(Some("0"), None);
        for i in 1..200 {
            let parent = s.agent().to_owned();
            s.meta_init(Some(&i.to_string()), Some(&parent));
        }
        assert_eq!(s.depth(), MAX_DEPTH);
    }
}
