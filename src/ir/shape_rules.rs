//! Shape and dtype rules: the result types of a primitive from its operand types, or a message
//! saying what does not fit. Called for every equation at trace time; the tracer adds the op
//! name, the operand types and the caller's location to the message.

use super::{
    BinaryOp, Collective, CustomCall, DType, DotDims, GatherDims, Literal, Manual, Prim, RaggedDotMode, ReduceOp,
    ScatterDims, Shape, Type, UnaryOp,
};

pub type RuleResult = Result<Vec<Type>, String>;

pub fn infer(prim: &Prim, ins: &[&Type]) -> RuleResult {
    match prim {
        Prim::Unary(op) => {
            arity(ins, 1)?;
            let numeric_ok = match op {
                UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign => true,
                UnaryOp::Exp
                | UnaryOp::Log
                | UnaryOp::Log1p
                | UnaryOp::Tanh
                | UnaryOp::Logistic
                | UnaryOp::Sqrt
                | UnaryOp::Rsqrt
                | UnaryOp::Erf
                | UnaryOp::ErfInv
                | UnaryOp::Sin
                | UnaryOp::Cos => false,
            };
            let t = ins[0];
            if !(t.dtype.is_float() || (numeric_ok && t.dtype == DType::S32)) {
                return Err(format!("unsupported element type {}", t.dtype));
            }
            Ok(vec![t.clone()])
        }
        Prim::Binary(op) => {
            arity(ins, 2)?;
            same_types(ins)?;
            let dt = ins[0].dtype;
            let ok = match op {
                BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div | BinaryOp::Max | BinaryOp::Min => {
                    dt != DType::Pred
                }
                BinaryOp::Pow => dt.is_float(),
                BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => !dt.is_float(),
                BinaryOp::ShiftLeft | BinaryOp::ShiftRightLogical => dt.is_integer(),
            };
            if !ok {
                return Err(format!("unsupported element type {dt}"));
            }
            Ok(vec![ins[0].clone()])
        }
        Prim::Compare(_) => {
            arity(ins, 2)?;
            same_types(ins)?;
            Ok(vec![ins[0].with_dtype(DType::Pred)])
        }
        Prim::Select => {
            arity(ins, 3)?;
            if ins[0].dtype != DType::Pred {
                return Err("the predicate must be pred".into());
            }
            if ins[0].shape != ins[1].shape {
                return Err("the predicate and the values differ in shape".into());
            }
            same_types(&ins[1..])?;
            Ok(vec![ins[1].clone()])
        }
        Prim::Convert(dt) => {
            arity(ins, 1)?;
            Ok(vec![ins[0].with_dtype(*dt)])
        }
        Prim::Iota { ty, axis } => {
            arity(ins, 0)?;
            if *axis >= ty.rank() {
                return Err(format!("axis {axis} out of range for {ty}"));
            }
            if ty.dtype == DType::Pred {
                return Err("iota of pred".into());
            }
            Ok(vec![ty.clone()])
        }
        Prim::Constant { ty, value } => {
            arity(ins, 0)?;
            if let Literal::Dense(values) = value {
                if values.len() as i64 != ty.shape.num_elements() {
                    return Err(format!("{} values for {ty}", values.len()));
                }
            }
            Ok(vec![ty.clone()])
        }
        Prim::DotGeneral { dims, preferred } => {
            arity(ins, 2)?;
            let dtype = dot_result_type(*preferred, ins[0].dtype, ins[1].dtype)?;
            dot_general(dims, dtype, ins[0], ins[1])
        }
        Prim::Reduce { op, axes } => {
            arity(ins, 1)?;
            let t = ins[0];
            distinct_in_range(axes, t.rank(), "reduction axes")?;
            if t.dtype == DType::Pred || (*op == ReduceOp::Sum && !t.dtype.is_float() && t.dtype != DType::S32) {
                return Err(format!("unsupported element type {}", t.dtype));
            }
            let dims: Vec<i64> = (0..t.rank()).filter(|d| !axes.contains(d)).map(|d| t.shape[d]).collect();
            Ok(vec![Type::new(t.dtype, dims)])
        }
        Prim::Reshape(shape) => {
            arity(ins, 1)?;
            if shape.num_elements() != ins[0].shape.num_elements() || shape.iter().any(|&d| d < 0) {
                return Err(format!("cannot reshape to {shape:?}"));
            }
            Ok(vec![Type { dtype: ins[0].dtype, shape: shape.clone() }])
        }
        Prim::Transpose(perm) => {
            arity(ins, 1)?;
            let t = ins[0];
            if perm.len() != t.rank() {
                return Err(format!("permutation {perm:?} has the wrong length"));
            }
            distinct_in_range(perm, t.rank(), "permutation")?;
            Ok(vec![Type::new(t.dtype, perm.iter().map(|&p| t.shape[p]).collect::<Vec<_>>())])
        }
        Prim::BroadcastInDim { shape, dims } => {
            arity(ins, 1)?;
            let t = ins[0];
            if dims.len() != t.rank() {
                return Err(format!("broadcast dims {dims:?} do not match the operand rank"));
            }
            distinct_in_range(dims, shape.rank(), "broadcast dims")?;
            for (i, &d) in dims.iter().enumerate() {
                if t.shape[i] != 1 && t.shape[i] != shape[d] {
                    return Err(format!("operand dim {i} (size {}) cannot broadcast to {shape:?}", t.shape[i]));
                }
            }
            Ok(vec![Type { dtype: t.dtype, shape: shape.clone() }])
        }
        Prim::Slice { start, limit, strides } => {
            arity(ins, 1)?;
            let t = ins[0];
            if start.len() != t.rank() || limit.len() != t.rank() || strides.len() != t.rank() {
                return Err("slice bounds do not match the operand rank".into());
            }
            let mut out = Vec::with_capacity(t.rank());
            for d in 0..t.rank() {
                let (s, l, st) = (start[d], limit[d], strides[d]);
                if s < 0 || s > l || l > t.shape[d] || st < 1 {
                    return Err(format!("bad slice [{s}:{l}:{st}] of dim {d}"));
                }
                out.push((l - s + st - 1) / st);
            }
            Ok(vec![Type::new(t.dtype, out)])
        }
        Prim::DynamicSlice { sizes } => {
            let t = ins.first().ok_or("missing operand")?;
            arity(ins, 1 + t.rank())?;
            indices(&ins[1..])?;
            if sizes.len() != t.rank() || sizes.iter().zip(t.shape.iter()).any(|(s, d)| *s < 0 || s > d) {
                return Err(format!("slice sizes {sizes:?} do not fit"));
            }
            Ok(vec![Type::new(t.dtype, sizes.clone())])
        }
        Prim::DynamicUpdateSlice => {
            let t = ins.first().ok_or("missing operand")?;
            arity(ins, 2 + t.rank())?;
            let u = ins[1];
            if u.dtype != t.dtype || u.rank() != t.rank() || u.shape.iter().zip(t.shape.iter()).any(|(a, b)| a > b) {
                return Err("the update does not fit in the operand".into());
            }
            indices(&ins[2..])?;
            Ok(vec![(*t).clone()])
        }
        Prim::Concatenate { axis } => {
            let first = ins.first().ok_or("nothing to concatenate")?;
            if *axis >= first.rank() {
                return Err(format!("axis {axis} out of range"));
            }
            let mut total = 0;
            for t in ins {
                let same_other_dims =
                    t.rank() == first.rank() && (0..t.rank()).all(|d| d == *axis || t.shape[d] == first.shape[d]);
                if t.dtype != first.dtype || !same_other_dims {
                    return Err("operands differ outside the concatenation axis".into());
                }
                total += t.shape[*axis];
            }
            let mut dims = first.shape.to_vec();
            dims[*axis] = total;
            Ok(vec![Type::new(first.dtype, dims)])
        }
        Prim::Gather(dims) => {
            arity(ins, 2)?;
            gather(dims, ins[0], ins[1])
        }
        Prim::ScatterAdd(dims) => {
            arity(ins, 3)?;
            scatter(dims, ins[0], ins[1], ins[2])
        }
        Prim::Sort { axis, .. } => {
            let keys = ins.first().ok_or("nothing to sort")?;
            if *axis >= keys.rank() {
                return Err(format!("axis {axis} out of range"));
            }
            if ins.iter().any(|t| t.shape != keys.shape) {
                return Err("the operands differ in shape".into());
            }
            if keys.dtype == DType::Pred {
                return Err("cannot sort by pred keys".into());
            }
            Ok(ins.iter().map(|t| (*t).clone()).collect())
        }
        Prim::TopK { k } => {
            arity(ins, 1)?;
            let t = ins[0];
            let n = *t.shape.last().ok_or("the operand must have at least one dimension")?;
            if !t.dtype.is_float() && t.dtype != DType::S32 {
                return Err(format!("unsupported element type {}", t.dtype));
            }
            if *k < 1 || *k > n {
                return Err(format!("k = {k} must be in 1..={n}"));
            }
            let mut dims = t.shape.to_vec();
            *dims.last_mut().expect("rank >= 1") = *k;
            Ok(vec![Type::new(t.dtype, dims.clone()), Type::new(DType::S32, dims)])
        }
        Prim::Cumsum { axis, .. } => {
            arity(ins, 1)?;
            let t = ins[0];
            if *axis >= t.rank() {
                return Err(format!("axis {axis} out of range"));
            }
            if !t.dtype.is_float() && t.dtype != DType::S32 {
                return Err(format!("unsupported element type {}", t.dtype));
            }
            Ok(vec![t.clone()])
        }
        Prim::RaggedDot(mode) => {
            arity(ins, 3)?;
            ragged_dot(*mode, ins[0], ins[1], ins[2])
        }
        Prim::Pad { low, high, interior } => {
            arity(ins, 2)?;
            let (t, v) = (ins[0], ins[1]);
            if v.rank() != 0 || v.dtype != t.dtype {
                return Err("the padding value must be a scalar of the operand's type".into());
            }
            if low.len() != t.rank() || high.len() != t.rank() || interior.len() != t.rank() {
                return Err("padding does not match the operand rank".into());
            }
            if low.iter().chain(high).chain(interior).any(|&p| p < 0) {
                return Err("padding amounts must be non-negative".into());
            }
            let dims: Vec<i64> =
                (0..t.rank()).map(|d| low[d] + high[d] + t.shape[d] + (t.shape[d] - 1).max(0) * interior[d]).collect();
            Ok(vec![Type::new(t.dtype, dims)])
        }
        Prim::StopGradient | Prim::Name(_) => {
            arity(ins, 1)?;
            Ok(vec![ins[0].clone()])
        }
        Prim::ShardingConstraint(spec) => {
            arity(ins, 1)?;
            if spec.rank() > ins[0].rank() {
                return Err(format!("partition spec {spec} has more entries than the operand has dimensions"));
            }
            Ok(vec![ins[0].clone()])
        }
        Prim::OptimizationBarrier => Ok(ins.iter().map(|t| (*t).clone()).collect()),
        Prim::Scan(scan) => {
            let body = &scan.body;
            let (nk, nc) = (scan.num_consts, scan.num_carry);
            if ins.len() != body.inputs.len() || nk + nc > ins.len() || nc > body.outputs.len() {
                return Err(format!("{} operands for a body with {} inputs", ins.len(), body.inputs.len()));
            }
            let mut slice_types = Vec::with_capacity(ins.len());
            for (i, t) in ins.iter().enumerate() {
                if i < nk + nc {
                    slice_types.push((*t).clone());
                } else {
                    if t.rank() == 0 || t.shape[0] != scan.length {
                        return Err(format!("scanned operand {t} does not have leading dimension {}", scan.length));
                    }
                    slice_types.push(Type::new(t.dtype, &t.shape[1..]));
                }
            }
            if slice_types != body.input_types() {
                return Err("operand types do not match the body's inputs".into());
            }
            let outs = body.output_types();
            if outs[..nc] != slice_types[nk..nk + nc] {
                return Err("the body changes the carry's type".into());
            }
            let mut result = outs[..nc].to_vec();
            for y in &outs[nc..] {
                let dims: Vec<i64> = std::iter::once(scan.length).chain(y.shape.iter().copied()).collect();
                result.push(Type::new(y.dtype, dims));
            }
            Ok(result)
        }
        Prim::Remat(remat) => {
            let want = remat.body.input_types();
            if ins.len() != want.len() || ins.iter().zip(&want).any(|(a, b)| *a != b) {
                return Err("operand types do not match the body's inputs".into());
            }
            Ok(remat.body.output_types())
        }
        Prim::Composite(c) => {
            let want = c.forward.input_types();
            if ins.len() != want.len() || ins.iter().zip(&want).any(|(a, b)| *a != b) {
                return Err(format!("operand types do not match the inputs of composite {}", c.name));
            }
            Ok(c.forward.output_types())
        }
        Prim::CustomCall(call) => custom_call(call, ins),
        Prim::ManualComputation(m) => manual(m, ins),
        Prim::Collective(c) => collective(c, ins),
    }
}

