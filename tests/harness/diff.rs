//! Where two sequences first differ; shared by the harness, the soak bench and the fuzz checks (`fuzz/check.rs`
//! includes this file by path).

/// The index of the first element at which `a` and `b` differ; the shorter length when one is a prefix of the other.
pub fn first_difference<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()))
}
