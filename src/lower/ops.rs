//! The StableHLO spelling of every primitive, in one exhaustive match. Simple ops use the
//! pretty syntax; gather, scatter, sort and reduce_window use the generic form (the ops with a
//! combiner region share `region_op`), and `ragged_dot` becomes loops (`ragged`). Identity-like primitives
//! (`stop_gradient`, `checkpoint_name`, and sharding constraints without a mesh) emit nothing.

use super::shardy::Shardings;
use super::text::{dense, I64Array, List, Ssa, TensorType};
use super::{w, Emitter};
use crate::ir::{BinaryOp, Comparison, DType, Eqn, Graph, Literal, Prim, ReduceOp, Scan, Type, UnaryOp};
use std::fmt::Write;

/// Writes `eqn`; returns the names of its results.
pub(super) fn emit(e: &mut Emitter, g: &Graph, eqn: &Eqn, ins: &[Ssa]) -> Vec<Ssa> {
    let in_ty = |i: usize| TensorType(g.ty(eqn.inputs[i]));
    let out = g.ty(eqn.outputs[0]);
    let t = TensorType(out);
    match &eqn.prim {
        Prim::Unary(op) => {
            let r = Ssa::Value(e.fresh());
            e.indent();
            match unary_name(*op) {
                (name, false) => w(writeln!(e.out, "{r} = stablehlo.{name} {} : {t}", ins[0])),
                (name, true) => w(writeln!(e.out, "{r} = \"chlo.{name}\"({}) : ({t}) -> {t}", ins[0])),
            }
            vec![r]
        }
        Prim::Binary(op) => vec![e.op(&format!("stablehlo.{} {}, {} : {t}", binary_name(*op), ins[0], ins[1]))],
        Prim::Compare(dir) => {
            let kind = compare_type(g.ty(eqn.inputs[0]).dtype);
            let line = format!(
                "stablehlo.compare {}, {}, {}, {kind} : ({}, {}) -> {t}",
                compare_name(*dir),
                ins[0],
                ins[1],
                in_ty(0),
                in_ty(1)
            );
            vec![e.op(&line)]
        }
        Prim::Select => vec![e.op(&format!("stablehlo.select {}, {}, {} : {}, {t}", ins[0], ins[1], ins[2], in_ty(0)))],
        Prim::Convert(_) => vec![e.op(&format!("stablehlo.convert {} : ({}) -> {t}", ins[0], in_ty(0)))],
        Prim::Iota { axis, .. } => vec![e.op(&format!("stablehlo.iota dim = {axis} : {t}"))],
        Prim::Constant { ty, value } => vec![e.constant(ty, value)],
        // The result type (`t`) carries a preferred element type.
        Prim::DotGeneral { dims: d, .. } => {
            let mut line = format!("stablehlo.dot_general {}, {}, ", ins[0], ins[1]);
            if !d.lhs_batch.is_empty() {
                w(write!(line, "batching_dims = {} x {}, ", List(&d.lhs_batch), List(&d.rhs_batch)));
            }
            w(write!(
                line,
                "contracting_dims = {} x {} : ({}, {}) -> {t}",
                List(&d.lhs_contract),
                List(&d.rhs_contract),
                in_ty(0),
                in_ty(1)
            ));
            vec![e.op(&line)]
        }
        Prim::Reduce { op, axes } => {
            let operand = g.ty(eqn.inputs[0]);
            let init = e.constant(&Type::scalar(operand.dtype), &Literal::Splat(reduce_init(*op, operand.dtype)));
            let combiner = match op {
                ReduceOp::Sum => "add",
                ReduceOp::Max => "maximum",
            };
            let line = format!(
                "stablehlo.reduce({} init: {init}) applies stablehlo.{combiner} across dimensions = {} : ({}, {}) -> {t}",
                ins[0],
                List(axes),
                in_ty(0),
                TensorType(&Type::scalar(operand.dtype))
            );
            vec![e.op(&line)]
        }
        Prim::Reshape(_) => vec![e.op(&format!("stablehlo.reshape {} : ({}) -> {t}", ins[0], in_ty(0)))],
        Prim::Transpose(perm) => {
            vec![e.op(&format!("stablehlo.transpose {}, dims = {} : ({}) -> {t}", ins[0], List(perm), in_ty(0)))]
        }
        Prim::BroadcastInDim { dims, .. } => {
            vec![e.op(&format!("stablehlo.broadcast_in_dim {}, dims = {} : ({}) -> {t}", ins[0], List(dims), in_ty(0)))]
        }
        Prim::Slice { start, limit, strides } => vec![e.op(&format!(
            "\"stablehlo.slice\"({}) {{start_indices = {}, limit_indices = {}, strides = {}}} : ({}) -> {t}",
            ins[0],
            I64Array(start),
            I64Array(limit),
            I64Array(strides),
            in_ty(0)
        ))],
        Prim::DynamicSlice { sizes } => {
            let idx_types = vec![TensorType(&Type::scalar(DType::S32)).to_string(); ins.len() - 1];
            vec![e.op(&format!(
                "stablehlo.dynamic_slice {}, sizes = {} : ({}, {}) -> {t}",
                join(ins),
                List(sizes),
                in_ty(0),
                idx_types.join(", ")
            ))]
        }
        Prim::DynamicUpdateSlice => {
            let types: Vec<String> = (0..ins.len()).map(|i| in_ty(i).to_string()).collect();
            vec![e.op(&format!("stablehlo.dynamic_update_slice {} : ({}) -> {t}", join(ins), types.join(", ")))]
        }
        Prim::Concatenate { axis } => {
            let types: Vec<String> = (0..ins.len()).map(|i| in_ty(i).to_string()).collect();
            vec![e.op(&format!("stablehlo.concatenate {}, dim = {axis} : ({}) -> {t}", join(ins), types.join(", ")))]
        }
        Prim::Gather(d) => {
            let mut fields = Vec::new();
            push_dims(&mut fields, "offset_dims", &d.offset_dims);
            push_dims(&mut fields, "collapsed_slice_dims", &d.collapsed_slice_dims);
            push_dims(&mut fields, "operand_batching_dims", &d.operand_batching_dims);
            push_dims(&mut fields, "start_indices_batching_dims", &d.start_indices_batching_dims);
            push_dims(&mut fields, "start_index_map", &d.start_index_map);
            fields.push(format!("index_vector_dim = {}", d.index_vector_dim));
            vec![e.op(&format!(
                "\"stablehlo.gather\"({}, {}) {{dimension_numbers = #stablehlo.gather<{}>, slice_sizes = {}, indices_are_sorted = false}} : ({}, {}) -> {t}",
                ins[0],
                ins[1],
                fields.join(", "),
                I64Array(&d.slice_sizes),
                in_ty(0),
                in_ty(1)
            ))]
        }
        Prim::ScatterAdd(d) => {
            let mut fields = Vec::new();
            push_dims(&mut fields, "update_window_dims", &d.update_window_dims);
            push_dims(&mut fields, "inserted_window_dims", &d.inserted_window_dims);
            push_dims(&mut fields, "input_batching_dims", &d.input_batching_dims);
            push_dims(&mut fields, "scatter_indices_batching_dims", &d.scatter_indices_batching_dims);
            push_dims(&mut fields, "scatter_dims_to_operand_dims", &d.scatter_dims_to_operand_dims);
            fields.push(format!("index_vector_dim = {}", d.index_vector_dim));
            let attrs = format!(
                "scatter_dimension_numbers = #stablehlo.scatter<{}>, indices_are_sorted = false, unique_indices = false",
                fields.join(", ")
            );
            let types: Vec<String> = (0..3).map(|i| in_ty(i).to_string()).collect();
            let elem = Type::scalar(out.dtype);
            let r = e.region_op("stablehlo.scatter", ins, &[&elem, &elem], &[&elem], |e, args| {
                vec![e.op(&format!("stablehlo.add {}, {} : {}", args[0], args[1], TensorType(&elem)))]
            });
            e.close_region_op(&attrs, &format!("({}) -> {t}", types.join(", ")));
            vec![r]
        }
        Prim::Sort { axis, descending } => {
            let key = g.ty(eqn.inputs[0]);
            let scalars: Vec<Type> =
                eqn.inputs.iter().flat_map(|&v| [Type::scalar(g.ty(v).dtype), Type::scalar(g.ty(v).dtype)]).collect();
            let refs: Vec<&Type> = scalars.iter().collect();
            let direction = if *descending { "GT" } else { "LT" };
            let kind = if key.dtype.is_float() { "TOTALORDER" } else { compare_type(key.dtype) };
            let pred = Type::scalar(DType::Pred);
            let first = e.fresh();
            let results: Vec<Ssa> = (0..ins.len() as u32)
                .map(|k| if ins.len() == 1 { Ssa::Value(first) } else { Ssa::Result(first, k) })
                .collect();
            e.region_op_named(first, ins.len(), "stablehlo.sort", ins, &refs, &[&pred], |e, args| {
                let elem = TensorType(&scalars[0]);
                vec![e.op(&format!(
                    "stablehlo.compare {direction}, {}, {}, {kind} : ({elem}, {elem}) -> {}",
                    args[0],
                    args[1],
                    TensorType(&pred)
                ))]
            });
            let types: Vec<String> = (0..ins.len()).map(|i| in_ty(i).to_string()).collect();
            e.close_region_op(
                &format!("dimension = {axis} : i64, is_stable = true"),
                &format!("({}) -> ({})", types.join(", "), types.join(", ")),
            );
            results
        }
        Prim::TopK { k } => {
            let indices = TensorType(g.ty(eqn.outputs[1]));
            e.multi(2, &format!("chlo.top_k({}, k = {k}) : {} -> ({t}, {indices})", ins[0], in_ty(0)))
        }
        Prim::Cumsum { axis, reverse } => {
            let n = out.shape[*axis];
            let mut window = vec![1; out.rank()];
            window[*axis] = n;
            let padding: Vec<String> = (0..out.rank())
                .map(|d| match (d == *axis, reverse) {
                    (false, _) => "[0, 0]".to_string(),
                    (true, false) => format!("[{}, 0]", n - 1),
                    (true, true) => format!("[0, {}]", n - 1),
                })
                .collect();
            let elem = Type::scalar(out.dtype);
            let init = e.constant(&elem, &Literal::Splat(0.0));
            let r = e.region_op("stablehlo.reduce_window", &[ins[0], init], &[&elem, &elem], &[&elem], |e, args| {
                vec![e.op(&format!("stablehlo.add {}, {} : {}", args[0], args[1], TensorType(&elem)))]
            });
            e.close_region_op(
                &format!(
                    "window_dimensions = {}, padding = dense<[{}]> : tensor<{}x2xi64>",
                    I64Array(&window),
                    padding.join(", "),
                    out.rank()
                ),
                &format!("({}, {}) -> {t}", in_ty(0), TensorType(&elem)),
            );
            vec![r]
        }
        Prim::RaggedDot(mode) => vec![e.ragged_dot(*mode, g, eqn, ins)],
        Prim::Pad { low, high, interior } => vec![e.op(&format!(
            "stablehlo.pad {}, {}, low = {}, high = {}, interior = {} : ({}, {}) -> {t}",
            ins[0],
            ins[1],
            List(low),
            List(high),
            List(interior),
            in_ty(0),
            in_ty(1)
        ))],
        Prim::StopGradient | Prim::Name(_) => vec![ins[0]],
        Prim::ShardingConstraint(spec) => match e.mesh {
            None => vec![ins[0]],
            Some(_) => vec![e.op(&format!(
                "sdy.sharding_constraint {} {} : {t}",
                ins[0],
                Shardings { spec: Some(spec), rank: out.rank(), open: false }
            ))],
        },
        Prim::OptimizationBarrier => {
            let types: Vec<String> = (0..ins.len()).map(|i| in_ty(i).to_string()).collect();
            e.multi(ins.len(), &format!("stablehlo.optimization_barrier {} : {}", join(ins), types.join(", ")))
        }
        Prim::Scan(s) => e.scan(s, g, eqn, ins),
        Prim::Remat(r) => e.graph(&r.body, ins),
        Prim::Composite(c) => e.graph(&c.forward, ins),
        Prim::CustomCall(call) => e.custom_call(call, g, eqn, ins),
        Prim::ManualComputation(m) => e.manual(m, g, eqn, ins),
        Prim::Collective(c) => vec![e.collective(c, g, eqn, ins)],
    }
}

