//! JAX's default PRNG on the host: the threefry2x32 block cipher and the few `jax.random`
//! functions MaxText's synthetic data draws from (`PRNGKey`, `split`, `randint`, `uniform`),
//! bit for bit. Followed: `jax/_src/random/threefry2x32.py` (`threefry2x32` rounds,
//! `_threefry_split_foldlike`, `_threefry_random_bits_partitionable`), `jax/_src/random/core.py`
//! (`_randint`, `_uniform`) and `jax/_src/random/prng.py` (`iota_2x32_shape`) of jax 0.10.2 on
//! PyPI; the same functions at jax main cec06d1 (v0.11.0+510).
//!
//! Since jax 0.5.0 `jax_threefry_partitionable` defaults to true: element `i` (row-major flat
//! index) of a `shape`-shaped draw gets the cipher of the counter pair `(i >> 32, i & 0xffffffff)`,
//! whatever the shape. So one element, or one host's rows of a batch, is computed alone and
//! equals the element of the whole draw. (The older layout, which depends on the total size, is
//! not implemented: no JAX release since 0.5.0 uses it by default.)

/// A raw threefry key, `jax.random.PRNGKey(seed)`'s two `uint32` words.
pub type Key = [u32; 2];

/// `jax.random.PRNGKey(seed)`: the 64-bit seed's high and low words (`threefry_seed`).
pub fn key(seed: u64) -> Key {
    [(seed >> 32) as u32, seed as u32]
}

/// The threefry2x32 block cipher (20 rounds) of the counter pair `x` under `key`.
pub fn threefry2x32(key: Key, x: [u32; 2]) -> [u32; 2] {
    const ROTATIONS: [[u32; 4]; 2] = [[13, 15, 26, 6], [17, 29, 16, 24]];
    let ks = [key[0], key[1], key[0] ^ key[1] ^ 0x1BD1_1BDA];
    let mut x = [x[0].wrapping_add(ks[0]), x[1].wrapping_add(ks[1])];
    for i in 0..5 {
        for r in ROTATIONS[i % 2] {
            x[0] = x[0].wrapping_add(x[1]);
            x[1] = x[1].rotate_left(r) ^ x[0];
        }
        x[0] = x[0].wrapping_add(ks[(i + 1) % 3]);
        x[1] = x[1].wrapping_add(ks[(i + 2) % 3]).wrapping_add(i as u32 + 1);
    }
    x
}

/// The cipher of element `index`'s counter (`iota_2x32_shape`: the flat index's high and low
/// words).
fn block(key: Key, index: u64) -> [u32; 2] {
    threefry2x32(key, [(index >> 32) as u32, index as u32])
}

/// Key `i` of `jax.random.split(key, n)` (for any `n > i`).
pub fn split(key: Key, i: u64) -> Key {
    block(key, i)
}

/// Element `index` of `jax.random.bits(key, shape)` for 32-bit words: the cipher's two words
/// xor-ed.
pub fn bits32(key: Key, index: u64) -> u32 {
    let [a, b] = block(key, index);
    a ^ b
}

/// `jax.random.randint(key, shape, minval, maxval, dtype=int32)`, element by element.
#[derive(Clone, Copy, Debug)]
pub struct RandInt {
    higher: Key,
    lower: Key,
    minval: i32,
    span: u32,
    multiplier: u32,
}

impl RandInt {
    pub fn new(key: Key, minval: i32, maxval: i32) -> RandInt {
        // `_randint`: two draws of 32 bits, reduced modulo the span as one 64-bit number; an empty
        // range gives `minval`.
        let span = if maxval <= minval { 1 } else { maxval.wrapping_sub(minval) as u32 };
        let m = (1u32 << 16) % span;
        let multiplier = m.wrapping_mul(m) % span;
        RandInt { higher: split(key, 0), lower: split(key, 1), minval, span, multiplier }
    }

    /// The element at row-major flat index `index` of the draw.
    pub fn at(&self, index: u64) -> i32 {
        let (hi, lo) = (bits32(self.higher, index), bits32(self.lower, index));
        // JAX computes in uint32 and lets the product and the sum wrap.
        let offset = (hi % self.span).wrapping_mul(self.multiplier).wrapping_add(lo % self.span) % self.span;
        self.minval.wrapping_add(offset as i32)
    }
}

/// Element `index` of `jax.random.uniform(key, shape)` (float32 in [0, 1)): the bits' top 23 as
/// the mantissa of a float in [1, 2), minus 1.
pub fn uniform_f32(key: Key, index: u64) -> f32 {
    f32::from_bits((bits32(key, index) >> 9) | 0x3F80_0000) - 1.0
}
