//! Every numeric key is range-checked before anything is traced: each key of `Config` that holds
//! a number must declare a range in the key registry (a new key without one fails here), and
//! the values users get wrong (0, -1, 1e30, nan, .inf, a word) are either in the key's range or
//! refused with one line that names the key, from the command line and from a YAML file alike.

use maxrs::config::{self, ConfigError};

/// The keys whose built-in default is a number.
fn numeric_keys() -> Vec<String> {
    let c = config::load(None, &[]).unwrap();
    let values = serde_json::to_value(&c).unwrap();
    config::key_names().filter(|k| values[*k].is_number()).map(String::from).collect()
}

/// Loads `key` set to `text` (on the command line, or in a config file) and runs the checks that
/// need no devices, then those for one device.
fn outcome(key: &str, text: &str, in_file: bool, dir: &std::path::Path) -> Result<config::Config, ConfigError> {
    let c = if in_file {
        let path = dir.join(format!("{key}.yml"));
        std::fs::write(&path, format!("{key}: {text}\n")).unwrap();
        config::load(Some(&path), &[])?
    } else {
        config::load(None, &[format!("{key}={text}")])?
    };
    config::check(&c)?;
    config::validate(&c, 1, 1)?;
    Ok(c)
}

#[test]
fn every_numeric_key_has_a_range() {
    let keys = numeric_keys();
    let missing: Vec<&String> = keys.iter().filter(|k| config::range(k).is_none()).collect();
    assert!(missing.is_empty(), "numeric keys without a range in config::registry: {missing:?}");
    for key in config::registry::keys().iter().filter(|k| k.range.is_some()) {
        let optional = key.kind == config::registry::Kind::IntOrNone;
        assert!(
            optional || keys.iter().any(|k| k == key.name),
            "the registry gives `{}` a range, but it is not a numeric key of Config",
            key.name
        );
    }
}

#[test]
fn bad_numbers_get_one_line_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    for key in numeric_keys() {
        let range = config::range(&key).unwrap();
        for text in ["0", "-1", "1e30", "-1e30", "nan", ".nan", ".inf", "-.inf", "inf", "twelve"] {
            for in_file in [false, true] {
                let place = if in_file { "in a file" } else { "on the command line" };
                match outcome(&key, text, in_file, dir.path()) {
                    Err(e) => {
                        let line = e.to_string();
                        assert!(!line.contains('\n'), "{key}={text} {place}: more than one line: {line}");
                        assert!(line.contains(&key), "{key}={text} {place}: the error does not name the key: {line}");
                    }
                    Ok(c) => {
                        let value = serde_json::to_value(&c).unwrap()[&key].as_f64().unwrap();
                        assert!(range.contains(value), "{key}={text} {place} accepted outside {range}");
                        assert!(
                            ["0", "-1"].contains(&text),
                            "{key}={text} {place} must be refused (only 0 or -1 can be in a range)"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn sizes_that_crashed_or_panicked_are_refused_by_key() {
    let cases: &[(&[&str], &str)] = &[
        (&["head_dim=3"], "head_dim=3; rotary embeddings"),
        (&["vocab_size=3000000000"], "vocab_size=3000000000; it must be an integer in [2, 2147483647]"),
        (&["per_device_batch_size=1e30"], "per_device_batch_size=1e+30; it must be a number in (0, 16777216]"),
        (&["per_device_batch_size=1e12"], "per_device_batch_size=1000000000000"),
        (&["cpu_device_count=100000"], "cpu_device_count=100000; it must be an integer in [1, 1024]"),
        (&["init_weights_seed=-1"], "init_weights_seed"),
        (
            &["per_device_batch_size=16777216", "max_target_length=1048576", "vocab_size=1000000"],
            "per_device_batch_size, max_target_length, vocab_size: the logits",
        ),
    ];
    for (list, expected) in cases {
        let args: Vec<String> = list.iter().map(|s| s.to_string()).collect();
        let e = config::load(None, &args).and_then(|c| config::check(&c).and(config::validate(&c, 1, 1).map(|_| ())));
        let e = e.expect_err(&format!("{list:?} must be refused")).to_string();
        assert!(e.contains(expected), "{list:?}: {e}");
    }
}

#[test]
fn a_batch_or_model_the_machine_cannot_hold_is_refused() {
    let c = config::load(None, &["per_device_batch_size=1000000".to_string()]).unwrap();
    let d = config::validate(&c, 1, 1).unwrap();
    let params = |c: &config::Config| maxrs::model::Model::from_config(c).unwrap().num_params();
    let e = config::check_host_memory(&c, &d, params(&c), 1 << 30, true).unwrap_err().to_string();
    assert!(e.contains("per_device_batch_size") && e.contains("GiB"), "{e}");
    let c = config::load(None, &["model_name=llama2-70b".to_string(), "per_device_batch_size=1".to_string()]).unwrap();
    let d = config::validate(&c, 1, 1).unwrap();
    let e = config::check_host_memory(&c, &d, params(&c), 24 << 30, true).unwrap_err().to_string();
    assert!(e.contains("model size") && e.contains("68.98B parameters"), "{e}");
    assert!(config::check_host_memory(&c, &d, params(&c), 24 << 30, false).is_ok(), "GPU devices hold their own state");
}
