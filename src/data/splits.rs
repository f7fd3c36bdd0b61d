//! Which files of a dataset make a split, as the Hugging Face `datasets` library picks them for
//! `load_dataset(path, name=, data_dir=, data_files=, split=)` (huggingface/datasets
//! `src/datasets/load.py`, `data_files.py`, `utils/metadata.py` at b7cb10b): MaxText's hf pipeline
//! hands `hf_path`, `hf_name`, `hf_data_dir`, `hf_train_files` / `hf_eval_files` and
//! `train_split` / `hf_eval_split` to that call (`input_pipeline/hf_data_processing.py` at MaxText
//! e591f30). Pure: it works on a listing of relative paths (a Hub repo's, or a local folder's).
//!
//! - `data_files` given: its one pattern is the split `train` (a string in `sanitize_patterns`).
//! - else the README's YAML `configs:` (unless `data_dir` is set): the config `name`, or the
//!   default one (the only one, the one named `default`, or the one with `default: true`); its
//!   `data_files` (a pattern, a list, `{split: pattern}` or `[{split, path}]`), or the default
//!   patterns under its `data_dir`.
//! - else the default patterns under `data_dir` (or the root): sharded `data/{split}-NNNNN-of-NNNNN*`
//!   names, then split names in folder names, then in file names (train/training,
//!   validation/valid/dev/val, test/testing/eval/evaluation), then every file as `train`.
//!
//! Patterns are fsspec globs (`*` stays within a folder, `**` crosses folders); hidden files,
//! `__special__` folders, the card files (README.md, ...) and files of no data extension are
//! skipped unless named, as `resolve_pattern` does. The builder is the most common extension's
//! (`.parquet` first on a tie), `infer_module_for_data_files_list`.

use std::collections::BTreeMap;

use super::documents::Format;

/// The split patterns of one dataset config, in the library's order.
type SplitPatterns = Vec<(String, Vec<String>)>;

/// What a `load_dataset` call asks for.
#[derive(Clone, Debug, Default)]
pub struct Request<'a> {
    /// `hf_name` ('' for the default config).
    pub name: &'a str,
    /// `hf_data_dir` ('' for none).
    pub data_dir: &'a str,
    /// `hf_train_files` / `hf_eval_files` inside the dataset ('' for none).
    pub data_files: &'a str,
    /// `train_split` / `hf_eval_split`.
    pub split: &'a str,
}

/// The files of the requested split (relative paths, in the library's order) and their format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chosen {
    pub files: Vec<String>,
    pub format: Format,
}

/// Picks the files of `request.split` among `files` (every file of the dataset, relative, `/`
/// separated); `readme` is the dataset card's text, if any. Errors say what exists.
pub fn choose(files: &[String], readme: Option<&str>, request: &Request) -> Result<Chosen, String> {
    let data_dir = request.data_dir.trim_matches('/');
    let splits = if !request.data_files.is_empty() {
        vec![("train".to_string(), vec![join(data_dir, request.data_files)])]
    } else {
        let configs = match readme {
            Some(text) => configs(text)?,
            None => Vec::new(),
        };
        let config = pick_config(&configs, request.name)?;
        match config {
            Some(config) if data_dir.is_empty() => match &config.data_files {
                Some(patterns) => patterns.clone(),
                None => default_patterns(files, config.data_dir.trim_matches('/'))
                    .ok_or_else(|| format!("config '{}' finds no data files under data_dir", config.name))?,
            },
            _ => default_patterns(files, data_dir).ok_or_else(|| match data_dir {
                "" => "no data files (.parquet, .jsonl, .json, .csv, .txt, .arrow, ...)".to_string(),
                dir => format!("no data files under hf_data_dir={dir}"),
            })?,
        }
    };
    let resolved: Vec<(String, Vec<String>)> =
        splits.iter().map(|(split, patterns)| (split.clone(), resolve_all(patterns, files))).collect();
    let names = resolved.iter().map(|(s, _)| s.as_str()).collect::<Vec<_>>().join(", ");
    let Some((_, chosen)) = resolved.iter().find(|(s, _)| s == request.split) else {
        return Err(format!("no split '{}'; the splits are {names}", request.split));
    };
    if chosen.is_empty() {
        let patterns = &splits.iter().find(|(s, _)| s == request.split).expect("found above").1;
        return Err(format!("split '{}' matches no data file (patterns {})", request.split, patterns.join(", ")));
    }
    // One builder for all splits, as infer_module_for_data_files requires.
    let mut builders = resolved.iter().filter(|(_, f)| !f.is_empty()).map(|(s, f)| (s, builder_of(f)));
    let (_, format) = builders.next().expect("the chosen split has files");
    let format = format?;
    if let Some((split, other)) = builders.find(|(_, b)| b.as_ref().ok() != Some(&format)) {
        return Err(format!(
            "the splits hold different file formats ({format:?} and, in split '{split}', {}); the library refuses \
             such a dataset",
            other.map(|f| format!("{f:?}")).unwrap_or_else(|e| e)
        ));
    }
    Ok(Chosen { files: chosen.clone(), format })
}

