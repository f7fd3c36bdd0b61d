//! The two 8-bit float formats of fp8 training (arXiv 2209.05433, as `ml_dtypes` and XLA define
//! them): `float8_e4m3fn` (4 exponent bits, bias 7, 3 mantissa bits, no infinities, NaN is
//! `S.1111.111`, largest finite 448) for activations and weights, `float8_e5m2` (IEEE-like:
//! 5 exponent bits, bias 15, 2 mantissa bits, infinities, largest finite 57344) for gradients.
//! Conversions from wider floats round to nearest, ties to even; a value past the largest
//! finite one after rounding becomes NaN (e4m3fn, which has no infinity) or infinity (e5m2), as
//! `ml_dtypes` converts. XLA's `convert` does the same on the devices; fp8 training never relies
//! on overflow, since it clamps to the largest finite value before converting.

/// An 8-bit float format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum F8 {
    E4M3FN,
    E5M2,
}

impl F8 {
    fn exponent_bits(self) -> i32 {
        match self {
            F8::E4M3FN => 4,
            F8::E5M2 => 5,
        }
    }

    fn mantissa_bits(self) -> i32 {
        match self {
            F8::E4M3FN => 3,
            F8::E5M2 => 2,
        }
    }

    fn bias(self) -> i32 {
        (1 << (self.exponent_bits() - 1)) - 1
    }

    /// The largest finite value: 448 (e4m3fn), 57344 (e5m2), `jnp.finfo(dtype).max`.
    pub fn max(self) -> f64 {
        match self {
            F8::E4M3FN => 448.0,
            F8::E5M2 => 57344.0,
        }
    }

    /// The bit pattern of NaN (the one `ml_dtypes` produces).
    fn nan(self) -> u8 {
        match self {
            F8::E4M3FN => 0x7F,
            F8::E5M2 => 0x7E,
        }
    }

    /// The value of bit pattern `bits`.
    pub fn decode(self, bits: u8) -> f64 {
        let (e, m) = (self.exponent_bits(), self.mantissa_bits());
        let sign = if bits & 0x80 != 0 { -1.0 } else { 1.0 };
        let exp = ((bits >> m) & ((1 << e) - 1)) as i32;
        let mant = (bits & ((1 << m) - 1)) as i32;
        let all_ones = (1 << e) - 1;
        match self {
            F8::E4M3FN if exp == all_ones && mant == (1 << m) - 1 => return f64::NAN,
            F8::E5M2 if exp == all_ones => return if mant == 0 { sign * f64::INFINITY } else { f64::NAN },
            _ => {}
        }
        let scale = |k: i32| 2f64.powi(k);
        if exp == 0 {
            sign * mant as f64 * scale(1 - self.bias() - m)
        } else {
            sign * (1.0 + mant as f64 * scale(-m)) * scale(exp - self.bias())
        }
    }

    /// The bit pattern nearest to `v` (ties to even).
    pub fn encode(self, v: f64) -> u8 {
        if v.is_nan() {
            return self.nan();
        }
        let sign: u8 = if v.is_sign_negative() { 0x80 } else { 0 };
        let a = v.abs();
        let m = self.mantissa_bits();
        let min_exp = 1 - self.bias();
        if a.is_infinite() {
            return self.overflow(sign);
        }
        // The spacing of representable values around `a`: 2^(e - m), with e no lower than the
        // smallest normal exponent (below it the values are subnormal, equally spaced).
        let e = if a == 0.0 { min_exp } else { exponent(a).max(min_exp) };
        let quantum = 2f64.powi(e - m);
        let rounded = round_half_even(a / quantum) * quantum;
        if rounded > self.max() {
            return self.overflow(sign);
        }
        if rounded < 2f64.powi(min_exp) {
            return sign | (rounded / 2f64.powi(min_exp - m)) as u8;
        }
        // Rounding may carry into the next binade: take the exponent of the rounded value.
        let e = exponent(rounded);
        let mant = (rounded / 2f64.powi(e - m)) as i32 - (1 << m);
        sign | (((e + self.bias()) << m) | mant) as u8
    }