/// One layout per operand and result, each a permutation of its value's dimensions.
fn custom_call(call: &CustomCall, ins: &[&Type]) -> RuleResult {
    arity(ins, call.operand_layouts.len())?;
    if call.result_layouts.len() != call.results.len() {
        return Err(format!("{} result layouts for {} results", call.result_layouts.len(), call.results.len()));
    }
    let layouts = call.operand_layouts.iter().zip(ins.iter().copied());
    for (i, (layout, t)) in layouts.chain(call.result_layouts.iter().zip(&call.results)).enumerate() {
        if layout.len() != t.rank() {
            return Err(format!("layout {layout:?} of value {i} ({t}) does not name each dimension once"));
        }
        distinct_in_range(layout, t.rank(), "layout")?;
    }
    Ok(call.results.clone())
}

/// Each operand's local shard must be the body's input; each result is the body's output
/// times its shards. Only manual axes split values, each dimension evenly.
fn manual(m: &Manual, ins: &[&Type]) -> RuleResult {
    let body = &m.body;
    if ins.len() != body.inputs.len() || m.in_specs.len() != ins.len() || m.out_specs.len() != body.outputs.len() {
        return Err(format!(
            "{} operands and {} operand specs for a body with {} inputs; {} result specs for {} outputs",
            ins.len(),
            m.in_specs.len(),
            body.inputs.len(),
            m.out_specs.len(),
            body.outputs.len()
        ));
    }
    for spec in m.in_specs.iter().chain(&m.out_specs) {
        if let Some(axis) = (0..spec.rank()).flat_map(|d| spec.dim(d)).find(|a| !m.axes.iter().any(|(n, _)| n == *a)) {
            return Err(format!("{spec} uses mesh axis \"{axis}\", which is not a manual axis"));
        }
    }
    for (i, (t, spec)) in ins.iter().zip(&m.in_specs).enumerate() {
        if spec.rank() > t.rank() {
            return Err(format!("operand {i} ({t}) has fewer dimensions than its spec {spec}"));
        }
        let mut local = t.shape.to_vec();
        for (d, size) in local.iter_mut().enumerate() {
            let shards = m.shards(spec, d);
            if *size % shards != 0 {
                return Err(format!("dimension {d} of operand {i} ({t}) does not split into {shards} shards ({spec})"));
            }
            *size /= shards;
        }
        let want = body.ty(body.inputs[i]);
        if Type::new(t.dtype, local) != *want {
            return Err(format!("operand {i} ({t}) split by {spec} is not the body's input {want}"));
        }
    }
    let mut results = Vec::with_capacity(body.outputs.len());
    for (o, spec) in body.outputs.iter().zip(&m.out_specs) {
        let t = body.ty(*o);
        if spec.rank() > t.rank() {
            return Err(format!("output {t} has fewer dimensions than its spec {spec}"));
        }
        let global: Vec<i64> = (0..t.rank()).map(|d| t.shape[d] * m.shards(spec, d)).collect();
        results.push(Type::new(t.dtype, global));
    }
    Ok(results)
}

