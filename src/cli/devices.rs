//! `maxrs devices`: which plugin maxrs loads, what platform it is, and the devices it sees.

use anyhow::{bail, Context, Result};
use maxrs::pjrt::{self, Client, Value};

#[derive(clap::Args)]
pub struct DevicesArgs {
    /// Plugin: a path to a .so or a name (cpu, cuda12, cuda13, tpu). Default: $MAXRS_PJRT_PLUGIN, else cpu.
    #[arg(long)]
    plugin: Option<String>,
    /// Client options as key=value (CPU plugin: cpu_device_count=N).
    options: Vec<String>,
}

pub fn run(args: DevicesArgs) -> Result<()> {
    let mut create_options = Vec::new();
    for (key, value) in super::parse_key_values(&args.options)? {
        match key.as_str() {
            "cpu_device_count" => {
                let n: i64 = value
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .with_context(|| format!("cpu_device_count must be a positive integer, got {value:?}"))?;
                create_options.push((key, Value::I64(n)));
            }
            other => bail!("unknown option {other:?} for `maxrs devices`; valid: cpu_device_count=N"),
        }
    }
    let (resolved, plugin) = pjrt::load_plugin(args.plugin.as_deref())?;
    let client = Client::create(&plugin, &create_options, None)?;

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
    Ok(())
}
