//! The threefry PRNG: known-answer vectors of the cipher (Random123, as JAX tests them), JAX's
//! key splitting, sampler statistics, and identical bits on 1 and 8 devices.

use crate::common::run;
use maxrs::host::HostTensor;
use maxrs::ir::{DType, Signature};
use maxrs::sharding::{Mesh, PartitionSpec};
use maxrs::tensor::{random, stack, trace, Tree};

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

/// A batch of keys draws what each key draws alone, and `params::init` (which draws parameters
/// of one shape and initializer as one batch) gives parameter `i` the draw of `fold_in(key, i)`
/// whatever the other parameters are; the keys bit for bit, the floats to XLA's rounding.
#[test]
fn batched_draws_equal_separate_draws() {
    use maxrs::model::params::{init, ParamDef, ParamInit};
    let defs = [
        ParamDef::new("a", &[3, 4], &["x", "y"], ParamInit::FanIn(4)),
        ParamDef::new("b", &[5], &["x"], ParamInit::Normal(0.5)),
        ParamDef::new("c", &[3, 4], &["x", "y"], ParamInit::FanIn(4)),
        ParamDef::new("d", &[3, 4], &["x", "y"], ParamInit::FanIn(8)),
        ParamDef::new("e", &[5], &["x"], ParamInit::Normal(0.5)),
        ParamDef::new("f", &[3, 4], &["x", "y"], ParamInit::Ones),
    ];
    let p = trace(&Signature::new(None), |ctx, _| {
        let key = random::key(ctx, 7);
        let keys = random::fold_in_each(&key, 3);
        let row = |i: i64| keys.slice_axis(0, i, i + 1).reshape(&[2]);
        let mut out = init(&defs, DType::F32, &key).prefixed("init");
        for (i, def) in defs.iter().enumerate() {
            let k = random::fold_in(&key, i as u32);
            let alone = match def.init {
                ParamInit::FanIn(fan_in) => {
                    random::truncated_normal(&k, -2.0, 2.0, &def.shape, DType::F32)
                        * ((1.0 / fan_in as f64).sqrt() / 0.879_625_661_034_239_8)
                }
                ParamInit::Normal(std) => random::normal(&k, &def.shape, DType::F32) * std,
                _ => ctx.full(1.0, DType::F32, &def.shape),
            };
            out = out.with(format!("alone.{}", def.name), alone);
        }
        out.with("each.normal", random::normal_each(&keys, &[4], DType::F32))
            .with("each.truncated", random::truncated_normal_each(&keys, -2.0, 2.0, &[4], DType::BF16))
            .with("one.normal", stack(&[0, 1, 2].map(|i| random::normal(&row(i), &[4], DType::F32)).each_ref(), 0))
            .with(
                "one.truncated",
                stack(
                    &[0, 1, 2].map(|i| random::truncated_normal(&row(i), -2.0, 2.0, &[4], DType::BF16)).each_ref(),
                    0,
                ),
            )
            .with("fold_in_each", keys.clone())
            .with("fold_in", stack(&[0, 1, 2].map(|i| random::fold_in(&key, i)).each_ref(), 0))
    })
    .unwrap();
    let out = run(&p, &Tree::new());
    // The same f32 arithmetic on the same bits; XLA may vectorize an element differently in a
    // batch than alone (the erf_inv polynomial contracted otherwise), which moves it by an ulp or two.
    let close = |a: &str, b: &str| {
        let (a_v, b_v) = (out[a].to_f64(), out[b].to_f64());
        assert_eq!(a_v.len(), b_v.len(), "{a}");
        for (x, y) in a_v.iter().zip(&b_v) {
            assert!((x - y).abs() <= 1e-6 * y.abs().max(1e-3), "{a}: {x} vs {y}");
        }
    };
    for def in &defs {
        close(&format!("init.{}", def.name), &format!("alone.{}", def.name));
    }
    close("each.normal", "one.normal");
    close("each.truncated", "one.truncated");
    assert_eq!(out["fold_in_each"].to_u32(), out["fold_in"].to_u32());
}
