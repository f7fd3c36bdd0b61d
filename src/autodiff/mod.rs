//! Reverse-mode automatic differentiation as a transformation of the IR, and its entry points:
//! [`value_and_grad`] (and [`value_and_grad_with_aux`]) for traced code, JAX-style, and
//! [`value_and_grad_program`] for a whole program. It builds on `crate::tensor`, never the other
//! way round.
//!
//! `forward` evaluates a graph into a destination trace — re-binding each equation — and keeps
//! a `Tape`: the value of every graph value there, which values are active (see `activity`),
//! and, for scans and remat regions, the extra forward results their VJP needs. `backward`
//! walks the equations in reverse and applies each primitive's VJP rule (`rules`, one
//! exhaustive match), accumulating cotangents. Both phases emit ordinary equations with the
//! `Tensor` API, so the rules read like the math, and the result is again a plain graph.
//!
//! Structured primitives differentiate into structured code:
//! - a `scan` becomes a forward scan that also stacks per-iteration residuals and a reverse
//!   scan over a backward body (`scan`); what is saved versus recomputed per iteration follows
//!   from remat regions in the body;
//! - a remat region is inlined in the forward pass and recomputed behind an optimization
//!   barrier in the backward pass, keeping only the values its policy names (`remat`);
//! - a manual computation's cotangents are another manual computation over the same axes, whose
//!   body differentiates the forward body shard by shard (`manual`).

mod activity;
mod manual;
mod remat;
mod rules;
mod scan;

use crate::ir::{Eqn, Graph, InputSpec, OutputSpec, Prim, Program};
use crate::tensor::{usage_error, Tensor, Trace, Tree};

/// The forward evaluation of a graph, with what the backward pass needs.
pub struct Tape {
    /// Per graph value: its tensor in the destination trace.
    env: Vec<Option<Tensor>>,
    /// Per graph value: does it carry a cotangent.
    active: Vec<bool>,
    /// Per equation: extra forward results for its VJP rule.
    extras: Vec<Extra>,
}

/// Extra forward results of one equation, used by its VJP rule.
#[derive(Clone)]
pub(crate) enum Extra {
    None,
    Scan(scan::ScanTape),
    /// The values a remat region's policy saves, in body order of their `Name` tags.
    Remat(Vec<Tensor>),
}

impl Extra {
    /// The same extras with every tensor replaced (for a backward body that reads them as inputs).
    fn map_tensors(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Extra {
        match self {
            Extra::None => Extra::None,
            Extra::Scan(t) => Extra::Scan(t.map_stacked(f)),
            Extra::Remat(saved) => Extra::Remat(saved.iter().map(f).collect()),
        }
    }
}

impl Tape {
    fn value(&self, v: crate::ir::ValueId) -> &Tensor {
        self.env[v.index()].as_ref().expect("every value is computed by the forward pass")
    }