fn collective(c: &Collective, ins: &[&Type]) -> Result<Vec<Type>, String> {
    let n = c.axis().size as i64;
    let split = |t: &Type, dim: usize| -> Result<(), String> {
        match t.shape[dim] % n {
            0 => Ok(()),
            _ => Err(format!("dimension {dim} of {t} does not split into {n} parts")),
        }
    };
    let dim_of = |t: &Type, dim: usize| match dim < t.rank() {
        true => Ok(()),
        false => Err(format!("dimension {dim} out of range for {t}")),
    };
    let t = match c {
        Collective::AxisIndex { .. } => {
            arity(ins, 0)?;
            return Ok(vec![Type::scalar(DType::S32)]);
        }
        _ => {
            arity(ins, 1)?;
            ins[0]
        }
    };
    if t.dtype == DType::Pred {
        return Err(format!("unsupported element type {}", t.dtype));
    }
    let mut shape = t.shape.to_vec();
    match c {
        Collective::AllGather { dim, .. } => {
            dim_of(t, *dim)?;
            shape[*dim] *= n;
        }
        Collective::ReduceScatter { dim, .. } => {
            dim_of(t, *dim)?;
            split(t, *dim)?;
            shape[*dim] /= n;
        }
        Collective::Permute { pairs, .. } => {
            let ok = |pick: fn(&(usize, usize)) -> usize| {
                pairs
                    .iter()
                    .enumerate()
                    .all(|(i, p)| pick(p) < n as usize && !pairs[..i].iter().any(|q| pick(q) == pick(p)))
            };
            if !ok(|p| p.0) || !ok(|p| p.1) {
                return Err(format!("pairs {pairs:?} must have distinct sources and distinct targets below {n}"));
            }
        }
        Collective::AllToAll { split: from, concat, .. } => {
            dim_of(t, *from)?;
            dim_of(t, *concat)?;
            split(t, *from)?;
            shape[*from] /= n;
            shape[*concat] *= n;
        }
        Collective::AxisIndex { .. } => {}
    }
    Ok(vec![Type::new(t.dtype, shape)])
}

