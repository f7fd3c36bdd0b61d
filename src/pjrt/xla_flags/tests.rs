use super::*;
use crate::pjrt::provision::{PluginName, Provisioner};

fn flag(name: &str, value: Option<&str>) -> XlaFlag {
    XlaFlag { name: name.into(), value: value.map(String::from) }
}

#[test]
fn parses_like_xla() {
    let text =
        "  --xla_a=1\t--xla_b\n--xla_c=\"two words \\\" \\\\\" --xla_d='a \\ b' --xla_e= --xla_f=x=\"y\" --xla_a=3 ";
    let flags = XlaFlags::parse(text).unwrap();
    let expected = vec![
        flag("xla_a", Some("3")),
        flag("xla_b", None),
        flag("xla_c", Some("two words \" \\")),
        flag("xla_d", Some("a \\ b")),
        flag("xla_e", Some("")),
        flag("xla_f", Some("x=\"y\"")),
    ];
    assert_eq!(flags.iter().cloned().collect::<Vec<_>>(), expected);
    assert_eq!(flags.get("xla_b"), Some(None));
    assert_eq!(flags.get("xla_zzz"), None);
}

#[test]
fn refuses_what_xla_would_ignore_or_reject() {
    for (text, needle) in [
        ("--xla_a=1 stray --xla_b=2", "`stray` is not a flag"),
        ("-xla_a=1", "one dash"),
        ("--xla_a=1 -- --xla_b", "bare `--`"),
        ("--xla_a=\"open", "no closing \""),
    ] {
        let err = XlaFlags::parse(text).unwrap_err().to_string();
        assert!(err.contains(needle), "{text:?}: {err}");
    }
}

#[test]
fn env_string_round_trips() {
    let mut flags = XlaFlags::default();
    for (name, value) in [
        ("xla_dump_to", Some("/tmp/my dumps")),
        ("xla_q", Some("'quoted")),
        ("xla_back", Some("a\\b \"c\"")),
        ("xla_gpu_enable_command_buffer", Some("")),
        ("xla_bool", None),
        ("xla_plain", Some("x=y")),
    ] {
        flags.set(name, value);
    }
    let env = flags.to_env_string();
    assert!(env.starts_with("--xla_dump_to=\"/tmp/my dumps\" "), "{env}");
    assert_eq!(XlaFlags::parse(&env).unwrap(), flags);
}

#[test]
fn merge_lets_later_sources_win_and_keeps_order() {
    let mut flags = XlaFlags::parse("--xla_a=1 --xla_b=2").unwrap();
    flags.merge(&XlaFlags::parse("--xla_c=3 --xla_a=9").unwrap());
    assert_eq!(flags.to_env_string(), "--xla_a=9 --xla_b=2 --xla_c=3");
}

#[test]
fn flags_files_allow_comment_lines() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.flags");
    std::fs::write(&path, "# tuned for tests\n--xla_a=1\n  # indented comment\n--xla_b=\"x y\"\n").unwrap();
    assert_eq!(load_flags_file(&path).unwrap().to_env_string(), "--xla_a=1 --xla_b=\"x y\"");
    std::fs::write(&path, "--xla_a=1 oops\n").unwrap();
    let err = load_flags_file(&path).unwrap_err().to_string();
    assert!(err.contains("x.flags") && err.contains("oops"), "{err}");
}

