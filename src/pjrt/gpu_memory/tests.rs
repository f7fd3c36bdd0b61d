use std::collections::HashMap;

use super::*;

const GIB: u64 = 1 << 30;

fn settings(vars: &[(&str, &str)]) -> Result<GpuAllocator> {
    let vars: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    GpuAllocator::from_lookup(|var| Ok(vars.get(var).cloned()))
}

fn error(vars: &[(&str, &str)]) -> String {
    settings(vars).unwrap_err().to_string()
}

#[test]
fn unset_variables_pass_no_option_and_mean_xla_defaults() {
    let a = settings(&[]).unwrap();
    assert_eq!(a, GpuAllocator::default());
    assert!(a.client_options().is_empty());
    assert_eq!((a.fraction(), a.is_capped()), (0.75, true));
    // JAX reads empty values of these as unset.
    let empty = settings(&[
        ("XLA_PYTHON_CLIENT_MEM_FRACTION", ""),
        ("XLA_CLIENT_MEM_FRACTION", ""),
        ("XLA_PYTHON_CLIENT_PREALLOCATE", ""),
        ("XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB", ""),
    ]);
    assert_eq!(empty.unwrap(), GpuAllocator::default());
}

#[test]
fn each_variable_becomes_jaxlibs_client_option() {
    let a = settings(&[
        ("XLA_PYTHON_CLIENT_ALLOCATOR", "CUDA_ASYNC"),
        ("XLA_PYTHON_CLIENT_MEM_FRACTION", " 0.95 "),
        ("XLA_PYTHON_CLIENT_PREALLOCATE", "False"),
        ("XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB", "512"),
        ("XLA_PYTHON_CLIENT_ABORT_COLLECTIVES_ON_FAILURE", "1"),
        ("XLA_PYTHON_CLIENT_USE_TFRT_GPU_CLIENT", "0"),
    ])
    .unwrap();
    assert_eq!(
        a.client_options(),
        vec![
            ("allocator".to_string(), Value::Str("cuda_async".into())),
            ("memory_fraction".to_string(), Value::F32(0.95)),
            ("preallocate".to_string(), Value::Bool(false)),
            ("collective_memory_size".to_string(), Value::I64(512 << 20)),
            ("abort_collectives_on_failure".to_string(), Value::Bool(true)),
        ]
    );
    assert_eq!(a.fraction, Some(FromVar { value: 0.95, var: "XLA_PYTHON_CLIENT_MEM_FRACTION" }));
    for off in ["false", "False", "0"] {
        assert_eq!(settings(&[("XLA_PYTHON_CLIENT_PREALLOCATE", off)]).unwrap().preallocate, Some(false));
    }
    for on in ["true", "True", "1"] {
        assert_eq!(settings(&[("XLA_PYTHON_CLIENT_PREALLOCATE", on)]).unwrap().preallocate, Some(true));
    }
    let new_name = settings(&[("XLA_CLIENT_MEM_FRACTION", "1")]).unwrap();
    assert_eq!(new_name.fraction, Some(FromVar { value: 1.0, var: "XLA_CLIENT_MEM_FRACTION" }));
}

