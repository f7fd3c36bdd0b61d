//! Differentiating a manual computation (JAX's `shard_map` transpose). The cotangents come from a
//! second manual computation over the same axes, whose body recomputes the forward body on each
//! device's shards and differentiates it there: it reads the operands and the results'
//! cotangents (split as the results are) and returns the operands' cotangents (split as the
//! operands are). A device's local cotangent is the whole cotangent of its shard only when the
//! operand is split over every manual axis; an operand whole along some manual axis would need
//! its per-device cotangents summed across that axis (a `psum`), which the IR has no collective
//! for, so asking for its cotangent is refused.

use crate::ir::{Manual, Prim};
use crate::tensor::{usage_error, Tensor, Trace};
use std::sync::Arc;

pub(crate) fn backward(
    dest: &Trace,
    m: &Manual,
    ins: &[&Tensor],
    outs: &[&Tensor],
    cts: &[Option<Tensor>],
    needs: &[bool],
) -> Vec<Option<Tensor>> {
    let wanted: Vec<bool> = ins.iter().zip(needs).map(|(x, &n)| n && x.dtype().is_float()).collect();
    for (i, spec) in m.in_specs.iter().enumerate().filter(|(i, _)| wanted[*i]) {
        let split = |axis: &str| (0..spec.rank()).any(|d| spec.dim(d).iter().any(|a| a == axis));
        if let Some((axis, _)) = m.axes.iter().find(|(a, size)| *size > 1 && !split(a)) {
            usage_error(&format!(
                "manual_computation: operand {i} ({spec}) is whole along manual axis \"{axis}\": its gradient \
                 would be a sum across that axis, which is not supported"
            ));
        }
    }
    let body = &m.body;
    let tb = Trace::manual_root(&crate::tensor::manual_axes(&m.axes));
    let b_ins: Vec<Tensor> = body.inputs.iter().map(|&v| tb.input(body.ty(v).clone())).collect();
    let b_cts: Vec<Option<Tensor>> = body.outputs.iter().map(|&v| Some(tb.input(body.ty(v).clone()))).collect();
    let tape = super::forward(&tb, body, &b_ins, &wanted);
    let grads = super::backward(&tb, body, &tape, &b_cts);
    let local_cts: Vec<Tensor> = grads
        .into_iter()
        .zip(&b_ins)
        .zip(&wanted)
        .filter(|(_, &w)| w)
        .map(|((g, x), _)| g.unwrap_or_else(|| x.zeros_like()))
        .collect();
    let (graph, _) = tb.finish(&local_cts.iter().collect::<Vec<_>>());
    let in_specs = m.in_specs.iter().chain(&m.out_specs).cloned().collect();
    let out_specs = m.in_specs.iter().zip(&wanted).filter(|(_, &w)| w).map(|(s, _)| s.clone()).collect();
    let spec = Manual { body: Arc::new(graph), axes: m.axes.clone(), in_specs, out_specs };
    let zeros: Vec<Tensor> =
        cts.iter().zip(outs).map(|(ct, out)| ct.clone().unwrap_or_else(|| out.zeros_like())).collect();
    let operands: Vec<&Tensor> = ins.iter().copied().chain(&zeros).collect();
    let mut results = dest.bind(Prim::ManualComputation(spec), &operands).into_iter();
    wanted.iter().map(|&w| if w { results.next() } else { None }).collect()
}