/// `name = [..]`, left out when empty (as MLIR prints these attributes).
fn push_dims(fields: &mut Vec<String>, name: &str, dims: &[usize]) {
    if !dims.is_empty() {
        fields.push(format!("{name} = {}", List(dims)));
    }
}

/// The op name, and whether it lives in CHLO (written in generic form) rather than StableHLO.
fn unary_name(op: UnaryOp) -> (&'static str, bool) {
    match op {
        UnaryOp::Neg => ("negate", false),
        UnaryOp::Exp => ("exponential", false),
        UnaryOp::Log => ("log", false),
        UnaryOp::Log1p => ("log_plus_one", false),
        UnaryOp::Tanh => ("tanh", false),
        UnaryOp::Logistic => ("logistic", false),
        UnaryOp::Sqrt => ("sqrt", false),
        UnaryOp::Rsqrt => ("rsqrt", false),
        UnaryOp::Abs => ("abs", false),
        UnaryOp::Sign => ("sign", false),
        UnaryOp::Erf => ("erf", true),
        UnaryOp::ErfInv => ("erf_inv", true),
        UnaryOp::Sin => ("sine", false),
        UnaryOp::Cos => ("cosine", false),
    }
}

fn binary_name(op: BinaryOp) -> &'static str {
    match op {
        BinaryOp::Add => "add",
        BinaryOp::Sub => "subtract",
        BinaryOp::Mul => "multiply",
        BinaryOp::Div => "divide",
        BinaryOp::Max => "maximum",
        BinaryOp::Min => "minimum",
        BinaryOp::Pow => "power",
        BinaryOp::And => "and",
        BinaryOp::Or => "or",
        BinaryOp::Xor => "xor",
        BinaryOp::ShiftLeft => "shift_left",
        BinaryOp::ShiftRightLogical => "shift_right_logical",
    }
}

