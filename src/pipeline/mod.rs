//! What every stage of the translator shares, below them all: the settings (`Options`) and the observer the
//! stages report into (`Observer`, `Stats`, `ParseErrorKind`), plus how a stream ended.

mod observer;
mod options;

pub use observer::{Observer, ParseErrorKind, Stats};
pub use options::*;
