//! The `[[frontend]]` routes (DESIGN 5.3, "Choosing"): which public path speaks which protocol, and what a request
//! on one asks for.

use http::Method;

use crate::config::Frontend;
use crate::frontend::Protocol;

/// The configured routes.
#[derive(Debug, Clone, Default)]
pub struct Routes {
    routes: Vec<(Frontend, Protocol)>,
}

/// What a request on a route asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Asked<'a> {
    /// `POST <path>`: a turn.
    Turn,
    /// `OPTIONS <path>`: a preflight, answered by the backend's answer on the run path.
    Preflight,
    /// `GET <path>/<chat id>/stream` (AI SDK): the chat's running stream.
    Resume(&'a str),
    /// Anything else on the route: forwarded as it is.
    Other,
}

impl Routes {
    pub fn new(frontends: &[Frontend]) -> Self {
        Self {
            routes: frontends.iter().map(|f| (f.clone(), f.protocol())).collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// The route `path` is on, and what the request asks for.
    pub fn find<'p>(&self, method: &Method, path: &'p str) -> Option<(&Frontend, Protocol, Asked<'p>)> {
        self.routes.iter().find_map(|(route, protocol)| {
            let asked = if path == route.path {
                match *method {
                    Method::POST => Asked::Turn,
                    Method::OPTIONS => Asked::Preflight,
                    _ => Asked::Other,
                }
            } else {
                let rest = path.strip_prefix(route.path.as_str())?.strip_prefix('/')?;
                match (rest.strip_suffix("/stream"), *protocol, method) {
                    (Some(id), Protocol::AiSdk, &Method::GET) if !id.is_empty() && !id.contains('/') => {
                        Asked::Resume(id)
                    }
                    _ => return None,
                }
            };
            Some((route, *protocol, asked))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_answers_its_path_and_the_ai_sdks_resume_path_only() {
        let f = |path: &str, protocol: &str| Frontend {
            path: path.into(),
            protocol: protocol.into(),
            run: "/run".into(),
            tool_results: "/tr".into(),
            agent_type: None,
        };
        let routes = Routes::new(&[f("/api/chat", "ai-sdk"), f("/agui", "ag-ui")]);
        let asked = |m: Method, p: &str| routes.find(&m, p).map(|(r, _, a)| (r.path.clone(), format!("{a:?}")));
        assert_eq!(
            asked(Method::POST, "/api/chat"),
            Some(("/api/chat".into(), "Turn".into()))
        );
        assert_eq!(
            asked(Method::OPTIONS, "/api/chat"),
            Some(("/api/chat".into(), "Preflight".into()))
        );
        assert_eq!(
            asked(Method::GET, "/api/chat/c-1/stream"),
            Some(("/api/chat".into(), "Resume(\"c-1\")".into()))
        );
        assert_eq!(
            asked(Method::GET, "/agui/c-1/stream"),
            None,
            "AG-UI has no resume route"
        );
        assert_eq!(asked(Method::GET, "/api/chat/a/b/stream"), None);
        assert_eq!(asked(Method::POST, "/api/chatter"), None);
        assert_eq!(
            asked(Method::GET, "/api/chat"),
            Some(("/api/chat".into(), "Other".into()))
        );
    }
}
