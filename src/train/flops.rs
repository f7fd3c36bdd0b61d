//! Peak TFLOP/s per device kind, and MFU: the model's TFLOPs per step (`crate::model::flops`)
//! against what the devices could do.

/// Dense bf16 peak TFLOP/s of one device, from the PJRT device kind (`Device::kind()`), unless
/// `configured` (`peak_tflops_per_device`) overrides it. `None` when unknown (CPU, new chips):
/// then no MFU is reported rather than a wrong one.
pub fn peak_tflops_per_device(device_kind: &str, configured: Option<f64>) -> Option<f64> {
    if configured.is_some() {
        return configured;
    }
    let kind = device_kind.to_ascii_lowercase();
    // Vendor datasheets, dense (no 2:4 sparsity) bf16. H100 PCIe and NVL run at lower clocks
    // and power than SXM, hence the lower peaks; the H200 has the H100 SXM's compute.
    let table: &[(&str, f64)] = &[
        ("h100 pcie", 756.0),
        ("h100 nvl", 835.0),
        ("h100", 989.0),
        ("h200", 989.0),
        ("a100", 312.0),
        ("tpu v4", 275.0),
        ("tpu v5 lite", 197.0),
        ("tpu v5", 459.0),
        ("tpu v6 lite", 918.0),
    ];
    table.iter().find(|(needle, _)| kind.contains(needle)).map(|&(_, peak)| peak)
}

/// Model FLOPs utilisation: achieved over peak, as a fraction (0.5 = 50%).
pub fn mfu(tflops_per_sec_per_device: f64, peak_tflops_per_device: f64) -> f64 {
    tflops_per_sec_per_device / peak_tflops_per_device
}
