//! The lowering of `ragged_dot` as loops of dense products.
//!
//! XLA's own `ragged-dot` does not fit: XLA:CPU refuses to compile it ("not supported by
//! XLA:CPU ThunkEmitter"), and XLA's generic expansion (`RaggedDotRewriter`, used on GPUs
//! without the cuDNN fusion) multiplies every row by every group's matrix, G times the work.
//! Instead the rows are walked group by group in tiles of `tile_rows` rows: each tile is one
//! dense product with its group's matrix, and only the tile's rows inside the group are kept.
//! The work is one product per row plus at most one partial tile per group.
//!
//! Both loops carry everything they read (StableHLO regions may capture, but explicit operands
//! keep the loop self-contained for every consumer). Operands are padded by one tile of zero
//! rows so that a tile starting at any row of the input fits without `dynamic_slice` clamping
//! its start.

use super::text::{I64Array, List, Ssa, TensorType};
use super::{w, Emitter};
use crate::ir::{DType, Eqn, Graph, Literal, RaggedDotMode, Type};
use std::fmt::Write;

/// Rows per tile, from the mean group size. A group wastes at most one partial tile, so smaller
/// tiles waste less; but a tile's rows set its product's arithmetic intensity, since each tile
/// re-reads its group's `[k, n]` matrix (rows mode: `rows` FLOPs per byte) or adds into the
/// group's `[k, n]` accumulator (groups mode: f32 read and written, `rows / 4` FLOPs per byte),
/// and a GPU needs about 300 to be compute-bound (an H100's 989 TFLOP/s over 3.35 TB/s). Rows
/// mode takes a quarter of the mean group (256 rows for Mixtral's 2 x 2048 tokens, top 2 of 8
/// experts: about an eighth more rows than assigned), groups mode the whole mean group (1024:
/// about half the groups then take a second, partly empty tile), as powers of two. Each tile is
/// one loop iteration with its own slices and update, so large batches take large tiles: at
/// most 1024 and 4096 rows (Mixtral's 2 layers at 12 x 4096 tokens on an H200: 0.94 s a step
/// with at most 256 and 1024, 0.79 s with these).
fn tile_rows(mode: RaggedDotMode, rows: i64, groups: i64) -> i64 {
    let mean = (rows / groups.max(1)).max(1);
    let pow2 = |n: i64| n.max(1).unsigned_abs().next_power_of_two() as i64;
    match mode {
        RaggedDotMode::NonContracting { .. } => pow2(mean / 4).clamp(8, 1024),
        RaggedDotMode::Contracting => pow2(mean).clamp(8, 4096),
    }
}

/// Accumulation type for sums over tiles: f32 for 16- and 8-bit floats.
fn accumulator(dtype: DType) -> DType {
    match dtype {
        DType::BF16 | DType::F16 | DType::F8E4M3FN | DType::F8E5M2 => DType::F32,
        DType::F32 | DType::F64 | DType::S8 | DType::S32 | DType::S64 | DType::U8 | DType::U32 | DType::Pred => dtype,
    }
}

