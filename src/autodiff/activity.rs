//! Activity analysis: which values carry a cotangent. A value is active when it is a float and
//! depends on an active input through primitives other than `stop_gradient`. The backward
//! pass visits only equations with active results, so integer index math, masks and
//! stop-gradient branches cost nothing there.

use crate::ir::{Eqn, Graph, Prim, Scan};

/// Per value of `graph`: is it active, given which inputs are.
pub(crate) fn analyze(graph: &Graph, inputs_active: &[bool]) -> Vec<bool> {
    let mut active = vec![false; graph.types.len()];
    for (v, &a) in graph.inputs.iter().zip(inputs_active) {
        active[v.index()] = a && graph.ty(*v).dtype.is_float();
    }
    for eqn in &graph.eqns {
        let ins: Vec<bool> = eqn.inputs.iter().map(|v| active[v.index()]).collect();
        if !ins.contains(&true) {
            continue;
        }
        for (o, a) in eqn.outputs.iter().zip(outputs_active(eqn, &ins)) {
            active[o.index()] = a && graph.ty(*o).dtype.is_float();
        }
    }
    active
}

/// Activity of an equation's results from its operands' (before the float filter).
fn outputs_active(eqn: &Eqn, ins: &[bool]) -> Vec<bool> {
    match &eqn.prim {
        Prim::StopGradient => vec![false],
        Prim::Scan(scan) => {
            let body = scan_body(scan, ins);
            scan.body.outputs.iter().map(|v| body[v.index()]).collect()
        }
        Prim::Remat(remat) => {
            let body = analyze(&remat.body, ins);
            remat.body.outputs.iter().map(|v| body[v.index()]).collect()
        }
        Prim::Unary(_)
        | Prim::Binary(_)
        | Prim::Compare(_)
        | Prim::Select
        | Prim::Convert(_)
        | Prim::Iota { .. }
        | Prim::Constant { .. }
        | Prim::DotGeneral { .. }
        | Prim::Reduce { .. }
        | Prim::Reshape(_)
        | Prim::Transpose(_)
        | Prim::BroadcastInDim { .. }
        | Prim::Slice { .. }
        | Prim::DynamicSlice { .. }
        | Prim::DynamicUpdateSlice
        | Prim::Concatenate { .. }
        | Prim::Gather(_)
        | Prim::ScatterAdd(_)
        | Prim::Sort { .. }
        | Prim::TopK { .. }
        | Prim::Cumsum { .. }
        | Prim::RaggedDot(_)
        | Prim::Pad { .. }
        | Prim::Name(_)
        | Prim::ShardingConstraint(_)
        | Prim::OptimizationBarrier
        | Prim::Composite(_)
        | Prim::CustomCall(_)
        | Prim::ManualComputation(_)
        | Prim::Collective(_) => vec![true; eqn.outputs.len()],
    }
}

/// Activity of every value of a scan body given the scan's operand activity. A carry becomes
/// active if the body makes its next value depend on anything active, which may in turn
/// activate other carries: iterate to the fixpoint (at most once per carry).
pub(crate) fn scan_body(scan: &Scan, operands_active: &[bool]) -> Vec<bool> {
    let (nk, nc) = (scan.num_consts, scan.num_carry);
    let mut ins = operands_active.to_vec();
    loop {
        let values = analyze(&scan.body, &ins);
        let mut changed = false;
        for c in 0..nc {
            if values[scan.body.outputs[c].index()] && !ins[nk + c] {
                ins[nk + c] = true;
                changed = true;
            }
        }
        if !changed {
            return values;
        }
    }
}