fn join(dir: &str, pattern: &str) -> String {
    match dir {
        "" => pattern.trim_start_matches("./").to_string(),
        dir => format!("{dir}/{}", pattern.trim_start_matches("./")),
    }
}

/// One entry of the card's `configs:`.
#[derive(Clone, Debug)]
struct Config {
    name: String,
    default: bool,
    data_dir: String,
    data_files: Option<SplitPatterns>,
}

/// The card's YAML header (between the first two `---` lines) and its `configs:`.
fn configs(readme: &str) -> Result<Vec<Config>, String> {
    let mut lines = readme.lines();
    if lines.next().map(str::trim_end) != Some("---") {
        return Ok(Vec::new());
    }
    let yaml: Vec<&str> = lines.take_while(|l| l.trim_end() != "---").collect();
    let header: serde_yaml::Value =
        serde_yaml::from_str(&yaml.join("\n")).map_err(|e| format!("README.md's YAML header: {e}"))?;
    let Some(list) = header.get("configs") else { return Ok(Vec::new()) };
    let bad = |what: &str| format!("README.md's `configs:` {what}");
    let list = list.as_sequence().ok_or_else(|| bad("is not a list"))?;
    list.iter()
        .map(|entry| {
            let text = |key: &str| entry.get(key).and_then(|v| v.as_str()).map(str::to_string);
            let name = text("config_name").unwrap_or_else(|| "default".into());
            let data_files =
                entry.get("data_files").map(|v| split_patterns(v).ok_or_else(|| bad("data_files"))).transpose()?;
            Ok(Config {
                default: entry.get("default").and_then(|v| v.as_bool()).unwrap_or(false),
                data_dir: text("data_dir").unwrap_or_default(),
                name,
                data_files,
            })
        })
        .collect()
}

/// `data_files` of a config as `sanitize_patterns` reads it.
fn split_patterns(value: &serde_yaml::Value) -> Option<SplitPatterns> {
    let strings = |v: &serde_yaml::Value| match v {
        serde_yaml::Value::String(s) => Some(vec![s.clone()]),
        serde_yaml::Value::Sequence(items) => items.iter().map(|i| i.as_str().map(str::to_string)).collect(),
        _ => None,
    };
    match value {
        serde_yaml::Value::Mapping(map) => {
            map.iter().map(|(k, v)| Some((k.as_str()?.to_string(), strings(v)?))).collect()
        }
        serde_yaml::Value::Sequence(items) if items.iter().any(|i| i.is_mapping()) => {
            items.iter().map(|i| Some((i.get("split")?.as_str()?.to_string(), strings(i.get("path")?)?))).collect()
        }
        other => Some(vec![("train".into(), strings(other)?)]),
    }
}

