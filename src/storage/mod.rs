//! The one storage seam: every file maxrs reads or writes for a run (checkpoints, parameter
//! files, datasets, metrics, TensorBoard events, the resolved config) is named by a
//! [`Location`], a local path or a `gs://bucket/key` URL, and goes through the functions here.
//!
//! What callers can rely on, on both backends:
//! - [`write`] / [`create`]: a file appears under its name only when complete. Locally it is
//!   written to a temporary sibling, fsynced and renamed (the parent directory is fsynced too);
//!   on GCS an object upload is atomic by itself (a resumable upload becomes visible only when
//!   completed; an abandoned one is cancelled).
//! - [`StagedDir`]: a directory whose contents appear together. Locally it is a temporary sibling
//!   directory renamed into place; GCS has no directories to rename, so there the caller must
//!   write a commit file last (checkpoints write their manifest last) and readers must treat a
//!   directory without it as incomplete. This is Orbax's choice too: `AtomicRenameTemporaryPath`
//!   locally, `CommitFileTemporaryPath` (a `commit_success.txt`) where renames are not atomic
//!   (google/orbax `checkpoint/orbax/checkpoint/_src/path/atomicity.py`, commit 08ec2b4).
//! - [`open_read`]: a sequential reader (GCS streams the object); [`read_range`]: bytes
//!   `offset..offset + len` of a file (a seek locally, a ranged GET on GCS), so that a process
//!   restoring a checkpoint reads only the slices it needs; [`size`]: a file's size, or that it
//!   is missing; [`list_dir`] lists the immediate children of a directory (GCS: the
//!   `/`-delimited prefixes and objects).
//!
//! GCS goes through its JSON API (see `gcs.rs`) with Application Default Credentials
//! (`GOOGLE_APPLICATION_CREDENTIALS`, gcloud's application default credentials, the metadata
//! server). `STORAGE_EMULATOR_HOST=http://host:port` (the variable Google's client libraries
//! honour) sends every request to a GCS emulator such as fake-gcs-server, without credentials.
//! Errors name the location and the operation, in one line.

mod gcs;
mod local;

use std::io::{Read, Write};

use anyhow::{bail, Context, Result};

use crate::files::Location;
use crate::input::{self, Limit};

/// A file being written; it appears under its name only after [`ObjectWriter::finish`]. Dropping
/// it unfinished discards what was written.
pub struct ObjectWriter {
    inner: WriterImpl,
}

enum WriterImpl {
    Local(local::FileWriter),
    Gcs(gcs::ObjectUpload),
}

impl ObjectWriter {
    /// Makes the file visible, complete, under its name (locally: fsync, rename, fsync the
    /// directory). Returns the number of bytes written.
    pub fn finish(self) -> Result<u64> {
        match self.inner {
            WriterImpl::Local(w) => w.finish(),
            WriterImpl::Gcs(w) => w.finish(),
        }
    }
}

impl Write for ObjectWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match &mut self.inner {
            WriterImpl::Local(w) => w.write(buf),
            WriterImpl::Gcs(w) => w.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.inner {
            WriterImpl::Local(w) => w.flush(),
            WriterImpl::Gcs(_) => Ok(()),
        }
    }
}

/// Starts writing the file at `location` (parent directories are created as needed).
pub fn create(location: &Location) -> Result<ObjectWriter> {
    let inner = match location {
        Location::Local(path) => WriterImpl::Local(local::FileWriter::create(path)?),
        Location::Gcs { bucket, key } => WriterImpl::Gcs(gcs::ObjectUpload::start(bucket, key)?),
    };
    Ok(ObjectWriter { inner })
}

/// Writes `bytes` as the whole file at `location`, atomically (see the module docs).
pub fn write(location: &Location, bytes: &[u8]) -> Result<()> {
    match location {
        Location::Gcs { bucket, key } => gcs::put(bucket, key, bytes),
        Location::Local(_) => {
            let mut writer = create(location)?;
            writer.write_all(bytes).map_err(|e| anyhow::anyhow!("writing {location}: {e}"))?;
            writer.finish().map(drop)
        }
    }
}

