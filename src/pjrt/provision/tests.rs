use super::*;

#[test]
fn plugin_names_parse_and_display() {
    for name in PluginName::ALL {
        assert_eq!(name.to_string().parse::<PluginName>().unwrap(), name);
    }
    assert_eq!(" CUDA12 ".parse::<PluginName>().unwrap(), PluginName::Cuda12);
    let err = "gpu".parse::<PluginName>().unwrap_err().to_string();
    assert!(err.contains("`gpu`") && err.contains("cpu, cuda12, cuda13, tpu"), "{err}");
}

#[test]
fn specs_are_names_or_paths() {
    assert_eq!("tpu".parse::<PluginSpec>().unwrap(), PluginSpec::Name(PluginName::Tpu));
    assert_eq!("./cpu".parse::<PluginSpec>().unwrap(), PluginSpec::Path("./cpu".into()));
    assert_eq!("libtpu.so".parse::<PluginSpec>().unwrap(), PluginSpec::Path("libtpu.so".into()));
    assert!("cuda11".parse::<PluginSpec>().is_err());
}

#[test]
fn missing_path_spec_is_an_error_naming_it() {
    let cache = tempfile::tempdir().unwrap();
    let spec = PluginSpec::Path("/nonexistent/dir/plugin.so".into());
    let err = Provisioner::isolated(cache.path().into()).resolve(&spec, "--plugin").unwrap_err().to_string();
    assert!(err.contains("/nonexistent/dir/plugin.so") && err.contains("--plugin"), "{err}");
}

#[test]
fn unknown_spec_names_its_origin() {
    let err = resolve_plugin(Some("cuda11")).unwrap_err().to_string();
    assert!(err.contains("cuda11") && err.contains("--plugin"), "{err}");
}

#[test]
fn existing_path_spec_is_used_as_is() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let spec = PluginSpec::Path(file.path().into());
    let resolved = Provisioner::isolated(cache.path().into()).resolve(&spec, "--plugin").unwrap();
    assert_eq!(resolved.path, file.path());
    assert_eq!((resolved.source, resolved.version), (PluginSource::Path, None));
}

/// Hits PyPI (~60 MB): the first resolve downloads and unpacks, the second finds the cache.
#[test]
fn downloads_cpu_plugin_then_uses_cache() {
    let cache = tempfile::tempdir().unwrap();
    let provisioner = Provisioner::isolated(cache.path().into());
    let first = provisioner.plugin(PluginName::Cpu).unwrap();
    assert_eq!(first.source, PluginSource::Download);
    assert_eq!(first.path, cache.path().join("plugins/lammps-jax-pjrt-cpu-0.11.2/pjrt_c_api_cpu_plugin.so"));
    assert_eq!(first.version.as_deref(), Some("0.11.2"));
    assert!(std::fs::metadata(&first.path).unwrap().len() > 100 << 20);
    let downloads: Vec<_> = std::fs::read_dir(cache.path().join("downloads")).unwrap().collect();
    assert!(downloads.is_empty(), "the wheel must be deleted once the plugin is unpacked");

    let second = provisioner.plugin(PluginName::Cpu).unwrap();
    assert_eq!(second.source, PluginSource::Cache);
    assert_eq!(second.path, first.path);
}

/// The lock holds the wheel `pick` would choose for each plugin on x86_64 (every plugin) and
/// aarch64 (the CUDA ones, the only ones published for it).
#[test]
fn every_pinned_plugin_wheel_is_locked() {
    for name in PluginName::ALL {
        let pin = name.pin();
        let arches: &[&str] = if name.cuda_major().is_some() { &["x86_64", "aarch64"] } else { &["x86_64"] };
        for arch in arches {
            let picked =
                pin.locked_wheel(arch).unwrap_or_else(|| panic!("no locked wheel of {} for {arch}", pin.requirement()));
            assert_eq!(lock::sha256(picked).map(str::len), Some(64));
        }
    }
}
