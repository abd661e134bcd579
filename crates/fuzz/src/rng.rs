//! A small, fast, deterministic random number generator (SplitMix64).
//!
//! Every input is made by its own generator, seeded from the run's seed and the input's index,
//! so input `i` of seed `s` can be made again on its own: a crash that kills the process is
//! reproduced from `(s, i)` alone, without having written every input down first.

/// SplitMix64: one `u64` of state, good enough statistics for choosing mutations.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator for one run's seed.
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// The generator of input `index` of the run with `seed`.
    pub fn for_input(seed: u64, index: u64) -> Rng {
        let mut mixer = Rng::new(seed ^ 0x6a09_e667_f3bc_c909);
        let base = mixer.next_u64();
        let mut rng = Rng::new(base ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        rng.next_u64();
        rng
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut mixed = self.state;
        mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        mixed ^ (mixed >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        // The modulo bias is irrelevant at these sizes.
        (self.next_u64() % n as u64) as usize
    }

    /// True once in `n` times on average.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    /// One of `items`, which must not be empty.
    ///
    /// # Panics
    /// When `items` is empty.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// A random byte.
    pub fn byte(&mut self) -> u8 {
        self.next_u64() as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_reproducible_from_seed_and_index() {
        let first: Vec<u64> = (0..4).map(|i| Rng::for_input(7, i).next_u64()).collect();
        let again: Vec<u64> = (0..4).map(|i| Rng::for_input(7, i).next_u64()).collect();
        let other_seed: Vec<u64> = (0..4).map(|i| Rng::for_input(8, i).next_u64()).collect();
        assert_eq!(first, again);
        assert_ne!(first, other_seed);
        assert_ne!(first[0], first[1]);
    }

    #[test]
    fn below_stays_below() {
        let mut rng = Rng::new(1);
        assert!((0..1000).all(|_| rng.below(3) < 3));
        assert_eq!(rng.below(0), 0);
    }
}
