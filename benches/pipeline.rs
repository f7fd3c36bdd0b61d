//! Pipeline parallelism's bubble on the CPU plugin's 8 devices: for 2 and 4 stages, 4, 8 and 16
//! microbatches, gpipe and 1f1b, the measured bubble (the stages' mean idle fraction between a
//! step's first task and its last, from each stage's task timeline) next to the schedule's
//! theory `(p - 1) / (m + p - 1)`, the bubble the schedule has when simulated with each task's
//! measured duration (so that the gap to the measured one is the runtime's: transfers, threads,
//! and here the host cores the stages share), the host's scheduling time per microbatch (a stage
//! thread's time that is neither running a program nor waiting for an input) and the step time.
//! Medians over the steps after the first (compilation and warm-up).
//!
//! The model: 8 llama layers (emb 128, 4 heads, mlp 512, vocab 512), 64 sequences of 128 tokens, f32,
//! `8 / p` layers per stage (one repeat), fsdp over the devices of a stage.
//!
//! `cargo bench --bench pipeline` (`PIPELINE_BENCH_STEPS=6` to change the steps per case)

use std::collections::HashMap;
use std::time::Instant;

use maxrs::config;
use maxrs::data::{self, ProcessShare};
use maxrs::pjrt::cpu_client;
use maxrs::train::pipeline::run::build;
use maxrs::train::run::StartupTimes;

const DEVICES: usize = 8;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() -> anyhow::Result<()> {
    std::env::set_var("TF_CPP_MIN_LOG_LEVEL", "1");
    let steps: usize = std::env::var("PIPELINE_BENCH_STEPS").unwrap_or_else(|_| "5".into()).parse()?;
    let client = cpu_client(DEVICES)?;
    println!(
        "pipeline bubble on {DEVICES} CPU devices ({} host cores), 8 layers, batch 64 x 128 tokens, f32; \
         median over steps 2..{steps}",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
    println!(
        "| stages | microbatches | schedule | bubble measured | bubble theory | bubble simulated from task times | \
         host per microbatch | step |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for stages in [2usize, 4] {
        for microbatches in [4usize, 8, 16] {
            for schedule in ["gpipe", "1f1b"] {
                let args: Vec<String> = [
                    "base_emb_dim=128",
                    "base_num_query_heads=4",
                    "base_num_kv_heads=4",
                    "head_dim=32",
                    "base_mlp_dim=512",
                    "base_num_decoder_layers=8",
                    "vocab_size=512",
                    "max_target_length=128",
                    "per_device_batch_size=8",
                    "dtype=float32",
                    "weight_dtype=float32",
                ]
                .iter()
                .map(|s| s.to_string())
                .chain([
                    format!("cpu_device_count={DEVICES}"),
                    format!("steps={steps}"),
                    format!("ici_pipeline_parallelism={stages}"),
                    format!("num_layers_per_pipeline_stage={}", 8 / stages),
                    format!("num_pipeline_microbatches={microbatches}"),
                    format!("pipeline_schedule={schedule}"),
                ])
                .collect();
                let c = config::load(None, &args)?;
                let derived = config::validate(&c, DEVICES, 1)?;
                let plan = derived.pipeline.clone().expect("a pipelined config");
                let granules = vec![(0..DEVICES as i64).collect::<Vec<_>>()];
                let mut pipeline = build(&c, &client, &derived, &granules, &mut StartupTimes::default())?;
                let mut batches = data::open_train(&c, derived.global_batch_size, ProcessShare::SINGLE, None)?;
                let (mut bubbles, mut overheads, mut times) = (Vec::new(), Vec::new(), Vec::new());
                let mut simulated = Vec::new();
                for step in 0..steps {
                    let batch = batches.next_batch()?.expect("synthetic data does not run out");
                    let t = Instant::now();
                    let result = pipeline.step(&batch)?;
                    if step > 0 {
                        times.push(t.elapsed().as_secs_f64());
                        bubbles.push(result.timeline.bubble());
                        overheads.push(result.host_overhead_per_microbatch);
                        let took: HashMap<_, f64> = result
                            .timeline
                            .per_stage
                            .iter()
                            .enumerate()
                            .flat_map(|(s, tasks)| {
                                tasks.iter().map(move |(task, start, end)| ((s, *task), end - start))
                            })
                            .collect();
                        let ideal = pipeline.schedule.simulate(|s, task| took[&(s, *task)])?;
                        simulated.push(ideal.bubble());
                    }
                }
                println!(
                    "| {stages} | {microbatches} | {schedule} | {:.1}% | {:.1}% | {:.1}% | {:.3} ms | {:.3} s |",
                    100.0 * median(bubbles),
                    100.0 * plan.theoretical_bubble(),
                    100.0 * median(simulated),
                    1e3 * median(overheads),
                    median(times)
                );
            }
        }
    }
    Ok(())
}
