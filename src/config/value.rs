//! Giving each value its key's type: YAML values from files and `key=value` text from the command
//! line both go through `coerce`, which checks the key exists and converts the value the way
//! MaxText's loader would (`True`, `10_000`, `1.e-5`, `[silu, linear]`, a bare word for a list).

use std::sync::OnceLock;

use serde_yaml::{Mapping, Value};

use super::docs;
use super::error::{closest, ConfigError};
use super::keys::Config;
use super::maxtext_keys;
use super::refused::not_supported_yet;
use super::registry::{self, Kind};

/// Every key with its built-in default, typed as the `Config` field is: the generated
/// `configs/base.yml` read into a `Config`, so a default that does not fit its key's type fails
/// here, at the first load.
pub(crate) fn schema() -> &'static Mapping {
    static SCHEMA: OnceLock<Mapping> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let config: Config = serde_yaml::from_str(&docs::base_yml())
            .unwrap_or_else(|e| panic!("the defaults declared in src/config/keys.rs do not match their types: {e}"));
        match serde_yaml::to_value(config) {
            Ok(Value::Mapping(m)) => m,
            other => panic!("Config serializes to a mapping, got {other:?}"),
        }
    })
}

/// The valid keys, in declaration (`Config` field) order.
pub fn key_names() -> impl Iterator<Item = &'static str> {
    registry::keys().iter().map(|k| k.name)
}

/// `key`'s value in `config`, as text, when it differs from the default in `configs/base.yml`
/// (`None` when it is the default, or no such key exists).
pub fn non_default_value(config: &Config, key: &str) -> Option<String> {
    let value = match serde_yaml::to_value(config) {
        Ok(Value::Mapping(m)) => m.get(key).cloned()?,
        _ => return None,
    };
    (schema().get(key)? != &value).then(|| show(&value))
}

/// Checks that `key` exists and converts `value` to its type. `origin` says where the value was
/// written, for errors ("on the command line", "in configs/base.yml").
pub(crate) fn coerce(key: &str, value: Value, origin: &str) -> Result<Value, ConfigError> {
    let Some(declared) = registry::key(key) else {
        if let Some(reason) = not_supported_yet(key) {
            return Err(ConfigError::NotSupported {
                key: key.to_string(),
                origin: origin.to_string(),
                reason: reason.into(),
            });
        }
        if let Some(default) = maxtext_keys::default_of(key) {
            let reason = format!("maxrs has only its default ({})", show(default));
            return Err(ConfigError::NotSupported { key: key.to_string(), origin: origin.to_string(), reason });
        }
        return Err(ConfigError::UnknownKey {
            key: key.to_string(),
            origin: origin.to_string(),
            suggestion: closest(key, key_names()),
        });
    };
    let kind = declared.kind;
    let wrong = |value: &Value| ConfigError::WrongType {
        key: key.to_string(),
        origin: origin.to_string(),
        expected: kind.expected().to_string(),
        value: show(value),
    };
    let coerced = match kind {
        Kind::IntOrNone => match &value {
            Value::Null => Some(Value::Null),
            Value::Number(n) if n.is_i64() => Some(value.clone()),
            Value::String(s) if matches!(s.trim(), "None" | "none" | "null" | "") => Some(Value::Null),
            Value::String(s) => parse_number::<i64>(s).map(Value::from),
            _ => None,
        },
        Kind::Bool => match &value {
            Value::Bool(_) => Some(value.clone()),
            Value::String(s) => parse_bool(s).map(Value::Bool),
            _ => None,
        },
        // YAML's `.inf` and `.nan` are numbers too: no key takes them.
        Kind::Float => match &value {
            Value::Number(v) => v.as_f64().filter(|x| x.is_finite()).map(Value::from),
            Value::String(s) => parse_number::<f64>(s).filter(|x| x.is_finite()).map(Value::from),
            _ => None,
        },
        Kind::Int => match &value {
            Value::Number(v) if v.is_f64() => v.as_f64().and_then(exact_i64).map(Value::from),
            Value::Number(v) => v.as_i64().map(Value::from),
            Value::String(s) => parse_number::<i64>(s).map(Value::from),
            _ => None,
        },
        Kind::Text | Kind::Choice(_) => match &value {
            Value::String(_) => Some(value.clone()),
            Value::Number(n) => Some(Value::String(n.to_string())),
            Value::Bool(b) => Some(Value::String(b.to_string())),
            Value::Null => Some(Value::String(String::new())),
            _ => None,
        },
        Kind::Texts | Kind::TextLists | Kind::AxisRules => {
            let list = match &value {
                Value::Sequence(_) => Some(value.clone()),
                Value::String(s) => Some(parse_list(s)),
                _ => None,
            };
            // In a list of strings, numbers are strings as they are for a string key (`prompt=[1 2, 3]`).
            match (kind, list) {
                (Kind::Texts, Some(Value::Sequence(list))) => Some(Value::Sequence(
                    list.into_iter()
                        .map(|item| match item {
                            Value::Number(n) => Value::String(n.to_string()),
                            other => other,
                        })
                        .collect(),
                )),
                (_, list) => list,
            }
        }
    };
    let coerced = coerced.ok_or_else(|| wrong(&value))?;
    if let (Some(allowed), Value::String(s)) = (kind.choices(), &coerced) {
        if !allowed.contains(&s.as_str()) {
            return Err(ConfigError::NotAChoice {
                key: key.to_string(),
                origin: origin.to_string(),
                value: s.clone(),
                allowed: allowed.iter().map(|a| a.to_string()).collect(),
                suggestion: closest(s, allowed.iter().copied()),
            });
        }
    }
    if matches!(kind, Kind::Texts | Kind::TextLists | Kind::AxisRules) {
        check_structure(key, &coerced).map_err(|_| wrong(&coerced))?;
    }
    Ok(coerced)
}

