//! Loading a `Config` the way MaxText's `pyconfig` does, and remembering where each value came
//! from ([`Resolved`], shown by `--print-config`).
//!
//! Precedence, lowest first (MaxText's rule, `src/maxtext/configs/pyconfig.py`
//! `_initialize_pydantic` at main e591f30: `merge(base_yml_config, model_cfg, overrides_cfg)`,
//! with `validate_no_keys_overridden_twice` refusing a command-line value that contradicts the
//! model file unless `override_model_config=True`):
//! - a named model (`model_name=llama2-7b`): built-in `configs/base.yml` defaults, the user's
//!   config file, `models/<model_name>.yml` (model keys only: the config file's model keys act
//!   as defaults), `key=value` arguments (contradicting the model file is an error unless
//!   `override_model_config=true`);
//! - the `default` model (MaxText has no file for it: its keys are base.yml's): built-in
//!   defaults, `models/default.yml` (the tiny model and its quick-start run settings), the
//!   user's config file, `key=value`. So whatever the user writes wins over the quick-start.
//!
//! Last come MaxText's environment overrides: `M_<KEY>` sets `key` (`M_STEPS=10`), refused for a
//! key also given on the command line, or set by a named model's file without
//! `override_model_config=true` (pyconfig.py `_initialize_pydantic`, step 6, at main e591f30).
//!
//! `logical_axis_rules` merge by logical name instead of being replaced (MaxText's
//! `_merge_logical_axis_rules`), except in the config file, which is MaxText's base table.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde_yaml::{Mapping, Value};

use super::builtin;
use super::choices::LogicalAxisRule;
use super::error::{closest, escape, quote, ConfigError};
use super::keys::Config;
use super::maxtext_keys;
use super::nested;
use super::registry::{self, Origin};
use super::rules;
use super::value::{coerce, schema, show};
use crate::input;

/// The model whose file holds defaults rather than a fixed architecture: in MaxText the default
/// model has no file at all, so everything the user writes applies to it.
const DEFAULT_MODEL: &str = "default";

/// Where a key's value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The built-in `configs/base.yml`.
    Default,
    /// The user's config file.
    ConfigFile(PathBuf),
    /// A model file (its description: a path or `built-in models/<name>.yml`).
    Model(String),
    /// A `key=value` argument.
    CommandLine,
    /// An environment variable or a command-line flag that stands for a key (`--plugin`,
    /// `MAXRS_PJRT_PLUGIN`, `--topology`).
    Setting(String),
}

impl Source {
    /// Whether the user chose this value (config file, command line, flag or environment),
    /// rather than it being a default.
    pub fn is_user(&self) -> bool {
        matches!(self, Source::ConfigFile(_) | Source::CommandLine | Source::Setting(_))
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("configs/base.yml default"),
            Source::ConfigFile(path) => write!(f, "{}", path.display()),
            Source::Model(origin) => f.write_str(origin),
            Source::CommandLine => f.write_str("command line"),
            Source::Setting(what) => f.write_str(what),
        }
    }
}

/// A loaded config with the source of every key.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub config: Config,
    pub sources: BTreeMap<String, Source>,
    /// The setting files on disk it was read from, each with what named it (`CONFIG`, the
    /// command's config argument; `model_name`, a model file found on disk): no output of the
    /// command may overwrite one (`output::check_resolved_paths`).
    pub files_read: Vec<(&'static str, PathBuf)>,
}

impl Resolved {
    /// Where `key` got its value (`Default` for a key nothing set).
    pub fn source(&self, key: &str) -> &Source {
        self.sources.get(key).unwrap_or(&Source::Default)
    }

    /// Records that `key` was set to its current value by `source` (for values that come from
    /// outside the config layers, such as `--plugin`).
    pub fn set_source(&mut self, key: &str, source: Source) {
        self.sources.insert(key.to_string(), source);
    }

