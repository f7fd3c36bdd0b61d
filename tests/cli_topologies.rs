//! `maxrs topologies` as a user runs it: one row per catalog family, with its device facts.

use std::process::Command;

use maxrs::aot::topology::catalog;

#[test]
fn lists_every_family_with_its_devices() {
    let out = Command::new(env!("CARGO_BIN_EXE_maxrs")).arg("topologies").output().expect("run maxrs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let row = |pattern: &str| -> Vec<&str> {
        let line = stdout.lines().find(|l| l.starts_with(&format!("{pattern} "))).unwrap_or_else(|| {
            panic!("no row for {pattern} in:\n{stdout}");
        });
        line.split("  ").map(str::trim).filter(|cell| !cell.is_empty()).collect()
    };
    for family in catalog() {
        let cells = row(family.pattern);
        assert_eq!(cells[1], family.platform.to_string(), "{cells:?}");
        assert_eq!(cells[2], family.device_kind, "{cells:?}");
    }
    assert_eq!(row("a3mega-N")[3..], ["79.11 GiB", "8", "1 to 4096 hosts"]);
    assert_eq!(row("cpu-N")[3..5], ["host", "-"]);
    let v5e = row("v5e-N");
    assert_eq!(v5e[3..], ["16.00 GiB", "-", "1, 4, 8, 16, 32, 64, 128, 256"]);
    // The long v5p list wraps onto indented lines under its column.
    assert!(stdout.contains(",\n ") && stdout.contains(" 17920\n"), "{stdout}");
}
