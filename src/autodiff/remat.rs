//! Differentiating a remat (`checkpoint`) region. Forward: the body is inlined and only the
//! values tagged with a name the policy saves are kept for later. Backward: the body is
//! recomputed from its operands (behind an optimization barrier where `fences.inputs` says, so
//! XLA cannot merge the recomputation with the forward pass), with the saved values substituted
//! for their tags, and then differentiated. Recomputation that only fed saved values is dead and
//! removed, and so is a saved value the backward pass does not read (its barrier lane is dropped by
//! `Graph::dce`), as JAX's `save_only_these_names` keeps only the named values that are
//! residuals (e.g. MaxText's `mlpwo`, only added to the residual stream). A
//! composite whose results are all saved (blockwise attention's output and statistics under
//! `minimal_with_context`) is not recomputed at all: its backward pass reads only operands and
//! results.

use super::{activity, Extra};
use crate::ir::{Prim, Remat};
use crate::tensor::{Tensor, Trace};

pub(crate) fn forward(dest: &Trace, r: &Remat, ins: &[&Tensor]) -> (Vec<Tensor>, Extra) {
    let args: Vec<Tensor> = ins.iter().map(|&t| t.clone()).collect();
    // Nothing inside is active here: a plain evaluation, with no residuals for nested scans.
    let tape = super::forward_with(dest, &r.body, &args, vec![false; r.body.types.len()], &mut |_, _| None);
    let saved = saved_eqns(r).into_iter().map(|i| tape.value(r.body.eqns[i].outputs[0]).clone()).collect();
    (tape.outputs(&r.body), Extra::Remat(saved))
}

pub(crate) fn backward(
    dest: &Trace,
    r: &Remat,
    ins: &[&Tensor],
    saved: &[Tensor],
    cts: &[Option<Tensor>],
    needs: &[bool],
) -> Vec<Option<Tensor>> {
    let fence_in: Vec<&Tensor> = ins.iter().copied().chain(saved).collect();
    let fenced = if r.fences.inputs {
        dest.bind(Prim::OptimizationBarrier, &fence_in)
    } else {
        fence_in.into_iter().cloned().collect()
    };
    let (args, kept) = fenced.split_at(ins.len());
    let saved_at = saved_eqns(r);
    let composites = saved_composites(r, &saved_at);
    let active = activity::analyze(&r.body, needs);
    let tape = super::forward_with(dest, &r.body, args, active, &mut |i, _| {
        if let Some(p) = saved_at.iter().position(|&j| j == i) {
            return Some((vec![kept[p].clone()], Extra::None));
        }
        let (_, picks) = composites.iter().find(|(j, _)| *j == i)?;
        Some((picks.iter().map(|&p| kept[p].clone()).collect(), Extra::None))
    });
    let cts = super::backward(dest, &r.body, &tape, cts);
    if r.fences.cotangents {
        fence_together(dest, cts)
    } else {
        cts
    }
}

/// The region's input cotangents behind one optimization barrier: the cotangent that flows on
/// to the previous region (the layer's input) is only available once every other one (the
/// layer's weight gradients) is computed. Without it XLA may defer a layer's weight-gradient
/// matmuls to the end of the backward pass (next to the gradients' reduce-scatters), keeping
/// their `[batch, seq, mlp]` operands of every layer alive at once.
fn fence_together(dest: &Trace, cts: Vec<Option<Tensor>>) -> Vec<Option<Tensor>> {
    let present: Vec<&Tensor> = cts.iter().flatten().collect();
    if present.len() < 2 {
        return cts;
    }
    let mut fenced = dest.bind(Prim::OptimizationBarrier, &present).into_iter();
    cts.iter().map(|ct| ct.as_ref().and_then(|_| fenced.next())).collect()
}

/// The body's composites whose every result is tagged with a saved name: per composite, its
/// equation index and, per result, the position of its saved value in `saved_at`'s order.
fn saved_composites(r: &Remat, saved_at: &[usize]) -> Vec<(usize, Vec<usize>)> {
    let body = &r.body;
    body.eqns
        .iter()
        .enumerate()
        .filter(|(_, eqn)| matches!(eqn.prim, Prim::Composite(_)))
        .filter_map(|(i, eqn)| {
            let picks: Option<Vec<usize>> =
                eqn.outputs.iter().map(|out| saved_at.iter().position(|&j| body.eqns[j].inputs[0] == *out)).collect();
            picks.map(|p| (i, p))
        })
        .collect()
}

/// Indices of the body's `Name` equations whose tag the policy saves.
fn saved_eqns(r: &Remat) -> Vec<usize> {
    let mut found = Vec::new();
    for (i, eqn) in r.body.eqns.iter().enumerate() {
        if let Prim::Name(name) = &eqn.prim {
            if r.saved_names.contains(name) {
                found.push(i);
            }
        }
    }
    found
}