/// Lists have inner structure that the checks above do not see: put the value into the built-in
/// config and let serde judge it, so an error here can only be this key's.
fn check_structure(key: &str, value: &Value) -> Result<(), serde_yaml::Error> {
    let mut probe = schema().clone();
    probe.insert(Value::from(key), value.clone());
    serde_yaml::from_value::<Config>(Value::Mapping(probe)).map(|_| ())
}

/// A float that is exactly an `i64` (`1000.0`, `1e3`); `None` for fractions, non-finite values
/// and values out of range, which a cast would silently round or saturate.
fn exact_i64(x: f64) -> Option<i64> {
    // 2^63 is the first float past i64::MAX; every float below it in magnitude converts exactly.
    (x.fract() == 0.0 && x.abs() < 9_223_372_036_854_775_808.0).then_some(x as i64)
}

/// MaxText's YAML loader accepts Python's spellings of booleans as well as YAML's.
pub(super) fn parse_bool(s: &str) -> Option<bool> {
    match s.trim() {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

/// Numbers as Python writes them: `150_001`, `1.e-5`.
fn parse_number<T: std::str::FromStr>(s: &str) -> Option<T> {
    s.trim().replace('_', "").parse().ok()
}

/// A command-line list: YAML flow syntax (`[silu, linear]`, `['a','b']`) or, as in MaxText, a bare
/// word meaning a list of one.
pub(super) fn parse_list(s: &str) -> Value {
    match serde_yaml::from_str::<Value>(s) {
        Ok(list @ Value::Sequence(_)) => list,
        _ => Value::Sequence(vec![Value::String(s.trim().to_string())]),
    }
}

/// A value as the user would have written it, for error messages.
pub(crate) fn show(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        // JSON has no infinities or NaN; YAML's spellings are what the user wrote.
        Value::Number(n) if n.as_f64().is_some_and(|x| !x.is_finite()) => match n.as_f64() {
            Some(x) if x.is_nan() => ".nan".into(),
            Some(x) if x > 0.0 => ".inf".into(),
            _ => "-.inf".into(),
        },
        Value::Null => "null".into(),
        other => serde_json::to_string(other).unwrap_or_else(|_| format!("{other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(key: &str, text: &str) -> Result<Value, ConfigError> {
        coerce(key, Value::String(text.into()), "on the command line")
    }

    #[test]
    fn schema_has_every_key_with_its_type() {
        let s = schema();
        assert!(s.get("steps").unwrap().is_i64());
        assert!(s.get("per_device_batch_size").unwrap().is_f64());
        assert!(s.get("scan_layers").unwrap().is_bool());
        assert!(s.get("mesh_axes").unwrap().is_sequence());
        assert!(key_names().any(|k| k == "ici_tensor_sequence_parallelism"));
    }

    #[test]
    fn text_takes_the_type_of_its_key() {
        assert_eq!(cli("scan_layers", "False").unwrap(), Value::Bool(false));
        assert_eq!(cli("steps", "150_001").unwrap(), Value::from(150001));
        assert_eq!(cli("learning_rate", "1.e-5").unwrap(), Value::from(1e-5));
        assert_eq!(cli("per_device_batch_size", "4").unwrap(), Value::from(4.0));
        assert_eq!(cli("run_name", "123").unwrap(), Value::from("123"));
        assert_eq!(
            cli("mlp_activations", "[silu, linear]").unwrap(),
            serde_yaml::from_str::<Value>("[silu, linear]").unwrap()
        );
        assert_eq!(cli("mesh_axes", "fsdp").unwrap(), serde_yaml::from_str::<Value>("[fsdp]").unwrap());
        assert_eq!(cli("prompt", "[1 2, 3]").unwrap(), serde_yaml::from_str::<Value>("['1 2', '3']").unwrap());
    }

    #[test]
    fn yaml_numbers_become_the_key_type() {
        let f = coerce("learning_rate", Value::from(1), "in f.yml").unwrap();
        assert_eq!(f, Value::from(1.0));
        let i = coerce("steps", Value::from(1000.0), "in f.yml").unwrap();
        assert_eq!(i, Value::from(1000));
        assert!(coerce("steps", Value::from(10.5), "in f.yml").is_err());
        assert!(coerce("steps", Value::from(1e30), "in f.yml").is_err(), "no saturating cast");
        for bad in [f64::INFINITY, f64::NEG_INFINITY, f64::NAN] {
            let e = coerce("adam_eps", Value::from(bad), "in f.yml").unwrap_err().to_string();
            assert!(e.contains("`adam_eps`") && e.contains("a finite number"), "{e}");
            assert!(e.contains(".inf`") || e.contains(".nan`"), "{e}");
        }
    }

    #[test]
    fn wrong_types_name_key_expectation_and_value() {
        let e = cli("steps", "many").unwrap_err().to_string();
        assert!(e.contains("`steps`") && e.contains("an integer") && e.contains("`many`"), "{e}");
        let e = cli("learning_rate", "nan").unwrap_err().to_string();
        assert!(e.contains("a finite number"), "{e}");
        let e = cli("logical_axis_rules", "[[embed]]").unwrap_err().to_string();
        assert!(e.contains("logical_axis_rules") && e.contains("rows"), "{e}");
        let e = cli("data_sharding", "[[1, [2]]]").unwrap_err().to_string();
        assert!(e.contains("lists of strings"), "{e}");
    }

    #[test]
    fn maxtext_checkpoint_keys_maxrs_lacks_are_refused_as_not_supported() {
        let e = cli("checkpoint_storage_use_ocdbt", "true").unwrap_err().to_string();
        assert!(e.contains("checkpoint_storage_use_ocdbt") && e.contains("not supported yet"), "{e}");
        assert_eq!(cli("max_num_checkpoints_to_keep", "None").unwrap(), Value::Null);
        assert_eq!(cli("max_num_checkpoints_to_keep", "3").unwrap(), Value::from(3));
        assert!(cli("max_num_checkpoints_to_keep", "three").unwrap_err().to_string().contains("an integer or None"));
    }

    #[test]
    fn choices_are_checked_with_a_suggestion() {
        let e = cli("remat_policy", "ful").unwrap_err().to_string();
        assert!(e.contains("full, minimal, minimal_with_context") && e.contains("did you mean `full`"), "{e}");
        assert!(cli("dtype", "float32").is_ok());
    }
}
