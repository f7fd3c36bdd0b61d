//! A sharded state on 8 CPU devices in one process, its devices split as if they were hosts:
//! the state's blocks as the runtime lays them out and copies them off the devices
//! (`Compiled::input_blocks`, `fetch_blocks`), written by 2 virtual hosts (each the blocks the
//! write plan gives it, `shards::to_write`), committed in one manifest, then read by 4 virtual
//! hosts of another mesh (each only the slices its devices' blocks need), put onto that mesh's
//! devices (`Compiled::put_blocks`) and run: every element equals the saved state.

use std::collections::BTreeMap;

use maxrs::checkpoint::dir::{load_blocks, manifest_of, write_manifest, write_part, Expected, Share};
use maxrs::checkpoint::shards::{to_write, ArrayLayout, HostArray};
use maxrs::files::Location;
use maxrs::host::HostTensor;
use maxrs::ir::{DType, Program, Signature};
use maxrs::pjrt::cpu_client;
use maxrs::runtime::{self, Compiled};
use maxrs::sharding::{Mesh, PartitionSpec};
use maxrs::tensor::{trace, Tree};

/// `params.w` [8, 6] split over fsdp (replicated over data), `params.b` [16] over data and fsdp,
/// `opt_state.count` replicated: the program passes them through (a step that changes nothing).
fn program(mesh: Mesh) -> Program {
    let specs = [
        ("params.w", vec![8, 6], PartitionSpec::new(&[&["fsdp"], &[]])),
        ("params.b", vec![16], PartitionSpec::new(&[&["data", "fsdp"]])),
        ("opt_state.count", vec![], PartitionSpec::replicated()),
    ];
    let mut sig = Signature::new(Some(mesh));
    for (name, dims, spec) in &specs {
        let ty = if dims.is_empty() { DType::S32 } else { DType::F32 };
        sig.input(name, ty, dims).sharded(spec.clone());
        sig.output_sharding(name, spec.clone());
    }
    trace(&sig, |_, i| {
        let mut out = Tree::new();
        for (name, ..) in &specs {
            out.insert(*name, i[*name].clone());
        }
        out
    })
    .unwrap()
}

fn layouts(compiled: &Compiled, granules: &[Vec<i64>]) -> Vec<ArrayLayout> {
    compiled
        .program
        .inputs
        .iter()
        .enumerate()
        .map(|(i, spec)| ArrayLayout {
            name: spec.name.clone(),
            ty: spec.ty.dtype,
            dims: spec.ty.shape.to_vec(),
            blocks: compiled.input_blocks(i, granules).unwrap(),
        })
        .collect()
}

#[test]
fn a_state_saved_by_two_virtual_hosts_restores_onto_four_of_another_mesh() {
    let client = cpu_client(8).unwrap();
    let ids: Vec<i64> = (0..8).collect();
    let state: BTreeMap<&str, HostTensor> = BTreeMap::from([
        ("params.w", HostTensor::from_f32(&[8, 6], &(0..48).map(|v| v as f32 * 0.5 - 3.0).collect::<Vec<_>>())),
        ("params.b", HostTensor::from_f32(&[16], &(0..16).map(|v| (v * v) as f32).collect::<Vec<_>>())),
        ("opt_state.count", HostTensor::from_i32(&[], &[41])),
    ]);

    // Saved on data 2 x fsdp 4, the two "hosts" holding devices 0-3 and 4-7.
    let saving = runtime::compile(&client, &program(Mesh::new(&[("data", 2), ("fsdp", 4)]))).unwrap();
    let on_devices: Vec<_> =
        (0..3).map(|i| saving.put(&client, i, &state[saving.program.inputs[i].name.as_str()]).unwrap()).collect();
    let outputs = saving.execute(&on_devices.iter().collect::<Vec<_>>()).unwrap();
    let hosts2 = vec![ids[..4].to_vec(), ids[4..].to_vec()];
    let saved_layouts = layouts(&saving, &hosts2);
    let tmp = tempfile::tempdir().unwrap();
    let dir = Location::Local(tmp.path().to_path_buf());
    let mut parts = Vec::new();
    let mut shares = Vec::new();
    for host in 0..2 {
        // What this host's devices hold: the blocks of its own devices.
        let held: Vec<HostArray> = saved_layouts
            .iter()
            .map(|layout| {
                let mine = layout.blocks_of(host);
                let out = saving.output_index(&layout.name).unwrap();
                let blocks = saving
                    .fetch_blocks(out, &outputs[out])
                    .unwrap()
                    .into_iter()
                    .filter(|(b, _)| mine.contains(b))
                    .collect();
                HostArray { name: layout.name.clone(), ty: layout.ty, dims: layout.dims.clone(), blocks }
            })
            .collect();
        let share = Share {
            step: Some(7),
            arrays: to_write(&saved_layouts, held, host, 2).unwrap(),
            model: BTreeMap::new(),
            data: None,
        };
        parts.push(write_part(&dir, &share, host, 2).unwrap());
        shares.push(share);
    }
    // "params.w" is replicated over data (across the hosts): each of its 4 blocks written once,
    // the hosts sharing them.
    let w_slices: Vec<usize> = parts.iter().map(|p| p.slices.iter().filter(|(n, _)| n == "params.w").count()).collect();
    assert_eq!(w_slices.iter().sum::<usize>(), 4, "{w_slices:?}");
    assert!(w_slices.iter().all(|&n| n > 0), "both hosts write part of the replicated array: {w_slices:?}");
    write_manifest(&dir, &manifest_of(&shares[0], 2, parts).unwrap()).unwrap();

    // Restored on fsdp 2 x data 4, four "hosts" of 2 devices.
    let restoring = runtime::compile(&client, &program(Mesh::new(&[("fsdp", 2), ("data", 4)]))).unwrap();
    let hosts4: Vec<Vec<i64>> = ids.chunks(2).map(|c| c.to_vec()).collect();
    let restored_layouts = layouts(&restoring, &hosts4);
    let expected: Vec<Expected> =
        restored_layouts.iter().map(|l| Expected { name: l.name.clone(), ty: l.ty, dims: l.dims.clone() }).collect();
    let total: u64 = state.values().map(|t| t.data.len() as u64).sum();
    let mut read: BTreeMap<String, HostArray> = BTreeMap::new();
    for host in 0..4 {
        let wanted = restored_layouts.iter().map(|l| (l.name.clone(), l.blocks_of(host))).collect();
        let loaded = load_blocks(&dir, &expected, &BTreeMap::new(), false, &wanted).unwrap();
        assert!(loaded.bytes_read < total, "host {host} read {} of {total} bytes", loaded.bytes_read);
        for (name, array) in loaded.arrays {
            read.entry(name)
                .or_insert_with(|| HostArray { blocks: vec![], ..array.clone() })
                .blocks
                .extend(array.blocks);
        }
    }
    let on_devices: Vec<_> = restoring
        .program
        .inputs
        .iter()
        .enumerate()
        .map(|(i, spec)| restoring.put_blocks(&client, i, |b| read[&spec.name].block(&b.to_vec())).unwrap())
        .collect();
    let outputs = restoring.execute(&on_devices.iter().collect::<Vec<_>>()).unwrap();
    for (i, spec) in restoring.program.outputs.iter().enumerate() {
        assert_eq!(restoring.fetch(i, &outputs[i]).unwrap(), state[spec.name.as_str()], "{}", spec.name);
    }
}
