//! `maxrs devices`: which plugin maxrs loads, what platform it is, and the devices it sees (on
//! GPUs with the memory JAX's allocator variables leave usable).

use anyhow::{bail, Context, Result};
use maxrs::pjrt::gpu_memory;
use maxrs::pjrt::provision::choose_plugin;
use maxrs::pjrt::{self, Value};

#[derive(clap::Args)]
pub struct DevicesArgs {
    /// Plugin: a path to a .so or a name (cpu, cuda12, cuda13, tpu); same as plugin=P.
    /// Default: $MAXRS_PJRT_PLUGIN, else cpu.
    #[arg(long)]
    plugin: Option<String>,
    /// plugin=P, and client options as key=value (CPU plugin: cpu_device_count=N).
    options: Vec<String>,
}

pub fn run(args: DevicesArgs) -> Result<()> {
    let mut create_options = Vec::new();
    let mut plugin_key = None;
    for (key, value) in super::parse_key_values(&args.options)? {
        match key.as_str() {
            "plugin" => plugin_key = Some(value),
            "cpu_device_count" => {
                let range = maxrs::config::range("cpu_device_count").expect("a numeric key");
                let n: i64 = value
                    .parse()
                    .ok()
                    .filter(|n| range.contains(*n as f64))
                    .with_context(|| format!("cpu_device_count={value}; it must be {range}"))?;
                create_options.push((key, Value::I64(n)));
            }
            other => bail!("unknown option {other:?} for `maxrs devices`; valid: plugin=P, cpu_device_count=N"),
        }
    }
    let choice = choose_plugin(args.plugin.as_deref(), plugin_key.as_deref())?;
    let (resolved, plugin) = pjrt::load_chosen_plugin(&choice)?;
    // A CUDA client gets the allocator JAX's variables set, as `maxrs train` does.
    let client = gpu_memory::create_client(&plugin, create_options, None)?;

    let origin = match (&resolved.package, &resolved.version) {
        (Some(package), Some(version)) => format!(" ({package} {version}, from {})", resolved.source),
        _ => format!(" (from {})", resolved.source),
    };
    let (major, minor) = plugin.api_version();
    println!("plugin    {}{origin}", resolved.path.display());
    println!("platform  {} (version {})", client.platform_name()?, client.platform_version()?);
    println!("PJRT API  {major}.{minor} (maxrs binding {}.{})", pjrt::ffi::API_MAJOR, pjrt::ffi::API_MINOR);
    let devices = client.devices()?;
    println!("process   {}", client.process_index()?);
    println!("devices   {}", devices.len());
    println!("  {:>4}  {:<24} {:>7}  {:>12}", "id", "kind", "process", "memory");
    for device in &devices {
        let memory = match device.memory_stats()? {
            Some(stats) => match stats.bytes_limit {
                Some(limit) => format!("{:.1} GiB", limit as f64 / (1u64 << 30) as f64),
                None => format!("{} B used", stats.bytes_in_use),
            },
            None => "-".to_string(),
        };
        println!("  {:>4}  {:<24} {:>7}  {:>12}", device.id, device.kind, device.process_index, memory);
    }
    if let Some(line) = gpu_memory::describe_client(&client)? {
        println!("{line}");
    }
    Ok(())
}