    /// The graph's outputs as computed in the destination trace.
    pub fn outputs(&self, graph: &Graph) -> Vec<Tensor> {
        graph.outputs.iter().map(|&v| self.value(v).clone()).collect()
    }
}

/// A replacement for an equation's forward evaluation: its results and extras.
type Substitute<'a> = &'a mut dyn FnMut(usize, &Eqn) -> Option<(Vec<Tensor>, Extra)>;

/// Evaluates `graph` on `args` into `dest`, recording what differentiating with respect to the
/// inputs flagged in `wrt` needs.
pub fn forward(dest: &Trace, graph: &Graph, args: &[Tensor], wrt: &[bool]) -> Tape {
    let active = activity::analyze(graph, wrt);
    forward_with(dest, graph, args, active, &mut |_, _| None)
}

/// `forward` with given activity, where `substitute` may supply an equation's results instead
/// of evaluating it (saved residuals, remat policy values).
fn forward_with(dest: &Trace, graph: &Graph, args: &[Tensor], active: Vec<bool>, substitute: Substitute) -> Tape {
    let mut env: Vec<Option<Tensor>> = vec![None; graph.types.len()];
    for (v, a) in graph.inputs.iter().zip(args) {
        env[v.index()] = Some(a.clone());
    }
    let mut extras = Vec::with_capacity(graph.eqns.len());
    for (i, eqn) in graph.eqns.iter().enumerate() {
        let (outs, extra) = substitute(i, eqn).unwrap_or_else(|| {
            let ins: Vec<&Tensor> =
                eqn.inputs.iter().map(|v| env[v.index()].as_ref().expect("operand computed")).collect();
            let ins_active: Vec<bool> = eqn.inputs.iter().map(|v| active[v.index()]).collect();
            match &eqn.prim {
                Prim::Scan(s) if ins_active.contains(&true) => scan::forward(dest, s, &ins, &ins_active),
                Prim::Remat(r) if ins_active.contains(&true) => remat::forward(dest, r, &ins),
                // Everything else (and inactive structured ops) is re-bound unchanged.
                prim => (dest.bind(prim.clone(), &ins), Extra::None),
            }
        });
        for (o, t) in eqn.outputs.iter().zip(outs) {
            env[o.index()] = Some(t);
        }
        extras.push(extra);
    }
    Tape { env, active, extras }
}

/// Cotangents of `graph`'s inputs (`None`: zero or not differentiable) given cotangents of its
/// outputs, emitting the backward computation into `dest`.
pub fn backward(dest: &Trace, graph: &Graph, tape: &Tape, out_cts: &[Option<Tensor>]) -> Vec<Option<Tensor>> {
    backward_to(dest, graph, tape, out_cts, &[], &[]).0
}

/// `backward` that stops at the values `stops`: it does not go on through the equations that
/// produce them, and returns their cotangents after the inputs'. The equations `fenced` (by
/// index) release their operands' cotangents together (`fence_together`).
pub(crate) fn backward_to(
    dest: &Trace,
    graph: &Graph,
    tape: &Tape,
    out_cts: &[Option<Tensor>],
    stops: &[crate::ir::ValueId],
    fenced: &[usize],
) -> (Vec<Option<Tensor>>, Vec<Option<Tensor>>) {
    let mut cts: Vec<Option<Tensor>> = vec![None; graph.types.len()];
    for (v, ct) in graph.outputs.iter().zip(out_cts) {
        if let (true, Some(ct)) = (tape.active[v.index()], ct) {
            accumulate(&mut cts, *v, ct.clone());
        }
    }
    for (i, eqn) in graph.eqns.iter().enumerate().rev() {
        if eqn.outputs.iter().any(|o| stops.contains(o)) {
            continue;
        }
        let out_cts: Vec<Option<Tensor>> = eqn.outputs.iter().map(|o| cts[o.index()].take()).collect();
        if out_cts.iter().all(Option::is_none) {
            continue;
        }
        let ins: Vec<&Tensor> = eqn.inputs.iter().map(|&v| tape.value(v)).collect();
        let outs: Vec<&Tensor> = eqn.outputs.iter().map(|&v| tape.value(v)).collect();
        let needs: Vec<bool> = eqn.inputs.iter().map(|v| tape.active[v.index()]).collect();
        let mut in_cts = rules::vjp(dest, &eqn.prim, &ins, &outs, &tape.extras[i], &out_cts, &needs);
        if fenced.contains(&i) {
            in_cts = fence_together(dest, in_cts);
        }
        for ((v, ct), need) in eqn.inputs.iter().zip(in_cts).zip(needs) {
            if let (true, Some(ct)) = (need, ct) {
                accumulate(&mut cts, *v, ct);
            }
        }
    }
    let inputs = graph.inputs.iter().map(|v| cts[v.index()].take()).collect();
    (inputs, stops.iter().map(|v| cts[v.index()].take()).collect())
}

/// The cotangents `cts` behind one optimization barrier: none is available until all are
/// computed.
pub(crate) fn fence_together(dest: &Trace, cts: Vec<Option<Tensor>>) -> Vec<Option<Tensor>> {
    let present: Vec<&Tensor> = cts.iter().flatten().collect();
    if present.len() < 2 {
        return cts;
    }
    let mut fenced = dest.bind(Prim::OptimizationBarrier, &present).into_iter();
    cts.iter().map(|ct| ct.as_ref().and_then(|_| fenced.next())).collect()
}

fn accumulate(cts: &mut [Option<Tensor>], v: crate::ir::ValueId, ct: Tensor) {
    let slot = &mut cts[v.index()];
    *slot = Some(match slot.take() {
        None => ct,
        Some(prev) => &prev + &ct,
    });
}

/// The value of `f(params)` (a float scalar) and its gradient with respect to every float
/// entry of `params` (zeros where it does not depend on one).
#[track_caller]
pub fn value_and_grad(params: &Tree, f: impl FnOnce(&Tree) -> Tensor) -> (Tensor, Tree) {
    let (value, _, grads) = value_and_grad_with_aux(params, |p| (f(p), Tree::new()));
    (value, grads)
}

/// Like `value_and_grad` for `f` returning `(loss, aux)`: `(loss, aux, grads)`.
#[track_caller]
pub fn value_and_grad_with_aux(params: &Tree, f: impl FnOnce(&Tree) -> (Tensor, Tree)) -> (Tensor, Tree, Tree) {
    let parent = Trace::innermost(params.values()).current();
    let child = parent.child();
    let p_in = params.map(|_, t| child.input(t.ty().clone()));
    let (loss, aux) = f(&p_in);
    if loss.rank() != 0 || !loss.dtype().is_float() {
        usage_error(&format!("value_and_grad: the function must return a float scalar, not {}", loss.ty()));
    }
    let outs: Vec<&Tensor> = std::iter::once(&loss).chain(aux.values()).collect();
    let (graph, captures) = child.finish(&outs);
    let args: Vec<Tensor> = params.values().cloned().chain(captures).collect();
    let wrt: Vec<bool> = (0..args.len()).map(|i| i < params.len()).collect();
    let tape = forward(&parent, &graph, &args, &wrt);
    let results = tape.outputs(&graph);
    let mut cts = vec![None; results.len()];
    cts[0] = Some(results[0].ones_like());
    let grads = backward(&parent, &graph, &tape, &cts);
    let grad_tree = params
        .iter()
        .zip(grads)
        .filter(|((_, p), _)| p.dtype().is_float())
        .map(|((name, p), g)| (name, g.unwrap_or_else(|| p.zeros_like())))
        .collect();
    let aux_tree = aux.names().zip(results[1..].iter().cloned()).collect();
    (results[0].clone(), aux_tree, grad_tree)
}

/// The whole-program transformation: a program with the same inputs whose outputs are the
/// original ones followed by `grad.<name>` for each float input named in `wrt`, differentiating
/// the first output (a float scalar: the loss).
pub fn value_and_grad_program(program: &Program, wrt: &[&str]) -> Program {
    let dest = Trace::root(program.mesh.clone());
    let args: Vec<Tensor> = program.inputs.iter().map(|i| dest.input(i.ty.clone())).collect();
    let flags: Vec<bool> = program.inputs.iter().map(|i| wrt.contains(&i.name.as_str())).collect();
    let tape = forward(&dest, &program.graph, &args, &flags);
    let outs = tape.outputs(&program.graph);
    let mut out_cts = vec![None; outs.len()];
    out_cts[0] = Some(outs[0].ones_like());
    let grads = backward(&dest, &program.graph, &tape, &out_cts);
    let mut results: Vec<Tensor> = outs.clone();
    let mut outputs: Vec<OutputSpec> = program.outputs.clone();
    for ((input, grad), arg) in program.inputs.iter().zip(grads).zip(&args) {
        if wrt.contains(&input.name.as_str()) && input.ty.dtype.is_float() {
            results.push(grad.unwrap_or_else(|| arg.zeros_like()));
            outputs.push(OutputSpec {
                name: format!("grad.{}", input.name),
                ty: input.ty.clone(),
                sharding: input.sharding.clone(),
            });
        }
    }
    let refs: Vec<&Tensor> = results.iter().collect();
    let (mut graph, _) = dest.finish(&refs);
    graph.dce();
    let inputs: Vec<InputSpec> = program.inputs.clone();
    Program { graph, inputs, outputs, mesh: program.mesh.clone() }
}
