//! Byte searches the item states share: a needle, a needle's start at the end of the input, the CDATA prefix.

/// Prefix of a CDATA section.
pub const CDATA_OPEN: &[u8] = b"<![CDATA[";

/// Whether `hay` ends with a proper prefix of `needle` of at least one
/// byte; returns that prefix's length.
pub fn partial_suffix(hay: &[u8], needle: &[u8]) -> usize {
    let max = needle.len().saturating_sub(1).min(hay.len());
    (1..=max)
        .rev()
        .find(|&n| hay[hay.len() - n..] == needle[..n])
        .unwrap_or(0)
}

/// Finds `needle` in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(hay, needle)
}
