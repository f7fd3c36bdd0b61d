//! Contractions: `dot_general` (with a preferred result type, as fp8 products take it) and its
//! transposes (its VJP, and the fp8 product's backward pass), `matmul`, `einsum` for one or two
//! operands (each label at most once per operand, built from reductions, one `dot_general` and
//! a transpose), and the grouped matmul `ragged_dot`.

use super::trace::{apply1, op_error, op_error_at, Tensor};
use crate::ir::{DType, DotDims, Prim, RaggedDotMode};
use std::panic::Location;

impl Tensor {
    #[track_caller]
    pub fn dot_general(&self, other: &Tensor, dims: DotDims) -> Tensor {
        apply1(Prim::DotGeneral { dims, preferred: None }, &[self, other])
    }

    /// `dot_general` whose products accumulate into `dtype` (JAX's `preferred_element_type`),
    /// a float no narrower than the operands, which may be the two 8-bit formats mixed.
    #[track_caller]
    pub fn dot_general_preferred(&self, other: &Tensor, dims: DotDims, dtype: DType) -> Tensor {
        apply1(Prim::DotGeneral { dims, preferred: Some(dtype) }, &[self, other])
    }

    /// A grouped matmul (XLA's `ragged_dot`): `self[M,K]` holds consecutive groups of rows of
    /// sizes `group_sizes: s32[G]`, and row `m` of group `g` is multiplied by `rhs[g]`
    /// (`rhs: [G,K,N]`), giving `[M,N]`; rows past `sum(group_sizes)` are zero. This is how
    /// tokens sorted by expert meet their expert's weights.
    #[track_caller]
    pub fn ragged_dot(&self, rhs: &Tensor, group_sizes: &Tensor) -> Tensor {
        apply1(Prim::RaggedDot(RaggedDotMode::NonContracting { rhs_transposed: false }), &[self, rhs, group_sizes])
    }

    /// `[..., m, k] @ [k, n] -> [..., m, n]`, or a batched product of equal-rank operands
    /// `[b..., m, k] @ [b..., k, n]`.
    #[track_caller]
    pub fn matmul(&self, other: &Tensor) -> Tensor {
        let (r, s) = (self.rank(), other.rank());
        if r == 0 || s == 0 {
            op_error("matmul", "operands must have at least one dimension", &[self.ty(), other.ty()]);
        }
        if s <= 2 {
            return self.dot_general(
                other,
                DotDims { lhs_batch: vec![], rhs_batch: vec![], lhs_contract: vec![r - 1], rhs_contract: vec![0] },
            );
        }
        if r != s {
            op_error("matmul", "batched matmul needs operands of equal rank", &[self.ty(), other.ty()]);
        }
        let batch: Vec<usize> = (0..r - 2).collect();
        self.dot_general(
            other,
            DotDims {
                lhs_batch: batch.clone(),
                rhs_batch: batch,
                lhs_contract: vec![r - 1],
                rhs_contract: vec![s - 2],
            },
        )
    }
}

/// `einsum("btd,dhk->bthk", &[&x, &w])`. Labels in both operands and the output are batch
/// dimensions, in both operands only are contracted, in one operand only are summed first.
#[track_caller]
pub fn einsum(spec: &str, operands: &[&Tensor]) -> Tensor {
    let types: Vec<_> = operands.iter().map(|t| t.ty()).collect();
    let at = Location::caller();
    let fail = |msg: String| -> ! { op_error_at(&format!("einsum \"{spec}\""), &msg, &types, at) };
    let (ins, out) = spec.split_once("->").unwrap_or_else(|| fail("expected `inputs->output`".into()));
    let in_labels: Vec<Vec<char>> = ins.split(',').map(|s| s.trim().chars().collect()).collect();
    let out: Vec<char> = out.trim().chars().collect();
    if in_labels.len() != operands.len() || !(1..=2).contains(&operands.len()) {
        fail(format!("{} label groups for {} operands (one or two are supported)", in_labels.len(), operands.len()));
    }
    let mut sizes: Vec<(char, i64)> = Vec::new();
    for (labels, t) in in_labels.iter().zip(operands) {
        if labels.len() != t.rank() {
            fail(format!("labels {labels:?} do not match rank {}", t.rank()));
        }
        for (i, &c) in labels.iter().enumerate() {
            if labels[..i].contains(&c) {
                fail(format!("label '{c}' repeats within an operand"));
            }
            match sizes.iter().find(|(l, _)| *l == c) {
                Some(&(_, n)) if n != t.shape()[i] => fail(format!("label '{c}' has sizes {n} and {}", t.shape()[i])),
                Some(_) => {}
                None => sizes.push((c, t.shape()[i])),
            }
        }
    }
    for (i, &c) in out.iter().enumerate() {
        if out[..i].contains(&c) || !sizes.iter().any(|(l, _)| *l == c) {
            fail(format!("output label '{c}' repeats or appears in no operand"));
        }
    }
    let in_other = |k: usize, c: char| in_labels.iter().enumerate().any(|(j, l)| j != k && l.contains(&c));
    // Sum out labels that appear in one operand only and not in the output.
    let mut reduced: Vec<(Tensor, Vec<char>)> = Vec::new();
    for (k, (labels, t)) in in_labels.iter().zip(operands).enumerate() {
        let drop: Vec<isize> = (0..labels.len())
            .filter(|&i| !out.contains(&labels[i]) && !in_other(k, labels[i]))
            .map(|i| i as isize)
            .collect();
        let kept: Vec<char> = labels.iter().copied().filter(|c| out.contains(c) || in_other(k, *c)).collect();
        reduced.push((t.sum(&drop), kept));
    }
    let (result, labels) = if let [(x, xl), (y, yl)] = &reduced[..] {
        let batch: Vec<char> = out.iter().copied().filter(|c| xl.contains(c) && yl.contains(c)).collect();
        let contract: Vec<char> = xl.iter().copied().filter(|c| yl.contains(c) && !out.contains(c)).collect();
        let pos = |l: &[char], c: &char| l.iter().position(|x| x == c).expect("label present");
        let dims = DotDims {
            lhs_batch: batch.iter().map(|c| pos(xl, c)).collect(),
            rhs_batch: batch.iter().map(|c| pos(yl, c)).collect(),
            lhs_contract: contract.iter().map(|c| pos(xl, c)).collect(),
            rhs_contract: contract.iter().map(|c| pos(yl, c)).collect(),
        };
        let mut labels = batch.clone();
        labels.extend(xl.iter().filter(|c| !batch.contains(c) && !contract.contains(c)));
        labels.extend(yl.iter().filter(|c| !batch.contains(c) && !contract.contains(c)));
        (x.dot_general(y, dims), labels)
    } else {
        reduced.pop().expect("one operand")
    };
    let perm: Vec<usize> = out.iter().map(|c| labels.iter().position(|l| l == c).expect("label present")).collect();
    result.transpose(&perm)
}

