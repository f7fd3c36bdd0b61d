//! The threefry PRNG: known-answer vectors of the cipher (Random123, as JAX tests them), JAX's
//! key splitting, sampler statistics, and identical bits on 1 and 8 devices.

use crate::common::run;
use maxrs::host::HostTensor;
use maxrs::ir::{DType, Signature};
use maxrs::sharding::{Mesh, PartitionSpec};
use maxrs::tensor::{random, trace, Tree};

fn u32s(program: &maxrs::ir::Program, name: &str) -> Vec<u32> {
    run(program, &Tree::new())[name].to_u32()
}

#[test]
fn threefry_known_answers() {
    let vectors: [([u32; 2], [u32; 2], [u32; 2]); 3] = [
        ([0, 0], [0, 0], [0x6b200159, 0x99ba4efe]),
        ([u32::MAX, u32::MAX], [u32::MAX, u32::MAX], [0x1cb996fc, 0xbb002be7]),
        ([0x13198a2e, 0x03707344], [0x243f6a88, 0x85a308d3], [0xc4923a9c, 0x483df7a0]),
    ];
    for (key, count, expected) in vectors {
        let p = trace(&Signature::new(None), |ctx, _| {
            let k = ctx.constant(DType::U32, &[2], &[key[0] as f64, key[1] as f64]);
            let (a, b) = random::threefry2x32(
                &k,
                &ctx.full(count[0] as f64, DType::U32, &[1]),
                &ctx.full(count[1] as f64, DType::U32, &[1]),
            );
            Tree::new().with("a", a).with("b", b)
        })
        .unwrap();
        let out = run(&p, &Tree::new());
        assert_eq!([out["a"].to_u32()[0], out["b"].to_u32()[0]], expected, "key {key:x?} counter {count:x?}");
    }
}

#[test]
fn split_and_fold_in_follow_jax() {
    let p = trace(&Signature::new(None), |ctx, _| {
        let key = random::key(ctx, 0);
        Tree::new().with("split", random::split(&key, 2)).with("fold", random::fold_in(&key, 1))
    })
    .unwrap();
    // jax.random.split(PRNGKey(0)) with threefry_partitionable: key i = threefry(key, (0, i)).
    assert_eq!(u32s(&p, "split")[..2], [0x6b200159, 0x99ba4efe]);
    assert_eq!(u32s(&p, "fold"), u32s(&p, "split")[2..]);
}

#[test]
fn samplers_have_the_right_statistics() {
    const N: i64 = 20000;
    let p = trace(&Signature::new(None), |ctx, _| {
        let keys = random::split(&random::key(ctx, 42), 3);
        let key = |i: i64| keys.slice_axis(0, i, i + 1).reshape(&[2]);
        Tree::new()
            .with("uniform", random::uniform(&key(0), &[N], DType::F32, -2.0, 3.0))
            .with("normal", random::normal(&key(1), &[N], DType::F32))
            .with("truncated", random::truncated_normal(&key(2), -2.0, 2.0, &[N], DType::BF16).astype(DType::F32))
    })
    .unwrap();
    let out = run(&p, &Tree::new());
    let stats = |v: &[f32]| {
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
        (
            mean,
            var.sqrt(),
            v.iter().cloned().fold(f32::INFINITY, f32::min),
            v.iter().cloned().fold(f32::NEG_INFINITY, f32::max),
        )
    };
    let (mean, std, lo, hi) = stats(&out["uniform"].to_f32());
    assert!(
        (mean - 0.5).abs() < 0.05 && (std - 5.0 / 12f64.sqrt()).abs() < 0.05 && lo >= -2.0 && hi < 3.0,
        "{mean} {std} {lo} {hi}"
    );
    let (mean, std, _, _) = stats(&out["normal"].to_f32());
    assert!(mean.abs() < 0.03 && (std - 1.0).abs() < 0.03, "{mean} {std}");
    // The standard normal truncated to (-2, 2) has standard deviation 0.8796.
    let (mean, std, lo, hi) = stats(&out["truncated"].to_f32());
    assert!(mean.abs() < 0.03 && (std - 0.8796).abs() < 0.03 && lo >= -2.0 && hi <= 2.0, "{mean} {std} {lo} {hi}");
}

#[test]
fn bits_are_the_same_sharded_and_on_one_device() {
    let build = |mesh: Option<Mesh>| {
        let mut sig = Signature::new(mesh.clone());
        sig.input("seed", DType::U32, &[]);
        if mesh.is_some() {
            sig.output_sharding("bits", PartitionSpec::new(&[&["x"], &["y"]]));
        }
        trace(&sig, |_, i| Tree::new().with("bits", random::bits(&random::key_from(&i["seed"]), &[16, 6]))).unwrap()
    };
    let seed = Tree::new().with("seed", HostTensor::from_u32(&[], &[1234]));
    let sharded = run(&build(Some(Mesh::new(&[("x", 4), ("y", 2)]))), &seed)["bits"].to_u32();
    let single = run(&build(None), &seed)["bits"].to_u32();
    assert_eq!(sharded, single);
    let mut distinct = single.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), single.len(), "96 random words are distinct");
}
