//! Local files, below everything that reads or writes them: where a file lives ([`Location`],
//! local or `gs://`), the checks on a path before maxrs writes there ([`Kind`]) or reads it,
//! and the writers that never leave a half-written file ([`AtomicFile`], [`write_atomic`]: the one
//! way maxrs writes a file whole, for command outputs, the plugin cache, parameter files and the
//! storage seam's local backend) or interleave two runs' lines ([`LockedAppend`]).
//!
//! A foundation: `input` opens what maxrs reads, `output` checks a command's paths against each
//! other, `storage` reads and writes locations on both backends.

mod check;
mod location;
mod write;

pub(crate) use check::{absolute, check_output, describe_special, shown, NEW_DIR};
pub use check::{same_file, Kind};
pub use location::Location;
pub use write::{place_executable, sync_dir, write_atomic, AtomicFile, LockedAppend};
