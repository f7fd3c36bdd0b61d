//! [`Location`]: where a file or directory maxrs reads or writes lives, a local path or a
//! `gs://bucket/key` URL, checked when parsed (the bucket and object names go into request URLs).
//! The type only: `crate::storage` reads and writes locations.

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

/// Where a file or directory lives.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Location {
    Local(PathBuf),
    /// An object (or a `/`-separated prefix acting as a directory) in a GCS bucket. `key` has no
    /// leading or trailing `/`; empty is the bucket's root.
    Gcs {
        bucket: String,
        key: String,
    },
}

impl Location {
    /// `gs://bucket/key...` or a local path. Other URL schemes are refused rather than taken as
    /// relative paths.
    pub fn parse(text: &str) -> Result<Location> {
        if let Some(rest) = text.strip_prefix("gs://") {
            let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                bail!("{text}: a gs:// location needs a bucket name (gs://BUCKET/PATH)");
            }
            // Both go into request URLs.
            crate::net::google::check_bucket(text, bucket)?;
            let key = key.trim_matches('/');
            crate::net::google::check_object_name(text, key)?;
            return Ok(Location::Gcs { bucket: bucket.to_string(), key: key.to_string() });
        }
        if let Some((scheme, _)) = text.split_once("://") {
            bail!("{text}: `{scheme}://` is not supported; use a local path or gs://BUCKET/PATH");
        }
        // `gs:/bkt/runs` (a slash lost in a script) would otherwise be a local folder `./gs:`.
        if let Some(scheme) = url_scheme(text) {
            bail!("{text}: `{scheme}:` followed by one slash is not a location; write gs://BUCKET/PATH, or ./{text} for a local path");
        }
        if text.is_empty() {
            bail!("an empty path names no file");
        }
        Ok(Location::Local(PathBuf::from(text)))
    }

    /// The child `name` (which may contain `/`).
    pub fn join(&self, name: &str) -> Location {
        match self {
            Location::Local(path) => Location::Local(path.join(name)),
            Location::Gcs { bucket, key } => {
                let name = name.trim_matches('/');
                let key = if key.is_empty() { name.to_string() } else { format!("{key}/{name}") };
                Location::Gcs { bucket: bucket.clone(), key }
            }
        }
    }

    /// The last component of the name.
    pub fn file_name(&self) -> String {
        match self {
            Location::Local(path) => path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            Location::Gcs { key, .. } => key.rsplit('/').next().unwrap_or("").to_string(),
        }
    }

    /// The directory holding this location (a bucket's root has none).
    pub fn parent(&self) -> Option<Location> {
        match self {
            Location::Local(path) => path.parent().map(|p| Location::Local(p.to_path_buf())),
            Location::Gcs { bucket, key } if !key.is_empty() => Some(Location::Gcs {
                bucket: bucket.clone(),
                key: key.rsplit_once('/').map(|(parent, _)| parent.to_string()).unwrap_or_default(),
            }),
            Location::Gcs { .. } => None,
        }
    }

    pub fn is_local(&self) -> bool {
        matches!(self, Location::Local(_))
    }

    pub fn local_path(&self) -> Option<&Path> {
        match self {
            Location::Local(path) => Some(path),
            Location::Gcs { .. } => None,
        }
    }
}

/// The scheme of a text that starts like a URL with a slash missing (`gs:/bkt`, `https:/host`):
/// a letter, then letters, digits, `+`, `-` or `.`, then `:/` (so `run:1/x` stays a path).
fn url_scheme(text: &str) -> Option<&str> {
    let (scheme, rest) = text.split_once(':')?;
    let mut chars = scheme.chars();
    let well_formed = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    (well_formed && rest.starts_with('/')).then_some(scheme)
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Local(path) => write!(f, "{}", path.display()),
            Location::Gcs { bucket, key } => write!(f, "gs://{bucket}/{key}"),
        }
    }
}

impl From<&Path> for Location {
    fn from(path: &Path) -> Location {
        Location::Local(path.to_path_buf())
    }
}
