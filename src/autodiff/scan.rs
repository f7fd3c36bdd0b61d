//! Differentiating `scan`: a forward scan that also emits per-iteration residuals, and a
//! reverse scan over a backward body.
//!
//! The backward body is traced first, so we learn what it reads: it replays the forward
//! body, except that every equation depending on the carry or the scanned slices reads its
//! results (and nested extras) from placeholder inputs — the residual candidates — while
//! loop-invariant equations are recomputed from the consts. Dead-code elimination then keeps
//! only the placeholders the VJP rules actually use; exactly those become extra stacked
//! outputs of the forward scan. A remat region inside the body exposes only its inputs and
//! the values its policy saves (its VJP recomputes the rest), so the body's remat policy
//! decides what is saved per iteration.

use super::{activity, Extra};
use crate::ir::{Graph, Prim, Scan, ValueId};
use crate::tensor::{Tensor, Trace};
use std::sync::Arc;

/// What the forward scan recorded for its VJP.
#[derive(Clone)]
pub(crate) struct ScanTape {
    /// Per-iteration residuals stacked along a leading axis (extra outputs of the forward scan).
    stacked: Vec<Tensor>,
    /// Operands `consts ++ (carry cts ++ const ct accumulators) ++ (xs ++ y cts ++ residuals)`,
    /// results `(carry cts ++ const ct accumulators) ++ x cts`.
    backward: Arc<Graph>,
    /// Indices (within their group) of the carries, consts, ys and xs with cotangents.
    ct_carry: Vec<usize>,
    ct_consts: Vec<usize>,
    ct_ys: Vec<usize>,
    ct_xs: Vec<usize>,
}

