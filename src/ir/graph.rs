//! The program representation: a flat list of equations in SSA form (JAX's jaxpr). Values are
//! numbered densely per graph, so per-value side tables in the transformations are plain `Vec`s.
//! Sub-graphs (scan and remat bodies) are closed: they see only their own inputs.

use super::{Prim, Type};
use std::fmt;

/// Index of a value in its graph's `types` table.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

impl ValueId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Debug for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// One primitive application: `outputs = prim(inputs)`.
#[derive(Clone, Debug)]
pub struct Eqn {
    pub prim: Prim,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
}

#[derive(Clone, Debug, Default)]
pub struct Graph {
    /// Type of every value, inputs included.
    pub types: Vec<Type>,
    pub inputs: Vec<ValueId>,
    /// In dependency order: every operand is an input or an earlier equation's output.
    pub eqns: Vec<Eqn>,
    pub outputs: Vec<ValueId>,
}

impl Graph {
    pub fn ty(&self, v: ValueId) -> &Type {
        &self.types[v.index()]
    }

    pub fn new_value(&mut self, ty: Type) -> ValueId {
        let id = ValueId(u32::try_from(self.types.len()).expect("more than 2^32 values in one graph"));
        self.types.push(ty);
        id
    }

    pub fn input_types(&self) -> Vec<Type> {
        self.inputs.iter().map(|&v| self.ty(v).clone()).collect()
    }

    pub fn output_types(&self) -> Vec<Type> {
        self.outputs.iter().map(|&v| self.ty(v).clone()).collect()
    }

    /// Dead-code elimination: drops equations none of whose results reach an output (all
    /// primitives are pure), and the unread lanes of an optimization barrier (its operand `i` is
    /// its result `i`): a value fenced but never read afterwards need not stay alive until the
    /// barrier (e.g. a value a remat policy saves that the backward pass turns out not to
    /// need). Returns, per input, whether anything still reads it.
    pub fn dce(&mut self) -> Vec<bool> {
        let mut live = vec![false; self.types.len()];
        for v in &self.outputs {
            live[v.index()] = true;
        }
        let mut keep = vec![false; self.eqns.len()];
        for (i, eqn) in self.eqns.iter_mut().enumerate().rev() {
            if !eqn.outputs.iter().any(|o| live[o.index()]) {
                continue;
            }
            keep[i] = true;
            if matches!(eqn.prim, Prim::OptimizationBarrier) {
                let lanes = eqn.inputs.iter().zip(&eqn.outputs).filter(|(_, o)| live[o.index()]);
                let (inputs, outputs) = lanes.map(|(&i, &o)| (i, o)).unzip();
                (eqn.inputs, eqn.outputs) = (inputs, outputs);
            }
            for v in &eqn.inputs {
                live[v.index()] = true;
            }
        }
        let mut flags = keep.into_iter();
        self.eqns.retain(|_| flags.next().unwrap_or(false));
        self.inputs.iter().map(|v| live[v.index()]).collect()
    }

    /// Number of equations including those inside scan, remat, composite (forward) and manual
    /// bodies (for reports).
    pub fn count_eqns(&self) -> usize {
        let mut count = self.eqns.len();
        for eqn in &self.eqns {
            if let Prim::Scan(s) = &eqn.prim {
                count += s.body.count_eqns();
            }
            if let Prim::Remat(r) = &eqn.prim {
                count += r.body.count_eqns();
            }
            if let Prim::Composite(c) = &eqn.prim {
                count += c.forward.count_eqns();
            }
            if let Prim::ManualComputation(m) = &eqn.prim {
                count += m.body.count_eqns();
            }
        }
        count
    }
}
