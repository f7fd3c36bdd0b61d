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
use crate::files::Location;
use crate::host::{shape_string, HostTensor};
use crate::train_state::Group;

/// A train state read from a MaxText checkpoint.
pub struct State {
    /// MaxText's `step`: the number of updates applied, the step a resumed run starts at.
    pub next_step: u64,
    /// Exactly the `expected` arrays, by maxrs name.
    pub arrays: BTreeMap<String, HostTensor>,
}

/// The checkpoint array holding maxrs's train-state array `name`.
fn maxtext_name(name: &str) -> Result<String> {
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
    })
}

/// Reads the `expected` arrays of a train state (each of exactly the expected type and shape,
/// as resuming needs) and its step from the Orbax checkpoint at `location`, each parameter and
/// its moments as `stored` says MaxText holds the parameter (`params::stored`).
pub fn load(location: &Location, expected: &[Expected], stored: &BTreeMap<String, params::Stored>) -> Result<State> {
    let ckpt = Checkpoint::open(location)?;
    let at = ckpt.location().clone();
    let names: Vec<String> = ckpt.names().map(str::to_string).collect();
    ensure!(
        names.iter().any(|n| n.starts_with("opt_state/")),
        "{at}: no optimizer state (opt_state/...): a parameter-only checkpoint; use load_parameters_path"
    );
    let mut arrays = BTreeMap::new();
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
        arrays.insert(e.name.clone(), params::to_maxrs(how.stacked, ckpt.read(&name)?));
    }
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
        let e = load(&fixture("nnx/checkpoints/1"), std::slice::from_ref(&count), &BTreeMap::new())
            .err()
            .unwrap()
            .to_string();
        // Loading only the count leaves the checkpoint's parameters unused: another model.
        assert!(e.contains("36 arrays the run does not have"), "{e}");
        let e = load(&fixture("nnx_params/0/items"), &[count], &BTreeMap::new()).err().unwrap().to_string();
        assert!(e.contains("a parameter-only checkpoint; use load_parameters_path"), "{e}");
        let wrong = Expected { name: "params.decoder.decoder_norm.scale".into(), ty: DType::BF16, dims: vec![16] };
        let e = load(&fixture("nnx/checkpoints/1"), &[wrong], &BTreeMap::new()).err().unwrap().to_string();
        assert!(e.contains("params/params/decoder/decoder_norm/scale is f32[16] but the run's"), "{e}");
    }
}
