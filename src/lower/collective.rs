//! The collectives of a manual body as JAX writes them in a `shard_map` (`jax/_src/lax/parallel.py`):
//! `stablehlo.all_gather`, `reduce_scatter`, `collective_permute` and `all_to_all` with a fresh
//! device-to-device channel and the axis's device groups (`use_global_device_ids`: the ids are
//! the program's logical device ids, row-major over the mesh as `sdy.mesh` declares it), and
//! `axis_index` from `stablehlo.partition_id`.

use super::text::{Ssa, TensorType};
use super::Emitter;
use crate::ir::{Collective, DType, Eqn, Graph, Literal, Type};

impl Emitter<'_> {
    pub(super) fn collective(&mut self, c: &Collective, g: &Graph, eqn: &Eqn, ins: &[Ssa]) -> Ssa {
        let groups = self.device_groups(&c.axis().name);
        let out = g.ty(eqn.outputs[0]);
        let (t, in_t) = (TensorType(out), eqn.inputs.first().map(|&v| TensorType(g.ty(v))));
        let signature = |in_t: TensorType| format!("({in_t}) -> {t}");
        self.channels += 1;
        let channel = format!("channel_handle = #stablehlo.channel_handle<handle = {}, type = 1>", self.channels);
        let replica_groups = format!("replica_groups = {}", i64_matrix(&groups));
        match c {
            Collective::AllGather { dim, .. } => self.op(&format!(
                "\"stablehlo.all_gather\"({}) {{all_gather_dim = {dim} : i64, {channel}, {replica_groups}, \
                 use_global_device_ids}} : {}",
                ins[0],
                signature(in_t.expect("one operand"))
            )),
            Collective::ReduceScatter { dim, .. } => {
                let elem = Type::scalar(out.dtype);
                let r = self.region_op("stablehlo.reduce_scatter", ins, &[&elem, &elem], &[&elem], |e, args| {
                    vec![e.op(&format!("stablehlo.add {}, {} : {}", args[0], args[1], TensorType(&elem)))]
                });
                self.close_region_op(
                    &format!("scatter_dimension = {dim} : i64, {channel}, {replica_groups}, use_global_device_ids"),
                    &signature(in_t.expect("one operand")),
                );
                r
            }
            // No pair: every device receives nothing, which is zeros.
            Collective::Permute { pairs, .. } if pairs.is_empty() => self.constant(out, &Literal::Splat(0.0)),
            Collective::Permute { pairs, .. } => {
                let global: Vec<Vec<i64>> = groups
                    .iter()
                    .flat_map(|group| pairs.iter().map(|&(from, to)| vec![group[from], group[to]]))
                    .collect();
                self.op(&format!(
                    "\"stablehlo.collective_permute\"({}) {{{channel}, source_target_pairs = {}}} : {}",
                    ins[0],
                    i64_matrix(&global),
                    signature(in_t.expect("one operand"))
                ))
            }
            Collective::AllToAll { axis, split, concat } => self.op(&format!(
                "\"stablehlo.all_to_all\"({}) {{split_dimension = {split} : i64, concat_dimension = {concat} : i64, \
                 split_count = {} : i64, {replica_groups}, {channel}}} : {}",
                ins[0],
                axis.size,
                signature(in_t.expect("one operand"))
            )),
            Collective::AxisIndex { axis } => {
                let stride = self.axis_stride(&axis.name);
                let s32 = Type::scalar(DType::S32);
                let id = self.op("stablehlo.partition_id : tensor<ui32>");
                let id = self.op(&format!("stablehlo.convert {id} : (tensor<ui32>) -> {}", TensorType(&s32)));
                let (stride, size) = (self.scalar_i32(stride), self.scalar_i32(axis.size as i64));
                let major = self.op(&format!("stablehlo.divide {id}, {stride} : {}", TensorType(&s32)));
                self.op(&format!("stablehlo.remainder {major}, {size} : {}", TensorType(&s32)))
            }
        }
    }

    /// The mesh's devices in groups along axis `name` (those whose coordinates differ only
    /// along it), each in the axis's order, by logical device id.
    fn device_groups(&self, name: &str) -> Vec<Vec<i64>> {
        let mesh = self.mesh.expect("collectives are traced only in manual bodies, which need a mesh");
        let size = mesh.axis_size(name).expect("a manual axis is a mesh axis") as i64;
        let stride = self.axis_stride(name);
        (0..mesh.size() as i64)
            .filter(|id| (id / stride) % size == 0)
            .map(|first| (0..size).map(|k| first + k * stride).collect())
            .collect()
    }

    /// How far apart, in logical device ids, neighbours along axis `name` are: the product of
    /// the sizes of the axes after it (row-major).
    fn axis_stride(&self, name: &str) -> i64 {
        let mesh = self.mesh.expect("collectives are traced only in manual bodies, which need a mesh");
        let at = mesh.axes().iter().position(|(a, _)| a == name).expect("a manual axis is a mesh axis");
        mesh.axes()[at + 1..].iter().map(|(_, s)| *s as i64).product()
    }
}

/// `dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>`.
fn i64_matrix(rows: &[Vec<i64>]) -> String {
    let cols = rows.first().map_or(0, Vec::len);
    let text: Vec<String> =
        rows.iter().map(|r| format!("[{}]", r.iter().map(i64::to_string).collect::<Vec<_>>().join(", "))).collect();
    format!("dense<[{}]> : tensor<{}x{cols}xi64>", text.join(", "), rows.len())
}
