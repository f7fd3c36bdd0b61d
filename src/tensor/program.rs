//! `trace`: runs a function over named inputs in a fresh root trace and returns the
//! `Program`, or the first shape/usage error as a `TraceError` (carrying op, shapes and call site).

use super::trace::{Tensor, Trace};
use super::Tree;
use crate::ir::{OutputSpec, Program, Signature};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A tracing failure: the panic message of the op that rejected its operands.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TraceError(pub String);

/// Traces `f` over the inputs of `sig` (given to `f` as a tree, plus the trace for creating
/// constants) into a program whose outputs are the returned tree.
pub fn trace(sig: &Signature, f: impl FnOnce(&Trace, &Tree) -> Tree) -> Result<Program, TraceError> {
    check_signature(sig)?;
    let root = Trace::root(sig.mesh.clone());
    let inputs: Tree = sig.inputs.iter().map(|i| (i.name.clone(), root.input(i.ty.clone()))).collect();
    let traced = catch_unwind(AssertUnwindSafe(|| {
        let outs = f(&root, &inputs);
        let refs: Vec<&Tensor> = outs.values().collect();
        let (graph, _) = root.finish(&refs);
        (graph, outs)
    }));
    let (mut graph, outs) = traced.map_err(|payload| {
        let msg = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "tracing panicked".to_string());
        TraceError(msg)
    })?;
    graph.dce();
    let outputs: Vec<OutputSpec> = outs
        .iter()
        .map(|(name, t)| OutputSpec {
            name: name.to_string(),
            ty: t.ty().clone(),
            sharding: sig.output_shardings.get(name).cloned(),
        })
        .collect();
    if let Some(mesh) = &sig.mesh {
        for o in &outputs {
            if let Some(spec) = &o.sharding {
                spec.validate(mesh, o.ty.rank()).map_err(|m| TraceError(format!("output \"{}\": {m}", o.name)))?;
            }
        }
    }
    if let Some(name) = sig.output_shardings.keys().find(|n| outs.get(n).is_none()) {
        return Err(TraceError(format!(
            "a sharding is given for output \"{name}\", which the function does not return"
        )));
    }
    Ok(Program { graph, inputs: sig.inputs.clone(), outputs, mesh: sig.mesh.clone() })
}

fn check_signature(sig: &Signature) -> Result<(), TraceError> {
    for (i, input) in sig.inputs.iter().enumerate() {
        if sig.inputs[..i].iter().any(|o| o.name == input.name) {
            return Err(TraceError(format!("input \"{}\" is declared twice", input.name)));
        }
        match (&sig.mesh, &input.sharding) {
            (Some(mesh), Some(spec)) => spec
                .validate(mesh, input.ty.rank())
                .map_err(|m| TraceError(format!("input \"{}\": {m}", input.name)))?,
            (None, Some(_)) => {
                return Err(TraceError(format!("input \"{}\" is sharded but the signature has no mesh", input.name)))
            }
            (_, None) => {}
        }
    }
    Ok(())
}
