//! MaxText's nested mappings: `lora:` (and `dpo:`) is one key of MaxText's config holding a mapping
//! (`LoRA` in `src/maxtext/configs/types.py` at e591f30), which a file sets as `lora:
//! {enable_lora: true}` and a command line as `lora.enable_lora=true` (OmegaConf's dotted
//! overrides, merged field by field). maxrs declares each field as its own key,
//! `lora.enable_lora`, so a mapping from a file is spread into those keys here, and a later file
//! or the command line overrides one field without resetting the others (as OmegaConf's merge).

use serde_yaml::Value;

use super::error::{quote, ConfigError};
use super::value::show;

/// MaxText's keys whose value is a mapping of fields.
const NESTED: &[&str] = &["lora", "dpo"];

/// `(key, value)` as maxrs's keys: a nested mapping's fields each as `<key>.<field>`, any other
/// key as it is. A nested key's value must be a mapping (from the command line, its YAML text).
pub fn spread(key: String, value: Value, origin: &str) -> Result<Vec<(String, Value)>, ConfigError> {
    if !NESTED.contains(&key.as_str()) {
        return Ok(vec![(key, value)]);
    }
    let value = match value {
        Value::String(text) => serde_yaml::from_str(&text).unwrap_or(Value::String(text)),
        other => other,
    };
    let Value::Mapping(fields) = value else {
        return Err(ConfigError::invalid(
            &key,
            format!(
                "{origin} is {}: it is a mapping of fields, given as {key}: {{field: value}} in a file or {key}.<field>=value on the command line",
                quote(&show(&value))
            ),
        ));
    };
    fields
        .into_iter()
        .map(|(field, value)| match field.as_str() {
            Some(field) => Ok((format!("{key}.{field}"), value)),
            None => {
                Err(ConfigError::invalid(&key, format!("{origin}: field {} is not a string", quote(&show(&field)))))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nested_mapping_spreads_into_its_fields() {
        let value: Value = serde_yaml::from_str("{enable_lora: true, lora_rank: 4}").unwrap();
        let fields = spread("lora".into(), value, "in f.yml").unwrap();
        assert_eq!(fields[0], ("lora.enable_lora".to_string(), Value::Bool(true)));
        assert_eq!(fields[1].0, "lora.lora_rank");
        let text = spread("lora".into(), Value::String("{lora_alpha: 8}".into()), "on the command line").unwrap();
        assert_eq!(text[0].0, "lora.lora_alpha");
        let err = spread("lora".into(), Value::Bool(true), "on the command line").unwrap_err().to_string();
        assert!(err.contains("lora.<field>=value"), "{err}");
        assert_eq!(spread("steps".into(), Value::Bool(true), "x").unwrap().len(), 1);
    }
}
