//! Legacy items.