fn arity(ins: &[&Type], n: usize) -> Result<(), String> {
    if ins.len() != n {
        return Err(format!("expects {n} operands, got {}", ins.len()));
    }
    Ok(())
}

fn same_types(ins: &[&Type]) -> Result<(), String> {
    if ins.windows(2).any(|w| w[0] != w[1]) {
        return Err("operand types differ".into());
    }
    Ok(())
}

fn indices(ins: &[&Type]) -> Result<(), String> {
    if ins.iter().any(|t| t.rank() != 0 || t.dtype != DType::S32) {
        return Err("start indices must be s32 scalars".into());
    }
    Ok(())
}

fn distinct_in_range(axes: &[usize], rank: usize, what: &str) -> Result<(), String> {
    for (i, &a) in axes.iter().enumerate() {
        if a >= rank || axes[..i].contains(&a) {
            return Err(format!("{what} {axes:?} are not distinct dimensions below {rank}"));
        }
    }
    Ok(())
}

/// The element type of a dot's result: the operands' (which must agree), or a preferred one: a
/// float no narrower than the float operands, which may then be the two 8-bit formats mixed.
fn dot_result_type(preferred: Option<DType>, lhs: DType, rhs: DType) -> Result<DType, String> {
    let Some(p) = preferred else {
        return match lhs == rhs {
            true => Ok(lhs),
            false => Err("operand element types differ".into()),
        };
    };
    if !(p.is_float() && lhs.is_float() && rhs.is_float()) {
        return Err(format!("a preferred element type ({p}) needs float operands and a float result"));
    }
    if lhs != rhs && !(lhs.is_f8() && rhs.is_f8()) {
        return Err("operand element types differ (only the two 8-bit float formats may mix)".into());
    }
    if p.byte_size() < lhs.byte_size().max(rhs.byte_size()) {
        return Err(format!("the preferred element type {p} is narrower than the operands"));
    }
    Ok(p)
}

