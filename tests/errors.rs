//! Trace-time errors name the operation, the operand shapes and the caller's file:line, and
//! `trace` returns them as errors instead of panicking out of the caller.

use maxrs::autodiff::value_and_grad;
use maxrs::ir::{DType, DotDims, Signature};
use maxrs::tensor::{einsum, scan, trace, Tensor, Trace, Tree};

fn signature(inputs: &[(&str, DType, &[i64])]) -> Signature {
    let mut sig = Signature::new(None);
    for (name, dtype, dims) in inputs {
        sig.input(name, *dtype, dims);
    }
    sig
}

/// Traces `f` and returns the error message, which must mention the call site `line`.
fn error_at(sig: &Signature, line: u32, f: impl FnOnce(&Trace, &Tree) -> Tree) -> String {
    let msg = trace(sig, f).expect_err("tracing must fail").to_string();
    assert!(msg.contains(&format!("at tests/errors.rs:{line}:")), "no call site line {line} in: {msg}");
    msg
}

#[test]
fn matmul_shape_mismatch_names_op_shapes_and_line() {
    let sig = signature(&[("x", DType::F32, &[4, 8]), ("w", DType::F32, &[16, 3])]);
    let msg = error_at(&sig, line!(), |_, i| Tree::new().with("y", i["x"].matmul(&i["w"])));
    assert!(
        msg.starts_with("dot_general: contracting dimension 1 of lhs (size 8) != dimension 0 of rhs (size 16)"),
        "{msg}"
    );
    assert!(msg.contains("operands: (f32[4,8], f32[16,3])"), "{msg}");
}

#[test]
fn broadcasting_and_dtype_mismatches() {
    let sig = signature(&[("a", DType::F32, &[2, 3]), ("b", DType::F32, &[4]), ("c", DType::BF16, &[2, 3])]);
    let msg = error_at(&sig, line!(), |_, i| Tree::new().with("y", &i["a"] + &i["b"]));
    assert!(msg.starts_with("add: shapes do not broadcast; operands: (f32[2,3], f32[4])"), "{msg}");
    let msg = error_at(&sig, line!(), |_, i| Tree::new().with("y", &i["a"] * &i["c"]));
    assert!(msg.starts_with("mul: element types differ") && msg.contains("(f32[2,3], bf16[2,3])"), "{msg}");
}

/// `dot_general` of the inputs `a` and `b` over `a`'s last dim and `b`'s first, with a
/// preferred result type when given; errors point at the caller.
#[track_caller]
fn dot(i: &Tree, a: &str, b: &str, preferred: Option<DType>) -> Tree {
    let dims = DotDims { lhs_batch: vec![], rhs_batch: vec![], lhs_contract: vec![1], rhs_contract: vec![0] };
    let y = match preferred {
        Some(dtype) => i[a].dot_general_preferred(&i[b], dims, dtype),
        None => i[a].dot_general(&i[b], dims),
    };
    Tree::new().with("y", y)
}

/// A dot's operand types must agree, except for the two 8-bit formats under a preferred result
/// type, which must be a float no narrower than the operands.
#[test]
fn dot_element_types() {
    let sig = signature(&[
        ("a", DType::F32, &[2, 3]),
        ("b", DType::BF16, &[3, 2]),
        ("c", DType::F32, &[3, 2]),
        ("e4", DType::F8E4M3FN, &[3, 2]),
        ("e5", DType::F8E5M2, &[2, 3]),
    ]);
    let msg = error_at(&sig, line!(), |_, i| dot(i, "a", "b", None));
    assert!(msg.starts_with("dot_general: operand element types differ; operands: (f32[2,3], bf16[3,2])"), "{msg}");
    let msg = error_at(&sig, line!(), |_, i| dot(i, "a", "b", Some(DType::F32)));
    let want = "dot_general: operand element types differ (only the two 8-bit float formats may mix)";
    assert!(msg.starts_with(want), "{msg}");
    let msg = error_at(&sig, line!(), |_, i| dot(i, "a", "c", Some(DType::BF16)));
    assert!(msg.starts_with("dot_general: the preferred element type bf16 is narrower than the operands"), "{msg}");
    let msg = error_at(&sig, line!(), |_, i| dot(i, "e5", "e4", None));
    assert!(msg.starts_with("dot_general: operand element types differ;"), "{msg}");
    let fp8 = trace(&sig, |_, i| dot(i, "e5", "e4", Some(DType::BF16))).unwrap();
    assert_eq!(fp8.outputs[0].ty.to_string(), "bf16[2,2]");
}

