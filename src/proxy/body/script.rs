//! A scripted in-memory body for the adapters' unit tests, and helpers to poll it without a runtime.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use bytes::Bytes;
use http_body::{Body, Frame};

use crate::proxy::base::drain::DrainCut;
use crate::proxy::body::layer::{Drain, Ending, Gather, Layer};

use crate::proxy::upstream::error::StreamError;

/// What the scripted upstream does at one poll.
pub enum Step {
    Data(Bytes),
    Trailers,
    /// Fails (as an idle timeout: the one `StreamError` a test can make).
    Fail,
    End,
    Pending,
}

pub fn data(s: &str) -> Step {
    Step::Data(Bytes::copy_from_slice(s.as_bytes()))
}

/// A body that plays its steps in order, then waits forever; counts its polls.
pub struct Script {
    steps: VecDeque<Step>,
    polls: usize,
}

impl Script {
    pub fn new(steps: impl IntoIterator<Item = Step>) -> Self {
        Self {
            steps: steps.into_iter().collect(),
            polls: 0,
        }
    }

    pub fn polls(&self) -> usize {
        self.polls
    }

    /// One more step, played after the others.
    pub fn push(&mut self, step: Step) {
        self.steps.push_back(step);
    }
}

/// As the innermost layer of a stack under test: nothing to cut, a completed stream, nothing counted.
impl Drain for Script {
    fn cut_for_drain(&mut self) -> DrainCut {
        DrainCut::Nothing
    }
}

impl Layer for Script {
    fn ending(&mut self) -> Ending {
        Ending::Completed
    }
}

impl Body for Script {
    type Data = Bytes;
    type Error = StreamError;

    fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, StreamError>>> {
        let this = self.get_mut();
        this.polls += 1;
        match this.steps.pop_front() {
            Some(Step::Data(b)) => Poll::Ready(Some(Ok(Frame::data(b)))),
            Some(Step::Trailers) => Poll::Ready(Some(Ok(Frame::trailers(http::HeaderMap::new())))),
            Some(Step::Fail) => Poll::Ready(Some(Err(StreamError::IdleTimeout))),
            Some(Step::End) => Poll::Ready(None),
            Some(Step::Pending) | None => Poll::Pending,
        }
    }
}

/// What one poll returned, comparable.
#[derive(Debug, PartialEq, Eq)]
pub enum Seen {
    Data(String),
    Trailers,
    Err,
    End,
    Pending,
}

impl Seen {
    pub fn data(s: &str) -> Self {
        Seen::Data(s.to_owned())
    }

    pub fn of<E>(p: Poll<Option<Result<Frame<Bytes>, E>>>) -> Self {
        match p {
            Poll::Pending => Seen::Pending,
            Poll::Ready(None) => Seen::End,
            Poll::Ready(Some(Err(_))) => Seen::Err,
            Poll::Ready(Some(Ok(f))) => match f.into_data() {
                Ok(d) => Seen::Data(String::from_utf8_lossy(&d).into_owned()),
                Err(_) => Seen::Trailers,
            },
        }
    }
}

struct Noop;

impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

fn noop() -> Waker {
    Waker::from(Arc::new(Noop))
}

/// Polls `body` once with a waker that does nothing.
pub fn poll<B: Body<Data = Bytes> + Unpin>(body: &mut B) -> Seen {
    let waker = noop();
    Seen::of(Pin::new(body).poll_frame(&mut Context::from_waker(&waker)))
}

/// `poll_more` once.
pub fn more<G: Gather>(g: &mut G) -> Option<String> {
    let waker = noop();
    let d = g.poll_more(&mut Context::from_waker(&waker))?;
    Some(String::from_utf8_lossy(&d).into_owned())
}
