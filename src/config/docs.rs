//! The texts generated from the key registry: `configs/base.yml` ([`base_yml`], which is also the
//! built-in defaults every run starts from) and the book's key reference (`docs/src/reference/keys.md`).
//! The files in the repository are kept for MaxText users who pass `configs/base.yml` on the command
//! line and for readers; a test fails when either differs from what the declarations in `keys.rs`
//! generate, and [`REGENERATE`] rewrites both.

use serde_yaml::Value;

use super::registry::{self, Key, Kind, Origin};

/// The command that rewrites `configs/base.yml` and the book's key tables from the declarations.
pub const REGENERATE: &str = "MAXRS_WRITE_CONFIG_DOCS=1 cargo test --lib config::docs";

/// Comment lines are wrapped to this width.
const WIDTH: usize = 100;

/// `configs/base.yml`: every key with its default, grouped by section, with its meaning and
/// notes as comments.
pub fn base_yml() -> String {
    let mut out = format!(
        "# maxrs base configuration: MaxText's key names and defaults for what maxrs supports\n\
         # ({}), and maxrs's own keys (marked \"maxrs:\").\n\
         # Generated from the key declarations in src/config/keys.rs: edit those, then run\n\
         # `{REGENERATE}`.\n\
         #\n\
         # Precedence, lowest first (docs/src/reference/configuration.md): the built-in copy of this\n\
         # file, your config file, models/<model_name>.yml, key=value on the command line. As in\n\
         # MaxText, a key the model file sets may only be changed on the command line with\n\
         # override_model_config=true. The tiny \"default\" model is the exception: its file holds\n\
         # defaults (the model and quick-start run settings) that your config file and key=value\n\
         # override.\n",
        registry::MAXTEXT_BASE_YML.replace('@', " at MaxText main ")
    );
    for section in registry::sections() {
        out.push('\n');
        let intro: Vec<&str> = section.doc().collect();
        comment(&mut out, section.title, &intro);
        for key in registry::keys().iter().filter(|k| k.section == section.title) {
            write_key(&mut out, key);
        }
    }
    out
}

/// One key: `name: default # meaning`, or the meaning and notes above it when they do not fit.
fn write_key(out: &mut String, key: &Key) {
    let marker = if key.origin == Origin::Maxrs { "maxrs: " } else { "" };
    let meaning = format!("{marker}{}", key.meaning());
    let value = yaml_value(key);
    let notes: Vec<&str> = key.notes().collect();
    let inline = format!("{}: {value} # {meaning}", key.name);
    if notes.is_empty() && !inline.contains('\n') && inline.len() <= WIDTH {
        out.push_str(&inline);
    } else {
        comment(out, &meaning, &notes);
        out.push_str(&format!("{}: {value}", key.name));
    }
    out.push('\n');
}