#[test]
fn einsum_and_reshape_errors() {
    let sig = signature(&[("x", DType::F32, &[2, 5, 8]), ("w", DType::F32, &[4, 4, 2])]);
    let msg = error_at(&sig, line!(), |_, i| Tree::new().with("y", einsum("btd,dhk->bthk", &[&i["x"], &i["w"]])));
    assert!(msg.starts_with("einsum \"btd,dhk->bthk\": label 'd' has sizes 8 and 4"), "{msg}");
    let msg = error_at(&sig, line!(), |_, i| Tree::new().with("y", i["x"].reshape(&[3, -1])));
    assert!(msg.starts_with("reshape: cannot infer -1 in [3, -1]; operands: (f32[2,5,8])"), "{msg}");
}

#[test]
fn errors_inside_a_scan_body_point_into_the_body() {
    let sig = signature(&[("h", DType::F32, &[3]), ("w", DType::F32, &[2, 4, 4])]);
    let msg = error_at(&sig, line!() + 2, |_, i| {
        let (c, _) = scan(&Tree::new().with("h", i["h"].clone()), &Tree::new().with("w", i["w"].clone()), |c, x| {
            (Tree::new().with("h", x["w"].matmul(&c["h"])), Tree::new())
        });
        c
    });
    assert!(msg.starts_with("dot_general:") && msg.contains("(f32[4,4], f32[3])"), "{msg}");
}

#[test]
fn scan_carry_must_keep_its_type() {
    let sig = signature(&[("h", DType::F32, &[4]), ("w", DType::F32, &[2, 3, 4])]);
    // The error points at the `scan` call.
    let msg = error_at(&sig, line!() + 1, |_, i| {
        let (c, _) = scan(&Tree::new().with("h", i["h"].clone()), &Tree::new().with("w", i["w"].clone()), |c, x| {
            (Tree::new().with("h", x["w"].matmul(&c["h"])), Tree::new())
        });
        c
    });
    assert!(msg.starts_with("scan: the body changes carry \"h\" from f32[4] to f32[3]"), "{msg}");
}

#[test]
fn escaped_tensors_and_missing_names_are_reported() {
    let sig = signature(&[("h", DType::F32, &[4]), ("w", DType::F32, &[2, 4, 4])]);
    let msg = error_at(&sig, line!() + 7, |_, i| {
        let mut leaked: Option<Tensor> = None;
        let (c, _) = scan(&Tree::new().with("h", i["h"].clone()), &Tree::new().with("w", i["w"].clone()), |c, x| {
            leaked = Some(x["w"].clone());
            (c.clone(), Tree::new())
        });
        let leaked = leaked.expect("set by the body");
        c.with("y", &i["h"] + &leaked.sum(&[0]))
    });
    assert!(msg.contains("escape"), "{msg}");
    let msg = error_at(&sig, line!(), |_, i| Tree::new().with("y", i["nope"].clone()));
    assert!(msg.starts_with("no entry \"nope\" in the tree (it has [\"h\", \"w\"])"), "{msg}");
}

#[test]
fn value_and_grad_needs_a_scalar() {
    let sig = signature(&[("w", DType::F32, &[4])]);
    let msg = error_at(&sig, line!(), |_, i| value_and_grad(i, |p| p["w"].exp()).1);
    assert!(msg.starts_with("value_and_grad: the function must return a float scalar, not f32[4]"), "{msg}");
}

#[test]
fn signature_errors() {
    let mut sig = signature(&[("x", DType::F32, &[4]), ("x", DType::F32, &[4])]);
    assert_eq!(trace(&sig, |_, i| i.clone()).unwrap_err().to_string(), "input \"x\" is declared twice");
    sig.inputs.pop();
    sig.inputs[0].sharded(maxrs::sharding::PartitionSpec::new(&[&["data"]]));
    assert_eq!(
        trace(&sig, |_, i| i.clone()).unwrap_err().to_string(),
        "input \"x\" is sharded but the signature has no mesh"
    );
}