#[test]
fn bad_values_are_one_line_naming_the_variable_and_what_is_valid() {
    for bad in ["0", "-0.5", "1.01", "nan", "inf", "0.9x", "ninety"] {
        let e = error(&[("XLA_PYTHON_CLIENT_MEM_FRACTION", bad)]);
        assert!(e.contains(&format!("XLA_PYTHON_CLIENT_MEM_FRACTION={bad:?} is not a fraction in (0, 1]")), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
    let e = error(&[("XLA_PYTHON_CLIENT_ALLOCATOR", "cudaMalloc")]);
    assert!(
        e.contains("\"cudaMalloc\" is not an allocator JAX knows")
            && e.contains("default, platform, bfc, cuda_async, vmm, address"),
        "{e}"
    );
    // JAX refuses an empty allocator name too (it is not one of its names).
    assert!(error(&[("XLA_PYTHON_CLIENT_ALLOCATOR", "")]).contains("\"\" is not an allocator"));
    let e = error(&[("XLA_CLIENT_MEM_FRACTION", "0.9"), ("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.8")]);
    assert!(e.contains("both set") && e.contains("unset XLA_PYTHON_CLIENT_MEM_FRACTION"), "{e}");
    let e = error(&[("XLA_PYTHON_CLIENT_PREALLOCATE", "no")]);
    assert!(e.contains("XLA_PYTHON_CLIENT_PREALLOCATE=\"no\"") && e.contains("give false"), "{e}");
    let e = error(&[("XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB", "-1")]);
    assert!(e.contains("not a whole number of MiB >= 0"), "{e}");
    let e = error(&[("XLA_PYTHON_CLIENT_ABORT_COLLECTIVES_ON_FAILURE", "yes")]);
    assert!(e.contains("\"yes\" is not an integer"), "{e}");
    let e = error(&[("XLA_PYTHON_CLIENT_USE_TFRT_GPU_CLIENT", "1")]);
    assert!(e.contains("not supported yet"), "{e}");
}

#[test]
fn usable_memory_is_xlas_total_times_fraction_and_the_whole_device_without_a_pool() {
    // An H100 as the plugin's target description gives it (79.11 GiB) against an independent
    // product: XLA's `size_t allocator_memory = total_memory * memory_fraction`.
    let h100: u64 = 84_942_979_072;
    let default = GpuAllocator::default();
    assert_eq!(default.usable_bytes(h100), 63_707_234_304);
    let high = settings(&[("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")]).unwrap();
    assert_eq!(high.usable_bytes(h100), (84_942_979_072u128 * 95 / 100) as u64);
    // preallocate=false grows the same pool to the same limit.
    let on_demand = settings(&[("XLA_PYTHON_CLIENT_PREALLOCATE", "false")]).unwrap();
    assert_eq!(on_demand.usable_bytes(h100), default.usable_bytes(h100));
    let platform = settings(&[("XLA_PYTHON_CLIENT_ALLOCATOR", "platform"), ("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")]);
    assert_eq!(platform.unwrap().usable_bytes(h100), h100);
}

#[test]
fn the_verdict_names_both_numbers_and_the_fraction_that_fits() {
    let device = 80 * GIB;
    let budget = GpuBudget::planned(GpuAllocator::default(), device);
    assert_eq!(budget.usable_bytes, 60 * GIB);
    assert_eq!(budget.shortfall(60 * GIB), None, "exactly the limit fits");
    // The run: 30 GiB of state + a 38.48 GiB temporary.
    let needed = 30 * GIB + (38.48 * GIB as f64) as u64;
    let e = budget.shortfall(needed).unwrap();
    assert!(e.contains("needs 68.48 GiB") && e.contains("may use 60.00 GiB") && e.contains("GPU's 80.00 GiB"), "{e}");
    assert!(e.contains("memory fraction 0.75 (XLA's default; XLA_PYTHON_CLIENT_MEM_FRACTION sets it)"), "{e}");
    // 68.48 / 80 = 0.856: the smallest hundredth that covers it.
    assert!(e.contains("Set XLA_PYTHON_CLIENT_MEM_FRACTION=0.86 "), "{e}");
    let raised = GpuBudget::planned(settings(&[("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.86")]).unwrap(), device);
    assert_eq!(raised.shortfall(needed), None);
    // The variable the user set is the one named.
    let new_name = GpuBudget::planned(settings(&[("XLA_CLIENT_MEM_FRACTION", "0.8")]).unwrap(), device);
    assert!(new_name.shortfall(needed).unwrap().contains("Set XLA_CLIENT_MEM_FRACTION=0.86"));
    // Past the advised fraction, or without a pool, no variable helps.
    let e = budget.shortfall(78 * GIB).unwrap();
    assert!(e.contains("needs 98% of the device") && e.contains("make the step smaller") && !e.contains("Set "), "{e}");
    let platform = GpuBudget::planned(settings(&[("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")]).unwrap(), device);
    assert_eq!(platform.shortfall(80 * GIB), None);
    assert!(platform.shortfall(81 * GIB).unwrap().contains("make the step smaller"));
}

#[test]
fn a_live_budget_takes_the_plugins_limit() {
    let allocator = settings(&[("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")]).unwrap();
    let live = GpuBudget::reported(allocator.clone(), Some(40 * GIB)).unwrap();
    assert_eq!((live.usable_bytes, live.device_bytes, live.reported), (40 * GIB, 80 * GIB, true));
    assert!(live.to_string().starts_with("40.00 GiB usable per GPU (the plugin's limit): "), "{live}");
    assert!(live.shortfall(50 * GIB).unwrap().contains("Set XLA_PYTHON_CLIENT_MEM_FRACTION=0.63 "));
    assert_eq!(GpuBudget::reported(allocator, None), None);
    let platform = settings(&[("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")]).unwrap();
    assert_eq!(GpuBudget::reported(platform, Some(80 * GIB)), None, "no pool: no limit to judge against");
}

/// A plugin that does not know an option refuses the client; the error names the option, the
/// variable and the file. The CPU plugin rejects options it does not know, as an older CUDA
/// plugin would.
#[test]
fn an_option_the_plugin_refuses_is_one_line_naming_the_variable() {
    let (_, plugin) = crate::pjrt::load_plugin(Some("cpu")).unwrap();
    let allocator = settings(&[("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")]).unwrap();
    let err = Client::create(&plugin, &allocator.client_options(), None).err().expect("the CPU plugin refuses it");
    let line = allocator.explain_create_error(&plugin, &err).expect("the error concerns memory_fraction");
    assert!(
        line.contains("refused the client option `memory_fraction` that XLA_PYTHON_CLIENT_MEM_FRACTION sets"),
        "{line}"
    );
    assert!(line.contains(&plugin.path().display().to_string()) && !line.contains('\n'), "{line}");
    assert_eq!(GpuAllocator::default().explain_create_error(&plugin, &err), None);
    assert!(!is_cuda_plugin(&plugin));
}