/// The config `name` asks for ('': the default one); `None` when the card has no configs.
fn pick_config<'c>(configs: &'c [Config], name: &str) -> Result<Option<&'c Config>, String> {
    let names = || configs.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ");
    if configs.is_empty() {
        // The library builds one config named `default`.
        return match name {
            "" | "default" => Ok(None),
            other => Err(format!("hf_name={other}: no such config; the dataset has one, default")),
        };
    }
    if !name.is_empty() {
        return configs
            .iter()
            .find(|c| c.name == name)
            .map(Some)
            .ok_or_else(|| format!("hf_name={name}: no such config; the configs are {}", names()));
    }
    let defaults: Vec<&Config> =
        configs.iter().filter(|c| configs.len() == 1 || c.name == "default" || c.default).collect();
    match defaults.as_slice() {
        [one] => Ok(Some(one)),
        [] => {
            Err(format!("the dataset has several configs and none is the default; set hf_name to one of {}", names()))
        }
        [a, b, ..] => {
            Err(format!("the dataset has several default configs ('{}' and '{}'); set hf_name", a.name, b.name))
        }
    }
}

const SPLIT_KEYWORDS: [(&str, &[&str]); 3] = [
    ("train", &["train", "training"]),
    ("validation", &["validation", "valid", "dev", "val"]),
    ("test", &["test", "testing", "eval", "evaluation"]),
];
const SEP: &str = "[-._ 0-9]";
const SHARD: &str = "-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9]*.*";

/// `get_data_patterns` under `dir`: the first family of default patterns that matches a file.
fn default_patterns(files: &[String], dir: &str) -> Option<SplitPatterns> {
    let matches = |pattern: &str| !resolve(pattern, files).is_empty();
    // Sharded names: data/{split}-00000-of-00001.parquet.
    let sharded = join(dir, &format!("data/*{SHARD}"));
    let shards = resolve(&sharded, files);
    if !shards.is_empty() {
        let mut splits: Vec<String> = shards
            .iter()
            .filter_map(|f| {
                let base = f.rsplit('/').next()?;
                let at = base.char_indices().find(|&(i, _)| is_shard_suffix(&base[i..]))?.0;
                Some(base[..at].to_string())
            })
            .collect();
        splits.sort();
        splits.dedup();
        let rank = |s: &String| SPLIT_KEYWORDS.iter().position(|(k, _)| k == s).unwrap_or(3);
        splits.sort_by_key(|s| (rank(s), s.clone()));
        return Some(splits.into_iter().map(|s| (s.clone(), vec![join(dir, &format!("data/{s}{SHARD}"))])).collect());
    }
    let logs = vec![("logs".to_string(), vec![join(dir, "**/*.eval")])];
    let in_dir_name = keyword_patterns(dir, &["**/{k}/**", "**/{k}{s}*/**", "**/*{s}{k}/**", "**/*{s}{k}{s}*/**"]);
    let in_file_name = keyword_patterns(dir, &["**/{k}{s}*", "**/*{s}{k}{s}*"]);
    let all = vec![("train".to_string(), vec![join(dir, "**")])];
    for family in [logs, in_dir_name, in_file_name, all] {
        let found: SplitPatterns =
            family.into_iter().filter(|(_, patterns)| patterns.iter().any(|p| matches(p))).collect();
        if !found.is_empty() {
            return Some(found);
        }
    }
    None
}

/// Whether `rest` is `-NNNNN-of-NNNNN` followed by anything with a dot.
fn is_shard_suffix(rest: &str) -> bool {
    let b = rest.as_bytes();
    let digits = |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    b.len() > 15 && b[0] == b'-' && digits(1..6) && &b[6..10] == b"-of-" && digits(10..15) && rest[15..].contains('.')
}

fn keyword_patterns(dir: &str, templates: &[&str]) -> SplitPatterns {
    SPLIT_KEYWORDS
        .iter()
        .map(|(split, keywords)| {
            let patterns = keywords
                .iter()
                .flat_map(|k| templates.iter().map(move |t| join(dir, &t.replace("{k}", k).replace("{s}", SEP))))
                .collect();
            (split.to_string(), patterns)
        })
        .collect()
}

/// The files of all `patterns`, in pattern order, each once.
fn resolve_all(patterns: &[String], files: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for pattern in patterns {
        for file in resolve(pattern, files) {
            if !out.contains(&file) {
                out.push(file);
            }
        }
    }
    out
}

/// Card and metadata files the library never reads as data (`FILES_TO_IGNORE`).
const FILES_TO_IGNORE: [&str; 6] =
    ["README.md", "config.json", "dataset_info.json", "dataset_infos.json", "dummy_data.zip", "dataset_dict.json"];

