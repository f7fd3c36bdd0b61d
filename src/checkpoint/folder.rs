//! The file names a checkpoint's own index gives (a maxrs `manifest.json`, a Hugging Face
//! `model.safetensors.index.json`), each checked to be a file of the checkpoint's folder: a plain
//! file name (no `/`, `..` or absolute path), and locally not a symlink leading out of the
//! folder. So an index cannot make maxrs read another step's files (a run would resume "from
//! step 3" with step 2's state) or `../../../../etc/passwd`.

use std::path::{Path, PathBuf};

use crate::files::Location;

/// Why `name` is not a file of the checkpoint folder `dir`, if it is not; `plain` says how the
/// index names its files (`a manifest names its files by plain file names such as
/// params.safetensors`).
pub(super) fn outside(dir: &Location, name: &str, plain: &str) -> Option<String> {
    let is_plain = !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\', '\0'])
        && Path::new(name).is_relative();
    if !is_plain {
        return Some(format!("not a file of the checkpoint folder; {plain}"));
    }
    let target = link_out_of(dir.local_path()?, name)?;
    Some(format!("a symlink to {target:?}, outside the checkpoint folder; copy the file into the folder"))
}

/// Where `folder/name` leads when it is a symlink whose target lies outside `folder` (and
/// outside the `blobs` folder of a Hugging Face cache snapshot: the one link out that is allowed
/// is Hugging Face's own cache layout, where `snapshots/<revision>/<file>` links to
/// `../../blobs/<hash>`, huggingface_hub `docs/source/en/guides/manage-cache.md`).
fn link_out_of(folder: &Path, name: &str) -> Option<PathBuf> {
    let path = folder.join(name);
    if !std::fs::symlink_metadata(&path).ok()?.file_type().is_symlink() {
        return None;
    }
    // An unresolvable link is reported by the reader with what it is (missing, a loop).
    let target = std::fs::canonicalize(&path).ok()?;
    let root = std::fs::canonicalize(folder).ok()?;
    let cache_blobs = root
        .parent()
        .filter(|snapshots| snapshots.file_name().is_some_and(|n| n == "snapshots"))
        .and_then(|snapshots| snapshots.parent())
        .map(|repo| repo.join("blobs"));
    let inside = target.starts_with(&root) || cache_blobs.is_some_and(|blobs| target.starts_with(blobs));
    (!inside).then_some(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_may_stay_in_the_folder_or_lead_into_a_hub_cache_blob() {
        let root = tempfile::tempdir().unwrap();
        let repo = root.path().join("models--org--name");
        let snapshot = repo.join("snapshots").join("0123abc");
        std::fs::create_dir_all(&snapshot).unwrap();
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::write(repo.join("blobs").join("f00d"), b"weights").unwrap();
        std::fs::write(snapshot.join("plain.safetensors"), b"weights").unwrap();
        std::fs::write(root.path().join("outside.safetensors"), b"weights").unwrap();
        let link = |name: &str, target: &str| std::os::unix::fs::symlink(target, snapshot.join(name)).unwrap();
        link("cached.safetensors", "../../blobs/f00d");
        link("sibling.safetensors", "plain.safetensors");
        link("out.safetensors", "../../../outside.safetensors");
        link("dangling.safetensors", "missing");
        for inside in ["plain.safetensors", "cached.safetensors", "sibling.safetensors", "dangling.safetensors"] {
            assert_eq!(link_out_of(&snapshot, inside), None, "{inside}");
        }
        let out = link_out_of(&snapshot, "out.safetensors");
        assert_eq!(out, Some(root.path().join("outside.safetensors").canonicalize().unwrap()));
        // Outside a snapshot folder, a cache-like `blobs` link is a link out like any other.
        let plain_dir = root.path().join("ckpt");
        std::fs::create_dir_all(&plain_dir).unwrap();
        std::os::unix::fs::symlink("../models--org--name/blobs/f00d", plain_dir.join("m.safetensors")).unwrap();
        assert!(link_out_of(&plain_dir, "m.safetensors").is_some());
    }
}
