//! Lowering to StableHLO MLIR text, the program format PJRT plugins compile.
//!
//! One pass over the graph writes into a single `String` with `std::fmt::Write`. The module
//! carries `mhlo.num_partitions`/`mhlo.num_replicas`; with a mesh, a Shardy `sdy.mesh` and a
//! `sdy.sharding` on every argument and result (replicated unless specified). Donated inputs
//! get `tf.aliasing_output` (XLA turns it into input/output aliasing); arguments carry their
//! names as locations and results as `jax.result_info`, so XLA dumps stay readable. Each
//! primitive is written by `ops` (one exhaustive match); scans become `stablehlo.while` loops,
//! ragged dots loops of dense products (`ragged`), remat regions and composites are inlined
//! (their recomputation and backward passes were made explicit by autodiff), and custom calls
//! and manual computations are written as JAX writes them (`custom`), as are the collectives of
//! manual bodies (`collective`).

mod collective;
mod custom;
mod ops;
mod ragged;
mod shardy;
mod text;

use crate::ir::{Graph, Program};
use crate::sharding::Mesh;
use shardy::{MeshDecl, Shardings};
use std::fmt::Write;
use text::{Quoted, Ssa, TensorType};

/// The StableHLO module for `program`, entry function `@main`.
pub fn to_stablehlo(program: &Program) -> String {
    let mut e = Emitter {
        out: String::with_capacity(64 * program.graph.eqns.len() + 1024),
        next: 0,
        depth: 0,
        mesh: program.mesh.as_ref(),
        channels: 0,
    };
    let partitions = program.mesh.as_ref().map_or(1, Mesh::size);
    w(writeln!(
        e.out,
        "module @maxrs attributes {{mhlo.num_partitions = {partitions} : i32, mhlo.num_replicas = 1 : i32}} {{"
    ));
    if let Some(mesh) = &program.mesh {
        w(writeln!(e.out, "  {}", MeshDecl(mesh)));
    }
    e.out.push_str("  func.func public @main(");
    let aliases = program.aliases();
    for (i, input) in program.inputs.iter().enumerate() {
        if i > 0 {
            e.out.push_str(", ");
        }
        w(write!(e.out, "{}: {}", Ssa::Arg(i), TensorType(&input.ty)));
        let mut attrs = Vec::new();
        if program.mesh.is_some() {
            attrs.push(format!(
                "sdy.sharding = #sdy.sharding{}",
                Shardings { spec: input.sharding.as_ref(), rank: input.ty.rank(), open: false }
            ));
        }
        if let Some(o) = aliases[i] {
            attrs.push(format!("tf.aliasing_output = {o} : i32"));
        }
        if !attrs.is_empty() {
            w(write!(e.out, " {{{}}}", attrs.join(", ")));
        }
        w(write!(e.out, " loc({})", Quoted(&input.name)));
    }
    e.out.push_str(") -> (");
    for (i, output) in program.outputs.iter().enumerate() {
        if i > 0 {
            e.out.push_str(", ");
        }
        w(write!(e.out, "{} {{jax.result_info = {}", TensorType(&output.ty), Quoted(&output.name)));
        if program.mesh.is_some() {
            w(write!(
                e.out,
                ", sdy.sharding = #sdy.sharding{}",
                Shardings { spec: output.sharding.as_ref(), rank: output.ty.rank(), open: false }
            ));
        }
        e.out.push('}');
    }
    e.out.push_str(") {\n");
    e.depth = 2;
    let args: Vec<Ssa> = (0..program.inputs.len()).map(Ssa::Arg).collect();
    let results = e.graph(&program.graph, &args);
    e.terminator("return", &program.graph, &results);
    e.out.push_str("  }\n}\n");
    e.out
}

/// `write!` into a `String` cannot fail.
fn w(r: std::fmt::Result) {
    r.expect("writing to a String cannot fail");
}

struct Emitter<'a> {
    out: String,
    /// Next SSA number.
    next: u32,
    /// Indentation level (two spaces each).
    depth: usize,
    mesh: Option<&'a Mesh>,
    /// Channel handles given to collectives so far (each takes the next, from 1).
    channels: i64,
}

impl Emitter<'_> {
    fn fresh(&mut self) -> u32 {
        self.next += 1;
        self.next - 1
    }

    /// Starts a new line at the current indentation.
    fn indent(&mut self) {
        for _ in 0..self.depth {
            self.out.push_str("  ");
        }
    }

    /// Writes the equations of `graph` with its inputs bound to `inputs`; returns its outputs.
    fn graph(&mut self, graph: &Graph, inputs: &[Ssa]) -> Vec<Ssa> {
        let mut env: Vec<Option<Ssa>> = vec![None; graph.types.len()];
        for (v, s) in graph.inputs.iter().zip(inputs) {
            env[v.index()] = Some(*s);
        }
        for eqn in &graph.eqns {
            let ins: Vec<Ssa> = eqn.inputs.iter().map(|v| env[v.index()].expect("operand lowered")).collect();
            let outs = ops::emit(self, graph, eqn, &ins);
            for (v, s) in eqn.outputs.iter().zip(outs) {
                env[v.index()] = Some(s);
            }
        }
        graph.outputs.iter().map(|v| env[v.index()].expect("output lowered")).collect()
    }

    /// `return %a, %b : tensor<..>, tensor<..>` (`op` is `return` or `stablehlo.return`).
    fn terminator(&mut self, op: &str, graph: &Graph, values: &[Ssa]) {
        let types: Vec<_> = graph.outputs.iter().map(|&v| graph.ty(v)).collect();
        self.terminator_typed(op, values, &types);
    }

    fn terminator_typed(&mut self, op: &str, values: &[Ssa], types: &[&crate::ir::Type]) {
        self.indent();
        self.out.push_str(op);
        for (i, v) in values.iter().enumerate() {
            w(write!(self.out, "{}{v}", if i == 0 { " " } else { ", " }));
        }
        for (i, t) in types.iter().enumerate() {
            w(write!(self.out, "{}{}", if i == 0 { " : " } else { ", " }, TensorType(t)));
        }
        self.out.push('\n');
    }
}