/// Extensions the library reads data from (`_EXTENSION_TO_MODULE`, with the folder builders'
/// media); other files (a LICENSE, a script) are skipped.
const DATA_EXTENSIONS: &[&str] = &[
    "csv",
    "tsv",
    "json",
    "jsonl",
    "ndjson",
    "parquet",
    "geoparquet",
    "gpq",
    "arrow",
    "txt",
    "conll",
    "conllu",
    "tar",
    "xml",
    "hdf5",
    "h5",
    "eval",
    "lance",
    "tsfile",
    "zip",
    "png",
    "jpg",
    "jpeg",
    "gif",
    "bmp",
    "tif",
    "tiff",
    "webp",
    "wav",
    "mp3",
    "flac",
    "ogg",
    "opus",
    "m4a",
    "mp4",
    "avi",
    "mkv",
    "mov",
    "webm",
    "pdf",
    "nii",
];

/// `resolve_pattern`: the files matching `pattern`, sorted.
fn resolve(pattern: &str, files: &[String]) -> Vec<String> {
    let Ok(matcher) = glob::Pattern::new(pattern) else { return Vec::new() };
    let options = glob::MatchOptions { require_literal_separator: true, ..Default::default() };
    let pattern_base = pattern.rsplit('/').next().unwrap_or(pattern);
    let hidden = |path: &str| path.split('/').filter(|p| p.starts_with('.') && p.chars().any(|c| c != '.')).count();
    let special = |path: &str| {
        let parent = path.rsplit_once('/').map_or("", |(p, _)| p);
        parent.split('/').filter(|p| p.starts_with("__")).count()
    };
    let mut out: Vec<String> = files
        .iter()
        .filter(|f| matcher.matches_with(f, options))
        .filter(|f| {
            let base = f.rsplit('/').next().unwrap_or(f);
            let ignored = FILES_TO_IGNORE.contains(&base) && base != pattern_base;
            let data = base.split('.').skip(1).any(|ext| DATA_EXTENSIONS.contains(&ext.to_ascii_lowercase().as_str()));
            !ignored && data && hidden(f) == hidden(pattern) && special(f) == special(pattern)
        })
        .cloned()
        .collect();
    out.sort();
    out
}

