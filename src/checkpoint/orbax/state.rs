//! A MaxText train state in an Orbax checkpoint (`load_full_state_path=<step>/items`), under
//! maxrs's train-state names. MaxText e591f30's item holds (`opt_type=adamw`, its default):
//! - `params/params/<parameter>`: maxrs's `params.<parameter>`;
//! - `opt_state/0/{mu,nu}/params/<parameter>` and `opt_state/0/count`: optax's `adamw` chain
//!   (`src/maxtext/optimizers/optimizers.py` at MaxText e591f30, `get_optimizer`) whose first
//!   state is `scale_by_adam`'s (count, mu, nu); maxrs's `opt_state.{mu,nu}.<parameter>` and
//!   `opt_state.count`. The chain's last state, `scale_by_schedule`'s `opt_state/2/count`, counts
//!   the same updates: any count that differs is refused;
//! - `step`: the updates applied, which is the step MaxText runs next (`get_first_step` in
//!   `src/maxtext/trainers/pre_train/train.py` at MaxText e591f30: `int(state.step)`);
//! - parameters and moments of a scanned stack have their layer axis at 1, maxrs's at 0
//!   (`params::to_maxrs` moves it, for the parameters the model says are stacked);
//! - `nnx_aux/...`: NNX's random streams (dropout's and the init's), which maxrs draws by itself.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, ensure, Result};

use super::{params, Checkpoint};
use crate::checkpoint::dir::Expected;
use crate::checkpoint::shards::{Bounds, HostArray};
use crate::files::Location;
use crate::host::shape_string;
use crate::train_state::Group;

/// A train state read from a MaxText checkpoint.
pub struct State {
    /// MaxText's `step`: the number of updates applied, the step a resumed run starts at.
    pub next_step: u64,
    /// Exactly the `expected` arrays, by maxrs name, each as the blocks wanted of it.
    pub arrays: BTreeMap<String, HostArray>,
}

/// The checkpoint array holding maxrs's train-state array `name`.
pub(super) fn maxtext_name(name: &str) -> Result<String> {
    let (group, key) = Group::of(name).ok_or_else(|| anyhow!("{name} is not a train-state array"))?;
    let key = key.replace('.', "/");
    Ok(match group {
        Group::Params => format!("params/params/{key}"),
        Group::Mu => format!("opt_state/0/mu/params/{key}"),
        Group::Nu => format!("opt_state/0/nu/params/{key}"),
        Group::Count => "opt_state/0/count".to_string(),
        Group::Fp8 => {
            bail!("{name}: resuming fp8 state (quantization=fp8) from a MaxText checkpoint is not supported yet")
        }
        // Tunix keeps DPO's reference model apart from the train state it checkpoints.
        Group::Reference => {
            bail!("{name}: DPO's reference model in a MaxText checkpoint is not supported yet")
        }
    })
}

/// Reads the `expected` arrays of a train state (each of exactly the expected type and shape,
/// as resuming needs) and its step from the Orbax checkpoint at `location`, each parameter and
/// its moments as `stored` says MaxText holds the parameter (`params::stored`). Of each array
/// only the blocks `wanted` names (maxrs's layout: those one process's devices hold) are read,
/// by ranges: never a whole array one process does not hold whole.
pub fn load(
    location: &Location,
    expected: &[Expected],
    stored: &BTreeMap<String, params::Stored>,
    wanted: &BTreeMap<String, Vec<Bounds>>,
) -> Result<State> {
    let ckpt = Checkpoint::open(location)?;
    let at = ckpt.location().clone();
    let names: Vec<String> = ckpt.names().map(str::to_string).collect();
    ensure!(
        names.iter().any(|n| n.starts_with("opt_state/")),
        "{at}: no optimizer state (opt_state/...): a parameter-only checkpoint; use load_parameters_path"
    );
    let mut reads = Vec::new();
    for e in expected {
        let name = maxtext_name(&e.name)?;
        if !names.contains(&name) {
            bail!("{at}: no array {name} for the run's {} (a checkpoint of another model or optimizer?)", e.name);
        }
        let array = ckpt.array(&name)?;
        let key = Group::of(&e.name).map_or("", |(_, key)| key);
        let how = stored.get(key).copied().unwrap_or(params::Stored::SAME);
        let stored: Vec<i64> = array.shape.iter().map(|&d| d as i64).collect();
        let dims = params::maxrs_dims(how.stacked, &stored);
        ensure!(
            array.ty == e.ty && dims == e.dims,
            "{at}: {name} is {} but the run's {} is {}",
            params::describe(array.ty, &stored, &dims),
            e.name,
            shape_string(e.ty, &e.dims)
        );
        reads.push((e, name, how));
    }
    // Every array is checked before any is read.
    let read = super::read_in_parallel(&reads, |(e, name, how)| {
        let blocks = params::read_blocks(&ckpt, name, *how, wanted.get(&e.name).map_or(&[][..], Vec::as_slice))?;
        Ok(HostArray { name: e.name.clone(), ty: e.ty, dims: e.dims.clone(), blocks })
    })?;
    let arrays: BTreeMap<String, HostArray> = read.into_iter().map(|a| (a.name.clone(), a)).collect();
    let step = scalar(&ckpt, "step")?;
    for count in names.iter().filter(|n| n.starts_with("opt_state/") && n.ends_with("/count")) {
        let value = scalar(&ckpt, count)?;
        ensure!(value == step, "{at}: {count} is {value} but step is {step} (an optimizer maxrs does not know?)");
    }
    let unused: Vec<&String> = names
        .iter()
        .filter(|n| n.starts_with("params/") || n.starts_with("opt_state/0/mu/") || n.starts_with("opt_state/0/nu/"))
        .filter(|n| !expected.iter().any(|e| maxtext_name(&e.name).is_ok_and(|m| &m == *n)))
        .collect();
    if let Some(first) = unused.first() {
        bail!("{at}: {} arrays the run does not have, e.g. {first} (a checkpoint of another model?)", unused.len());
    }
    Ok(State { next_step: step, arrays })
}

