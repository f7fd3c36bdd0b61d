//! Counter-based random numbers: JAX's threefry2x32 PRNG with its partitionable bit layout,
//! traced from 32-bit integer operations (as JAX's lowering of `threefry2x32_p` expands it).
//! Each element's bits depend only on the key and the element's index, so results are the
//! same on every backend and under any sharding. A key is a `u32[2]` tensor.

use super::shape_ops::stack;
use super::trace::{usage_error, Tensor, Trace};
use crate::ir::DType;
use std::f64::consts::SQRT_2;

/// `jax.random.PRNGKey(seed)` for a seed below 2^32: `[0, seed]`.
#[track_caller]
pub fn key(ctx: &Trace, seed: u32) -> Tensor {
    ctx.constant(DType::U32, &[2], &[0.0, seed as f64])
}

/// A key from a traced integer scalar seed (so the seed can be a program input).
#[track_caller]
pub fn key_from(seed: &Tensor) -> Tensor {
    let lo = seed.astype(DType::U32).reshape(&[1]);
    super::concatenate(&[&lo.zeros_like(), &lo], 0)
}

/// The threefry2x32 block cipher applied elementwise to counter pairs `(x0, x1)` (u32 arrays of
/// one shape) under `key`.
#[track_caller]
pub fn threefry2x32(key: &Tensor, x0: &Tensor, x1: &Tensor) -> (Tensor, Tensor) {
    check_key(key);
    let word = |i: i64| key.slice_axis(0, i, i + 1).reshape(&[]).broadcast_to(x0.shape());
    threefry2x32_words(&word(0), &word(1), x0, x1)
}

/// `threefry2x32` with the key's two words given per element (arrays of the counters' shape),
/// so that one cipher serves a batch of keys.
fn threefry2x32_words(k0: &Tensor, k1: &Tensor, x0: &Tensor, x1: &Tensor) -> (Tensor, Tensor) {
    let k2 = k0.bitwise_xor(k1).bitwise_xor(0x1BD1_1BDA_u32 as f64);
    let ks = [k0.clone(), k1.clone(), k2];
    const ROTATIONS: [[u32; 4]; 2] = [[13, 15, 26, 6], [17, 29, 16, 24]];
    let mut x = [x0 + &ks[0], x1 + &ks[1]];
    for i in 0..5 {
        for r in ROTATIONS[i % 2] {
            let sum = &x[0] + &x[1];
            let rotated = x[1].shift_left(r as f64).bitwise_or(x[1].shift_right_logical((32 - r) as f64));
            x = [sum.clone(), sum.bitwise_xor(&rotated)];
        }
        x = [&x[0] + &ks[(i + 1) % 3], &x[1] + &ks[(i + 2) % 3] + (i + 1) as f64];
    }
    let [a, b] = x;
    (a, b)
}

#[track_caller]
fn check_key(key: &Tensor) {
    if key.dtype() != DType::U32 || key.shape() != [2] {
        usage_error(&format!("a key must be u32[2], not {}", key.ty()));
    }
}

/// The pair of u32 counters (high and low word) of each element's row-major index.
#[track_caller]
fn counters(ctx: &Trace, shape: &[i64]) -> (Tensor, Tensor) {
    let n: i64 = shape.iter().product();
    if n > u32::MAX as i64 {
        usage_error(&format!("random arrays of more than 2^32 elements ({shape:?}) are not supported"));
    }
    let mut lo = ctx.zeros(DType::U32, shape);
    let mut stride = 1i64;
    for d in (0..shape.len()).rev() {
        lo = lo + ctx.iota(DType::U32, shape, d) * stride as f64;
        stride *= shape[d];
    }
    (lo.zeros_like(), lo)
}

/// Uniform random u32 bits of `shape` (`jax.random.bits`).
#[track_caller]
pub fn bits(key: &Tensor, shape: &[i64]) -> Tensor {
    check_key(key);
    bits_each(&key.reshape(&[1, 2]), shape).reshape(shape)
}

/// `bits(keys[i], shape)` for each row of `keys: u32[k, 2]`, stacked: `u32[k, ...shape]`. One
/// cipher over the batch: the same bits, and a program a k-th the size of k separate draws
/// (what XLA's compile time follows).
#[track_caller]
fn bits_each(keys: &Tensor, shape: &[i64]) -> Tensor {
    if keys.dtype() != DType::U32 || keys.rank() != 2 || keys.shape()[1] != 2 {
        usage_error(&format!("a batch of keys must be u32[k, 2], not {}", keys.ty()));
    }
    let batched: Vec<i64> = std::iter::once(keys.shape()[0]).chain(shape.iter().copied()).collect();
    let trailing: Vec<usize> = (1..batched.len()).collect();
    let (hi, lo) = counters(keys.trace(), shape);
    let (hi, lo) = (hi.broadcast_in_dim(&batched, &trailing), lo.broadcast_in_dim(&batched, &trailing));
    let word = |i: i64| keys.slice_axis(1, i, i + 1).reshape(&[batched[0]]).broadcast_in_dim(&batched, &[0]);
    let (a, b) = threefry2x32_words(&word(0), &word(1), &hi, &lo);
    a.bitwise_xor(&b)
}