/// The builder of `files`: their most common extension's, `.parquet` first on a tie, then
/// `.arrow`, `.jsonl`, `.json`, `.csv` (`infer_module_for_data_files_list`).
fn builder_of(files: &[String]) -> Result<Format, String> {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for file in files {
        let base = file.rsplit('/').next().unwrap_or(file);
        for ext in base.split('.').skip(1) {
            *counts.entry(ext.to_ascii_lowercase()).or_default() += 1;
        }
    }
    let favourite = |e: &str| ["csv", "json", "jsonl", "arrow", "lance", "parquet"].iter().position(|f| *f == e);
    let mut ranked: Vec<(&String, &usize)> = counts.iter().collect();
    ranked.sort_by(|a, b| (b.1, favourite(b.0), b.0).cmp(&(a.1, favourite(a.0), a.0)));
    for (ext, _) in ranked {
        let format = match ext.as_str() {
            "parquet" | "geoparquet" | "gpq" => Format::Parquet,
            "json" | "jsonl" | "ndjson" => Format::Json,
            "csv" => Format::Csv { tab: false },
            "tsv" => Format::Csv { tab: true },
            "txt" => Format::Lines,
            "arrow" => Format::Arrow,
            e if DATA_EXTENSIONS.contains(&e) => {
                return Err(format!(".{e} files (not supported yet: maxrs reads parquet, json, csv, text and arrow)"))
            }
            _ => continue,
        };
        return Ok(format);
    }
    Err("no files of a known format".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn pick(list: &[&str], readme: Option<&str>, split: &str) -> Result<Chosen, String> {
        choose(&files(list), readme, &Request { split, ..Default::default() })
    }

    #[test]
    fn sharded_names_give_the_splits() {
        let repo = [
            "README.md",
            "data/train-00000-of-00002.parquet",
            "data/train-00001-of-00002.parquet",
            "data/test_sft-00000-of-00001.parquet",
            ".gitattributes",
        ];
        let c = pick(&repo, None, "train").unwrap();
        assert_eq!(c.files, ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"]);
        assert_eq!(c.format, Format::Parquet);
        assert_eq!(pick(&repo, None, "test_sft").unwrap().files, ["data/test_sft-00000-of-00001.parquet"]);
        let e = pick(&repo, None, "trian").unwrap_err();
        assert_eq!(e, "no split 'trian'; the splits are train, test_sft");
    }

    #[test]
    fn keywords_in_folder_then_file_names_then_everything() {
        let dirs = ["train/a.jsonl", "train/b.jsonl", "dev/c.jsonl", "notes.md"];
        assert_eq!(pick(&dirs, None, "validation").unwrap().files, ["dev/c.jsonl"]);
        assert_eq!(pick(&dirs, None, "train").unwrap().format, Format::Json);
        let names = ["my_train.csv", "my-test.csv"];
        assert_eq!(pick(&names, None, "test").unwrap().files, ["my-test.csv"]);
        assert_eq!(pick(&names, None, "train").unwrap().format, Format::Csv { tab: false });
        // "constrained" holds "train" but not between separators: everything is train.
        let plain = ["a/constrained.txt", "b.txt", ".hidden/c.txt", "__pycache__/d.txt"];
        assert_eq!(pick(&plain, None, "train").unwrap().files, ["a/constrained.txt", "b.txt"]);
        assert_eq!(pick(&plain, None, "train").unwrap().format, Format::Lines);
    }

    #[test]
    fn the_card_configs_decide() {
        let card = "---\nlicense: mit\nconfigs:\n- config_name: default\n  data_files:\n  - split: train_sft\n    path: \
                    sft/train-*\n  - split: test_sft\n    path: sft/test-*\n- config_name: raw\n  data_files: raw/*.jsonl\n---\n# Card\n";
        let repo = ["sft/train-0.parquet", "sft/train-1.parquet", "sft/test-0.parquet", "raw/x.jsonl"];
        let c = pick(&repo, Some(card), "train_sft").unwrap();
        assert_eq!(c.files, ["sft/train-0.parquet", "sft/train-1.parquet"]);
        let e = pick(&repo, Some(card), "train").unwrap_err();
        assert_eq!(e, "no split 'train'; the splits are train_sft, test_sft");
        let raw = choose(&files(&repo), Some(card), &Request { name: "raw", split: "train", ..Default::default() });
        assert_eq!(raw.unwrap(), Chosen { files: vec!["raw/x.jsonl".into()], format: Format::Json });
        let e = choose(&files(&repo), Some(card), &Request { name: "nope", split: "train", ..Default::default() });
        assert_eq!(e.unwrap_err(), "hf_name=nope: no such config; the configs are default, raw");
        // data_dir overrides the configs' files: default patterns under it.
        let d = choose(&files(&repo), Some(card), &Request { data_dir: "raw", split: "train", ..Default::default() });
        assert_eq!(d.unwrap().files, ["raw/x.jsonl"]);
    }

    #[test]
    fn data_files_are_the_train_split() {
        let repo = ["x/a.json", "x/b.json", "y/c.json"];
        let r = Request { data_files: "x/*.json", split: "train", ..Default::default() };
        assert_eq!(choose(&files(&repo), None, &r).unwrap().files, ["x/a.json", "x/b.json"]);
        let r = Request { data_files: "x/*.json", split: "test", ..Default::default() };
        assert_eq!(choose(&files(&repo), None, &r).unwrap_err(), "no split 'test'; the splits are train");
    }

    #[test]
    fn the_most_common_extension_wins_parquet_on_a_tie() {
        assert_eq!(builder_of(&files(&["a.jsonl", "b.parquet"])).unwrap(), Format::Parquet);
        assert_eq!(builder_of(&files(&["a.jsonl", "b.jsonl", "c.parquet"])).unwrap(), Format::Json);
        assert_eq!(builder_of(&files(&["a.tsv"])).unwrap(), Format::Csv { tab: true });
        assert!(builder_of(&files(&["a.png"])).unwrap_err().contains(".png files (not supported yet"));
    }
}