/// The whole file at `location`, refused past `limit` bytes (a local one must be a regular
/// file, see [`crate::input`]).
pub fn read(location: &Location, limit: Limit) -> Result<Vec<u8>> {
    match location {
        Location::Local(path) => Ok(input::read("", path, limit)?),
        Location::Gcs { .. } => {
            let mut bytes = Vec::new();
            open_read(location)?
                .take(limit.bytes + 1)
                .read_to_end(&mut bytes)
                .map_err(|e| anyhow::anyhow!("reading {location}: {e}"))?;
            if bytes.len() as u64 > limit.bytes {
                bail!("{location} is larger than the {limit} maxrs reads for {}", limit.of);
            }
            Ok(bytes)
        }
    }
}

/// A sequential reader of the file at `location` (a local one must be a regular file).
pub fn open_read(location: &Location) -> Result<Box<dyn Read + Send>> {
    match location {
        Location::Local(path) => Ok(Box::new(input::open("", path)?)),
        Location::Gcs { bucket, key } => Ok(Box::new(gcs::ObjectReader::open(bucket, key)?)),
    }
}

/// The size of the file at `location`, `None` when there is none.
pub fn size(location: &Location) -> Result<Option<u64>> {
    match location {
        Location::Local(path) => match input::check("", path) {
            Ok(meta) => Ok(Some(meta.len())),
            Err(e) if e.is_missing() => Ok(None),
            Err(e) => Err(e.into()),
        },
        Location::Gcs { bucket, key } => gcs::size(bucket, key),
    }
}

/// The size of the file at `location`; an error naming it when there is none.
pub fn file_size(location: &Location) -> Result<u64> {
    let missing = match location {
        Location::Local(_) => "no such file",
        Location::Gcs { .. } => "no such object",
    };
    size(location)?.ok_or_else(|| anyhow::anyhow!("{location}: {missing}"))
}

/// Bytes `start..start + len` of the file at `location` (fewer at its end). On GCS one ranged
/// request, retried as a whole when the connection breaks mid-body: readers of large remote
/// files ([`RangeReader`], Parquet footers and row groups) fetch only what they use.
pub fn read_range(location: &Location, start: u64, len: u64) -> Result<Vec<u8>> {
    match location {
        Location::Local(path) => {
            use std::io::{Seek, SeekFrom};
            let mut file = input::open("", path)?;
            file.seek(SeekFrom::Start(start)).with_context(|| format!("reading {location}"))?;
            let mut bytes = Vec::new();
            file.take(len).read_to_end(&mut bytes).with_context(|| format!("reading {location}"))?;
            Ok(bytes)
        }
        Location::Gcs { bucket, key } => gcs::read_range(bucket, key, start, len),
    }
}

/// Every file under the `gs://` prefix `location` (recursively), sorted by name.
pub fn list_files(location: &Location) -> Result<Vec<Location>> {
    match location {
        Location::Local(_) => bail!("list_files lists gs:// prefixes; {location} is local"),
        Location::Gcs { bucket, key } => Ok(gcs::list_names(bucket, key)?
            .into_iter()
            .filter(|name| !name.ends_with('/'))
            .map(|key| Location::Gcs { bucket: bucket.clone(), key })
            .collect()),
    }
}

/// Bytes of the chunk a [`RangeReader`] asks for at a time.
pub const RANGE_CHUNK: u64 = 8 << 20;

/// A sequential reader of a file made of ranged reads of [`RANGE_CHUNK`] bytes: on GCS a broken
/// connection costs one chunk's retry, never a restart of the file, and nothing is read before
/// it is needed.
pub struct RangeReader {
    location: Location,
    position: u64,
    chunk: std::io::Cursor<Vec<u8>>,
    at_end: bool,
}

impl RangeReader {
    /// Reads `location` from byte `start`.
    pub fn new(location: Location, start: u64) -> RangeReader {
        RangeReader { location, position: start, chunk: std::io::Cursor::new(Vec::new()), at_end: false }
    }
}

