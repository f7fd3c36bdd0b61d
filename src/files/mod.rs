//! Local files, below everything that writes them (L0: imports nothing of maxrs): the one way
//! maxrs writes a file whole ([`AtomicFile`], [`write_atomic`]), used by command outputs, the
//! plugin cache, parameter files and the storage seam's local backend.

mod write;

pub use write::{sync_dir, write_atomic, AtomicFile};