fn dot_general(d: &DotDims, dtype: DType, lhs: &Type, rhs: &Type) -> RuleResult {
    if d.lhs_batch.len() != d.rhs_batch.len() || d.lhs_contract.len() != d.rhs_contract.len() {
        return Err("batch or contracting dimension lists differ in length".into());
    }
    let lhs_used: Vec<usize> = d.lhs_batch.iter().chain(&d.lhs_contract).copied().collect();
    let rhs_used: Vec<usize> = d.rhs_batch.iter().chain(&d.rhs_contract).copied().collect();
    distinct_in_range(&lhs_used, lhs.rank(), "lhs batch+contracting dims")?;
    distinct_in_range(&rhs_used, rhs.rank(), "rhs batch+contracting dims")?;
    for (kind, l, r) in [("batch", &d.lhs_batch, &d.rhs_batch), ("contracting", &d.lhs_contract, &d.rhs_contract)] {
        for (&a, &b) in l.iter().zip(r.iter()) {
            if lhs.shape[a] != rhs.shape[b] {
                return Err(format!(
                    "{kind} dimension {a} of lhs (size {}) != dimension {b} of rhs (size {})",
                    lhs.shape[a], rhs.shape[b]
                ));
            }
        }
    }
    let mut dims: Vec<i64> = d.lhs_batch.iter().map(|&a| lhs.shape[a]).collect();
    dims.extend((0..lhs.rank()).filter(|a| !lhs_used.contains(a)).map(|a| lhs.shape[a]));
    dims.extend((0..rhs.rank()).filter(|a| !rhs_used.contains(a)).map(|a| rhs.shape[a]));
    Ok(vec![Type { dtype, shape: Shape::from(dims) }])
}