/// `n` new keys, `u32[n, 2]` (`jax.random.split`).
#[track_caller]
pub fn split(key: &Tensor, n: i64) -> Tensor {
    let (hi, lo) = counters(key.trace(), &[n]);
    let (a, b) = threefry2x32(key, &hi, &lo);
    stack(&[&a, &b], 1)
}

/// A key derived from `key` and `data` (`jax.random.fold_in`).
#[track_caller]
pub fn fold_in(key: &Tensor, data: u32) -> Tensor {
    let ctx = key.trace();
    let (a, b) = threefry2x32(key, &ctx.zeros(DType::U32, &[1]), &ctx.full(data as f64, DType::U32, &[1]));
    super::concatenate(&[&a, &b], 0)
}

/// `fold_in(key, i)` for `i` in `0..n`, as rows of a `u32[n, 2]`: both encrypt the counter pair
/// `(0, i)`, so these are the rows of `split(key, n)`, drawn by one cipher.
#[track_caller]
pub fn fold_in_each(key: &Tensor, n: i64) -> Tensor {
    split(key, n)
}

/// Uniform in `[0, 1)` with 23 random mantissa bits, as an f32 (the same values as JAX's f32
/// sampler, which builds `1.m` by bit-casting and subtracts 1), from random `bits`.
fn unit_f32(bits: Tensor) -> Tensor {
    bits.shift_right_logical(9.0).astype(DType::F32) * (2f64).powi(-23)
}

/// Uniform in `[lo, hi)` (`jax.random.uniform`).
#[track_caller]
pub fn uniform(key: &Tensor, shape: &[i64], dtype: DType, lo: f64, hi: f64) -> Tensor {
    uniform_of(bits(key, shape), dtype, lo, hi)
}

/// `uniform(keys[i], ...)` for each row of `keys: u32[k, 2]`, stacked (see `bits_each`).
#[track_caller]
pub fn uniform_each(keys: &Tensor, shape: &[i64], dtype: DType, lo: f64, hi: f64) -> Tensor {
    uniform_of(bits_each(keys, shape), dtype, lo, hi)
}

fn uniform_of(bits: Tensor, dtype: DType, lo: f64, hi: f64) -> Tensor {
    (unit_f32(bits) * (hi - lo) + lo).maximum(lo).astype(dtype)
}

/// Standard normal (`jax.random.normal`): `sqrt(2) * erfinv(u)` for `u` uniform in `(-1, 1)`.
#[track_caller]
pub fn normal(key: &Tensor, shape: &[i64], dtype: DType) -> Tensor {
    check_key(key);
    normal_each(&key.reshape(&[1, 2]), shape, dtype).reshape(shape)
}

/// `normal(keys[i], shape, dtype)` for each row of `keys: u32[k, 2]`, stacked (see `bits_each`).
#[track_caller]
pub fn normal_each(keys: &Tensor, shape: &[i64], dtype: DType) -> Tensor {
    let lo = next_after_f32(-1.0, f32::INFINITY) as f64;
    (uniform_of(bits_each(keys, shape), DType::F32, lo, 1.0).erf_inv() * SQRT_2).astype(dtype)
}

/// Standard normal truncated to `(lower, upper)` (`jax.random.truncated_normal`), by inverting
/// the CDF on a uniform sample between the bounds' CDF values.
#[track_caller]
pub fn truncated_normal(key: &Tensor, lower: f64, upper: f64, shape: &[i64], dtype: DType) -> Tensor {
    check_key(key);
    truncated_normal_each(&key.reshape(&[1, 2]), lower, upper, shape, dtype).reshape(shape)
}

/// `truncated_normal(keys[i], ...)` for each row of `keys: u32[k, 2]`, stacked (see `bits_each`).
#[track_caller]
pub fn truncated_normal_each(keys: &Tensor, lower: f64, upper: f64, shape: &[i64], dtype: DType) -> Tensor {
    let bits = bits_each(keys, shape);
    let shape = bits.shape().to_vec();
    let ctx = keys.trace();
    let a = ctx.scalar(lower / SQRT_2, DType::F32).erf().broadcast_to(&shape);
    let b = ctx.scalar(upper / SQRT_2, DType::F32).erf().broadcast_to(&shape);
    let u = (unit_f32(bits) * &(&b - &a) + &a).maximum(&a);
    let lo = next_after_f32(lower as f32, f32::INFINITY) as f64;
    let hi = next_after_f32(upper as f32, f32::NEG_INFINITY) as f64;
    (u.erf_inv() * SQRT_2).clamp(lo, hi).astype(dtype)
}

/// The f32 next to `x` in the direction of `toward`.
fn next_after_f32(x: f32, toward: f32) -> f32 {
    if x.is_nan() || toward.is_nan() || x == toward {
        return x;
    }
    if x == 0.0 {
        return f32::from_bits(1).copysign(toward);
    }
    let up = (toward > x) == (x > 0.0);
    f32::from_bits(if up { x.to_bits() + 1 } else { x.to_bits() - 1 })
}