/// A non-negative integer scalar of the checkpoint.
fn scalar(ckpt: &Checkpoint, name: &str) -> Result<u64> {
    let tensor = ckpt.read(name)?;
    let value = match (tensor.dims.is_empty(), tensor.data.len()) {
        (true, 4) => i64::from(i32::from_le_bytes(tensor.data[..].try_into().expect("4 bytes"))),
        (true, 8) => i64::from_le_bytes(tensor.data[..].try_into().expect("8 bytes")),
        _ => bail!("{}: {name} is {}, not an integer scalar", ckpt.location(), tensor.shape_string()),
    };
    u64::try_from(value).map_err(|_| anyhow!("{}: {name} is {value}", ckpt.location()))
}

#[cfg(test)]
mod tests {
    use super::super::tests::fixture;
    use super::*;
    use crate::host::DType;

    #[test]
    fn names_follow_maxtexts_adamw_state() {
        assert_eq!(
            maxtext_name("params.decoder.decoder_norm.scale").unwrap(),
            "params/params/decoder/decoder_norm/scale"
        );
        assert_eq!(
            maxtext_name("opt_state.nu.token_embedder.embedding").unwrap(),
            "opt_state/0/nu/params/token_embedder/embedding"
        );
        assert_eq!(maxtext_name("opt_state.count").unwrap(), "opt_state/0/count");
    }

    #[test]
    fn the_step_and_the_count_and_what_is_refused() {
        let count = Expected { name: "opt_state.count".into(), ty: DType::S32, dims: vec![] };
        let e = load(&fixture("nnx/checkpoints/1"), std::slice::from_ref(&count), &BTreeMap::new(), &BTreeMap::new())
            .err()
            .unwrap()
            .to_string();
        // Loading only the count leaves the checkpoint's parameters unused: another model.
        assert!(e.contains("36 arrays the run does not have"), "{e}");
        let e = load(&fixture("nnx_params/0/items"), &[count], &BTreeMap::new(), &BTreeMap::new())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("a parameter-only checkpoint; use load_parameters_path"), "{e}");
        let wrong = Expected { name: "params.decoder.decoder_norm.scale".into(), ty: DType::BF16, dims: vec![16] };
        let e = load(&fixture("nnx/checkpoints/1"), &[wrong], &BTreeMap::new(), &BTreeMap::new())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("params/params/decoder/decoder_norm/scale is f32[16] but the run's"), "{e}");
    }

    /// Two processes each holding one half of every array (along its first axis, the layers of a
    /// stacked one) read exactly those blocks: each equals that block of the whole array.
    #[test]
    fn each_process_reads_the_blocks_its_devices_hold() {
        let at = fixture("nnx/checkpoints/1");
        let ckpt = Checkpoint::open(&at).unwrap();
        let mut expected = Vec::new();
        let mut stored = BTreeMap::new();
        for name in ckpt.names() {
            let Some(group) = ["params/params/", "opt_state/0/mu/params/", "opt_state/0/nu/params/"]
                .iter()
                .position(|root| name.starts_with(root))
            else {
                continue;
            };
            let key = name.splitn(if group == 0 { 3 } else { 5 }, '/').last().unwrap().replace('/', ".");
            let how = params::Stored { stacked: key.starts_with("decoder.layers.") };
            let array = ckpt.array(name).unwrap();
            let dims = params::maxrs_dims(how.stacked, &array.shape.iter().map(|&d| d as i64).collect::<Vec<_>>());
            let maxrs = format!("{}.{key}", ["params", "opt_state.mu", "opt_state.nu"][group]);
            expected.push(Expected { name: maxrs, ty: array.ty, dims });
            stored.insert(key, how);
        }
        expected.push(Expected { name: "opt_state.count".into(), ty: DType::S32, dims: vec![] });
        let whole = |e: &Expected| -> Bounds { e.dims.iter().map(|&d| (0, d)).collect() };
        let all = expected.iter().map(|e| (e.name.clone(), vec![whole(e)])).collect();
        let state = load(&at, &expected, &stored, &all).unwrap();
        assert_eq!(state.arrays["params.decoder.layers.mlp.wi_0.kernel"].dims, [3, 16, 32]);
        for process in 0..2 {
            let half = |e: &Expected| -> Vec<Bounds> {
                let Some(&first) = e.dims.first() else { return vec![vec![]] };
                let (start, len) = [(0, first / 2), (first / 2, first - first / 2)][process];
                vec![[&[(start, len)][..], &whole(e)[1..]].concat()]
            };
            let wanted = expected.iter().map(|e| (e.name.clone(), half(e))).collect();
            let mine = load(&at, &expected, &stored, &wanted).unwrap();
            for e in &expected {
                let (bounds, block) = &mine.arrays[&e.name].blocks[0];
                let from_whole = crate::host::block_of(&state.arrays[&e.name].blocks[0].1, bounds);
                assert_eq!(block, &from_whole, "{} process {process}", e.name);
            }
        }
    }
}