/// Sizes and checks shared by gather and scatter: the index vector length must match the
/// indexed operand dims; indexed, collapsed and batching dims must be valid and disjoint; the
/// batching dims of both sides must pair up. Returns the batch (scatter) dims of `indices`.
#[allow(clippy::too_many_arguments)]
fn index_dims(
    operand: &Type,
    indices: &Type,
    index_vector_dim: usize,
    index_map: &[usize],
    dropped: &[usize],
    operand_batching: &[usize],
    indices_batching: &[usize],
) -> Result<Vec<usize>, String> {
    if !indices.dtype.is_integer() {
        return Err("indices must be s32 or u32".into());
    }
    if index_vector_dim > indices.rank() {
        return Err(format!("index_vector_dim {index_vector_dim} out of range"));
    }
    let index_len = if index_vector_dim == indices.rank() { 1 } else { indices.shape[index_vector_dim] };
    if index_map.len() as i64 != index_len {
        return Err(format!("index vectors of length {index_len} for {} indexed dims", index_map.len()));
    }
    distinct_in_range(index_map, operand.rank(), "indexed operand dims")?;
    let removed: Vec<usize> = dropped.iter().chain(operand_batching).copied().collect();
    distinct_in_range(&removed, operand.rank(), "collapsed and batching operand dims")?;
    if index_map.iter().any(|d| operand_batching.contains(d)) {
        return Err("an operand batching dim is also indexed".into());
    }
    if operand_batching.len() != indices_batching.len() {
        return Err("operand and indices batching dims differ in number".into());
    }
    distinct_in_range(indices_batching, indices.rank(), "indices batching dims")?;
    if indices_batching.contains(&index_vector_dim) {
        return Err("index_vector_dim is a batching dim".into());
    }
    for (&o, &i) in operand_batching.iter().zip(indices_batching) {
        if operand.shape[o] != indices.shape[i] {
            return Err(format!("batching dim {o} of the operand and {i} of the indices differ in size"));
        }
    }
    Ok((0..indices.rank()).filter(|&d| d != index_vector_dim).collect())
}

/// Positions `0..rank` split into `window` (given, strictly increasing) and the rest.
fn window_positions(window: &[usize], rank: usize, what: &str) -> Result<(), String> {
    if window.windows(2).any(|w| w[0] >= w[1]) || window.last().is_some_and(|&d| d >= rank) {
        return Err(format!("{what} {window:?} are not increasing dimensions below {rank}"));
    }
    Ok(())
}