    /// Every key, its value and its source, one per line in `Config` field order; a default of
    /// a key of maxrs's own (not MaxText's) says so.
    pub fn listing(&self) -> String {
        let values = match serde_yaml::to_value(&self.config) {
            Ok(Value::Mapping(m)) => m,
            _ => Mapping::new(),
        };
        let rows: Vec<(String, String, String)> = registry::keys()
            .iter()
            .map(|key| {
                let value = values.get(key.name).map(show_compact).unwrap_or_default();
                let source = self.source(key.name);
                let source = match (key.origin, source) {
                    (Origin::Maxrs, Source::Default) => format!("{source}; {} key", key.origin.describe()),
                    _ => source.to_string(),
                };
                (key.name.to_string(), value, source)
            })
            .collect();
        let key_width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
        let value_width = rows.iter().map(|r| r.1.len()).filter(|w| *w <= 40).max().unwrap_or(0);
        rows.iter()
            .map(|(k, v, s)| format!("{k:<key_width$} = {v:<value_width$}  ({s})"))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A value on one line: lists in flow style, strings quoted only when empty, hidden characters
/// escaped.
fn show_compact(value: &Value) -> String {
    match value {
        Value::String(s) if s.is_empty() => "\"\"".into(),
        other => escape(&show(other)),
    }
}

/// Loads MaxText's command line: an optional config file first (any argument without `=`, as in
/// `maxrs train configs/base.yml steps=10`), then `key=value` overrides.
pub fn load_args(args: &[String]) -> Result<Config, ConfigError> {
    Ok(resolve_args(args)?.config)
}

/// [`load_args`], keeping the source of each value. These are the user's own arguments, so
/// unlike [`resolve`]'s layered overrides a key may not have two values ([`refuse_repeated`]).
pub fn resolve_args(args: &[String]) -> Result<Resolved, ConfigError> {
    let (config_path, overrides) = match args.split_first() {
        Some((first, rest)) if !first.contains('=') => (Some(Path::new(first)), rest),
        _ => (None, args),
    };
    refuse_repeated(overrides)?;
    resolve(config_path, overrides)
}

/// The user's `key=value` arguments `user` layered over `derived`, settings a command took from
/// elsewhere (a checkpoint's model keys): a derived value gives way to the user's, while a key
/// the user gives twice is refused as in [`resolve_args`].
pub fn load_over(config_path: Option<&Path>, derived: &[String], user: &[String]) -> Result<Config, ConfigError> {
    refuse_repeated(user)?;
    let all: Vec<String> = derived.iter().chain(user).cloned().collect();
    load(config_path, &all)
}

/// Loads the config file at `config_path` (none: only the built-in defaults), the model it
/// selects, and the `key=value` `overrides`, later ones winning (callers layer their own
/// settings this way; a user's command line goes through [`load_args`]); see the module docs
/// for the order.
///
/// A file given here may list only some keys; the others keep the built-in defaults. The model file
/// is looked for next to a given config file (`<dir>/models/`, then `<dir>/../models/`, MaxText's
/// places) before the built-in copies; without a config file, built-in copies come first, then
/// `./models/`.
pub fn load(config_path: Option<&Path>, overrides: &[String]) -> Result<Config, ConfigError> {
    Ok(resolve(config_path, overrides)?.config)
}

/// [`load`], keeping the source of each value.
pub fn resolve(config_path: Option<&Path>, overrides: &[String]) -> Result<Resolved, ConfigError> {
    let cli = parse_overrides(overrides)?;
    let env = env_overrides(&cli)?;
    let chain = match config_path {
        Some(path) => read_config_chain(path)?,
        None => Vec::new(),
    };
    let file = flatten(&chain);

    let value_of = |key: &str| {
        let last = |layer: &Layer| layer.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        last(&cli).or_else(|| last(&file))
    };
    let model_name = match value_of("model_name") {
        Some(Value::String(name)) => name,
        _ => DEFAULT_MODEL.to_string(),
    };
    let (text, model_origin, model_file) = model_source(&model_name, config_path)?;
    let files_read = chain
        .iter()
        .rev()
        .enumerate()
        .map(|(i, (path, _))| (if i == 0 { "CONFIG" } else { BASE_CONFIG }, path.clone()))
        .chain(model_file.map(|p| ("model_name", p)));
    let model = read_layer(&text, &format!("in {model_origin}"))?;
    let model_source = Source::Model(model_origin.clone());

    let mut merged = Merged::defaults();
    if model_name == DEFAULT_MODEL {
        merged.apply(&model, false, &model_source)?;
        merged.apply_files(&chain)?;
        merged.apply(&cli, false, &Source::CommandLine)?;
    } else {
        if !matches!(value_of("override_model_config"), Some(Value::Bool(true))) {
            if let Some((key, _)) = env.iter().find(|(k, _)| model.iter().any(|(m, _)| m == k)) {
                return Err(ConfigError::invalid(
                    key.as_str(),
                    format!("set by {model_origin} and by {}; as in MaxText, add override_model_config=true to change a model's keys", env_key(key)),
                ));
            }
        }
        if let Some((key, _)) = model.iter().find(|(k, _)| !registry::key(k).is_some_and(|k| k.model_file)) {
            return Err(ConfigError::NotAModelKey { key: key.clone(), model_origin });
        }
        let override_model = matches!(value_of("override_model_config"), Some(Value::Bool(true)));
        if !override_model {
            check_model_not_contradicted(&model, &cli, &model_origin)?;
        }
        merged.apply_files(&chain)?;
        warn_model_wins(&model, &chain, &model_origin);
        // With override_model_config, MaxText applies only the model keys the command line leaves alone.
        let model: Layer =
            model.into_iter().filter(|(k, _)| !(override_model && cli.iter().any(|(c, _)| c == k))).collect();
        merged.apply(&model, false, &model_source)?;
        merged.apply(&cli, false, &Source::CommandLine)?;
    }
    for (key, value) in &env {
        merged.apply(&vec![(key.clone(), value.clone())], false, &Source::Setting(env_key(key)))?;
    }
    let config = serde_yaml::from_value(Value::Mapping(merged.values))
        .map_err(|e| ConfigError::invalid("config", e.to_string()))?;
    Ok(Resolved { config, sources: merged.sources, files_read: files_read.collect() })
}

/// A `key=value` that differs from the model file's value is refused (MaxText's
/// `validate_no_keys_overridden_twice` compares values, so restating the model's value is fine).
fn check_model_not_contradicted(model: &Layer, cli: &Layer, model_origin: &str) -> Result<(), ConfigError> {
    for (key, cli_v) in cli {
        if let Some((_, model_v)) = model.iter().find(|(k, _)| k == key) {
            if model_v != cli_v {
                return Err(ConfigError::ModelOverride {
                    key: key.clone(),
                    model_origin: model_origin.to_string(),
                    model_value: show(model_v),
                    cli_value: show(cli_v),
                });
            }
        }
    }
    Ok(())
}

/// The model file wins over the config file's model keys (MaxText's rule); say so when the config
/// file chose a value of its own (one that is not base.yml's default), so it does not vanish
/// silently.
fn warn_model_wins(model: &Layer, chain: &[(PathBuf, Layer)], model_origin: &str) {
    for (key, file_v) in flatten(chain) {
        let Some(path) = chain.iter().rev().find(|(_, layer)| layer.iter().any(|(k, _)| *k == key)).map(|(p, _)| p)
        else {
            continue;
        };
        let Some((_, model_v)) = model.iter().find(|(k, _)| *k == key) else { continue };
        let file_v = &file_v;
        if file_v != model_v && schema().get(key.as_str()) != Some(file_v) {
            tracing::warn!(
                "{} sets {key}={}, but {model_origin} sets {} and wins (a model file overrides the config \
                 file's model keys, as in MaxText); to change it pass {key}={} override_model_config=true",
                path.display(),
                escape(&show(file_v)),
                escape(&show(model_v)),
                escape(&show(file_v))
            );
        }
    }
}

/// The values merged so far and the layer each came from.
struct Merged {
    values: Mapping,
    sources: BTreeMap<String, Source>,
}

impl Merged {
    fn defaults() -> Merged {
        Merged { values: schema().clone(), sources: BTreeMap::new() }
    }

    /// Lays `layer` over the values. `logical_axis_rules` merge by name unless this is the base
    /// table (the config file) or the layer sets `override_logical_axis_rules`.
    fn apply(&mut self, layer: &Layer, is_base: bool, source: &Source) -> Result<(), ConfigError> {
        apply(&mut self.values, layer, is_base)?;
        for (key, _) in layer {
            self.sources.insert(key.clone(), source.clone());
        }
        Ok(())
    }

    /// Lays a config file's `base_config` chain over the values, base first; each file replaces
    /// `logical_axis_rules` rather than merging them (MaxText merges the chain with
    /// `OmegaConf.merge`, which replaces lists).
    fn apply_files(&mut self, chain: &[(PathBuf, Layer)]) -> Result<(), ConfigError> {
        for (path, layer) in chain {
            self.apply(layer, true, &Source::ConfigFile(path.clone()))?;
        }
        Ok(())
    }
}

type Layer = Vec<(String, Value)>;

/// The key of a config file that names the file it extends (MaxText's `_BASE_CONFIG_ATTR`).
const BASE_CONFIG: &str = "base_config";

/// The one file of maxrs's configs directory, which stands where MaxText's `MAXTEXT_CONFIGS_DIR`
/// does for a `base_config` not found next to the file: `base.yml`, the built-in defaults (every
/// key's default, so it adds no layer).
const BUILT_IN_BASE: &str = "base.yml";

/// A config file and the files its `base_config` names, in turn, base first: each file's path and
/// keys. As MaxText's `_load_config` (`src/maxtext/configs/pyconfig.py` at main e591f30), a
/// relative `base_config` is looked for next to the file that names it, then in the configs
/// directory (for maxrs, the built-in `base.yml`); an absolute one is read as it is. A file named
/// twice in one chain is refused (MaxText recurses until Python gives up).
fn read_config_chain(path: &Path) -> Result<Vec<(PathBuf, Layer)>, ConfigError> {
    let mut chain: Vec<(PathBuf, Layer)> = Vec::new();
    // Each file of the chain as the file system names it, to tell a file named twice.
    let mut identities: Vec<PathBuf> = Vec::new();
    let mut next = Some(path.to_path_buf());
    while let Some(path) = next.take() {
        let text = input::read_to_string("config file", &path, input::SETTINGS)?;
        let origin = format!("in {}", path.display());
        let (layer, base) = read_config_layer(&text, &origin)?;
        let identity = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        if identities.contains(&identity) {
            let names: Vec<String> = chain.iter().map(|(p, _)| p.display().to_string()).collect();
            return Err(ConfigError::invalid(
                BASE_CONFIG,
                format!(
                    "{} is named twice in one chain ({} -> {}): a config file cannot extend itself",
                    path.display(),
                    names.join(" -> "),
                    path.display()
                ),
            ));
        }
        if let Some(base) = base {
            let base_path = Path::new(&base);
            let beside = path.parent().unwrap_or(Path::new(".")).join(base_path);
            if base_path.is_absolute() {
                next = Some(base_path.to_path_buf());
            } else if beside.is_file() {
                next = Some(beside);
            } else if base != BUILT_IN_BASE {
                return Err(ConfigError::invalid(
                    BASE_CONFIG,
                    format!(
                        "{} {origin} is not a file next to it ({}) nor one of maxrs's configs (only {BUILT_IN_BASE}, the built-in defaults)",
                        quote(&base),
                        beside.display()
                    ),
                ));
            }
        }
        identities.push(identity);
        chain.push((path, layer));
    }
    chain.reverse();
    Ok(chain)
}

/// A config file's keys and its `base_config`, if it names one.
fn read_config_layer(text: &str, origin: &str) -> Result<(Layer, Option<String>), ConfigError> {
    let mut base = None;
    let mut layer = Layer::new();
    for (key, value) in parse_mapping(text, origin)? {
        if key == BASE_CONFIG {
            match value {
                Value::String(s) if !s.trim().is_empty() => base = Some(s),
                Value::Null => {}
                other => {
                    return Err(ConfigError::invalid(
                        BASE_CONFIG,
                        format!("{origin} is {}, expected the path of a config file", quote(&show(&other))),
                    ))
                }
            }
        } else if let Some(value) = typed(&key, value, origin)? {
            layer.push((key, value));
        }
    }
    Ok((layer, base))
}

/// The chain's keys as one layer, a later file's value replacing an earlier one's.
fn flatten(chain: &[(PathBuf, Layer)]) -> Layer {
    let mut flat = Layer::new();
    for (key, value) in chain.iter().flat_map(|(_, layer)| layer) {
        flat.retain(|(k, _)| k != key);
        flat.push((key.clone(), value.clone()));
    }
    flat
}

/// MaxText's name for the environment variable that overrides `key`: `M_` and the key in capitals.
fn env_key(key: &str) -> String {
    format!("M_{}", key.to_uppercase())
}

/// The keys set by `M_<KEY>` environment variables, each typed like a command-line value. As in
/// MaxText, a key may not also be on the command line, and only keys with a scalar value
/// (bool, number, string) can be set this way.
fn env_overrides(cli: &Layer) -> Result<Layer, ConfigError> {
    let mut layer = Layer::new();
    for (key, default) in schema() {
        let Some(key) = key.as_str() else { continue };
        let name = env_key(key);
        let Some(raw) = std::env::var_os(&name) else { continue };
        let origin = format!("in environment variable {name}");
        if cli.iter().any(|(k, _)| k == key) {
            return Err(ConfigError::invalid(
                key,
                format!("given both on the command line and {origin}; give it once"),
            ));
        }
        if !matches!(default, Value::Bool(_) | Value::Number(_) | Value::String(_)) {
            return Err(ConfigError::invalid(
                key,
                format!("{origin}: as in MaxText, only keys with a bool, number or string value can be set from the environment"),
            ));
        }
        let raw = raw.into_string().map_err(|_| ConfigError::invalid(key, format!("{origin} is not UTF-8")))?;
        layer.push((key.to_string(), coerce(key, Value::String(raw), &origin)?));
    }
    Ok(layer)
}

/// `key=value` arguments, each checked and typed.
fn parse_overrides(overrides: &[String]) -> Result<Layer, ConfigError> {
    overrides
        .iter()
        .map(|arg| {
            let (key, value) = arg.split_once('=').ok_or_else(|| ConfigError::Malformed(arg.clone()))?;
            let key = key.trim();
            if key.is_empty() {
                return Err(ConfigError::Malformed(arg.clone()));
            }
            if key == BASE_CONFIG {
                return Err(ConfigError::invalid(
                    BASE_CONFIG,
                    "is read only from a config file, as in MaxText (its pyconfig ignores it on the command line); \
                     give the file as the first argument",
                ));
            }
            let mut typed_keys = Layer::new();
            for (key, value) in
                nested::spread(key.to_string(), Value::String(value.to_string()), "on the command line")?
            {
                if let Some(value) = typed(&key, value, "on the command line")? {
                    typed_keys.push((key, value));
                }
            }
            Ok(typed_keys)
        })
        .collect::<Result<Vec<Layer>, ConfigError>>()
        .map(|layers| layers.into_iter().flatten().collect())
}

/// `value` typed for `key`, or `None` for a MaxText key maxrs lacks that changes nothing here
/// (`maxtext_keys::inert`: at MaxText's default, or an encoder's key), which is left out.
fn typed(key: &str, value: Value, origin: &str) -> Result<Option<Value>, ConfigError> {
    if registry::key(key).is_none() && maxtext_keys::inert(key, &value) {
        return Ok(None);
    }
    coerce(key, value, origin).map(Some)
}

/// Refuses a user's command line that gives one key two different values. MaxText's loader
/// keeps the last silently (`src/maxtext/configs/pyconfig.py` `_initialize_pydantic` reads the
/// arguments with `omegaconf.OmegaConf.from_cli`, whose `merge_with_dotlist` updates the key
/// once per argument; maxtext main at 018116f), which turns a script's `steps=3` and the user's
/// `steps=4` into whichever came last. The same value twice (a wrapper restating a setting)
/// loses nothing and stays accepted, as MaxText's `validate_no_keys_overridden_twice` accepts
/// a model key restated with its value. Arguments that are not valid `key=value` pairs are left
/// to [`resolve`], which names them.
fn refuse_repeated(overrides: &[String]) -> Result<(), ConfigError> {
    let mut seen: Vec<(&str, &str, Value)> = Vec::new();
    for arg in overrides {
        let Some((key, text)) = arg.split_once('=') else { continue };
        let key = key.trim();
        let Ok(value) = coerce(key, Value::String(text.to_string()), "on the command line") else { continue };
        if let Some((_, first, _)) = seen.iter().find(|(k, _, v)| *k == key && *v != value) {
            return Err(ConfigError::Repeated {
                key: key.to_string(),
                first: first.to_string(),
                second: text.to_string(),
            });
        }
        seen.push((key, text, value));
    }
    Ok(())
}

/// A model file's keys, each checked and typed.
fn read_layer(text: &str, origin: &str) -> Result<Layer, ConfigError> {
    parse_mapping(text, origin)?
        .into_iter()
        .map(|(key, value)| {
            if key == BASE_CONFIG {
                return Err(ConfigError::invalid(BASE_CONFIG, format!("{origin}: a model file cannot extend another (MaxText reads base_config in the config file only)")));
            }
            Ok(typed(&key, value, origin)?.map(|v| (key, v)))
        })
        .filter_map(Result::transpose)
        .collect()
}

/// A YAML file's top-level keys and their values, untyped.
fn parse_mapping(text: &str, origin: &str) -> Result<Vec<(String, Value)>, ConfigError> {
    let yaml_error = |message: String| ConfigError::Yaml { origin: origin.to_string(), message };
    let mapping: Mapping = match serde_yaml::from_str::<Value>(text).map_err(|e| yaml_error(e.to_string()))? {
        Value::Mapping(m) => m,
        Value::Null => Mapping::new(),
        other => return Err(yaml_error(format!("expected a mapping of keys to values, got {}", quote(&show(&other))))),
    };
    let mut keys = Vec::new();
    for (key, value) in mapping {
        let key =
            key.as_str().ok_or_else(|| yaml_error(format!("key {} is not a string", quote(&show(&key)))))?.to_string();
        keys.extend(nested::spread(key, value, origin)?);
    }
    Ok(keys)
}

/// Lays `layer` over `merged`. `logical_axis_rules` merge by name unless this is the base file or
/// the layer sets `override_logical_axis_rules`.
fn apply(merged: &mut Mapping, layer: &Layer, is_base: bool) -> Result<(), ConfigError> {
    let replace_rules =
        is_base || layer.iter().any(|(k, v)| k == "override_logical_axis_rules" && *v == Value::Bool(true));
    for (key, value) in layer {
        let value = if key == "logical_axis_rules" && !replace_rules {
            let typed = |v: &Value| -> Result<Vec<LogicalAxisRule>, ConfigError> {
                serde_yaml::from_value(v.clone()).map_err(|e| ConfigError::invalid("logical_axis_rules", e.to_string()))
            };
            let base = typed(merged.get(key.as_str()).unwrap_or(&Value::Null))?;
            let merged_rules = rules::merge(base, typed(value)?, false);
            serde_yaml::to_value(merged_rules).map_err(|e| ConfigError::invalid("logical_axis_rules", e.to_string()))?
        } else {
            value.clone()
        };
        merged.insert(Value::from(key.as_str()), value);
    }
    Ok(())
}

/// The text of `models/<name>.yml`, a description of where it came from, and its path when it
/// was read from disk.
fn model_source(name: &str, config_path: Option<&Path>) -> Result<(String, String, Option<PathBuf>), ConfigError> {
    let dirs: Vec<PathBuf> = match config_path {
        Some(path) => {
            let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
            vec![dir.join("models"), dir.join("..").join("models")]
        }
        None => vec![PathBuf::from("./models")],
    };
    let from_disk = || {
        // Anything at the path is read, so that a FIFO or folder is refused for what it is.
        dirs.iter().map(|d| d.join(format!("{name}.yml"))).find(|p| p.symlink_metadata().is_ok()).map(|p| {
            let text = input::read_to_string("model file", &p, input::SETTINGS)?;
            Ok((text, p.display().to_string(), Some(p)))
        })
    };
    let built_in =
        || builtin::model(name).map(|text| Ok((text.to_string(), format!("built-in models/{name}.yml"), None)));
    let found = if config_path.is_some() { from_disk().or_else(built_in) } else { built_in().or_else(from_disk) };
    if let Some(result) = found {
        return result;
    }

    let mut available: Vec<String> = builtin::MODELS.iter().map(|(n, _)| n.to_string()).collect();
    for dir in &dirs {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "yml") {
                if let Some(stem) = path.file_stem().and_then(|s| s.to_str()) {
                    available.push(stem.to_string());
                }
            }
        }
    }
    available.sort();
    available.dedup();
    let searched = std::iter::once("the built-in models".to_string())
        .chain(dirs.iter().map(|d| d.display().to_string()))
        .collect::<Vec<_>>()
        .join(", ");
    Err(ConfigError::UnknownModel {
        name: name.to_string(),
        suggestion: closest(name, available.iter().map(String::as_str)),
        searched,
        available,
    })
}
