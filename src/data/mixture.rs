//! Weighted mixtures of text datasets, over maxrs's text sources (local or `gs://` Parquet, JSON
//! Lines, text), written as MaxText writes its grain mixtures (maxtext
//! `src/maxtext/input_pipeline/grain_data_processing.py` `get_datasets`, main e591f30):
//! - `hf_train_files="pattern,weight;pattern,weight;..."`, the syntax of `grain_train_files`: the
//!   weights normalized and rounded to 4 decimals;
//! - `grain_train_mixture_config_path`, a JSON file `{"name": {"path": ..., "weight": ...}}`: the
//!   weights normalized, not rounded, and the components in the order of their sorted names (grain
//!   flattens the dict of datasets with `jax.tree_util`, which sorts keys). A resumed run may
//!   bring another file: each component resumes by name (a new one starts at its beginning, a
//!   removed one is dropped) and the interleaving continues at the saved index with the new
//!   weights, as grain's iterator `set_state` does.
//!
//! As MaxText builds it, each component is its own stream (its files shuffled and split between
//! processes as a single dataset's are, same seed), and each process mixes its own streams
//! document by document, before tokenization and packing, with grain's `IterDataset.mix`
//! (google/grain `grain/_src/python/dataset/transformations/mix.py`, main f5dd0d8):
//! - the normalized weights are scaled so the smallest is 100 and truncated to integers (grain's
//!   `_float_to_int_proportions`);
//! - document `k` of the mixture comes from the component [`select`] gives for `k` (grain's
//!   `_dataset_and_key_of_next_element`): a fixed interleaving in which every prefix holds each
//!   component in proportion, up to rounding;
//! - grain stops the mixture when any component runs out; maxrs repeats each component's epochs
//!   (as it repeats a single dataset's until `steps`), so the mixture never runs out and every
//!   component keeps its share.
//!
//! The position ([`MixtureState`]) is the mixture's document index and each component's own text
//! position: a resumed run re-opens every component where it stood and continues the
//! interleaving at the same index (grain's iterator state: `index` and each parent's state).
//!
//! What a mixture may be: at most [`MAX_COMPONENTS`] datasets, weights finite and positive with
//! a finite sum and at most [`MAX_WEIGHT_RATIO`] between the largest and the smallest (what
//! grain's integer proportions can hold); the mixture file is read whole, so bounded as a config
//! file is (`input::SETTINGS`). Its paths are the user's, as the YAML config's are: absolute, or
//! relative to the working directory, as MaxText's `find_data_files` resolves them
//! (grain_data_processing.py, e591f30: `Path(pattern).expanduser().resolve()`). The components
//! share one pool of tokenizer threads ([`super::text::Pool`]): a mixture of 10,000 datasets
//! runs as many threads as one dataset.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::error::DataError;
use super::packing::Encoded;
use super::storage::read_whole;
use super::text::{CheckedDocs, DocStream, Pool, TextSpec, TextState};
use super::DataState;
use crate::config::Config;
use crate::input;

/// The most datasets a mixture may have. Every dataset holds a window of its documents in memory
/// (its shuffle window), so a mixture this large already needs a large machine; with
/// [`MAX_WEIGHT_RATIO`] it keeps the proportions' sum below 2^64, as [`select`]'s arithmetic
/// needs.
pub const MAX_COMPONENTS: usize = 100_000;

/// The largest ratio between two weights of a mixture. grain scales the weights to integers with
/// the smallest at 100 (`_float_to_int_proportions`), so the largest becomes 100 x this: a
/// dataset weighted 1e-12 of another gets one document in a trillion, and a subnormal weight
/// (1e-310) would make the scale infinite.
pub const MAX_WEIGHT_RATIO: f64 = 1e12;

/// One dataset of a mixture: its file pattern and its weight as written.
#[derive(Clone, Debug, PartialEq)]
pub struct Component {
    pub pattern: String,
    pub weight: f64,
}

/// Where a mixture stands: the next document's index in the interleaving, and each component's
/// next document.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MixtureState {
    pub index: u64,
    pub components: Vec<TextState>,
    /// The components' names (a mixture file's), by which they resume; none for `hf_train_files`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
}

/// A run's mixture: its components (with their names, from a mixture file) and proportions.
#[derive(Clone, Debug, PartialEq)]
pub struct Mixture {
    /// The key the components come from, for errors.
    pub key: &'static str,
    pub components: Vec<Component>,
    /// Empty for `hf_train_files`.
    pub names: Vec<String>,
    pub proportions: Vec<u64>,
}

