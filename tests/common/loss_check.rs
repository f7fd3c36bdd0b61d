//! What the tests that compare a model's loss and gradients across meshes share (context
//! parallelism, vocabulary tiling): the model and its mesh on the CPU devices, the loss-and-gradient
//! program over a sharded batch, random parameters, and the error between two runs' outputs.

use super::{rng, uniform};
use maxrs::autodiff::value_and_grad_with_aux;
use maxrs::config;
use maxrs::host::HostTensor;
use maxrs::ir::{DType, Program, Signature};
use maxrs::model::Model;
use maxrs::sharding::Mesh;
use maxrs::tensor::{trace, Tree};

/// The model of `args` and the mesh `config::validate` gives it on `devices` CPU devices.
pub fn model_on(devices: usize, args: &[String]) -> (Model, Option<Mesh>) {
    let c = config::load(None, args).expect("config loads");
    let derived = config::validate(&c, devices, 1).expect("config validates");
    let ids: Vec<i64> = (0..devices as i64).collect();
    let mesh = derived.mesh.step_mesh(&[ids]).expect("mesh");
    (Model::from_config(&c).expect("model builds"), mesh)
}

/// The loss of `m` (`Model::loss` with `z_loss`) on a `[rows, seq]` batch of the s32 arrays
/// `names`, its gradient (`grad.<param>`) and, with `aux`, its aux values (`aux.*`); on `mesh`
/// (the batch split by the activation rules) or one device.
pub fn loss_program(
    m: &Model,
    mesh: Option<Mesh>,
    (rows, seq): (i64, i64),
    names: &[&str],
    z_loss: f64,
    aux: bool,
) -> Program {
    let mut sig = Signature::new(mesh.clone());
    m.declare_params(&mut sig, "params");
    let spec = mesh.as_ref().map(|mesh| m.config.rules.spec(&["activation_batch", "activation_length"], mesh));
    for name in names {
        let input = sig.input(name, DType::S32, &[rows, seq]);
        if let Some(spec) = &spec {
            input.sharded(spec.clone());
        }
    }
    trace(&sig, |_, inp| {
        let params = inp.subtree("params");
        let batch: Tree = names.iter().map(|n| (n.to_string(), inp[*n].clone())).collect();
        let (loss, values, grads) = value_and_grad_with_aux(&params, |p| m.loss(p, &batch, z_loss));
        let mut out = grads.prefixed("grad").with("loss", loss);
        if aux {
            out.extend(values.prefixed("aux"));
        }
        out
    })
    .expect("the model traces")
}

/// Every parameter of `m` (`params.<name>`, f32) uniform in `[-scale, scale)` from `seed`'s stream.
pub fn random_params(m: &Model, seed: u64, scale: f64) -> Tree<HostTensor> {
    let mut r = rng(seed);
    let mut params = Tree::new();
    for def in m.param_defs() {
        let n = def.shape.iter().product::<i64>() as usize;
        let values: Vec<f32> = uniform(&mut r, n, -scale, scale).into_iter().map(|v| v as f32).collect();
        params.insert(format!("params.{}", def.name), HostTensor::from_f32(&def.shape, &values));
    }
    params
}

/// max |got - want| / max(1, max |want|) over every output of `want`, which `got` has too.
pub fn worst_scaled_error(got: &Tree<HostTensor>, want: &Tree<HostTensor>) -> f64 {
    assert_eq!(got.names().collect::<Vec<_>>(), want.names().collect::<Vec<_>>(), "the same outputs");
    want.iter()
        .map(|(name, w)| {
            let (g, w) = (got[name].to_f64(), w.to_f64());
            let scale = w.iter().fold(1f64, |a, v| a.max(v.abs()));
            g.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max) / scale
        })
        .fold(0.0, f64::max)
}