impl Emitter<'_> {
    pub(super) fn ragged_dot(&mut self, mode: RaggedDotMode, g: &Graph, eqn: &Eqn, ins: &[Ssa]) -> Ssa {
        let (lhs, rhs, sizes) = (g.ty(eqn.inputs[0]), g.ty(eqn.inputs[1]), g.ty(eqn.inputs[2]));
        let out = g.ty(eqn.outputs[0]);
        let tm = tile_rows(mode, lhs.shape[0], sizes.shape[0]);
        match mode {
            RaggedDotMode::NonContracting { rhs_transposed } => {
                self.ragged_rows(lhs, rhs, sizes, out, tm, rhs_transposed, ins)
            }
            RaggedDotMode::Contracting => self.ragged_groups(lhs, rhs, sizes, out, tm, ins),
        }
    }

    /// `out[m] = lhs[m] @ rhs[g]` (or `rhs[g]^T`): for each group, for each tile of its rows,
    /// the tile's product replaces the output rows that belong to the group.
    #[allow(clippy::too_many_arguments)]
    fn ragged_rows(
        &mut self,
        lhs: &Type,
        rhs_ty: &Type,
        sizes: &Type,
        out: &Type,
        tm: i64,
        rhs_transposed: bool,
        ins: &[Ssa],
    ) -> Ssa {
        let (m, n) = (out.shape[0], out.shape[1]);
        let s32 = Type::scalar(DType::S32);
        let lhs_p = self.pad_rows(ins[0], lhs, tm);
        let lhs_p_ty = padded(lhs, tm);
        let out_p_ty = padded(out, tm);
        let out0 = self.constant(&out_p_ty, &Literal::Splat(0.0));
        let weight_ty = Type::new(rhs_ty.dtype, &rhs_ty.shape[1..]);
        let zero = self.scalar_i32(0);
        let carried: [(Ssa, &Type); 6] =
            [(zero, &s32), (zero, &s32), (out0, &out_p_ty), (lhs_p, &lhs_p_ty), (ins[1], rhs_ty), (ins[2], sizes)];
        let groups = sizes.shape[0];
        let results = self.while_loop(
            &carried,
            |e, a| e.less_than(a[0], groups),
            |e, a| {
                let (group, start, acc, lhs_p, rhs, sizes) = (a[0], a[1], a[2], a[3], a[4], a[5]);
                let size = e.element(sizes, &[group], &Type::new(DType::S32, [groups]));
                let zero = e.scalar_i32(0);
                let weight = e.element(rhs, &[group, zero, zero], rhs_ty);
                let done = e.group_tiles(
                    tm,
                    [(acc, &out_p_ty), (lhs_p, &lhs_p_ty), (weight, &weight_ty)],
                    size,
                    start,
                    |e, row, left, [acc, lhs_p, weight]| {
                        let k = lhs.shape[1];
                        let x = e.rows(lhs_p, &lhs_p_ty, row, tm);
                        let x_ty = Type::new(lhs.dtype, [tm, k]);
                        let y_ty = Type::new(out.dtype, [tm, n]);
                        let contract = if rhs_transposed { 1 } else { 0 };
                        let y = e.op(&format!(
                            "stablehlo.dot_general {x}, {weight}, contracting_dims = [1] x [{contract}] : ({}, {}) -> {}",
                            TensorType(&x_ty),
                            TensorType(&weight_ty),
                            TensorType(&y_ty)
                        ));
                        let old = e.rows(acc, &out_p_ty, row, tm);
                        let kept = e.select_rows(left, y, old, &y_ty);
                        let zero = e.scalar_i32(0);
                        e.op(&format!(
                            "stablehlo.dynamic_update_slice {acc}, {kept}, {row}, {zero} : ({}, {}, {s}, {s}) -> {}",
                            TensorType(&out_p_ty),
                            TensorType(&y_ty),
                            TensorType(&out_p_ty),
                            s = TensorType(&s32)
                        ))
                    },
                );
                let one = e.scalar_i32(1);
                vec![e.add_i32(group, one), e.add_i32(start, size), done, lhs_p, rhs, sizes]
            },
        );
        self.op(&format!(
            "\"stablehlo.slice\"({}) {{start_indices = {}, limit_indices = {}, strides = {}}} : ({}) -> {}",
            results[2],
            I64Array(&[0, 0]),
            I64Array(&[m, n]),
            I64Array(&[1, 1]),
            TensorType(&out_p_ty),
            TensorType(out)
        ))
    }

    /// `out[g] = lhs[rows of g]^T @ rhs[rows of g]`: for each group, the tiles' products summed
    /// (rows outside the group zeroed), written as the group's slice of the output.
    fn ragged_groups(&mut self, lhs: &Type, rhs: &Type, sizes: &Type, out: &Type, tm: i64, ins: &[Ssa]) -> Ssa {
        let (k, n) = (lhs.shape[1], rhs.shape[1]);
        let s32 = Type::scalar(DType::S32);
        let acc_ty = Type::new(accumulator(out.dtype), [k, n]);
        let lhs_p = self.pad_rows(ins[0], lhs, tm);
        let rhs_p = self.pad_rows(ins[1], rhs, tm);
        let (lhs_p_ty, rhs_p_ty) = (padded(lhs, tm), padded(rhs, tm));
        let out0 = self.constant(out, &Literal::Splat(0.0));
        let zero = self.scalar_i32(0);
        let groups = sizes.shape[0];
        let carried: [(Ssa, &Type); 6] =
            [(zero, &s32), (zero, &s32), (out0, out), (lhs_p, &lhs_p_ty), (rhs_p, &rhs_p_ty), (ins[2], sizes)];
        let results = self.while_loop(
            &carried,
            |e, a| e.less_than(a[0], groups),
            |e, a| {
                let (group, start, result, lhs_p, rhs_p, sizes) = (a[0], a[1], a[2], a[3], a[4], a[5]);
                let size = e.element(sizes, &[group], &Type::new(DType::S32, [groups]));
                let acc0 = e.constant(&acc_ty, &Literal::Splat(0.0));
                let done = e.group_tiles(
                    tm,
                    [(acc0, &acc_ty), (lhs_p, &lhs_p_ty), (rhs_p, &rhs_p_ty)],
                    size,
                    start,
                    |e, row, left, [acc, lhs_p, rhs_p]| {
                        let x_ty = Type::new(lhs.dtype, [tm, k]);
                        let y_ty = Type::new(rhs.dtype, [tm, n]);
                        let x = e.rows(lhs_p, &lhs_p_ty, row, tm);
                        let y = e.rows(rhs_p, &rhs_p_ty, row, tm);
                        let zeros = e.constant(&x_ty, &Literal::Splat(0.0));
                        let x = e.select_rows(left, x, zeros, &x_ty);
                        // The product in the accumulation dtype: one rounding per group, not
                        // per tile, and `acc + x^T y` is one GEMM with its sum fused in on GPUs
                        // instead of a product and a pass over [k, n] that adds it.
                        let prod = e.op(&format!(
                            "stablehlo.dot_general {x}, {y}, contracting_dims = [0] x [0] : ({}, {}) -> {}",
                            TensorType(&x_ty),
                            TensorType(&y_ty),
                            TensorType(&acc_ty)
                        ));
                        e.op(&format!("stablehlo.add {acc}, {prod} : {}", TensorType(&acc_ty)))
                    },
                );
                let block_ty = Type::new(out.dtype, [1, k, n]);
                let mut acc = done;
                if acc_ty.dtype != out.dtype {
                    acc = e.op(&format!(
                        "stablehlo.convert {acc} : ({}) -> {}",
                        TensorType(&acc_ty),
                        TensorType(&Type::new(out.dtype, [k, n]))
                    ));
                }
                let block = e.op(&format!(
                    "stablehlo.reshape {acc} : ({}) -> {}",
                    TensorType(&Type::new(out.dtype, [k, n])),
                    TensorType(&block_ty)
                ));
                let zero = e.scalar_i32(0);
                let updated = e.op(&format!(
                    "stablehlo.dynamic_update_slice {result}, {block}, {group}, {zero}, {zero} : ({}, {}, {s}, {s}, {s}) -> {}",
                    TensorType(out),
                    TensorType(&block_ty),
                    TensorType(out),
                    s = TensorType(&s32)
                ));
                let one = e.scalar_i32(1);
                vec![e.add_i32(group, one), e.add_i32(start, size), updated, lhs_p, rhs_p, sizes]
            },
        );
        results[2]
    }

    /// The loop over one group's rows in tiles of `tm`: `offset` = 0, tm, ... while `offset <
    /// size`. `body(e, row, left, [acc, a, b])` gives the next `acc` from the tile at `row` =
    /// `start + offset`, whose first `left` = `size - offset` rows are the group's (`a` and `b`
    /// ride along unchanged). Returns the final `acc`.
    fn group_tiles(
        &mut self,
        tm: i64,
        [acc, a, b]: [(Ssa, &Type); 3],
        size: Ssa,
        start: Ssa,
        body: impl FnOnce(&mut Self, Ssa, Ssa, [Ssa; 3]) -> Ssa,
    ) -> Ssa {
        let s32 = Type::scalar(DType::S32);
        let zero = self.scalar_i32(0);
        let carried: [(Ssa, &Type); 6] = [(zero, &s32), acc, a, b, (size, &s32), (start, &s32)];
        let done = self.while_loop(
            &carried,
            |e, v| e.compare_i32("LT", v[0], v[4]),
            |e, v| {
                let (offset, size, start) = (v[0], v[4], v[5]);
                let row = e.add_i32(start, offset);
                let left = e.sub_i32(size, offset);
                let next = body(e, row, left, [v[1], v[2], v[3]]);
                let tile = e.scalar_i32(tm);
                vec![e.add_i32(offset, tile), next, v[2], v[3], size, start]
            },
        );
        done[1]
    }

    /// A `stablehlo.while` over `carried` (initial value, type); `cond` and `body` see the
    /// loop's block arguments. Returns the loop's results.
    fn while_loop(
        &mut self,
        carried: &[(Ssa, &Type)],
        cond: impl FnOnce(&mut Self, &[Ssa]) -> Ssa,
        body: impl FnOnce(&mut Self, &[Ssa]) -> Vec<Ssa>,
    ) -> Vec<Ssa> {
        let id = self.fresh();
        let args: Vec<Ssa> = carried.iter().map(|_| Ssa::Value(self.fresh())).collect();
        let types: Vec<&Type> = carried.iter().map(|c| c.1).collect();
        let inits: Vec<String> = args.iter().zip(carried).map(|(a, (init, _))| format!("{a} = {init}")).collect();
        let names: Vec<String> = types.iter().map(|t| TensorType(t).to_string()).collect();
        self.indent();
        w(writeln!(self.out, "%{id}:{} = stablehlo.while({}) : {}", args.len(), inits.join(", "), names.join(", ")));
        self.indent();
        self.out.push_str("cond {\n");
        self.depth += 1;
        let go = cond(self, &args);
        self.terminator_typed("stablehlo.return", &[go], &[&Type::scalar(DType::Pred)]);
        self.depth -= 1;
        self.indent();
        self.out.push_str("} do {\n");
        self.depth += 1;
        let next = body(self, &args);
        self.terminator_typed("stablehlo.return", &next, &types);
        self.depth -= 1;
        self.indent();
        self.out.push_str("}\n");
        (0..args.len() as u32).map(|k| Ssa::Result(id, k)).collect()
    }

    fn less_than(&mut self, i: Ssa, limit: i64) -> Ssa {
        let limit = self.scalar_i32(limit);
        self.compare_i32("LT", i, limit)
    }

    fn compare_i32(&mut self, direction: &str, a: Ssa, b: Ssa) -> Ssa {
        let (s, p) = (Type::scalar(DType::S32), Type::scalar(DType::Pred));
        self.op(&format!(
            "stablehlo.compare {direction}, {a}, {b}, SIGNED : ({s}, {s}) -> {}",
            TensorType(&p),
            s = TensorType(&s)
        ))
    }

    fn add_i32(&mut self, a: Ssa, b: Ssa) -> Ssa {
        self.op(&format!("stablehlo.add {a}, {b} : {}", TensorType(&Type::scalar(DType::S32))))
    }

    fn sub_i32(&mut self, a: Ssa, b: Ssa) -> Ssa {
        self.op(&format!("stablehlo.subtract {a}, {b} : {}", TensorType(&Type::scalar(DType::S32))))
    }

    /// `array` with `tm` zero rows appended.
    fn pad_rows(&mut self, array: Ssa, ty: &Type, tm: i64) -> Ssa {
        let zero = self.constant(&Type::scalar(ty.dtype), &Literal::Splat(0.0));
        let mut high = vec![0; ty.rank()];
        high[0] = tm;
        let none = vec![0; ty.rank()];
        self.op(&format!(
            "stablehlo.pad {array}, {zero}, low = {}, high = {}, interior = {} : ({}, {}) -> {}",
            List(&none),
            List(&high),
            List(&none),
            TensorType(ty),
            TensorType(&Type::scalar(ty.dtype)),
            TensorType(&padded(ty, tm))
        ))
    }

    /// Rows `row..row + tm` of a rank-2 `array`.
    fn rows(&mut self, array: Ssa, ty: &Type, row: Ssa, tm: i64) -> Ssa {
        let zero = self.scalar_i32(0);
        let s = TensorType(&Type::scalar(DType::S32)).to_string();
        self.op(&format!(
            "stablehlo.dynamic_slice {array}, {row}, {zero}, sizes = {} : ({}, {s}, {s}) -> {}",
            List(&[tm, ty.shape[1]]),
            TensorType(ty),
            TensorType(&Type::new(ty.dtype, [tm, ty.shape[1]]))
        ))
    }

    /// Element `at` of `array` (one index per dimension), without the unit dimensions of the
    /// slice: a scalar of a rank-1 array, a `[K,N]` matrix of a `[G,K,N]` one.
    fn element(&mut self, array: Ssa, at: &[Ssa], ty: &Type) -> Ssa {
        let mut sizes = ty.shape.to_vec();
        sizes[0] = 1;
        let s = TensorType(&Type::scalar(DType::S32)).to_string();
        let index_types = vec![s; at.len()];
        let slice_ty = Type::new(ty.dtype, sizes.clone());
        let at: Vec<String> = at.iter().map(|a| a.to_string()).collect();
        let slice = self.op(&format!(
            "stablehlo.dynamic_slice {array}, {}, sizes = {} : ({}, {}) -> {}",
            at.join(", "),
            List(&sizes),
            TensorType(ty),
            index_types.join(", "),
            TensorType(&slice_ty)
        ));
        let result_ty = Type::new(ty.dtype, &sizes[1..]);
        self.op(&format!("stablehlo.reshape {slice} : ({}) -> {}", TensorType(&slice_ty), TensorType(&result_ty)))
    }

    /// `if row < left { a } else { b }` per row of the `[rows, cols]` values `a`, `b`.
    fn select_rows(&mut self, left: Ssa, a: Ssa, b: Ssa, ty: &Type) -> Ssa {
        let index_ty = Type::new(DType::S32, ty.shape.clone());
        let rows = self.op(&format!("stablehlo.iota dim = 0 : {}", TensorType(&index_ty)));
        let limit = self.op(&format!(
            "stablehlo.broadcast_in_dim {left}, dims = [] : ({}) -> {}",
            TensorType(&Type::scalar(DType::S32)),
            TensorType(&index_ty)
        ));
        let pred_ty = Type::new(DType::Pred, ty.shape.clone());
        let mask = self.op(&format!(
            "stablehlo.compare LT, {rows}, {limit}, SIGNED : ({i}, {i}) -> {}",
            TensorType(&pred_ty),
            i = TensorType(&index_ty)
        ));
        self.op(&format!("stablehlo.select {mask}, {a}, {b} : {}, {}", TensorType(&pred_ty), TensorType(ty)))
    }
}

/// `ty` with `tm` more rows.
fn padded(ty: &Type, tm: i64) -> Type {
    let mut dims = ty.shape.to_vec();
    dims[0] += tm;
    Type::new(ty.dtype, dims)
}
