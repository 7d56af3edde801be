//! SplitMix64: the one deterministic PRNG of the tests and benches, so every scenario and bench input is
//! reproducible by seed (`benches/inputs` includes this file by path).

#![allow(dead_code)]

#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    /// Starts from `state` as given (the benches' inputs were generated from unmixed seeds).
    pub fn from_state(state: u64) -> Self {
        Self(state)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// True with probability `num / den`.
    pub fn one_in(&mut self, num: u64, den: u64) -> bool {
        self.next_u64() % den < num
    }

    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }

    /// Sorted distinct cut offsets in `1..len`, at most `n` of them.
    pub fn cuts(&mut self, len: usize, n: usize) -> Vec<usize> {
        if len < 2 {
            return Vec::new();
        }
        let mut v: Vec<usize> = (0..n).map(|_| self.range(1, len - 1)).collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}