impl Mixture {
    /// The training mixture `c` configures, if any.
    pub fn of(c: &Config) -> Result<Option<Mixture>, DataError> {
        let key = "grain_train_mixture_config_path";
        let path = &c.grain_train_mixture_config_path;
        if path.is_empty() {
            let Some(components) = parse("hf_train_files", &c.hf_train_files)? else { return Ok(None) };
            let weights: Vec<f64> = components.iter().map(|m| m.weight).collect();
            let proportions = proportions(&weights).expect("parse checked the weights");
            return Ok(Some(Mixture { key: "hf_train_files", components, names: vec![], proportions }));
        }
        let bytes = read_whole(key, path, input::SETTINGS)?;
        let bad = |message: String| DataError::BadMixture { key, value: path.clone(), message };
        // Sorted by name: the order in which grain flattens MaxText's dict of datasets.
        let entries: BTreeMap<String, serde_json::Value> = serde_json::from_slice(&bytes).map_err(|e| {
            bad(format!("not a JSON object of {{\"name\": {{\"path\": \"GLOB\", \"weight\": NUMBER}}}}: {e}"))
        })?;
        if entries.is_empty() {
            return Err(bad("names no dataset".into()));
        }
        let mut components = Vec::new();
        for (name, entry) in &entries {
            let pattern = entry.get("path").and_then(|p| p.as_str()).filter(|p| !p.is_empty());
            let weight = entry.get("weight").and_then(|w| w.as_f64()).filter(|w| w.is_finite() && *w > 0.0);
            match (pattern, weight) {
                (Some(pattern), Some(weight)) => components.push(Component { pattern: pattern.to_string(), weight }),
                _ => {
                    return Err(bad(format!(
                        "dataset {name:?} is {entry}; each needs a \"path\" (a file or glob) and a positive \"weight\""
                    )))
                }
            }
        }
        let names: Vec<String> = entries.into_keys().collect();
        check_weights(&components, |i| format!("dataset {:?}", names[i])).map_err(bad)?;
        let total: f64 = components.iter().map(|m| m.weight).sum();
        let proportions = grain_proportions(&components.iter().map(|m| m.weight / total).collect::<Vec<_>>());
        Ok(Some(Mixture { key, components, names, proportions }))
    }

    /// Where the mixture starts: at the beginning, or at `saved`, the position of the run it
    /// resumes (by name for a mixture file: see the module docs).
    pub fn start_at(&self, saved: Option<MixtureState>) -> Result<MixtureState, DataError> {
        let n = self.components.len();
        let fresh = MixtureState { index: 0, components: vec![TextState::default(); n], names: self.names.clone() };
        let Some(saved) = saved else { return Ok(fresh) };
        let cannot =
            |why: String| DataError::BadState(format!("the saved mixture position cannot resume {}: {why}", self.key));
        match (self.names.is_empty(), saved.names.is_empty()) {
            (true, true) if saved.components.len() == n => Ok(saved),
            (true, true) => Err(cannot(format!("it has {} datasets, this run {n}", saved.components.len()))),
            (false, false) if saved.names.len() == saved.components.len() => {
                let by_name: BTreeMap<&String, &TextState> = saved.names.iter().zip(&saved.components).collect();
                let components = self.names.iter().map(|name| by_name.get(name).map(|s| **s).unwrap_or_default());
                Ok(MixtureState { index: saved.index, components: components.collect(), ..fresh })
            }
            _ => Err(cannot("one of them names its datasets (a mixture file), the other does not".into())),
        }
    }
}

/// The components of `value` (the `hf_train_files` value) when it is a mixture (it has a `;`, as
/// MaxText decides), each `pattern,weight`; `None` for a single pattern.
pub fn parse(key: &'static str, value: &str) -> Result<Option<Vec<Component>>, DataError> {
    if !value.contains(';') {
        return Ok(None);
    }
    let bad = |message: String| DataError::BadMixture { key, value: value.to_string(), message };
    let components = value
        .split(';')
        .map(|part| {
            let (pattern, weight) = part.rsplit_once(',').ok_or_else(|| {
                bad(format!("component {part:?} has no weight; write each as pattern,weight (e.g. a/*.jsonl,0.3)"))
            })?;
            let weight: f64 = weight.trim().parse().map_err(|_| {
                bad(format!("the weight {weight:?} of {pattern:?} is not a number; weights are positive numbers"))
            })?;
            if !(weight.is_finite() && weight > 0.0) {
                return Err(bad(format!("the weight {weight} of {pattern:?} must be a positive number")));
            }
            if pattern.trim().is_empty() {
                return Err(bad(format!("component {part:?} has no file pattern")));
            }
            Ok(Component { pattern: pattern.trim().to_string(), weight })
        })
        .collect::<Result<Vec<_>, _>>()?;
    check_weights(&components, |i| format!("{:?}", components[i].pattern)).map_err(bad)?;
    proportions(&components.iter().map(|c| c.weight).collect::<Vec<_>>()).map_err(bad)?;
    Ok(Some(components))
}