fn compare_name(dir: Comparison) -> &'static str {
    match dir {
        Comparison::Eq => "EQ",
        Comparison::Ne => "NE",
        Comparison::Lt => "LT",
        Comparison::Le => "LE",
        Comparison::Gt => "GT",
        Comparison::Ge => "GE",
    }
}

fn compare_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F16 | DType::BF16 | DType::F32 | DType::F64 | DType::F8E4M3FN | DType::F8E5M2 => "FLOAT",
        DType::S8 | DType::S32 | DType::S64 => "SIGNED",
        DType::U8 | DType::U32 | DType::Pred => "UNSIGNED",
    }
}

/// The identity of the reduction: 0 for sums, the lowest value for max.
fn reduce_init(op: ReduceOp, dtype: DType) -> f64 {
    match (op, dtype) {
        (ReduceOp::Sum, _) => 0.0,
        (ReduceOp::Max, DType::F16 | DType::BF16 | DType::F32 | DType::F64 | DType::F8E5M2) => f64::NEG_INFINITY,
        // e4m3fn has no infinity: its lowest value is -448 (`jnp.finfo(jnp.float8_e4m3fn).min`).
        (ReduceOp::Max, DType::F8E4M3FN) => -crate::host::f8::F8::E4M3FN.max(),
        (ReduceOp::Max, DType::S8) => i8::MIN as f64,
        (ReduceOp::Max, DType::S32) => i32::MIN as f64,
        (ReduceOp::Max, DType::S64) => i64::MIN as f64,
        (ReduceOp::Max, DType::U8 | DType::U32 | DType::Pred) => 0.0,
    }
}

