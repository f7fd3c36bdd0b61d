use super::*;

fn tpu_args(t: &Topology) -> (&str, &[(&'static str, OptionValue)]) {
    match &t.args {
        TopologyArgs::Tpu { name, options } => (name.as_str(), options.as_slice()),
        other => panic!("not a TPU topology: {other:?}"),
    }
}

#[test]
fn a3mega_2_is_two_hosts_of_eight_h100() {
    let t = lookup("a3mega-2", 1).unwrap();
    assert_eq!((t.num_devices(), t.num_hosts(), t.devices_per_host), (16, 2, 8));
    assert_eq!(t.platform, Platform::Cuda);
    assert_eq!(t.device_kind, "NVIDIA H100 80GB HBM3");
    assert_eq!(t.args, TopologyArgs::Gpu { topology: "2x1x8".into(), target: GpuTarget::H100Sxm });
}

#[test]
fn gpu_names_and_maxtext_a3_slices() {
    let a3 = lookup("a3", 4).unwrap();
    assert_eq!((a3.num_devices(), a3.num_hosts()), (32, 4));
    assert_eq!(a3.args, TopologyArgs::Gpu { topology: "4x1x8".into(), target: GpuTarget::H100Sxm });
    let ultra = lookup("a3ultra-3", 1).unwrap();
    assert_eq!((ultra.num_devices(), ultra.memory_bytes_per_device), (24, Some(151_397_597_184)));
    assert_eq!(
        lookup("h100-1", 1).unwrap().args,
        TopologyArgs::Gpu { topology: "1x1x1".into(), target: GpuTarget::H100Sxm }
    );
    assert_eq!(lookup("h100-8", 1).unwrap().num_devices(), 8);
    assert!(lookup("h100-4", 1).unwrap_err().to_string().contains("h100-1 and h100-8"));
}

#[test]
fn v5e_256_two_slices() {
    let t = lookup("v5e-256", 2).unwrap();
    assert_eq!((t.num_devices(), t.hosts_per_slice, t.devices_per_host), (512, 64, 4));
    let (name, options) = tpu_args(&t);
    assert_eq!(name, "v5e:16x16");
    assert_eq!(
        options,
        &[
            ("chip_config_name", OptionValue::Str("default".into())),
            ("chips_per_host_bounds", OptionValue::Ints(vec![2, 2, 1])),
            ("wrap", OptionValue::Ints(vec![1, 1, 0])),
            ("num_slices", OptionValue::Int(2)),
        ]
    );
}

#[test]
fn tpu_names_map_like_maxtext() {
    // (name, libtpu topology, devices per slice, wrap) from MaxText's accelerator_to_spec_map.py.
    for (name, topology, devices, wrap) in [
        ("v4-8", "v4:2x2x1", 4, [0, 0, 0]),
        ("v4-128", "v4:4x4x4", 64, [1, 1, 1]),
        ("v4-384", "v4:4x4x12", 192, [1, 1, 1]),
        ("v4-4096", "v4:8x16x16", 2048, [1, 1, 1]),
        ("v5p-64", "v5:2x4x4", 32, [0, 0, 0]),
        ("v5p-640", "v5:4x4x20", 320, [1, 1, 1]),
        ("v5p-1152", "v5:4x12x12", 576, [1, 1, 1]),
        ("v5p-7808", "v5:4x4x244", 3904, [1, 1, 1]),
        ("v5p-10368", "v5:12x12x36", 5184, [1, 1, 1]),
        ("v5p-17920", "v5:16x20x28", 8960, [1, 1, 1]),
        ("v5e-1", "v5e:1x1", 1, [0, 0, 0]),
        ("v5e-128", "v5e:8x16", 128, [0, 1, 0]),
        ("v6e-8", "v6e:2x4", 8, [0, 0, 0]),
        ("v6e-256", "v6e:16x16", 256, [1, 1, 0]),
    ] {
        let t = lookup(name, 1).unwrap();
        let (got, options) = tpu_args(&t);
        assert_eq!((got, t.devices_per_slice()), (topology, devices), "{name}");
        assert!(options.contains(&("wrap", OptionValue::Ints(wrap.to_vec()))), "{name}: {options:?}");
    }
    assert_eq!(lookup("v4-8", 1).unwrap().hosts_per_slice, 1);
    assert_eq!(lookup("v5e-1", 1).unwrap().devices_per_host, 1);
}

#[test]
fn sizes_maxtext_does_not_list_are_refused_with_the_valid_ones() {
    for name in ["v5p-8576", "v5p-7", "v4-640", "v5e-2", "v6e-512"] {
        let err = lookup(name, 1).unwrap_err().to_string();
        assert!(err.contains(name) && err.contains("takes N in"), "{err}");
    }
    let err = lookup("v5e-3", 1).unwrap_err().to_string();
    assert!(err.contains("1, 4, 8, 16, 32, 64, 128, 256"), "{err}");
}

#[test]
fn unknown_names_list_the_valid_ones() {
    for name in ["tpu-8", "a3mega", "a3mega-0", "v5e-x", "h200-8"] {
        let err = lookup(name, 1).unwrap_err().to_string();
        assert!(err.contains(name) && err.contains("a3mega-N") && err.contains("v5e-N"), "{err}");
    }
    assert!(lookup("cpu-8", 0).is_err());
}

#[test]
fn cpu_topology_is_one_process() {
    let t = lookup("cpu-8", 1).unwrap();
    assert_eq!((t.num_devices(), t.args.clone()), (8, TopologyArgs::Cpu { device_count: 8 }));
    assert!(lookup("cpu-8", 2).unwrap_err().to_string().contains("cpu-16"));
}

/// `cpu-100000` crashed inside XLA and `cpu-20000` aborted in one of its checks; a huge GPU
/// target overflowed the host count.
#[test]
fn targets_too_large_to_compile_for_are_refused_with_the_bound() {
    assert_eq!(lookup("cpu-1024", 1).unwrap().num_devices(), 1024);
    let e = lookup("cpu-100000", 1).unwrap_err().to_string();
    assert!(e.contains("at most 1024 devices (cpu-1 to cpu-1024)"), "{e}");
    assert_eq!(lookup("a3mega-4096", 1).unwrap().num_hosts(), 4096);
    let e = lookup("a3mega-4294967295", 2).unwrap_err().to_string();
    assert!(e.contains("is 8589934590 GPU hosts; maxrs compiles for at most 4096"), "{e}");
    assert!(lookup("h100-8", 4097).unwrap_err().to_string().contains("4097 GPU hosts"));
    let e = lookup("cpu-4294967295", 2).unwrap_err().to_string();
    assert!(e.contains("at most 1024 devices"), "{e}");
}

#[test]
fn catalog_lists_every_family() {
    let patterns: Vec<_> = catalog().iter().map(|f| f.pattern).collect();
    assert_eq!(
        patterns,
        ["a3-N", "a3mega-N", "a3ultra-N", "h100-1", "h100-8", "cpu-N", "v4-N", "v5e-N", "v5p-N", "v6e-N"]
    );
    let v5p = catalog().into_iter().find(|f| f.pattern == "v5p-N").unwrap();
    assert!(
        v5p.sizes.starts_with("8, 16, 32, 64, 128, 256, 384") && v5p.sizes.ends_with("12288, 13824, 17920"),
        "{}",
        v5p.sizes
    );
}
