//! A decoding session: the prefill and generate programs compiled for a client, the parameters on
//! the devices, and the host loop that runs them for a batch of prompts (MaxText's `decode.py`:
//! prefill, then generate calls, the cache staying on the devices and donated to each call).

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};

use crate::checkpoint::{self, Expected};
use crate::config::{Config, Derived};
use crate::files::Location;
use crate::host::params_io::{load_parameters, ParamSpec, ParamsError};
use crate::host::HostTensor;
use crate::ir::Signature;
use crate::lower::to_stablehlo;
use crate::model::Model;
use crate::pjrt::Client;
use crate::runtime::{self, Compiled, DeviceArray};
use crate::sharding::Mesh;
use crate::storage;
use crate::tensor::{random, trace, Tree};
use crate::train_state::Group;

use super::programs::Engine;
use super::sampling::Sampling;

/// Wall times of the start-up phases, in seconds.
#[derive(Clone, Debug, Default)]
pub struct DecodeStartup {
    pub trace: f64,
    pub lower: f64,
    pub compile: f64,
    /// Parameters onto the devices (from the file, or drawn by the init program).
    pub params: f64,
}

/// What one batch of prompts gave.
#[derive(Clone, Debug, Default)]
pub struct Generation {
    /// Per prompt: the generated ids, the EOS that ended it included.
    pub tokens: Vec<Vec<i32>>,
    /// The prefill call: prompts in, cache and first tokens out (read back).
    pub prefill_seconds: f64,
    /// Per generate call, each until its tokens are read back.
    pub call_seconds: Vec<f64>,
    /// Tokens per sequence per generate call.
    pub steps_per_call: i64,
}

impl Generation {
    /// Per-token latency: the median generate call divided by its steps.
    pub fn per_token_seconds(&self) -> Option<f64> {
        let mut times = self.call_seconds.clone();
        times.sort_by(f64::total_cmp);
        times.get(times.len() / 2).map(|t| t / self.steps_per_call as f64)
    }

    /// Tokens the generate calls made for the prompts (padding rows and tokens after a
    /// sequence's EOS not counted), per second of generate calls.
    pub fn tokens_per_second(&self) -> Option<f64> {
        let made: usize = self.tokens.iter().map(|t| t.len().saturating_sub(1)).sum();
        let seconds: f64 = self.call_seconds.iter().sum();
        (seconds > 0.0).then(|| made as f64 / seconds)
    }
}

