//! Issue 33 on this CPU-only machine: `train-compile` for an H100 reads JAX's allocator
//! variables as the run will, refuses a bad one in one line before compiling, prints the usable
//! memory beside the step's, and judges the step against the allocator's share (not the whole
//! device), naming the fraction that would fit. The CUDA plugin is downloaded on first use (see
//! `skip_offline` in tests/common/provision.rs).

use crate::common::cli::{maxrs, refused};
use crate::common::provision::provisioned;
use maxrs::aot::topology::lookup;

const COMPILE: &[&str] = &["train-compile", "--topology=h100-1", "per_device_batch_size=1", "max_target_length=64"];

#[test]
fn a_bad_allocator_variable_is_one_line_before_the_compile() {
    let e = refused(COMPILE, &[("XLA_PYTHON_CLIENT_MEM_FRACTION", "1.5")]);
    assert!(e.contains("XLA_PYTHON_CLIENT_MEM_FRACTION=\"1.5\" is not a fraction in (0, 1]"), "{e}");
    let e = refused(COMPILE, &[("XLA_PYTHON_CLIENT_ALLOCATOR", "arena")]);
    assert!(e.contains("\"arena\" is not an allocator JAX knows"), "{e}");
}

#[test]
fn an_h100_step_is_judged_against_the_fraction_and_the_refusal_names_the_one_that_fits() {
    if !provisioned(&lookup("h100-1", 1).unwrap()) {
        return;
    }
    // Under XLA's default fraction the step fits: aot_train's A3 Mega compile (H100s too) checks
    // the usable 59.33 GiB it prints, one deviceless compile fewer here.
    // A fraction that leaves ~8 MB: the small step needs more, and the smallest hundredth fits it.
    let out = maxrs(COMPILE, &[("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.0001")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("out of memory: the compiled program needs"), "{stderr}");
    assert!(stderr.contains("memory fraction 0.0001 (XLA_PYTHON_CLIENT_MEM_FRACTION)"), "{stderr}");
    assert!(stderr.contains("Set XLA_PYTHON_CLIENT_MEM_FRACTION=0.01 "), "{stderr}");
    // The keys that shrink the step (the refusal aot_train's oversized H100 step had, one
    // deviceless compile fewer).
    assert!(stderr.contains("per_device_batch_size") && stderr.contains("remat_policy"), "{stderr}");
}
