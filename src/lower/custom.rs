//! The lowering of custom calls and manual computations, in the form JAX writes them:
//! `stablehlo.custom_call @target(...) {api_version, backend_config, operand_layouts,
//! result_layouts}` (as `jax._src.interpreters.mlir.custom_call`), and Shardy's
//! `sdy.manual_computation(...) in_shardings=[..] out_shardings=[..] manual_axes={..} (block
//! arguments) { body; sdy.return .. }` (as JAX's `shard_map` under Shardy).

use super::shardy::Shardings;
use super::text::{Quoted, Ssa, TensorType};
use super::{w, Emitter};
use crate::ir::{CustomCall, Eqn, Graph, Manual, Type};
use std::fmt::{self, Display, Write};

/// A layout as MLIR prints an index array: `dense<[3, 2, 1, 0]> : tensor<4xindex>`, a single
/// entry as a splat (`dense<0> : tensor<1xindex>`).
struct Layout<'a>(&'a [usize]);

impl Display for Layout<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let items: Vec<String> = self.0.iter().map(|d| d.to_string()).collect();
        match items.as_slice() {
            [one] => write!(f, "dense<{one}>")?,
            many => write!(f, "dense<[{}]>", many.join(", "))?,
        }
        write!(f, " : tensor<{}xindex>", self.0.len())
    }
}

/// `@name`, quoted when it is not a bare MLIR identifier.
struct Symbol<'a>(&'a str);

impl Display for Symbol<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bare = self.0.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && self.0.chars().all(|c| c.is_ascii_alphanumeric() || "_$.".contains(c));
        match bare {
            true => write!(f, "@{}", self.0),
            false => write!(f, "@{}", Quoted(self.0)),
        }
    }
}

/// `(a, b)` of types, or the bare type when there is one.
fn type_list(types: &[String]) -> String {
    match types {
        [one] => one.clone(),
        many => format!("({})", many.join(", ")),
    }
}

impl Emitter<'_> {
    pub(super) fn custom_call(&mut self, call: &CustomCall, g: &Graph, eqn: &Eqn, ins: &[Ssa]) -> Vec<Ssa> {
        let operand_types: Vec<String> = eqn.inputs.iter().map(|&v| TensorType(g.ty(v)).to_string()).collect();
        let mut result_types: Vec<String> = call.results.iter().map(|t| TensorType(t).to_string()).collect();
        let mut result_layouts: Vec<String> = call.result_layouts.iter().map(|l| Layout(l).to_string()).collect();
        if call.workspace {
            result_types.push("tensor<0xui8>".into());
            result_layouts.push(Layout(&[0]).to_string());
        }
        let operand_layouts: Vec<String> = call.operand_layouts.iter().map(|l| Layout(l).to_string()).collect();
        let operands: Vec<String> = ins.iter().map(|s| s.to_string()).collect();
        let body = format!(
            "stablehlo.custom_call {}({}) {{api_version = {} : i32, backend_config = {}, operand_layouts = [{}], result_layouts = [{}]}} : ({}) -> {}",
            Symbol(&call.target),
            operands.join(", "),
            call.api_version,
            Quoted(&call.backend_config),
            operand_layouts.join(", "),
            result_layouts.join(", "),
            operand_types.join(", "),
            type_list(&result_types),
        );
        // The workspace result is named with the others but never read.
        let r = self.fresh();
        self.indent();
        match result_types.len() {
            1 => w(writeln!(self.out, "%{r} = {body}")),
            n => w(writeln!(self.out, "%{r}:{n} = {body}")),
        }
        match result_types.len() {
            1 => vec![Ssa::Value(r)],
            _ => (0..call.results.len() as u32).map(|k| Ssa::Result(r, k)).collect(),
        }
    }

    pub(super) fn manual(&mut self, m: &Manual, g: &Graph, eqn: &Eqn, ins: &[Ssa]) -> Vec<Ssa> {
        let mesh = self.mesh.as_ref().expect("a manual computation is traced only on a mesh");
        // With axes left to the partitioner (the mesh's others), every dimension is open, so that
        // it keeps sharding the operands and results over them, as JAX's `shard_map` lowering
        // writes them (`_shardy_shard_map_sharding` in jax/_src/shard_map.py); closed, they
        // would be gathered whole over those axes at the computation's boundary (issue 49:
        // context-parallel attention's batch gathered over fsdp, 8x its memory on 8 devices).
        let open = m.axes.len() < mesh.axes().len();
        let shardings = |specs: &[crate::sharding::PartitionSpec], types: Vec<&Type>| {
            let each: Vec<String> = specs
                .iter()
                .zip(types)
                .map(|(spec, t)| Shardings { spec: Some(spec), rank: t.rank(), open }.to_string())
                .collect();
            format!("[{}]", each.join(", "))
        };
        let in_types: Vec<&Type> = eqn.inputs.iter().map(|&v| g.ty(v)).collect();
        let out_types: Vec<&Type> = eqn.outputs.iter().map(|&v| g.ty(v)).collect();
        let axes: Vec<String> = m.axes.iter().map(|(a, _)| format!("\"{a}\"")).collect();
        let body = &*m.body;
        let r = self.fresh();
        let args: Vec<Ssa> = body.inputs.iter().map(|_| Ssa::Value(self.fresh())).collect();
        let params: Vec<String> =
            args.iter().zip(&body.inputs).map(|(a, &v)| format!("{a}: {}", TensorType(body.ty(v)))).collect();
        let operands: Vec<String> = ins.iter().map(|s| s.to_string()).collect();
        let arity = if eqn.outputs.len() == 1 { String::new() } else { format!(":{}", eqn.outputs.len()) };
        self.indent();
        w(writeln!(
            self.out,
            "%{r}{arity} = sdy.manual_computation({}) in_shardings={} out_shardings={} manual_axes={{{}}} ({}) {{",
            operands.join(", "),
            shardings(&m.in_specs, in_types.clone()),
            shardings(&m.out_specs, out_types.clone()),
            axes.join(", "),
            params.join(", ")
        ));
        self.depth += 1;
        let results = self.graph(body, &args);
        self.terminator("sdy.return", body, &results);
        self.depth -= 1;
        self.indent();
        let ins_t: Vec<String> = in_types.iter().map(|t| TensorType(t).to_string()).collect();
        let outs_t: Vec<String> = out_types.iter().map(|t| TensorType(t).to_string()).collect();
        w(writeln!(self.out, "}} : ({}) -> {}", ins_t.join(", "), type_list(&outs_t)));
        match eqn.outputs.len() {
            1 => vec![Ssa::Value(r)],
            n => (0..n as u32).map(|k| Ssa::Result(r, k)).collect(),
        }
    }
}