fn repo_file(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

#[test]
fn shipped_flag_files_parse_and_have_no_comments() {
    for name in ["cpu", "h100", "a3mega", "a3mega-1", "a3mega-2", "a3mega-4", "a3mega-8", "a3mega-16"] {
        let path = repo_file(&format!("xla_flags/{name}.flags"));
        let text = std::fs::read_to_string(&path).unwrap();
        // `XLA_FLAGS="$(cat file)"` and XLA's own file reading do not skip comments.
        assert!(!text.contains('#'), "{name}.flags must stay comment-free");
        assert!(!XlaFlags::parse(&text).unwrap().is_empty());
    }
}

/// Uses the CPU plugin (installed, cached or downloaded once, ~60 MB).
fn cpu_plugin() -> std::path::PathBuf {
    Provisioner::from_env().plugin(PluginName::Cpu).unwrap().path
}

#[test]
fn cpu_flags_are_known_to_the_cpu_plugin() {
    let flags = load_flags_file(&repo_file("xla_flags/cpu.flags")).unwrap();
    let start = std::time::Instant::now();
    flags.validate_against_plugin(&cpu_plugin()).unwrap();
    eprintln!("validated {} flags in {:?}", flags.iter().count(), start.elapsed());
}

#[test]
fn unknown_flag_is_refused_with_suggestion_and_plugin() {
    let plugin = cpu_plugin();
    let flags =
        XlaFlags::parse("--xla_cpu_multi_thread_eigen=true --xla_cpu_multi_thread_eigan=false --xla_gpu_graph_level=0")
            .unwrap();
    let err = flags.validate_against_plugin(&plugin).unwrap_err().to_string();
    assert!(err.contains("2 XLA flags are unknown"), "{err}");
    assert!(err.contains("--xla_cpu_multi_thread_eigan: did you mean --xla_cpu_multi_thread_eigen?"), "{err}");
    // Removed from XLA (only its reserved proto field name is left in the library).
    assert!(err.contains("--xla_gpu_graph_level"), "{err}");
    assert!(err.contains(&plugin.display().to_string()), "{err}");
}

/// MaxText's per-node-count thresholds (`src/maxtext/configs/gpu/a3/llama_2_7b/<N>vm.sh`, main at
/// e591f30); `a3mega` is the 2-node set.
#[test]
fn a3mega_sets_follow_the_node_count() {
    const MIB: u64 = 1 << 20;
    for (nodes, all_reduce, reduce_scatter) in [
        (1, 128 * MIB, 64 * MIB),
        (2, 64 * MIB, 64 * MIB),
        (4, 512 * MIB, 64 * MIB),
        (8, 1024 * MIB, 64 * MIB),
        (16, 1024 * MIB, 128 * MIB),
    ] {
        let name = a3mega_for_nodes(nodes);
        assert_eq!(name, format!("a3mega-{nodes}"));
        let flags = load_flags_file(&repo_file(&format!("xla_flags/{name}.flags"))).unwrap();
        let value = |flag: &str| flags.get(flag).flatten().map(|v| v.parse::<u64>().unwrap());
        assert_eq!(value("xla_gpu_all_reduce_combine_threshold_bytes"), Some(all_reduce), "{name}");
        assert_eq!(value("xla_gpu_reduce_scatter_combine_threshold_bytes"), Some(reduce_scatter), "{name}");
        assert_eq!(value("xla_gpu_all_gather_combine_threshold_bytes"), Some(128 * MIB), "{name}");
        assert_eq!(flags.get("xla_gpu_pipeline_all_gather"), Some(Some("on")), "{name}");
    }
    assert_eq!(a3mega_for_nodes(3), "a3mega-2");
    assert_eq!(a3mega_for_nodes(32), "a3mega-16");
    let two = std::fs::read_to_string(repo_file("xla_flags/a3mega-2.flags")).unwrap();
    assert_eq!(std::fs::read_to_string(repo_file("xla_flags/a3mega.flags")).unwrap(), two);
}

/// Every GPU set's flag names are in the CUDA plugin maxrs fetches (downloaded once, ~490 MB,
/// as the AOT tests do).
#[test]
fn gpu_flag_files_are_known_to_the_cuda_plugin() {
    let plugin = Provisioner::from_env().plugin(PluginName::Cuda12).unwrap().path;
    for name in ["a3mega-1", "a3mega-2", "a3mega-4", "a3mega-8", "a3mega-16", "h100"] {
        let flags = load_flags_file(&repo_file(&format!("xla_flags/{name}.flags"))).unwrap();
        flags.validate_against_plugin(&plugin).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    }
}