impl Read for RangeReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.chunk.read(buf)?;
        if n > 0 || self.at_end || buf.is_empty() {
            return Ok(n);
        }
        let bytes = read_range(&self.location, self.position, RANGE_CHUNK)
            .map_err(|e| std::io::Error::other(format!("{e:#}")))?;
        self.position += bytes.len() as u64;
        self.at_end = (bytes.len() as u64) < RANGE_CHUNK;
        self.chunk = std::io::Cursor::new(bytes);
        self.chunk.read(buf)
    }
}

/// Copies a remote file into a temporary local file (deleted when dropped).
pub fn download(remote: &Location) -> Result<tempfile::TempPath> {
    let mut file = tempfile::NamedTempFile::new().context("creating a temporary file")?;
    let mut input = open_read(remote)?;
    std::io::copy(&mut input, file.as_file_mut()).with_context(|| format!("copying {remote} to a local file"))?;
    Ok(file.into_temp_path())
}

/// Whether a file exists at `location` (a directory is not a file; a FIFO or a device is, so
/// that reading it is refused naming what it is, rather than the file looking absent).
pub fn is_file(location: &Location) -> Result<bool> {
    match location {
        Location::Local(path) => Ok(std::fs::metadata(path).is_ok_and(|m| !m.is_dir())),
        Location::Gcs { bucket, key } => gcs::exists(bucket, key),
    }
}

/// One entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Entry {
    pub name: String,
    pub is_dir: bool,
}

/// The immediate children of the directory at `location`, sorted by name; an absent directory
/// lists as empty.
pub fn list_dir(location: &Location) -> Result<Vec<Entry>> {
    let mut entries = match location {
        Location::Local(path) => local::list_dir(path)?,
        Location::Gcs { bucket, key } => gcs::list_dir(bucket, key)?,
    };
    entries.sort();
    Ok(entries)
}

/// Deletes the file or directory tree at `location` (nothing there is not an error).
pub fn remove_all(location: &Location) -> Result<()> {
    match location {
        Location::Local(path) => local::remove_all(path),
        Location::Gcs { bucket, key } => gcs::remove_prefix(bucket, key),
    }
}

/// A directory being filled whose contents appear together at `final_location` on
/// [`StagedDir::commit`] (see the module docs for what that means on GCS).
pub struct StagedDir {
    staging: Location,
    final_location: Location,
}

/// The suffix of a local staging directory: `<name>.maxrs-tmp`. Like Orbax's
/// `.orbax-checkpoint-tmp`, a directory with it is never complete and may be deleted.
pub const STAGING_SUFFIX: &str = ".maxrs-tmp";

impl StagedDir {
    /// Starts a directory for `final_location` whose file `commit_file` is written last, removing
    /// what an interrupted earlier attempt left (locally its staging directory; on GCS the
    /// uncommitted objects under the final name, where it wrote). Fails when `final_location`
    /// already exists (locally) or has its commit file (GCS).
    pub fn start(final_location: &Location, commit_file: &str) -> Result<StagedDir> {
        let staging = match final_location {
            Location::Local(path) => {
                if path.exists() {
                    bail!("{}: already exists; not overwriting it", path.display());
                }
                let staging = StagedDir::staging_of(final_location);
                let Location::Local(staging_path) = &staging else { unreachable!("a local directory stages locally") };
                local::remove_all(staging_path)?;
                local::create_dir_all(staging_path)?;
                staging
            }
            Location::Gcs { bucket, key } => {
                if gcs::exists(bucket, &format!("{key}/{commit_file}"))? {
                    bail!("{final_location}: already exists (it has {commit_file}); not overwriting it");
                }
                gcs::remove_prefix(bucket, key)?;
                final_location.clone()
            }
        };
        Ok(StagedDir { staging, final_location: final_location.clone() })
    }