/// `first` wrapped to [`WIDTH`], then `more` as they are, as `# ` comment lines.
fn comment(out: &mut String, first: &str, more: &[&str]) {
    let mut line = String::from("#");
    for word in first.split_whitespace() {
        if line.len() + 1 + word.len() > WIDTH && line.len() > 1 {
            out.push_str(&line);
            out.push('\n');
            line = String::from("#");
        }
        line.push(' ');
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
    for text in more {
        out.push_str(&format!("# {text}\n").replace("# \n", "#\n"));
    }
}

/// The key's default as YAML: scalars as declared, lists in flow style (a long list of lists one
/// row per line).
fn yaml_value(key: &Key) -> String {
    if !matches!(key.kind, Kind::Texts | Kind::TextLists | Kind::AxisRules) {
        return key.default.to_string();
    }
    let Ok(Value::Sequence(items)) = serde_yaml::from_str::<Value>(key.default) else {
        panic!("the default of {} is not a YAML list: {}", key.name, key.default)
    };
    let one_line = flow(&Value::Sequence(items.clone()));
    if one_line.len() <= WIDTH || items.len() < 2 || !items.iter().all(Value::is_sequence) {
        return one_line;
    }
    let rows: Vec<String> = items.iter().map(|item| format!("    {},\n", flow(item))).collect();
    format!("[\n{}  ]", rows.concat())
}

/// A YAML value in flow style, strings double-quoted.
fn flow(value: &Value) -> String {
    match value {
        Value::Sequence(items) => format!("[{}]", items.iter().map(flow).collect::<Vec<_>>().join(", ")),
        Value::String(s) => serde_json::to_string(s).unwrap_or_default(),
        other => super::value::show(other),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::refused::REFUSED;
    use crate::config::registry::{Access, Families, Role};

    const BEGIN: &str = "<!-- BEGIN config keys: generated from src/config/keys.rs -->";
    const END: &str = "<!-- END config keys -->";
    /// The book's page that holds the generated tables between [`BEGIN`] and [`END`].
    const KEYS_PAGE: &str = "docs/src/reference/keys.md";

    /// The key reference's tables: one per section, then the MaxText keys maxrs refuses by name.
    fn key_tables() -> String {
        let mut out = format!(
            "{BEGIN}\n\nSource: \"MaxText\" is a key of MaxText's `{}`, \"maxrs\" is maxrs's own.\n\
             Role: \"model shape\" keys are read by the model of the families named, compiled into every\n\
             step and recorded in a checkpoint, which a run must match; \"step\" keys are compiled into\n\
             the train step and checked against an AOT artifact; \"program\" keys shape the compiled\n\
             programs otherwise; \"path\" keys name what a command reads or writes; \"run\" keys steer\n\
             the run only; \"model file\" keys may be set by `models/<name>.yml`.\n",
            registry::MAXTEXT_BASE_YML
        );
        for section in registry::sections() {
            out.push_str(&format!(
                "\n**{}**\n\n| key | type | default | values | role | source | meaning |\n|---|---|---|---|---|---|---|\n",
                section.title
            ));
            for key in registry::keys().iter().filter(|k| k.section == section.title) {
                let default = yaml_value(key);
                let default =
                    if default.len() > 40 { "see `configs/base.yml`".to_string() } else { format!("`{default}`") };
                let cells = [
                    format!("`{}`", key.name),
                    type_name(key.kind).to_string(),
                    default,
                    values(key),
                    role(key),
                    if key.origin == Origin::MaxText { "MaxText" } else { "maxrs" }.to_string(),
                    key.meaning().to_string(),
                ];
                out.push_str(&format!("| {} |\n", cells.map(|c| c.replace('|', "\\|")).join(" | ")));
            }
        }
        out.push_str(
            "\n**MaxText keys maxrs refuses by name** (\"not supported yet\", with the reason)\n\n| keys | reason |\n|---|---|\n",
        );
        for refusal in REFUSED {
            let keys: Vec<String> = refusal.keys.iter().map(|k| format!("`{k}`")).collect();
            out.push_str(&format!("| {} | {} |\n", keys.join(", "), refusal.reason.replace('|', "\\|")));
        }
        out.push_str(&format!("\n{END}"));
        out
    }

    fn type_name(kind: Kind) -> &'static str {
        match kind {
            Kind::Bool => "bool",
            Kind::Int => "int",
            Kind::Float => "float",
            Kind::Text | Kind::Choice(_) => "string",
            Kind::IntOrNone => "int or None",
            Kind::Texts => "list of strings",
            Kind::TextLists => "list of lists of strings",
            Kind::AxisRules => "rules",
        }
    }

    fn values(key: &Key) -> String {
        match (key.kind.choices(), key.range) {
            (Some(choices), _) => choices
                .iter()
                .map(|c| if c.is_empty() { "`\"\"`".into() } else { format!("`{c}`") })
                .collect::<Vec<_>>()
                .join(", "),
            (None, Some(range)) if key.kind == Kind::IntOrNone => format!("{range}, or None"),
            (None, Some(range)) => range.to_string(),
            (None, None) => String::new(),
        }
    }

    fn role(key: &Key) -> String {
        let families = match key.families {
            Families::None => String::new(),
            Families::All => " (all families)".to_string(),
            Families::Only(blocks) => {
                format!(" ({})", blocks.iter().map(|b| b.as_str()).collect::<Vec<_>>().join(", "))
            }
        };
        let access = |a: Access| match a {
            Access::Reads => "reads",
            Access::Writes => "writes",
            Access::Ignores => "ignores",
        };
        let role = match (key.role, key.path) {
            (Role::Model, _) => format!("model shape{families}"),
            (Role::Step, _) => format!("step{families}"),
            (Role::Program, _) => "program".to_string(),
            (Role::Path, Some(p)) => {
                format!("path: train {}, train-compile {}", access(p.train), access(p.train_compile))
            }
            (Role::Path, None) | (Role::Run, _) => "run".to_string(),
        };
        if key.model_file {
            format!("{role}; model file")
        } else {
            role
        }
    }

    /// The key reference page with its tables replaced by the generated ones.
    fn page_with_tables(page: &str) -> String {
        let (Some(begin), Some(end)) = (page.find(BEGIN), page.find(END)) else {
            panic!("{KEYS_PAGE} has no `{BEGIN}` ... `{END}` markers")
        };
        format!("{}{}{}", &page[..begin], key_tables(), &page[end + END.len()..])
    }

    #[test]
    fn base_yml_and_the_key_reference_are_generated_from_the_declarations() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let (yml_path, page_path) = (root.join("configs/base.yml"), root.join(KEYS_PAGE));
        let page = std::fs::read_to_string(&page_path).unwrap();
        let expected = [(yml_path, base_yml()), (page_path, page_with_tables(&page))];
        let write = std::env::var_os("MAXRS_WRITE_CONFIG_DOCS").is_some();
        for (path, text) in expected {
            if std::fs::read_to_string(&path).unwrap() == text {
                continue;
            }
            if write {
                std::fs::write(&path, text).unwrap();
            } else {
                panic!("{} is out of date with src/config/keys.rs; regenerate it with `{REGENERATE}`", path.display());
            }
        }
    }

    #[test]
    fn the_generated_base_yml_sets_every_key_to_its_default() {
        let yaml: serde_yaml::Mapping = serde_yaml::from_str(&base_yml()).unwrap();
        let names: Vec<&str> = yaml.keys().filter_map(Value::as_str).collect();
        assert_eq!(names, registry::keys().iter().map(|k| k.name).collect::<Vec<_>>());
    }
}