/// The cotangent of `dot_general(lhs, rhs, dims)`'s lhs (of rank `lhs_rank`) from the result's
/// cotangent `g` (JAX's `_dot_general_transpose_lhs`): `g` contracted with `rhs` over the rhs's
/// free dims, in the lhs's dim order, accumulated into `preferred` when given.
pub fn dot_transpose_lhs(g: &Tensor, lhs_rank: usize, rhs: &Tensor, d: &DotDims, preferred: Option<DType>) -> Tensor {
    let me = Side { rank: lhs_rank, batch: &d.lhs_batch, contract: &d.lhs_contract };
    let other = Side { rank: rhs.rank(), batch: &d.rhs_batch, contract: &d.rhs_contract };
    transpose_side(g, me, rhs, other, false, preferred)
}

/// The cotangent of `dot_general(lhs, rhs, dims)`'s rhs (of rank `rhs_rank`), as
/// [`dot_transpose_lhs`] for the other side.
pub fn dot_transpose_rhs(g: &Tensor, lhs: &Tensor, rhs_rank: usize, d: &DotDims, preferred: Option<DType>) -> Tensor {
    let me = Side { rank: rhs_rank, batch: &d.rhs_batch, contract: &d.rhs_contract };
    let other = Side { rank: lhs.rank(), batch: &d.lhs_batch, contract: &d.lhs_contract };
    transpose_side(g, me, lhs, other, true, preferred)
}

/// One operand of a dot: its rank, batch and contracting dims.
struct Side<'a> {
    rank: usize,
    batch: &'a [usize],
    contract: &'a [usize],
}

impl Side<'_> {
    /// The dims neither batched nor contracted, in order.
    fn free(&self) -> Vec<usize> {
        (0..self.rank).filter(|d| !self.batch.contains(d) && !self.contract.contains(d)).collect()
    }
}

/// The cotangent of the operand `me` given the other operand's value `other` (and its dims
/// `them`). `swapped`: `me` is the rhs, so its free dims come last in the output cotangent `g`.
fn transpose_side(g: &Tensor, me: Side, other: &Tensor, them: Side, swapped: bool, preferred: Option<DType>) -> Tensor {
    let nb = me.batch.len();
    let (me_kept, other_kept) = (me.free(), them.free());
    // Positions of the other operand's free dims in `g`.
    let other_start = if swapped { nb } else { nb + me_kept.len() };
    let g_other: Vec<usize> = (other_start..other_start + other_kept.len()).collect();
    // The other operand's contracting dims survive in increasing order; each pairs with one of
    // my contracting dims.
    let mut pairs: Vec<(usize, usize)> = them.contract.iter().copied().zip(me.contract.iter().copied()).collect();
    pairs.sort_unstable();
    let partners = pairs.iter().map(|p| p.1);
    let dot = |a: &Tensor, b: &Tensor, dims: DotDims| match preferred {
        Some(dtype) => a.dot_general_preferred(b, dims, dtype),
        None => a.dot_general(b, dims),
    };
    // Contract `g` with `other` over the other's free dims, keeping my dims in the order in
    // which I have them: `g` first for the lhs, `other` first for the rhs (so an ordinary
    // matmul needs no transpose).
    let mut layout: Vec<usize> = me.batch.to_vec();
    let prod = if swapped {
        layout.extend(partners);
        layout.extend(&me_kept);
        let dims = DotDims {
            lhs_batch: them.batch.to_vec(),
            rhs_batch: (0..nb).collect(),
            lhs_contract: other_kept,
            rhs_contract: g_other,
        };
        dot(other, g, dims)
    } else {
        layout.extend(&me_kept);
        layout.extend(partners);
        let dims = DotDims {
            lhs_batch: (0..nb).collect(),
            rhs_batch: them.batch.to_vec(),
            lhs_contract: g_other,
            rhs_contract: other_kept,
        };
        dot(g, other, dims)
    };
    let mut perm = vec![0; me.rank];
    for (pos, &dim) in layout.iter().enumerate() {
        perm[dim] = pos;
    }
    prod.transpose(&perm)
}