fn join(values: &[Ssa]) -> String {
    values.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", ")
}

impl Emitter<'_> {
    /// Writes `%n = <body>` and returns `%n`.
    pub(super) fn op(&mut self, body: &str) -> Ssa {
        let r = self.fresh();
        self.indent();
        w(writeln!(self.out, "%{r} = {body}"));
        Ssa::Value(r)
    }

    /// Writes `%n:k = <body>` (or `%n = ` for one result) and returns the results.
    fn multi(&mut self, count: usize, body: &str) -> Vec<Ssa> {
        if count == 1 {
            return vec![self.op(body)];
        }
        let r = self.fresh();
        self.indent();
        w(writeln!(self.out, "%{r}:{count} = {body}"));
        (0..count as u32).map(|k| Ssa::Result(r, k)).collect()
    }

    pub(super) fn constant(&mut self, ty: &Type, value: &Literal) -> Ssa {
        let mut body = String::from("stablehlo.constant ");
        dense(&mut body, ty, value);
        w(write!(body, " : {}", TensorType(ty)));
        self.op(&body)
    }

    pub(super) fn scalar_i32(&mut self, v: i64) -> Ssa {
        self.constant(&Type::scalar(DType::S32), &Literal::Splat(v as f64))
    }

    /// Writes `%r = "<name>"(<operands>) ({ ^bb0(<block_args>): <body> })` — a one-block region
    /// returning what `body` gives, of types `returns` — and leaves the line open for
    /// `close_region_op`. Returns `%r`.
    pub(super) fn region_op(
        &mut self,
        name: &str,
        operands: &[Ssa],
        block_args: &[&Type],
        returns: &[&Type],
        body: impl FnOnce(&mut Self, &[Ssa]) -> Vec<Ssa>,
    ) -> Ssa {
        let r = self.fresh();
        self.region_op_named(r, 1, name, operands, block_args, returns, body);
        Ssa::Value(r)
    }

    /// `region_op` with `count` results named `%r` (`%r:count` when more than one).
    #[allow(clippy::too_many_arguments)]
    fn region_op_named(
        &mut self,
        r: u32,
        count: usize,
        name: &str,
        operands: &[Ssa],
        block_args: &[&Type],
        returns: &[&Type],
        body: impl FnOnce(&mut Self, &[Ssa]) -> Vec<Ssa>,
    ) {
        let args: Vec<Ssa> = block_args.iter().map(|_| Ssa::Value(self.fresh())).collect();
        let arity = if count == 1 { String::new() } else { format!(":{count}") };
        self.indent();
        w(writeln!(self.out, "%{r}{arity} = \"{name}\"({}) ({{", join(operands)));
        self.indent();
        let params: Vec<String> = args.iter().zip(block_args).map(|(a, t)| format!("{a}: {}", TensorType(t))).collect();
        w(writeln!(self.out, "^bb0({}):", params.join(", ")));
        self.depth += 1;
        let results = body(self, &args);
        self.terminator_typed("stablehlo.return", &results, returns);
        self.depth -= 1;
    }

    /// Ends an op opened by `region_op`: `}) {<attrs>} : <signature>`.
    pub(super) fn close_region_op(&mut self, attrs: &str, signature: &str) {
        self.indent();
        w(writeln!(self.out, "}}) {{{attrs}}} : {signature}"));
    }

    /// A scan as `stablehlo.while` over `(i, consts, carry, xs, ys)`: the body slices
    /// `xs[i]`, runs the scan body, and writes `ys[i]` (`i` runs backwards when reversed).
    fn scan(&mut self, s: &Scan, g: &Graph, eqn: &Eqn, ins: &[Ssa]) -> Vec<Ssa> {
        let body = &*s.body;
        let (nk, nc) = (s.num_consts, s.num_carry);
        let nx = ins.len() - nk - nc;
        let i32_ty = Type::scalar(DType::S32);
        let ys_types: Vec<&Type> = eqn.outputs[nc..].iter().map(|&v| g.ty(v)).collect();
        let zero = self.scalar_i32(0);
        let mut inits = vec![zero];
        inits.extend_from_slice(ins);
        for ty in &ys_types {
            inits.push(self.constant(ty, &Literal::Splat(0.0)));
        }
        let mut types: Vec<&Type> = vec![&i32_ty];
        types.extend(eqn.inputs.iter().map(|&v| g.ty(v)));
        types.extend(&ys_types);

        let w_id = self.fresh();
        let args: Vec<Ssa> = types.iter().map(|_| Ssa::Value(self.fresh())).collect();
        self.indent();
        let pairs: Vec<String> = args.iter().zip(&inits).map(|(a, i)| format!("{a} = {i}")).collect();
        let type_list: Vec<String> = types.iter().map(|t| TensorType(t).to_string()).collect();
        w(writeln!(
            self.out,
            "%{w_id}:{} = stablehlo.while({}) : {}",
            args.len(),
            pairs.join(", "),
            type_list.join(", ")
        ));
        self.indent();
        self.out.push_str("cond {\n");
        self.depth += 1;
        let limit = self.scalar_i32(s.length);
        let pred_ty = Type::scalar(DType::Pred);
        let go = self.op(&format!(
            "stablehlo.compare LT, {}, {limit}, SIGNED : ({it}, {it}) -> {}",
            args[0],
            TensorType(&pred_ty),
            it = TensorType(&i32_ty)
        ));
        self.terminator_typed("stablehlo.return", &[go], &[&pred_ty]);
        self.depth -= 1;
        self.indent();
        self.out.push_str("} do {\n");
        self.depth += 1;

        let i = args[0];
        let index = if s.reverse {
            let last = self.scalar_i32(s.length - 1);
            self.op(&format!("stablehlo.subtract {last}, {i} : {}", TensorType(&i32_ty)))
        } else {
            i
        };
        let zero = self.scalar_i32(0);
        let mut body_in: Vec<Ssa> = args[1..1 + nk + nc].to_vec();
        for x in 0..nx {
            let stacked = g.ty(eqn.inputs[nk + nc + x]);
            let mut sizes = stacked.shape.to_vec();
            sizes[0] = 1;
            let starts: Vec<Ssa> = std::iter::once(index).chain(std::iter::repeat_n(zero, sizes.len() - 1)).collect();
            let one_ty = Type::new(stacked.dtype, sizes.clone());
            let idx_types = vec![TensorType(&i32_ty).to_string(); sizes.len()];
            let sliced = self.op(&format!(
                "stablehlo.dynamic_slice {}, {}, sizes = {} : ({}, {}) -> {}",
                args[1 + nk + nc + x],
                join(&starts),
                List(&sizes),
                TensorType(stacked),
                idx_types.join(", "),
                TensorType(&one_ty)
            ));
            let slice_ty = Type::new(stacked.dtype, &stacked.shape[1..]);
            body_in.push(self.op(&format!(
                "stablehlo.reshape {sliced} : ({}) -> {}",
                TensorType(&one_ty),
                TensorType(&slice_ty)
            )));
        }
        let body_out = self.graph(body, &body_in);

        let one = self.scalar_i32(1);
        let mut next = vec![self.op(&format!("stablehlo.add {i}, {one} : {}", TensorType(&i32_ty)))];
        next.extend_from_slice(&args[1..1 + nk]);
        next.extend_from_slice(&body_out[..nc]);
        next.extend_from_slice(&args[1 + nk + nc..1 + nk + nc + nx]);
        for (j, ty) in ys_types.iter().enumerate() {
            let y = body_out[nc + j];
            let mut sizes = ty.shape.to_vec();
            sizes[0] = 1;
            let one_ty = Type::new(ty.dtype, sizes.clone());
            let y_ty = g.ty(eqn.outputs[nc + j]);
            let elem_ty = Type::new(y_ty.dtype, &y_ty.shape[1..]);
            let expanded =
                self.op(&format!("stablehlo.reshape {y} : ({}) -> {}", TensorType(&elem_ty), TensorType(&one_ty)));
            let starts: Vec<Ssa> = std::iter::once(index).chain(std::iter::repeat_n(zero, sizes.len() - 1)).collect();
            let mut operand_types = vec![TensorType(ty).to_string(), TensorType(&one_ty).to_string()];
            operand_types.extend(std::iter::repeat_n(TensorType(&i32_ty).to_string(), sizes.len()));
            let buffer = args[1 + nk + nc + nx + j];
            next.push(self.op(&format!(
                "stablehlo.dynamic_update_slice {buffer}, {expanded}, {} : ({}) -> {}",
                join(&starts),
                operand_types.join(", "),
                TensorType(ty)
            )));
        }
        self.terminator_typed("stablehlo.return", &next, &types);
        self.depth -= 1;
        self.indent();
        self.out.push_str("}\n");

        let mut results: Vec<Ssa> = (0..nc).map(|c| Ssa::Result(w_id, (1 + nk + c) as u32)).collect();
        results.extend((0..ys_types.len()).map(|j| Ssa::Result(w_id, (1 + nk + nc + nx + j) as u32)));
        results
    }
}
