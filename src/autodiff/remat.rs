//! Differentiating a remat (`checkpoint`) region. Forward: the body is inlined and only the
//! values tagged with a name the policy saves are kept for later. Backward: the body is
//! recomputed from its operands (behind an optimization barrier where `fences.inputs` says, so
//! XLA cannot merge the recomputation with the forward pass), with the saved values substituted
//! for their tags, and then differentiated (with `fences.cotangents`, a product with a layer's
//! cast weights releases its cotangents together, and the region's leave through one barrier:
//! `products_at_hand`). Recomputation that only fed saved values is dead and
//! removed, and so is a saved value the backward pass does not read (its barrier lane is dropped by
//! `Graph::dce`), as JAX's `save_only_these_names` keeps only the named values that are
//! residuals (e.g. MaxText's `mlpwo`, only added to the residual stream). A
//! composite whose results are all saved (blockwise attention's output and statistics under
//! `minimal_with_context`) is not recomputed at all: its backward pass reads only operands and
//! results.

use super::{activity, Extra};
use crate::ir::{Prim, Remat, ValueId};
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
    let waits = r.fences.inputs && r.fences.wait_for_cotangents;
    let given: Vec<&Tensor> = if waits { cts.iter().flatten().collect() } else { Vec::new() };
    let fence_in: Vec<&Tensor> = ins.iter().copied().chain(saved).chain(given.iter().copied()).collect();
    let mut fenced = if r.fences.inputs {
        dest.bind(Prim::OptimizationBarrier, &fence_in)
    } else {
        fence_in.into_iter().cloned().collect()
    };
    // The cotangents that passed the barrier replace the given ones, in their slots.
    let mut passed = fenced.split_off(ins.len() + saved.len()).into_iter();
    let cts: Vec<Option<Tensor>> = cts
        .iter()
        .map(|ct| ct.as_ref().map(|c| if waits { passed.next().expect("fenced") } else { c.clone() }))
        .collect();
    let cts = &cts[..];
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
    if !r.fences.cotangents {
        return super::backward(dest, &r.body, &tape, cts);
    }
    let casts = narrowing_casts(r);
    let stops: Vec<ValueId> = casts.iter().map(|&(_, cast)| cast).collect();
    let fenced = products_at_hand(r, &saved_at, &stops);
    let (mut in_cts, cast_cts) = super::backward_to(dest, &r.body, &tape, cts, &stops, &fenced);
    // One barrier for all the region's cotangents: the one that flows on to the previous region
    // (the layer's input) is only available once every other one (the layer's weight gradients)
    // is computed. Without it XLA may defer a layer's weight-gradient matmuls to the end of the
    // backward pass (next to the gradients' reduce-scatters), keeping their `[batch, seq, mlp]`
    // operands of every layer alive at once. The cast inputs' cotangents pass it in the narrow
    // dtype they have before the transposed cast (`Convert`'s rule, `g.astype(x.dtype)`, applied
    // after the barrier: the same values). Fenced wide, every layer's f32 weight gradients would
    // be materialized in its backward pass and kept to the end; narrow, XLA fuses the widening
    // into the optimizer, as for MaxText's step (issue 46: bf16 gradients, half the bytes).
    let n = in_cts.len();
    let fenced = super::fence_together(dest, in_cts.drain(..).chain(cast_cts).collect());
    let (mut fenced_in, fenced_casts) = (fenced[..n].to_vec(), &fenced[n..]);
    for (&(input, _), ct) in casts.iter().zip(fenced_casts) {
        fenced_in[input] = ct.as_ref().map(|g| g.astype(ins[input].dtype()));
    }
    fenced_in
}

/// The region's inputs that its body reads only once, through a cast to a narrower float (a
/// layer's f32 parameters cast to bf16 for its products): per input, its position and the cast's
/// result, where the backward pass stops to fence their cotangents narrow.
fn narrowing_casts(r: &Remat) -> Vec<(usize, ValueId)> {
    let body = &r.body;
    let narrowing = |input: ValueId| {
        let mut uses = body.eqns.iter().filter(|eqn| eqn.inputs.contains(&input));
        let (Some(eqn), None) = (uses.next(), uses.next()) else { return None };
        let from = body.ty(input).dtype;
        match eqn.prim {
            Prim::Convert(to) if from.is_float() && to.is_float() && to.byte_size() < from.byte_size() => {
                Some(eqn.outputs[0])
            }
            _ => None,
        }
    };
    body.inputs
        .iter()
        .enumerate()
        .filter(|(_, v)| !body.outputs.contains(v))
        .filter_map(|(i, &v)| narrowing(v).map(|cast| (i, cast)))
        .collect()
}

/// The body's equations that read a cast input (`stops`: a product with a layer's weights) and
/// whose other operands are at hand in the backward pass: region inputs and saved values, or
/// computed from them without a product (a norm's output, an MLP's gated activation). Their
/// operands' cotangents are released together, so that the weights' gradient is computed as soon
/// as the product's output cotangent is, before the backward pass goes on (as JAX's transpose of
/// each product orders MaxText's step); left free, XLA's scheduler may defer a layer's weight
/// gradients past the rest of its backward pass and keep their `[batch, seq, mlp]` operands
/// alive through it (issue 46: 1.3 GiB more than MaxText at the peak of llama2-7b's 8-layer step
/// with dot-product attention). A product whose other operand is recomputed through products
/// (dot-product attention's output, not saved) is left free: fencing it would make XLA recompute
/// that operand early and hold attention's scores twice.
fn products_at_hand(r: &Remat, saved_at: &[usize], stops: &[ValueId]) -> Vec<usize> {
    let body = &r.body;
    let mut at_hand = vec![false; body.types.len()];
    for v in &body.inputs {
        at_hand[v.index()] = true;
    }
    for (i, eqn) in body.eqns.iter().enumerate() {
        let cheap = match &eqn.prim {
            Prim::Name(_) if saved_at.contains(&i) => true,
            Prim::DotGeneral { .. }
            | Prim::RaggedDot(_)
            | Prim::Scan(_)
            | Prim::Remat(_)
            | Prim::Composite(_)
            | Prim::CustomCall(_)
            | Prim::ManualComputation(_)
            | Prim::Collective(_) => false,
            _ => eqn.inputs.iter().all(|v| at_hand[v.index()]),
        };
        for v in &eqn.outputs {
            at_hand[v.index()] = cheap;
        }
    }
    let reads_stop = |eqn: &crate::ir::Eqn| eqn.inputs.iter().any(|v| stops.contains(v));
    body.eqns
        .iter()
        .enumerate()
        .filter(|(_, eqn)| reads_stop(eqn) && eqn.inputs.iter().all(|v| stops.contains(v) || at_hand[v.index()]))
        .map(|(i, _)| i)
        .collect()
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
