//! Deterministic randomness for the pipeline: SplitMix64 draws keyed by what they decide, and
//! [`Permutation`], a seeded bijection of `[0, n)` computed per index in O(1) memory, so a
//! shuffled epoch over billions of rows needs no table and resumes from a single position.

/// SplitMix64's finaliser: a bijective scrambling of 64 bits.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A key for one decision, from the values that identify it (seed, epoch, window, ...).
pub fn key(parts: &[u64]) -> u64 {
    parts.iter().fold(0x6A09_E667_F3BC_C908, |acc, &p| mix(acc ^ mix(p)))
}

/// The next SplitMix64 draw, scaled to `[0, n)` (multiply-shift; the bias is below 2^-50 for
/// the sizes used here).
pub fn uniform(state: &mut u64, n: u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    ((mix(*state) as u128 * n as u128) >> 64) as u64
}

/// Fisher-Yates shuffle of `items` driven by `key`.
pub fn shuffle<T>(items: &mut [T], key: u64) {
    let mut state = key;
    for i in (1..items.len()).rev() {
        let j = uniform(&mut state, i as u64 + 1) as usize;
        items.swap(i, j);
    }
}

/// A pseudo-random permutation of `[0, n)`: a 4-round Feistel network on the smallest even
/// number of bits covering `n`, walked until it lands inside `[0, n)` (cycle walking keeps it a
/// bijection; at most 4 steps are expected since the domain is under 4n).
#[derive(Clone, Copy, Debug)]
pub struct Permutation {
    n: u64,
    half_bits: u32,
    keys: [u64; 4],
}

impl Permutation {
    pub fn new(n: u64, key: u64) -> Permutation {
        let bits = 64 - n.saturating_sub(1).leading_zeros();
        let half_bits = bits.div_ceil(2).max(1);
        let keys = [mix(key ^ 1), mix(key ^ 2), mix(key ^ 3), mix(key ^ 4)];
        Permutation { n, half_bits, keys }
    }

    /// Where index `i` (< n) goes.
    pub fn apply(&self, i: u64) -> u64 {
        debug_assert!(i < self.n);
        let mut x = i;
        loop {
            x = self.feistel(x);
            if x < self.n {
                return x;
            }
        }
    }

    fn feistel(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut left, mut right) = (x >> self.half_bits, x & mask);
        for k in self.keys {
            let next = left ^ (mix(right ^ k) & mask);
            left = right;
            right = next;
        }
        (left << self.half_bits) | right
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutations_are_bijections_and_depend_on_the_key() {
        for n in [1u64, 2, 3, 7, 64, 1000, 4097] {
            let p = Permutation::new(n, 42);
            let mut seen: Vec<u64> = (0..n).map(|i| p.apply(i)).collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..n).collect::<Vec<_>>(), "n={n}");
        }
        let (a, b) = (Permutation::new(1000, 1), Permutation::new(1000, 2));
        assert!((0..1000).filter(|&i| a.apply(i) != b.apply(i)).count() > 900);
        assert!((0..1000).filter(|&i| a.apply(i) == i).count() < 20, "a shuffle moves almost everything");
    }

    #[test]
    fn shuffle_is_deterministic() {
        let (mut a, mut b): (Vec<u32>, Vec<u32>) = ((0..50).collect(), (0..50).collect());
        shuffle(&mut a, 9);
        shuffle(&mut b, 9);
        assert_eq!(a, b);
        assert_ne!(a, (0..50).collect::<Vec<_>>());
    }
}
