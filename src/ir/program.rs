//! A traced program: the graph plus what the outside world needs to call it — input and output
//! names, shardings on the mesh, and which inputs are donated to which outputs.

use super::{DType, Graph, Shape, Type};
use crate::sharding::{Mesh, PartitionSpec};
use std::collections::BTreeMap;

#[derive(Clone, Debug)]
pub struct InputSpec {
    pub name: String,
    pub ty: Type,
    /// `None`: replicated.
    pub sharding: Option<PartitionSpec>,
    /// The caller gives the buffer up; it may be reused for an output of identical type.
    pub donate: bool,
}

impl InputSpec {
    pub fn sharded(&mut self, spec: PartitionSpec) -> &mut InputSpec {
        self.sharding = Some(spec);
        self
    }

    pub fn donated(&mut self) -> &mut InputSpec {
        self.donate = true;
        self
    }
}

#[derive(Clone, Debug)]
pub struct OutputSpec {
    pub name: String,
    pub ty: Type,
    /// `None`: replicated.
    pub sharding: Option<PartitionSpec>,
}

/// What a traced function is called with: named, typed, optionally sharded and donated inputs,
/// the mesh (none: one device), and the shardings wanted for named outputs.
#[derive(Clone, Debug, Default)]
pub struct Signature {
    pub mesh: Option<Mesh>,
    pub inputs: Vec<InputSpec>,
    pub output_shardings: BTreeMap<String, PartitionSpec>,
}

impl Signature {
    pub fn new(mesh: Option<Mesh>) -> Signature {
        Signature { mesh, ..Signature::default() }
    }

    /// Adds an input; chain `.sharded(spec)` / `.donated()` on the result.
    pub fn input(&mut self, name: &str, dtype: DType, dims: &[i64]) -> &mut InputSpec {
        self.inputs.push(InputSpec {
            name: name.to_string(),
            ty: Type::new(dtype, Shape::new(dims)),
            sharding: None,
            donate: false,
        });
        self.inputs.last_mut().expect("just pushed")
    }

    pub fn output_sharding(&mut self, name: &str, spec: PartitionSpec) -> &mut Signature {
        self.output_shardings.insert(name.to_string(), spec);
        self
    }
}

#[derive(Clone, Debug)]
pub struct Program {
    /// Inputs and outputs in the order of `inputs` / `outputs` below.
    pub graph: Graph,
    pub inputs: Vec<InputSpec>,
    pub outputs: Vec<OutputSpec>,
    pub mesh: Option<Mesh>,
}

impl Program {
    /// For each input, the output it is aliased to: a donated input pairs with the output of
    /// the same name if the types match, else with the first free output of identical type.
    pub fn aliases(&self) -> Vec<Option<usize>> {
        let mut taken = vec![false; self.outputs.len()];
        let mut result = vec![None; self.inputs.len()];
        for (i, input) in self.inputs.iter().enumerate().filter(|(_, inp)| inp.donate) {
            let fits = |o: &OutputSpec| o.ty == input.ty && o.sharding == input.sharding;
            let same_name = self.outputs.iter().position(|o| o.name == input.name && fits(o));
            let chosen = same_name
                .filter(|&o| !taken[o])
                .or_else(|| (0..self.outputs.len()).find(|&o| !taken[o] && fits(&self.outputs[o])));
            if let Some(o) = chosen {
                taken[o] = true;
                result[i] = Some(o);
            }
        }
        result
    }
}
