//! The emitted StableHLO for a small sharded MLP training step, pinned with `insta`: module
//! attributes, the Shardy mesh, argument/result shardings, donation aliases, readable names,
//! constraints, and the forward/backward equations. The module must also compile on 4 devices.

use maxrs::autodiff::value_and_grad;
use maxrs::ir::{DType, Signature};
use maxrs::lower::to_stablehlo;
use maxrs::runtime::compile;
use maxrs::sharding::{Mesh, PartitionSpec};
use maxrs::tensor::{trace, Tree};

#[test]
fn sharded_mlp_step() {
    let mesh = Mesh::new(&[("data", 2), ("tensor", 2)]);
    let (batch, replicated) = (PartitionSpec::new(&[&["data"], &[]]), PartitionSpec::new(&[]));
    let (w1_spec, w2_spec) = (PartitionSpec::new(&[&[], &["tensor"]]), PartitionSpec::new(&[&["tensor"], &[]]));
    let mut sig = Signature::new(Some(mesh));
    sig.input("params.w1", DType::F32, &[8, 16]).sharded(w1_spec.clone()).donated();
    sig.input("params.w2", DType::F32, &[16, 8]).sharded(w2_spec.clone()).donated();
    sig.input("x", DType::F32, &[4, 8]).sharded(batch.clone());
    sig.output_sharding("params.w1", w1_spec).output_sharding("params.w2", w2_spec).output_sharding("loss", replicated);
    let program = trace(&sig, |_, inp| {
        let (loss, grads) = value_and_grad(&inp.subtree("params"), |p| {
            let h = inp["x"]
                .matmul(&p["w1"])
                .relu()
                .with_sharding_constraint(&PartitionSpec::new(&[&["data"], &["tensor"]]));
            h.matmul(&p["w2"]).square().mean_all()
        });
        let mut out = Tree::new().with("loss", loss);
        for (name, g) in grads.iter() {
            out.insert(format!("params.{name}"), &inp[&format!("params.{name}")] - &(g * 0.01));
        }
        out
    })
    .unwrap();
    let mlir = to_stablehlo(&program);
    insta::assert_snapshot!(mlir);
    compile(&crate::common::client(), &program).expect("the snapshotted module compiles");
}