    /// Where the files of `final_location` are written until it is committed: locally its
    /// `.maxrs-tmp` sibling, on GCS the final name itself. The processes of a job that write
    /// into one directory find it here (the one that started it commits it).
    pub fn staging_of(final_location: &Location) -> Location {
        match final_location {
            Location::Local(path) => {
                let mut name = path.file_name().unwrap_or_default().to_os_string();
                name.push(STAGING_SUFFIX);
                Location::Local(path.with_file_name(name))
            }
            Location::Gcs { .. } => final_location.clone(),
        }
    }

    /// Where to write the directory's files until it is committed.
    pub fn path(&self) -> &Location {
        &self.staging
    }

    /// Makes the directory visible under its final name (locally: fsync the staging directory,
    /// rename it, fsync the parent).
    pub fn commit(self) -> Result<Location> {
        if let (Location::Local(staging), Location::Local(target)) = (&self.staging, &self.final_location) {
            local::commit_dir(staging, target)?;
        }
        Ok(self.final_location)
    }

    /// Deletes what was written (a failed save).
    pub fn abandon(self) -> Result<()> {
        remove_all(&self.staging)
    }

    /// Writes the directory `final_location` whole: `fill` writes its files into the staging
    /// directory it is given, `commit_file` last; the directory is committed when `fill`
    /// succeeds and deleted when it fails.
    pub fn write_whole<T>(
        final_location: &Location,
        commit_file: &str,
        fill: impl FnOnce(&Location) -> Result<T>,
    ) -> Result<(Location, T)> {
        let staged = StagedDir::start(final_location, commit_file)?;
        match fill(staged.path()) {
            Ok(value) => Ok((staged.commit()?, value)),
            Err(e) => {
                if let Err(cleanup) = staged.abandon() {
                    tracing::warn!("cleaning up the failed write of {final_location}: {cleanup:#}");
                }
                Err(e)
            }
        }
    }
}

/// A file that grows by appending (metrics, TensorBoard events). Locally bytes go straight to
/// the file; GCS objects cannot be appended to, so there the content is kept and the whole
/// object rewritten on each [`Appender::flush`] (what TensorFlow's GCS file system does too).
pub struct Appender {
    location: Location,
    inner: AppenderImpl,
}

enum AppenderImpl {
    Local(crate::files::LockedAppend),
    Gcs { content: Vec<u8>, flushed: usize },
}

impl Appender {
    /// Opens `location`, the value of config key `key`, for appending; `truncate` starts it
    /// empty (locally at the first write, so a run that fails earlier leaves the old content),
    /// otherwise existing content is kept. Parent directories are created. A local file is
    /// locked while the appender lives: a second run naming it is refused.
    pub fn open(key: &str, location: &Location, truncate: bool) -> Result<Appender> {
        let inner = match location {
            Location::Local(path) => AppenderImpl::Local(crate::files::LockedAppend::open(key, path, truncate)?),
            Location::Gcs { .. } => {
                let content =
                    if !truncate && is_file(location)? { read(location, input::RUN_LOG)? } else { Vec::new() };
                let flushed = content.len();
                AppenderImpl::Gcs { content, flushed }
            }
        };
        Ok(Appender { location: location.clone(), inner })
    }

    /// Appends `bytes` (locally written at once, unbuffered).
    pub fn append(&mut self, bytes: &[u8]) -> Result<()> {
        match &mut self.inner {
            AppenderImpl::Local(file) => file.append(bytes),
            AppenderImpl::Gcs { content, .. } => {
                content.extend_from_slice(bytes);
                Ok(())
            }
        }
    }

    /// Makes everything appended so far durable (locally fsync; GCS: rewrite the object).
    pub fn flush(&mut self) -> Result<()> {
        match &mut self.inner {
            AppenderImpl::Local(file) => file.sync(),
            AppenderImpl::Gcs { content, flushed } => {
                if *flushed < content.len() || content.is_empty() {
                    write(&self.location, content)?;
                    *flushed = content.len();
                }
                Ok(())
            }
        }
    }

    pub fn location(&self) -> &Location {
        &self.location
    }
}