impl ScanTape {
    pub(crate) fn map_stacked(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> ScanTape {
        ScanTape { stacked: self.stacked.iter().map(f).collect(), ..self.clone() }
    }
}

pub(crate) fn forward(dest: &Trace, s: &Scan, ins: &[&Tensor], ins_active: &[bool]) -> (Vec<Tensor>, Extra) {
    let body = &*s.body;
    let (nk, nc) = (s.num_consts, s.num_carry);
    let nx = ins.len() - nk - nc;
    let ny = body.outputs.len() - nc;
    let act = activity::scan_body(s, ins_active);
    let input_active = |i: usize| act[body.inputs[i].index()];
    let ct_consts: Vec<usize> = (0..nk).filter(|&k| input_active(k)).collect();
    let ct_carry: Vec<usize> = (0..nc).filter(|&c| input_active(nk + c)).collect();
    let ct_xs: Vec<usize> = (0..nx).filter(|&x| input_active(nk + nc + x)).collect();
    let ct_ys: Vec<usize> = (0..ny).filter(|&y| act[body.outputs[nc + y].index()]).collect();
    let varies = per_iteration(body, nk);

    // The forward body, evaluated with a tape so nested scans and remat regions record extras.
    let tf = Trace::root(None);
    let f_args: Vec<Tensor> = body.inputs.iter().map(|&v| tf.input(body.ty(v).clone())).collect();
    let tape_f = super::forward_with(&tf, body, &f_args, act.clone(), &mut |_, _| None);

    // The backward body's fixed inputs, in scan operand order.
    let tb = Trace::root(None);
    let input = |v: ValueId| tb.input(body.ty(v).clone());
    let consts: Vec<Tensor> = body.inputs[..nk].iter().map(|&v| input(v)).collect();
    let carry_ct: Vec<Tensor> = ct_carry.iter().map(|&c| input(body.inputs[nk + c])).collect();
    let const_acc: Vec<Tensor> = ct_consts.iter().map(|&k| input(body.inputs[k])).collect();
    let xs: Vec<Tensor> = body.inputs[nk + nc..].iter().map(|&v| input(v)).collect();
    let y_ct: Vec<Tensor> = ct_ys.iter().map(|&y| input(body.outputs[nc + y])).collect();
    let num_fixed = nk + carry_ct.len() + const_acc.len() + nx + y_ct.len();

    // Residual candidates: a placeholder input per per-iteration forward value.
    let mut sources: Vec<Tensor> = Vec::new();
    let mut residual = |t: &Tensor| {
        sources.push(t.clone());
        tb.input(t.ty().clone())
    };
    let carry_in: Vec<Tensor> = (0..nc).map(|c| residual(tape_f.value(body.inputs[nk + c]))).collect();
    let b_args: Vec<Tensor> = consts.iter().chain(&carry_in).chain(&xs).cloned().collect();
    let tape_b = super::forward_with(&tb, body, &b_args, act, &mut |i, eqn| {
        varies[i].then(|| {
            let outs = eqn.outputs.iter().map(|&o| residual(tape_f.value(o))).collect();
            (outs, tape_f.extras[i].map_tensors(&mut residual))
        })
    });

    let mut out_cts: Vec<Option<Tensor>> = vec![None; body.outputs.len()];
    for (&c, ct) in ct_carry.iter().zip(&carry_ct) {
        out_cts[c] = Some(ct.clone());
    }
    for (&y, ct) in ct_ys.iter().zip(&y_ct) {
        out_cts[nc + y] = Some(ct.clone());
    }
    let in_cts = super::backward(&tb, body, &tape_b, &out_cts);
    let or_zeros = |i: usize| in_cts[i].clone().unwrap_or_else(|| tape_b.value(body.inputs[i]).zeros_like());
    let mut b_outs: Vec<Tensor> = ct_carry.iter().map(|&c| or_zeros(nk + c)).collect();
    for (&k, acc) in ct_consts.iter().zip(&const_acc) {
        b_outs.push(match &in_cts[k] {
            Some(ct) => acc + ct,
            None => acc.clone(),
        });
    }
    b_outs.extend(ct_xs.iter().map(|&x| or_zeros(nk + nc + x)));
    let (mut gb, _) = tb.finish(&b_outs.iter().collect::<Vec<_>>());
    let used = gb.dce();
    let keep = &used[num_fixed..];
    let mut position = 0;
    gb.inputs.retain(|_| {
        position += 1;
        position <= num_fixed || keep[position - num_fixed - 1]
    });

    // The forward scan: the original results, then the residuals the backward body reads.
    let mut f_outs = tape_f.outputs(body);
    f_outs.extend(sources.into_iter().zip(keep).filter(|(_, &k)| k).map(|(t, _)| t));
    let (gf, _) = tf.finish(&f_outs.iter().collect::<Vec<_>>());
    let fwd = Scan { body: Arc::new(gf), length: s.length, num_consts: nk, num_carry: nc, reverse: s.reverse };
    let mut results = dest.bind(Prim::Scan(fwd), ins);
    let stacked = results.split_off(nc + ny);
    (results, Extra::Scan(ScanTape { stacked, backward: Arc::new(gb), ct_carry, ct_consts, ct_ys, ct_xs }))
}

/// Runs the backward body in a scan of the opposite direction; returns operand cotangents.
pub(crate) fn backward(
    dest: &Trace,
    s: &Scan,
    ins: &[&Tensor],
    outs: &[&Tensor],
    tape: &ScanTape,
    cts: &[Option<Tensor>],
) -> Vec<Option<Tensor>> {
    let (nk, nc) = (s.num_consts, s.num_carry);
    let ct_or_zeros = |i: usize| cts[i].clone().unwrap_or_else(|| outs[i].zeros_like());
    let mut operands: Vec<Tensor> = ins[..nk].iter().map(|&t| t.clone()).collect();
    operands.extend(tape.ct_carry.iter().map(|&c| ct_or_zeros(c)));
    operands.extend(tape.ct_consts.iter().map(|&k| ins[k].zeros_like()));
    operands.extend(ins[nk + nc..].iter().map(|&t| t.clone()));
    operands.extend(tape.ct_ys.iter().map(|&y| ct_or_zeros(nc + y)));
    operands.extend(tape.stacked.iter().cloned());
    let bwd = Scan {
        body: tape.backward.clone(),
        length: s.length,
        num_consts: nk,
        num_carry: tape.ct_carry.len() + tape.ct_consts.len(),
        reverse: !s.reverse,
    };
    let mut results = dest.bind(Prim::Scan(bwd), &operands.iter().collect::<Vec<_>>()).into_iter();
    let mut in_cts = vec![None; ins.len()];
    for &c in &tape.ct_carry {
        in_cts[nk + c] = results.next();
    }
    for &k in &tape.ct_consts {
        in_cts[k] = results.next();
    }
    for &x in &tape.ct_xs {
        in_cts[nk + nc + x] = results.next();
    }
    in_cts
}

/// Per equation of a scan body: does it depend on the carry or the scanned slices (inputs
/// from `num_consts` on)? Equations that do not are loop-invariant.
fn per_iteration(body: &Graph, num_consts: usize) -> Vec<bool> {
    let mut varies = vec![false; body.types.len()];
    for v in &body.inputs[num_consts..] {
        varies[v.index()] = true;
    }
    body.eqns
        .iter()
        .map(|e| {
            let v = e.inputs.iter().any(|i| varies[i.index()]);
            for o in &e.outputs {
                varies[o.index()] = v;
            }
            v
        })
        .collect()
}