/// Where the parameters come from.
pub enum ParamSource<'a> {
    /// `load_parameters_path`: a checkpoint directory `maxrs train` wrote (its parameters), or a
    /// safetensors file in maxrs's layout; local or `gs://`.
    Load(&'a str),
    /// Host arrays by parameter name (tests, benchmarks).
    Host(&'a Tree<HostTensor>),
    /// Drawn on the devices from `init_weights_seed`, as training's initial parameters.
    Init(u32),
}

/// The prefill and generate programs compiled, with the parameters on the devices.
pub struct Session {
    pub engine: Engine,
    prefill: Compiled,
    generate: Compiled,
    /// The parameters by input name (`params.<name>`), shared by both programs.
    params: HashMap<String, DeviceArray>,
    /// The sampling seed (`decode_seed`): prefill's key is `PRNGKey(seed)`.
    pub seed: u32,
    pub startup: DecodeStartup,
    client: Client,
}

impl Session {
    /// Traces, lowers and compiles the decode programs for `c` (already checked with
    /// `config::validate` into `derived`) on `client`, `steps_per_call` tokens per generate
    /// call, and puts the parameters on the devices.
    pub fn new(
        c: &Config,
        derived: &Derived,
        mesh: Option<Mesh>,
        client: &Client,
        params: ParamSource,
        steps_per_call: i64,
    ) -> Result<Session> {
        crate::config::validate_decode(c)?;
        let engine = Engine {
            model: Model::from_config(c)?,
            batch: derived.micro_batch_size as i64,
            prefill_len: c.max_prefill_predict_length,
            cache_len: c.max_target_length,
            sampling: Sampling::from_config(c),
            mesh,
        };
        engine.check_cache_sharding()?;
        let mut startup = DecodeStartup::default();
        let t = Instant::now();
        // A parameter file is read first: a file for another model fails before compiling.
        let host_params = match &params {
            ParamSource::Load(path) => Some(read_params(c, &engine.model, path)?),
            ParamSource::Host(_) | ParamSource::Init(_) => None,
        };
        startup.params = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let prefill = engine.prefill().map_err(|e| anyhow!("tracing the prefill program: {e}"))?;
        let generate = engine
            .generate(&Engine::cache_specs(&prefill), steps_per_call)
            .map_err(|e| anyhow!("tracing the generate program: {e}"))?;
        startup.trace = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let (prefill_mlir, generate_mlir) = (to_stablehlo(&prefill), to_stablehlo(&generate));
        startup.lower = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let prefill = runtime::compile_lowered(client, &prefill, &prefill_mlir).context("compiling prefill")?;
        let generate = runtime::compile_lowered(client, &generate, &generate_mlir).context("compiling generate")?;
        startup.compile = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let params = match (params, host_params) {
            (ParamSource::Init(seed), _) => init_params(&engine.model, client, seed, &prefill)?,
            (ParamSource::Host(tree), _) => put_params(&engine.model, client, &prefill, tree)?,
            (ParamSource::Load(_), Some(tree)) => put_params(&engine.model, client, &prefill, &tree)?,
            (ParamSource::Load(_), None) => unreachable!("a file is read before compiling"),
        };
        startup.params += t.elapsed().as_secs_f64();
        Ok(Session { engine, prefill, generate, params, seed: c.decode_seed as u32, startup, client: client.clone() })
    }

    /// Decodes `prompts` (token ids, each 1..=prefill_len long, at most `batch` of them; the
    /// other rows of the batch decode a one-token padding prompt that nobody reads): the first
    /// token from prefill, then generate calls until each prompt's sequence has ended with
    /// `eos` or `cache_len - prefill_len` generate steps were made (MaxText's `decode.py` count).
    pub fn generate(&self, prompts: &[Vec<i32>], eos: Option<i32>) -> Result<Generation> {
        let e = &self.engine;
        let (b, p) = (e.batch as usize, e.prefill_len as usize);
        if prompts.is_empty() || prompts.len() > b {
            bail!("{} prompts for a batch of {b} sequences", prompts.len());
        }
        let mut tokens = vec![0i32; b * p];
        let mut lengths = vec![1i32; b];
        for (row, prompt) in prompts.iter().enumerate() {
            if prompt.is_empty() || prompt.len() > p {
                bail!("prompt {row} has {} tokens; it must have 1..={p}", prompt.len());
            }
            tokens[row * p..row * p + prompt.len()].copy_from_slice(prompt);
            lengths[row] = prompt.len() as i32;
        }
        let host = Tree::new()
            .with("tokens", HostTensor::from_i32(&[b as i64, p as i64], &tokens))
            .with("lengths", HostTensor::from_i32(&[b as i64], &lengths))
            .with("key", HostTensor::from_u32(&[2], &[0, self.seed]));

        let t = Instant::now();
        let mut state = HashMap::new();
        for (name, value) in host.iter() {
            let index = self.prefill.input_index(name)?;
            state.insert(name.to_string(), self.prefill.put(&self.client, index, value)?);
        }
        self.call(&self.prefill, &mut state)?;
        let first = self.read(&self.prefill, "tokens", &state)?;
        let steps_per_call = self.generate.program.outputs[self.generate.output_index("generated")?].ty.shape[0];
        let mut generation =
            Generation { prefill_seconds: t.elapsed().as_secs_f64(), steps_per_call, ..Default::default() };

        let mut done = vec![false; prompts.len()];
        for (row, &token) in first.iter().take(prompts.len()).enumerate() {
            generation.tokens.push(vec![token]);
            done[row] = eos == Some(token);
        }
        let budget = (e.cache_len - e.prefill_len) as usize;
        let mut steps = 0;
        while steps < budget && done.contains(&false) {
            let t = Instant::now();
            self.call(&self.generate, &mut state)?;
            let made = self.read(&self.generate, "generated", &state)?;
            generation.call_seconds.push(t.elapsed().as_secs_f64());
            for step in made.chunks(b).take(budget - steps) {
                steps += 1;
                for (row, &token) in step.iter().take(prompts.len()).enumerate() {
                    if !done[row] {
                        generation.tokens[row].push(token);
                        done[row] = eos == Some(token);
                    }
                }
            }
        }
        Ok(generation)
    }

    /// Runs `program` on the parameters and `state` (its other inputs, by name), replacing
    /// `state` with the outputs (donated inputs are consumed).
    fn call(&self, program: &Compiled, state: &mut HashMap<String, DeviceArray>) -> Result<()> {
        let args: Vec<&DeviceArray> = program
            .program
            .inputs
            .iter()
            .map(|spec| {
                self.params
                    .get(&spec.name)
                    .or_else(|| state.get(&spec.name))
                    .ok_or_else(|| anyhow!("no value for input \"{}\"", spec.name))
            })
            .collect::<Result<_>>()?;
        let outputs = program.execute(&args)?;
        *state = program.program.outputs.iter().map(|o| o.name.clone()).zip(outputs).collect();
        Ok(())
    }

    /// Output `name` of `program` (s32) back on the host.
    fn read(&self, program: &Compiled, name: &str, state: &HashMap<String, DeviceArray>) -> Result<Vec<i32>> {
        let array = state.get(name).ok_or_else(|| anyhow!("no output \"{name}\""))?;
        Ok(program.fetch(program.output_index(name)?, array)?.to_i32())
    }
}

/// The parameters `load_parameters_path` names, checked against `model`'s: a checkpoint
/// directory (its `params.*` arrays, as `maxrs train` restores them: the model keys it recorded
/// must match, float types are converted to `weight_dtype`) or a safetensors file in maxrs's
/// layout. Errors are one line.
fn read_params(c: &Config, model: &Model, path: &str) -> Result<Tree<HostTensor>> {
    let location = Location::parse(path)?;
    if storage::is_file(&location.join(checkpoint::manifest::MANIFEST_FILE))? {
        let expected: Vec<Expected> = expected_params(model)
            .into_iter()
            .map(|p| Expected { name: Group::Params.name(&p.name), ty: p.ty, dims: p.dims })
            .collect();
        let loaded = checkpoint::dir::load(&location, &expected, &checkpoint::manifest::model_keys(c, model), true)
            .map_err(|e| {
                anyhow!(
                    "load_parameters_path={location}: {}",
                    format!("{e:#}").replace(":\n  ", ": ").replace("\n  ", "; ")
                )
            })?;
        let step = loaded.manifest.step.map_or(String::new(), |s| format!(" (step {s})"));
        println!("loaded {} parameters from the checkpoint {location}{step}", loaded.arrays.len());
        return Ok(Group::Params.subtree(&loaded.arrays.into_iter().collect()));
    }
    let file = match &location {
        Location::Local(file) => load_parameters(file, &expected_params(model)),
        remote => load_parameters(&storage::download(remote)?, &expected_params(model)),
    };
    let params = file.map_err(|e| match e {
        ParamsError::Mismatch(m) => anyhow!("{}", one_line_mismatch(&m)),
        other => anyhow!(other),
    })?;
    Ok(params.into_iter().collect())
}

fn expected_params(model: &Model) -> Vec<ParamSpec> {
    let dtype = model.config.weight_dtype;
    model.param_defs().into_iter().map(|d| ParamSpec { name: d.name, ty: dtype, dims: d.shape }).collect()
}

/// Host parameters (by name, without the `params.` prefix) on the devices, laid out as
/// `prefill`'s `params.*` inputs.
fn put_params(
    model: &Model,
    client: &Client,
    prefill: &Compiled,
    host: &Tree<HostTensor>,
) -> Result<HashMap<String, DeviceArray>> {
    let mut params = HashMap::new();
    for spec in expected_params(model) {
        let value = host.get(&spec.name).ok_or_else(|| anyhow!("parameter \"{}\" is missing", spec.name))?;
        let name = Group::Params.name(&spec.name);
        let index = prefill.input_index(&name)?;
        params.insert(name, prefill.put(client, index, value)?);
    }
    Ok(params)
}

/// The parameters `maxrs train` would start from with `init_weights_seed = seed`, drawn on the
/// devices in the layout of `prefill`'s inputs.
fn init_params(model: &Model, client: &Client, seed: u32, prefill: &Compiled) -> Result<HashMap<String, DeviceArray>> {
    let mut sig = Signature::new(prefill.program.mesh.clone());
    let is_param = |name: &str| Group::of(name).is_some_and(|(g, _)| g == Group::Params);
    for input in prefill.program.inputs.iter().filter(|i| is_param(&i.name)) {
        if let Some(spec) = &input.sharding {
            sig.output_sharding(&input.name, spec.clone());
        }
    }
    let init = trace(&sig, |ctx, _| Group::Params.prefixed(model.init_params(&random::key(ctx, seed))))
        .map_err(|e| anyhow!("tracing the initializer: {e}"))?;
    let init = runtime::compile(client, &init)?;
    let outputs = init.execute(&[])?;
    Ok(init.program.outputs.iter().map(|o| o.name.clone()).zip(outputs).collect())
}

/// A parameter file for another model, in one line: how many tensors are missing, unexpected
/// or mis-shaped, with the first of each.
fn one_line_mismatch(m: &crate::host::params_io::Mismatch) -> String {
    let mut parts = Vec::new();
    if let Some((name, expected)) = m.wrong.first().map(|(n, e, f)| (n, format!("expected {e}, found {f}"))) {
        parts.push(format!("{} with the wrong shape or dtype (first: {name}: {expected})", m.wrong.len()));
    }
    if let Some((name, expected)) = m.missing.first() {
        parts.push(format!("{} missing (first: {name}, {expected})", m.missing.len()));
    }
    if let Some((name, found)) = m.unexpected.first() {
        parts.push(format!("{} unexpected (first: {name}, {found})", m.unexpected.len()));
    }
    format!(
        "load_parameters_path={}: the file is not this model's parameters: {}; was it saved for another model_name?",
        m.path.display(),
        parts.join("; ")
    )
}