fn gather(d: &GatherDims, operand: &Type, indices: &Type) -> RuleResult {
    let batch = index_dims(
        operand,
        indices,
        d.index_vector_dim,
        &d.start_index_map,
        &d.collapsed_slice_dims,
        &d.operand_batching_dims,
        &d.start_indices_batching_dims,
    )?;
    if d.slice_sizes.len() != operand.rank()
        || d.slice_sizes.iter().zip(operand.shape.iter()).any(|(s, n)| *s < 0 || s > n)
    {
        return Err(format!("slice sizes {:?} do not fit the operand", d.slice_sizes));
    }
    let removed: Vec<usize> = d.collapsed_slice_dims.iter().chain(&d.operand_batching_dims).copied().collect();
    if removed.iter().any(|&r| d.slice_sizes[r] != 1) {
        return Err("collapsed and batching dims must have slice size 1".into());
    }
    let window: Vec<usize> = (0..operand.rank()).filter(|r| !removed.contains(r)).collect();
    if window.len() != d.offset_dims.len() {
        return Err(format!("{} offset dims for {} slice dims", d.offset_dims.len(), window.len()));
    }
    let rank = batch.len() + window.len();
    window_positions(&d.offset_dims, rank, "offset dims")?;
    let (mut w, mut b) = (window.iter(), batch.iter());
    let dims: Vec<i64> = (0..rank)
        .map(|pos| match d.offset_dims.contains(&pos) {
            true => d.slice_sizes[*w.next().expect("counted")],
            false => indices.shape[*b.next().expect("counted")],
        })
        .collect();
    Ok(vec![Type::new(operand.dtype, dims)])
}

fn scatter(d: &ScatterDims, operand: &Type, indices: &Type, updates: &Type) -> RuleResult {
    if !operand.dtype.is_float() || updates.dtype != operand.dtype {
        return Err("needs a float operand and updates of the same type".into());
    }
    let batch = index_dims(
        operand,
        indices,
        d.index_vector_dim,
        &d.scatter_dims_to_operand_dims,
        &d.inserted_window_dims,
        &d.input_batching_dims,
        &d.scatter_indices_batching_dims,
    )?;
    let removed: Vec<usize> = d.inserted_window_dims.iter().chain(&d.input_batching_dims).copied().collect();
    let window: Vec<usize> = (0..operand.rank()).filter(|r| !removed.contains(r)).collect();
    if window.len() != d.update_window_dims.len() || updates.rank() != batch.len() + window.len() {
        return Err(format!("updates {updates} do not have one dim per scatter and window dim"));
    }
    window_positions(&d.update_window_dims, updates.rank(), "update window dims")?;
    let (mut w, mut b) = (window.iter(), batch.iter());
    for pos in 0..updates.rank() {
        let size = updates.shape[pos];
        let limit = if d.update_window_dims.contains(&pos) {
            operand.shape[*w.next().expect("counted")]
        } else {
            let want = indices.shape[*b.next().expect("counted")];
            if size != want {
                return Err(format!("update dim {pos} (size {size}) differs from its indices dim (size {want})"));
            }
            want
        };
        if size > limit {
            return Err(format!("update window dim {pos} (size {size}) exceeds the operand's (size {limit})"));
        }
    }
    Ok(vec![operand.clone()])
}

fn ragged_dot(mode: RaggedDotMode, lhs: &Type, rhs: &Type, sizes: &Type) -> RuleResult {
    if lhs.dtype != rhs.dtype || !lhs.dtype.is_float() {
        return Err("lhs and rhs must be floats of one type".into());
    }
    if sizes.dtype != DType::S32 || sizes.rank() != 1 || lhs.rank() != 2 {
        return Err("needs lhs[M,K] and group_sizes s32[G]".into());
    }
    let (m, k, g) = (lhs.shape[0], lhs.shape[1], sizes.shape[0]);
    match mode {
        RaggedDotMode::NonContracting { rhs_transposed } => {
            let (kk, n) = match (rhs_transposed, &rhs.shape[..]) {
                (false, &[gg, kk, n]) if gg == g => (kk, n),
                (true, &[gg, n, kk]) if gg == g => (kk, n),
                _ => return Err(format!("rhs must be [G={g}, K, N] ([G, N, K] transposed)")),
            };
            if kk != k {
                return Err(format!("contracting sizes differ: lhs {k}, rhs {kk}"));
            }
            Ok(vec![Type::new(lhs.dtype, [m, n])])
        }
        RaggedDotMode::Contracting => match rhs.shape[..] {
            [mm, n] if mm == m => Ok(vec![Type::new(lhs.dtype, [g, k, n])]),
            _ => Err(format!("rhs must be [M={m}, N]")),
        },
    }
}