/// Checks what grain's integer proportions need of a mixture's weights (each already finite and
/// positive): at most [`MAX_COMPONENTS`] datasets, a finite sum, and at most [`MAX_WEIGHT_RATIO`]
/// between the largest and the smallest. `name` names component `i` in the message.
fn check_weights(components: &[Component], name: impl Fn(usize) -> String) -> Result<(), String> {
    if components.len() > MAX_COMPONENTS {
        return Err(format!(
            "{} datasets, more than the {MAX_COMPONENTS} a mixture may have; merge some of them into one glob",
            components.len()
        ));
    }
    let sum: f64 = components.iter().map(|c| c.weight).sum();
    if !sum.is_finite() {
        return Err(format!(
            "the weights add up to {sum}, past the largest number; scale them down (only their ratios matter)"
        ));
    }
    let by_weight = |a: &(usize, &Component), b: &(usize, &Component)| a.1.weight.total_cmp(&b.1.weight);
    let (Some((small, smallest)), Some((large, largest))) =
        (components.iter().enumerate().min_by(by_weight), components.iter().enumerate().max_by(by_weight))
    else {
        return Ok(());
    };
    if largest.weight / smallest.weight > MAX_WEIGHT_RATIO {
        return Err(format!(
            "the weight {:?} of {} is less than 1/{MAX_WEIGHT_RATIO:e} of the weight {:?} of {}; weights may differ \
             by at most {MAX_WEIGHT_RATIO:e} times (grain scales them to integers, the smallest to 100): raise it or \
             drop that dataset",
            smallest.weight,
            name(small),
            largest.weight,
            name(large)
        ));
    }
    Ok(())
}

/// The integer proportions of `hf_train_files`' `weights`: MaxText's `round(w / sum(weights),
/// 4)`, then grain's scaling ([`grain_proportions`]). A weight that rounds to 0 is refused, as
/// grain refuses it.
pub fn proportions(weights: &[f64]) -> Result<Vec<u64>, String> {
    let sum: f64 = weights.iter().sum();
    // Rust's `{:.4}` rounds the exact binary value to nearest, ties to even: Python's `round`.
    let rounded: Vec<f64> =
        weights.iter().map(|w| format!("{:.4}", w / sum).parse().expect("a formatted float parses")).collect();
    if let Some(i) = rounded.iter().position(|&p| p == 0.0) {
        return Err(format!(
            "the weight {} is {:.6} of the total, which rounds to 0 at MaxText's 4 decimals; raise it or drop that \
             component",
            weights[i],
            weights[i] / sum
        ));
    }
    Ok(grain_proportions(&rounded))
}

/// grain's `_float_to_int_proportions`: `int(p * (100 / min(p)))` for positive `values`.
pub fn grain_proportions(values: &[f64]) -> Vec<u64> {
    let scale = 100.0 / values.iter().cloned().fold(f64::INFINITY, f64::min);
    values.iter().map(|p| (p * scale) as u64).collect()
}

/// The component of document `k` of the mixture and that document's index in the component:
/// grain's `_dataset_and_key_of_next_element`. Going through the components in order, the
/// documents `0..k` and `0..=k` are split between "this component" and "the rest" in proportion
/// (floor division); the component whose share grows from `k` to `k + 1` provides document `k`.
pub fn select(k: u64, proportions: &[u64]) -> (usize, u64) {
    let mut remaining: u128 = proportions.iter().map(|&p| p as u128).sum();
    let (mut at, mut next) = (k as u128, k as u128 + 1);
    for (i, &p) in proportions.iter().enumerate() {
        let p = p as u128;
        let rest_at = at * (remaining - p) / remaining;
        let rest_next = next * (remaining - p) / remaining;
        let mine_next = next - rest_next;
        if at - rest_at != mine_next {
            return (i, (mine_next - 1) as u64);
        }
        remaining -= p;
        (at, next) = (rest_at, rest_next);
    }
    unreachable!("the last component takes every remaining document (its share is all that remains)")
}

