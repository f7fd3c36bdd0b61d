//! Loading a `Config` the way MaxText's `pyconfig` does: base config, then
//! `models/<model_name>.yml`, then `key=value` arguments; `logical_axis_rules` merge by logical
//! name instead of being replaced; a model's keys change on the command line only with
//! `override_model_config=true`.

use std::path::{Path, PathBuf};

use serde_yaml::{Mapping, Value};

use super::builtin;
use super::error::{closest, ConfigError};
use super::keys::{Config, LogicalAxisRule};
use super::rules;
use super::value::{coerce, schema, show};

/// The model whose file may be overridden freely: in MaxText the default model has no file at all.
const DEFAULT_MODEL: &str = "default";

/// Loads MaxText's command line: an optional config file first (any argument without `=`, as in
/// `maxrs train configs/base.yml steps=10`), then `key=value` overrides.
pub fn load_args(args: &[String]) -> Result<Config, ConfigError> {
    match args.split_first() {
        Some((first, rest)) if !first.contains('=') => load(Some(Path::new(first)), rest),
        _ => load(None, args),
    }
}

/// Loads the config file at `config_path` (the built-in `configs/base.yml` if `None`), the model
/// it selects, and the `key=value` `overrides`, later ones winning.
///
/// A file given here may list only some keys; the others keep the built-in defaults. The model file
/// is looked for next to a given config file (`<dir>/models/`, then `<dir>/../models/`, MaxText's
/// places) before the built-in copies; without a config file, built-in copies come first, then
/// `./models/`.
pub fn load(config_path: Option<&Path>, overrides: &[String]) -> Result<Config, ConfigError> {
    let cli = parse_overrides(overrides)?;
    let mut merged = schema().clone();
    if let Some(path) = config_path {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        let base = read_layer(&text, &format!("in {}", path.display()))?;
        apply(&mut merged, &base, true)?;
    }

    let cli_value = |key: &str| cli.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v);
    let model_name = match cli_value("model_name").or_else(|| merged.get("model_name")) {
        Some(Value::String(name)) => name.clone(),
        _ => DEFAULT_MODEL.to_string(),
    };
    let (text, model_origin) = model_source(&model_name, config_path)?;
    let model = read_layer(&text, &format!("in {model_origin}"))?;

    let override_model = matches!(
        cli_value("override_model_config").or_else(|| merged.get("override_model_config")),
        Some(Value::Bool(true))
    );
    if model_name != DEFAULT_MODEL && !override_model {
        for (key, cli_v) in &cli {
            if let Some((_, model_v)) = model.iter().find(|(k, _)| k == key) {
                if model_v != cli_v {
                    return Err(ConfigError::ModelOverride {
                        key: key.clone(),
                        model_origin: model_origin.clone(),
                        model_value: show(model_v),
                        cli_value: show(cli_v),
                    });
                }
            }
        }
    }
    apply(&mut merged, &model, false)?;
    apply(&mut merged, &cli, false)?;
    serde_yaml::from_value(Value::Mapping(merged)).map_err(|e| ConfigError::invalid("config", e.to_string()))
}

type Layer = Vec<(String, Value)>;

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
            Ok((key.to_string(), coerce(key, Value::String(value.to_string()), "on the command line")?))
        })
        .collect()
}

/// A YAML file's keys, each checked and typed.
fn read_layer(text: &str, origin: &str) -> Result<Layer, ConfigError> {
    let yaml_error = |message: String| ConfigError::Yaml { origin: origin.to_string(), message };
    let mapping: Mapping = match serde_yaml::from_str::<Value>(text).map_err(|e| yaml_error(e.to_string()))? {
        Value::Mapping(m) => m,
        Value::Null => Mapping::new(),
        other => return Err(yaml_error(format!("expected a mapping of keys to values, got {}", show(&other)))),
    };
    mapping
        .into_iter()
        .map(|(key, value)| {
            let key =
                key.as_str().ok_or_else(|| yaml_error(format!("key {} is not a string", show(&key))))?.to_string();
            let value = coerce(&key, value, origin)?;
            Ok((key, value))
        })
        .collect()
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

/// The text of `models/<name>.yml` and a description of where it came from.
fn model_source(name: &str, config_path: Option<&Path>) -> Result<(String, String), ConfigError> {
    let dirs: Vec<PathBuf> = match config_path {
        Some(path) => {
            let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
            vec![dir.join("models"), dir.join("..").join("models")]
        }
        None => vec![PathBuf::from("./models")],
    };
    let from_disk = || {
        dirs.iter().map(|d| d.join(format!("{name}.yml"))).find(|p| p.is_file()).map(|p| {
            std::fs::read_to_string(&p)
                .map(|text| (text, p.display().to_string()))
                .map_err(|source| ConfigError::Read { path: p.clone(), source })
        })
    };
    let built_in = || builtin::model(name).map(|text| Ok((text.to_string(), format!("built-in models/{name}.yml"))));
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
