//! The logical axis rules table: merging it across config layers as MaxText does, checking that it
//! names real mesh axes, and handing it out as plain rows. Turning rows into partition specs is
//! `sharding::LogicalRules`'s job, not this module's.

use super::choices::LogicalAxisRule;
use super::error::{closest, quote, ConfigError};
use super::keys::Config;
use super::mesh::{built, MESH_AXES, SIZE_ONE_AXES};

/// The rules as `(logical axis name, mesh axes)` rows, in table order, keeping only mesh axes
/// that are in `mesh_axes` (leaving an axis out of the mesh is the same as giving it size 1).
///
/// A name may have several rows: as in MaxText (flax's `logical_to_mesh_axes`), the rows are tried
/// in order and a row applies to an array only if none of its mesh axes is already used by
/// another dimension of the same array; the later rows are fallbacks. An empty list means
/// replicated.
pub fn axis_rules(config: &Config) -> Vec<(String, Vec<String>)> {
    config
        .logical_axis_rules
        .iter()
        .map(|LogicalAxisRule(name, axes)| (name.clone(), in_mesh(config, axes.to_vec())))
        .collect()
}

/// The rules as the sharding code's `LogicalRules`.
pub fn logical_rules(config: &Config) -> crate::sharding::LogicalRules {
    crate::sharding::LogicalRules::from_rows(&axis_rules(config))
}

fn in_mesh(config: &Config, axes: Vec<String>) -> Vec<String> {
    axes.into_iter().filter(|a| config.mesh_axes.contains(a) && built(a)).collect()
}

/// The mesh axes of the first rule for `logical` (empty if there is none).
pub(crate) fn first_rule(config: &Config, logical: &str) -> Vec<String> {
    config
        .logical_axis_rules
        .iter()
        .find(|LogicalAxisRule(name, _)| name == logical)
        .map(|LogicalAxisRule(_, axes)| in_mesh(config, axes.to_vec()))
        .unwrap_or_default()
}

/// Applies a later layer's rules to an earlier layer's, as MaxText's loader does: the new rows
/// replace every earlier row with the same logical name and go at the end; with
/// `override_logical_axis_rules` the new table replaces the whole table.
pub(crate) fn merge(base: Vec<LogicalAxisRule>, new: Vec<LogicalAxisRule>, replace: bool) -> Vec<LogicalAxisRule> {
    if replace {
        return new;
    }
    let mut merged: Vec<LogicalAxisRule> =
        base.into_iter().filter(|LogicalAxisRule(name, _)| !new.iter().any(|r| &r.0 == name)).collect();
    merged.extend(new);
    merged
}

/// Every mesh axis named by a rule or by `data_sharding` must be one maxrs knows.
pub(crate) fn check(config: &Config) -> Result<(), ConfigError> {
    let known: Vec<&str> = MESH_AXES.iter().map(|(a, _)| *a).collect();
    let unknown = |axis: &str, key: &str, place: String| {
        let hint = closest(axis, known.iter().copied()).map(|s| format!("; did you mean `{s}`?")).unwrap_or_default();
        ConfigError::invalid(
            key,
            format!(
                "{place} names mesh axis {}, which maxrs does not know{hint} (mesh axes: {})",
                quote(axis),
                known.join(", ")
            ),
        )
    };
    let named = |a: &String| known.contains(&a.as_str()) || SIZE_ONE_AXES.contains(&a.as_str());
    for LogicalAxisRule(name, axes) in &config.logical_axis_rules {
        if let Some(axis) = axes.to_vec().iter().find(|a| !named(a)) {
            return Err(unknown(axis, "logical_axis_rules", format!("the rule for {}", quote(name))));
        }
    }
    for group in &config.data_sharding {
        if let Some(axis) = group.iter().find(|a| !named(a)) {
            return Err(unknown(axis, "data_sharding", "data_sharding".into()));
        }
    }
    // MaxText lays the input batch out over `data_sharding`; maxrs shards it by the logical rules
    // (`activation_batch`), which is the same layout for MaxText's default: every mesh axis.
    // (Unknown mesh axes are named by the mesh check.)
    let covers_mesh = |group: &Vec<String>| {
        config.mesh_axes.iter().filter(|a| known.contains(&a.as_str())).all(|a| group.contains(a))
    };
    if config.data_sharding.len() != 1 || !covers_mesh(&config.data_sharding[0]) {
        return Err(ConfigError::invalid(
            "data_sharding",
            format!(
                "{:?}: another input layout than all mesh axes ({:?}) is not supported yet; maxrs shards the batch by \
                 the logical axis rule of activation_batch",
                config.data_sharding, config.mesh_axes
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::choices::RuleAxes;

    fn rule(name: &str, axes: &[&str]) -> LogicalAxisRule {
        LogicalAxisRule(name.into(), RuleAxes::Many(axes.iter().map(|a| a.to_string()).collect()))
    }

    #[test]
    fn merge_replaces_rows_by_name_and_appends() {
        let base = vec![rule("norm", &["tensor"]), rule("embed", &["fsdp"]), rule("embed", &["context"])];
        let merged = merge(base.clone(), vec![rule("embed", &["data"])], false);
        assert_eq!(merged, vec![rule("norm", &["tensor"]), rule("embed", &["data"])]);
        assert_eq!(merge(base, vec![rule("x", &[])], true), vec![rule("x", &[])]);
    }
}
