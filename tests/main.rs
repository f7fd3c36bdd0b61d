//! maxrs's integration tests, one binary: each module is one area's tests (the file of the same
//! name), `common` holds the independent references and fixtures they share. One crate links
//! once, so adding a test costs no new link of the whole library.

/// XLA's cheapest compile for every plugin this binary loads and every `maxrs` it starts
/// (children inherit the variable): optimization level 0 and no expensive LLVM passes (CPU and
/// GPU), on the CPU the elemental emitter for fusions instead of the MLIR fusion emitters
/// (`xla_cpu_disable_new_fusion_emitters`, a backend extra option: each fusion's MLIR pipeline
/// was most of a compile; the default model's step compiles in 0.62 s instead of 1.7, the whole
/// run takes half the CPU, its losses the same), and for the deviceless GPU compiles of the AOT
/// tests no autotuning, no Triton or cuBLASLt GEMM fusions and `ptxas -O0`. The tests check
/// numbers to tolerances that do not depend on XLA's optimizations, and compiling is most of
/// their time (measured: 35-40% less CPU for the pipeline and Mixtral tests; a deviceless H100
/// compile of the default step 11.9 -> 4.3 CPU-s; all pass either way). A user's own `XLA_FLAGS` is kept as it is; benchmarks
/// and runs keep XLA's defaults.
///
/// One test thread more than the machine has cores (unless `RUST_TEST_THREADS` or
/// `--test-threads` says otherwise): many tests spend part of their time waiting (on the `maxrs`
/// processes they start, on a deadline, on a killed process), and a thread per core leaves a
/// core idle while one waits (measured on 2 cores: the tests used 1.83 of them).
///
/// The runs of the tests (in this process and the `maxrs` they start) share one compilation
/// cache (`jax_cache_dir`, set through MaxText's `M_JAX_CACHE_DIR`) in Cargo's scratch directory
/// for tests, not the user's `~/jax_cache`: a program that several tests compile (a resumed run,
/// the default model's step) is compiled once per build directory. Every compile is written
/// (`JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0`; JAX's default 1 s would keep the tiny
/// models' sub-second compiles out of it, and those are most of the tests' programs).
///
/// No Python interpreter is asked for pip-installed plugins (`MAXRS_PYTHON` empty): the tests
/// use the plugins maxrs fetches, and through pyenv's shims every `maxrs` started would spend
/// ~0.2 CPU-s starting one.
///
/// And libtpu's variables (`maxrs::aot::compile::prepare_libtpu_environment`) and the GCS
/// emulator's address (`common::gcs_emulator::reserve_address`), set here rather than by the
/// first test that needs them: setting the environment while another test's XLA spawns `ptxas`
/// made that spawn fail ("Bad address").
// SAFETY: a constructor runs before `main`, while the process has one thread, so nothing can
// read the environment while it is changed; it only sets environment variables.
#[ctor::ctor(unsafe)]
fn fast_cached_compiles_unless_the_user_chose_otherwise() {
    let unless_set = |name: &str, value: &dyn Fn() -> String| {
        if std::env::var_os(name).is_none() {
            std::env::set_var(name, value());
        }
    };
    unless_set("XLA_FLAGS", &|| {
        let cpu = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true \
                   --xla_backend_extra_options=xla_cpu_disable_new_fusion_emitters=true";
        let gpu = "--xla_gpu_autotune_level=0 --xla_gpu_enable_triton_gemm=false --xla_gpu_enable_cublaslt=false \
                   --xla_gpu_disable_gpuasm_optimizations=true";
        format!("{cpu} {gpu}")
    });
    unless_set("RUST_TEST_THREADS", &|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores + 1).to_string()
    });
    unless_set("MAXRS_PYTHON", &String::new);
    unless_set("M_JAX_CACHE_DIR", &|| concat!(env!("CARGO_TARGET_TMPDIR"), "/jax_cache").to_string());
    unless_set("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", &|| "0".to_string());
    maxrs::aot::compile::prepare_libtpu_environment();
    std::env::set_var("STORAGE_EMULATOR_HOST", common::gcs_emulator::reserve_address());
}

mod aot_compile;
mod aot_plugin_build;
mod aot_train;
mod attention;
mod checkpoint_hosts;
mod checkpoint_jobs;
mod checkpoint_process;
mod checkpoint_resume;
mod cli_devices;
mod cli_hardening;
mod cli_topologies;
mod cli_train;
mod cluster;
mod common;
mod compile_cache;
mod config;
mod config_key_walk;
mod config_numbers;
mod context_parallel;
mod convert_families;
mod convert_hf;
mod cudnn_golden;
mod cudnn_model;
mod data_gcs;
mod data_hf_path;
mod data_mixture;
mod data_sft;
mod data_sources;
mod data_synthetic;
mod data_text;
mod data_tokenizer;
mod data_train;
mod decode;
mod deepseek;
mod docs_book;
mod dpo;
mod errors;
mod fp8;
mod fp8_gpu_hlo;
mod fp8_moe;
mod fuzz;
mod gemma4;
mod gpu_memory;
mod grad_check;
mod hardening_checkpoint3;
mod hardening_data3;
mod hardening_inputs;
mod hardening_misc;
mod hardening_net;
mod hardening_outputs;
mod hardening_round3;
mod layers;
mod lora;
mod lowering_snapshot;
mod manual_computation;
mod maxtext_files;
mod mixtral;
mod model_families;
mod model_files;
mod model_packing;
mod model_reference;
mod moe_deepseek;
mod moe_reference;
mod ops_values;
mod orbax;
mod param_names;
mod pipeline;
mod pipeline_checkpoints;
mod pipeline_eval;
mod pipeline_hosts;
mod pjrt_runtime;
mod qwen2;
mod qwen3_custom;
mod random;
mod run_outputs;
mod scan_remat;
mod sharding;
mod storage;
mod submit;
mod train_flops;
mod train_metrics;
mod train_params_io;
mod train_pipeline;
mod train_run;
mod train_schedule;
mod train_step;
mod vocab_tiling;