    fn overflow(self, sign: u8) -> u8 {
        match self {
            F8::E4M3FN => sign | self.nan(),
            F8::E5M2 => sign | 0x7C,
        }
    }
}

/// `floor(log2(a))` of a positive finite `a`, exactly.
fn exponent(a: f64) -> i32 {
    let biased = ((a.to_bits() >> 52) & 0x7FF) as i32;
    if biased == 0 {
        // f64 subnormals are far below every f8 value; their exact exponent does not matter.
        -1075
    } else {
        biased - 1023
    }
}

fn round_half_even(x: f64) -> f64 {
    let r = x.round();
    if (r - x).abs() == 0.5 && r % 2.0 != 0.0 {
        r - x.signum()
    } else {
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every bit pattern decodes to a value that encodes back to itself (NaNs to NaN), and the
    /// formats' landmarks are `ml_dtypes`' (`jnp.finfo(jnp.float8_e4m3fn)`: max 448, smallest
    /// normal 2^-6, smallest subnormal 2^-9; e5m2: max 57344, smallest normal 2^-14, smallest
    /// subnormal 2^-16).
    #[test]
    fn every_pattern_round_trips_and_landmarks_match_ml_dtypes() {
        for f in [F8::E4M3FN, F8::E5M2] {
            for bits in 0..=255u8 {
                let v = f.decode(bits);
                if v.is_nan() {
                    assert!(f.decode(f.encode(v)).is_nan());
                } else if v == 0.0 {
                    assert_eq!(f.encode(v), bits, "{f:?} {bits:#04x}");
                } else {
                    assert_eq!(f.encode(v), bits, "{f:?} {bits:#04x} = {v}");
                }
            }
        }
        assert_eq!(F8::E4M3FN.decode(0x7E), 448.0);
        assert_eq!(F8::E4M3FN.decode(0x08), 2f64.powi(-6));
        assert_eq!(F8::E4M3FN.decode(0x01), 2f64.powi(-9));
        assert_eq!(F8::E5M2.decode(0x7B), 57344.0);
        assert_eq!(F8::E5M2.decode(0x04), 2f64.powi(-14));
        assert_eq!(F8::E5M2.decode(0x01), 2f64.powi(-16));
        assert_eq!(F8::E5M2.decode(0x7C), f64::INFINITY);
    }

    /// Rounding: to nearest, ties to even, into the next binade, and past the largest value.
    #[test]
    fn rounding_is_nearest_even_with_ml_dtypes_overflow() {
        let e4 = |v: f64| F8::E4M3FN.decode(F8::E4M3FN.encode(v));
        let e5 = |v: f64| F8::E5M2.decode(F8::E5M2.encode(v));
        // Between 1 and 1.125 (e4m3's spacing at 1 is 1/8): the tie goes to the even mantissa.
        assert_eq!(e4(1.0625), 1.0);
        assert_eq!(e4(1.1875), 1.25);
        assert_eq!(e4(1.07), 1.125);
        // 1.96875 rounds up into the next binade.
        assert_eq!(e4(1.96875), 2.0);
        // 464 is halfway between 448 and (the missing) 480: ties to even keep 448; beyond, NaN.
        assert_eq!(e4(464.0), 448.0);
        assert!(e4(470.0).is_nan());
        assert_eq!(e4(-3.3), -3.25);
        // Subnormals: e4m3's spacing below 2^-6 is 2^-9.
        assert_eq!(e4(3.4 * 2f64.powi(-9)), 3.0 * 2f64.powi(-9));
        assert_eq!(e4(2f64.powi(-11)), 0.0);
        // e5m2: spacing 1/4 at 1; 61440 (halfway to 2^16) rounds to even, i.e. up: infinity.
        assert_eq!(e5(1.125), 1.0);
        assert_eq!(e5(1.375), 1.5);
        assert_eq!(e5(61439.0), 57344.0);
        assert_eq!(e5(61440.0), f64::INFINITY);
        assert_eq!(e5(-1e9), f64::NEG_INFINITY);
    }
}
