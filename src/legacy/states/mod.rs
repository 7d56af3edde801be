//! The parser's state handlers: the methods of `Parser` that read one state's input, one file per family of
//! states. They sit above the parser (`super::super`) and the item types it holds, which never name them.

mod body;
mod dialects;
mod failure;
mod items;
mod raw;
mod text;