/// A process's mixed document stream: its component streams, read in the interleaving's order.
pub struct MixedDocs {
    components: Vec<CheckedDocs>,
    proportions: Vec<u64>,
    state: MixtureState,
}

impl MixedDocs {
    /// The streams of `specs` (one per component, in order) mixed by `proportions`, from `at`.
    pub fn start(specs: &[TextSpec], proportions: Vec<u64>, at: MixtureState) -> Result<MixedDocs, DataError> {
        if at.components.len() != specs.len() {
            return Err(DataError::BadState(format!(
                "a position of a mixture of {} datasets cannot resume a mixture of {}",
                at.components.len(),
                specs.len()
            )));
        }
        // One pool for all the components: the threads do not grow with their number.
        let pool = Pool::start(specs.first().map_or(1, |spec| spec.workers))?;
        let ahead = pool.ahead(specs.len());
        let components =
            specs.iter().zip(&at.components).map(|(spec, &start)| CheckedDocs::on(&pool, ahead, spec, start)).collect();
        Ok(MixedDocs { components, proportions, state: at })
    }
}

impl DocStream for MixedDocs {
    /// The next document of the interleaving; the stream ends when a component ends (grain's
    /// rule; training components repeat their epochs and never end).
    fn next_doc(&mut self) -> Result<Option<(DataState, DataState, Option<Encoded>)>, DataError> {
        let (component, _) = select(self.state.index, &self.proportions);
        let Some((position, ids)) = self.components[component].next_doc()? else { return Ok(None) };
        let before = DataState::HfMixture(self.state.clone());
        self.state.index += 1;
        self.state.components[component] = TextState { taken: position.taken + 1, ..position };
        Ok(Some((before, DataState::HfMixture(self.state.clone()), ids)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The components of documents `0..n`, with each document's index in its component.
    fn order(proportions: &[u64], n: u64) -> Vec<(usize, u64)> {
        (0..n).map(|k| select(k, proportions)).collect()
    }

    /// grain's recorded mixes (`mix_test.py` `test_getitems_mixing`, google/grain f5dd0d8): the
    /// values of the even numbers 0..10 and the odd ones, each repeating, mixed by the given
    /// proportions (grain scales them as `proportions` does after MaxText's normalization).
    #[test]
    fn the_interleaving_is_grains_recorded_one() {
        let cases: [(&[f64], [u64; 10]); 3] = [
            (&[1.0, 1.0], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]),
            (&[0.75, 0.25], [0, 2, 4, 1, 6, 8, 0, 3, 2, 4]),
            (&[1.0, 2.0], [0, 1, 3, 2, 5, 7, 4, 9, 1, 6]),
        ];
        for (weights, expected) in cases {
            let p = proportions(weights).unwrap();
            let values: Vec<u64> = order(&p, 10).iter().map(|&(c, key)| 2 * (key % 5) + c as u64).collect();
            assert_eq!(values, expected, "weights {weights:?} (proportions {p:?})");
        }
    }

    /// Derived independently: with two components the first `k` documents hold
    /// `ceil(k p0 / (p0 + p1))` of the first (the floor division's complement); with any number,
    /// every `sum(p)` consecutive documents from 0 hold exactly `p_i` of component `i`, and each
    /// component's documents come in order 0, 1, 2, ...
    #[test]
    fn every_prefix_holds_each_component_in_proportion() {
        for (p0, p1) in [(300, 100), (100, 233), (100, 100), (137, 1000)] {
            let docs = order(&[p0, p1], 2000);
            for k in 0..=2000u64 {
                let first = docs[..k as usize].iter().filter(|d| d.0 == 0).count() as u64;
                assert_eq!(first, (k * p0).div_ceil(p0 + p1), "k={k}, proportions {p0}:{p1}");
            }
        }
        let p = [100, 250, 130];
        let docs = order(&p, 3 * 480);
        for (i, &share) in p.iter().enumerate() {
            let mine: Vec<u64> = docs.iter().filter(|d| d.0 == i).map(|d| d.1).collect();
            assert_eq!(mine, (0..3 * share).collect::<Vec<_>>(), "component {i}");
            assert_eq!(docs[480..960].iter().filter(|d| d.0 == i).count() as u64, share);
        }
    }

    /// MaxText normalizes and rounds to 4 decimals, grain scales the smallest to 100 and truncates.
    /// The values are Python's, from MaxText's and grain's expressions:
    /// `python3 -c 'f = lambda v: [int(p * (100 / min(v))) for p in v]
    /// for w in [[0.3, 0.7], [3, 1], [1, 1, 1], [1, 6]]: print(f([round(x / sum(w), 4) for x in w]))'`
    /// (the smallest of [1, 6] becomes 99: 0.1429 x (100 / 0.1429) is 99.99999999999999).
    #[test]
    fn weights_become_maxtext_and_grain_proportions() {
        assert_eq!(proportions(&[0.3, 0.7]).unwrap(), [100, 233]);
        assert_eq!(proportions(&[3.0, 1.0]).unwrap(), [300, 100]);
        assert_eq!(proportions(&[1.0, 1.0, 1.0]).unwrap(), [100, 100, 100]);
        assert_eq!(proportions(&[1.0, 6.0]).unwrap(), [99, 599]);
        let e = proportions(&[2.0, 1e-5]).unwrap_err();
        assert!(e.contains("rounds to 0"), "{e}");
    }

    fn mixture_file(json: &str) -> (tempfile::TempDir, Config) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mixture.json");
        std::fs::write(&path, json).unwrap();
        let args = [format!("grain_train_mixture_config_path={}", path.display())];
        (dir, crate::config::load(None, &args).unwrap())
    }

    /// A mixture file's datasets in sorted name order (as `jax.tree_util` flattens a dict), weights
    /// normalized without rounding: 1/7 and 6/7 give grain's 100 : 600 here (hf_train_files' 4
    /// decimals give 99 : 599, above): `python3 -c 'w = {"web": 6, "code": 1}; v = [w[k] / 7 for k
    /// in sorted(w)]; print([int(p * (100 / min(v))) for p in v])'` prints `[100, 600]`.
    #[test]
    fn a_mixture_file_names_its_datasets_and_resumes_them_by_name() {
        let (_dir, c) =
            mixture_file(r#"{"web": {"path": "w/*.jsonl", "weight": 6}, "code": {"path": "c.jsonl", "weight": 1}}"#);
        let m = Mixture::of(&c).unwrap().unwrap();
        assert_eq!(m.names, ["code", "web"]);
        assert_eq!(m.components[0], Component { pattern: "c.jsonl".into(), weight: 1.0 });
        assert_eq!(m.proportions, [100, 600]);

        let at = |epoch| TextState { epoch, file: 0, row: 0, taken: 3 };
        let saved =
            MixtureState { index: 70, components: vec![at(1), at(2)], names: vec!["books".into(), "web".into()] };
        let resumed = m.start_at(Some(saved)).unwrap();
        assert_eq!(resumed.index, 70, "the interleaving goes on at the saved index");
        assert_eq!(resumed.components, [TextState::default(), at(2)], "code is new, web resumes, books is gone");
        assert_eq!(resumed.names, ["code", "web"]);
        let unnamed = MixtureState { index: 1, components: vec![at(0), at(0)], names: vec![] };
        assert!(m.start_at(Some(unnamed)).unwrap_err().to_string().contains("names its datasets"));

        let err = |json: &str| Mixture::of(&mixture_file(json).1).unwrap_err().to_string();
        let e = err(r#"{"web": {"path": "w.jsonl"}}"#);
        assert!(
            e.starts_with("grain_train_mixture_config_path=\"")
                && e.contains("\"web\"")
                && e.contains("positive \"weight\""),
            "{e}"
        );
        assert!(err("[1, 2]").contains("not a JSON object"));
        assert!(err("{}").contains("names no dataset"));
    }

    #[test]
    fn mixtures_are_parsed_as_maxtext_writes_them() {
        assert_eq!(parse("hf_train_files", "a/*.jsonl").unwrap(), None, "no `;`: one pattern");
        let m = parse("hf_train_files", "a/*.jsonl,0.3;gs://b/c.parquet, 0.7").unwrap().unwrap();
        assert_eq!(
            m,
            [
                Component { pattern: "a/*.jsonl".into(), weight: 0.3 },
                Component { pattern: "gs://b/c.parquet".into(), weight: 0.7 }
            ]
        );
        let err = |v: &str| parse("hf_train_files", v).unwrap_err().to_string();
        let e = err("a.jsonl;b.jsonl,1");
        assert!(e.starts_with("hf_train_files=\"a.jsonl;b.jsonl,1\": ") && e.contains("has no weight"), "{e}");
        assert!(err("a.jsonl,x;b.jsonl,1").contains("\"x\" of \"a.jsonl\" is not a number"));
        assert!(err("a.jsonl,0;b.jsonl,1").contains("must be a positive number"));
        assert!(err("a.jsonl,-1;b.jsonl,1").contains("must be a positive number"));
        assert!(err(",1;b.jsonl,1").contains("no file pattern"));
    }
}
