//! Parameter trees: an ordered map from dotted names (`decoder.layers.mlp.wi_0`) to values.
//! The same names serve program inputs/outputs, gradients, sharding rules and checkpoints.
//! Flat and sorted, so the order of program arguments is deterministic.

use std::collections::BTreeMap;
use std::ops::Index;

#[derive(Clone, Debug, PartialEq)]
pub struct Tree<T = super::Tensor>(BTreeMap<String, T>);

impl<T> Default for Tree<T> {
    fn default() -> Self {
        Tree(BTreeMap::new())
    }
}

impl<T> Tree<T> {
    pub fn new() -> Tree<T> {
        Tree::default()
    }

    pub fn insert(&mut self, name: impl Into<String>, value: T) -> Option<T> {
        self.0.insert(name.into(), value)
    }

    /// Builder form of `insert`.
    pub fn with(mut self, name: impl Into<String>, value: T) -> Tree<T> {
        self.insert(name, value);
        self
    }

    pub fn get(&self, name: &str) -> Option<&T> {
        self.0.get(name)
    }

    pub fn remove(&mut self, name: &str) -> Option<T> {
        self.0.remove(name)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &T)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.0.values()
    }

    pub fn map<U>(&self, mut f: impl FnMut(&str, &T) -> U) -> Tree<U> {
        Tree(self.0.iter().map(|(k, v)| (k.clone(), f(k, v))).collect())
    }

    /// Entries under `prefix.`, with the prefix removed.
    pub fn subtree(&self, prefix: &str) -> Tree<T>
    where
        T: Clone,
    {
        let dotted = format!("{prefix}.");
        Tree(
            self.0
                .range(dotted.clone()..)
                .take_while(|(k, _)| k.starts_with(&dotted))
                .map(|(k, v)| (k[dotted.len()..].to_string(), v.clone()))
                .collect(),
        )
    }

    /// The same entries with `prefix.` in front of every name.
    pub fn prefixed(self, prefix: &str) -> Tree<T> {
        Tree(self.0.into_iter().map(|(k, v)| (format!("{prefix}.{k}"), v)).collect())
    }

    /// Adds every entry of `other` (replacing entries of the same name).
    pub fn extend(&mut self, other: Tree<T>) {
        self.0.extend(other.0);
    }
}

impl<T> Index<&str> for Tree<T> {
    type Output = T;
    #[track_caller]
    fn index(&self, name: &str) -> &T {
        match self.0.get(name) {
            Some(v) => v,
            None => {
                let names: Vec<&str> = self.names().collect();
                super::trace::usage_error(&format!("no entry \"{name}\" in the tree (it has {names:?})"))
            }
        }
    }
}

impl<T, K: Into<String>> FromIterator<(K, T)> for Tree<T> {
    fn from_iter<I: IntoIterator<Item = (K, T)>>(iter: I) -> Tree<T> {
        Tree(iter.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }
}

impl<T> IntoIterator for Tree<T> {
    type Item = (String, T);
    type IntoIter = std::collections::btree_map::IntoIter<String, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}
