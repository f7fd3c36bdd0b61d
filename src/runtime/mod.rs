//! Running traced programs on a PJRT client: lower to StableHLO, compile (SPMD over the
//! program's mesh, device assignment in mesh order), split each host input into the blocks its
//! sharding gives each device, execute, and reassemble the outputs from their shards.
//! [`artifact`] is the file a compiled train step travels in (`compiled_trainstep_file`): written
//! by `maxrs train-compile`, loaded by `maxrs train` instead of compiling.

pub mod artifact;

use crate::host::{assemble, block_of, shard, whole, Bounds, HostTensor};
use crate::ir::Program;
use crate::lower::to_stablehlo;
use crate::pjrt::{Buffer, Client, CompileOptions, Device, LoadedExecutable};
use crate::tensor::Tree;
use anyhow::{anyhow, bail, Context, Result};

/// A global array on the devices: one buffer per addressable device, in execution order.
pub type DeviceArray = Vec<Buffer>;

/// A program compiled for a client, with what is needed to feed and read it.
pub struct Compiled {
    pub program: Program,
    pub executable: LoadedExecutable,
    /// Per addressable device (execution order): its position in the mesh.
    positions: Vec<usize>,
    /// Per addressable device: the type and shape of its block of each input, what its
    /// arguments must be.
    blocks: Vec<Vec<(crate::host::DType, Vec<i64>)>>,
}

/// Lowers and compiles `program` on `client`.
pub fn compile(client: &Client, program: &Program) -> Result<Compiled> {
    compile_lowered(client, program, &to_stablehlo(program))
}

/// Compiles `program`, already lowered to `mlir`, on `client`: SPMD over the program's mesh
/// (device assignment in mesh order), or for one device.
pub fn compile_lowered(client: &Client, program: &Program, mlir: &str) -> Result<Compiled> {
    let executable = client.compile(mlir, &compile_options(program)).context("compiling the lowered program")?;
    Compiled::new(program, executable)
}

/// What [`compile_lowered`] tells the plugin: SPMD over the program's mesh, devices assigned in
/// mesh order.
pub fn compile_options(program: &Program) -> CompileOptions {
    match &program.mesh {
        Some(mesh) => CompileOptions {
            device_assignment: Some(mesh.device_ids().to_vec()),
            ..CompileOptions::spmd(mesh.size() as i64)
        },
        None => CompileOptions::single_device(),
    }
}

/// Compiles and runs `program` once on named host inputs; returns the named outputs.
pub fn run_program(client: &Client, program: &Program, inputs: &Tree<HostTensor>) -> Result<Tree<HostTensor>> {
    compile(client, program)?.run(client, inputs)
}

/// The type and shape of the block of `program`'s input `index` on the device at mesh position
/// `pos`.
fn block_shape(program: &Program, index: usize, pos: usize) -> Result<(crate::host::DType, Vec<i64>)> {
    let spec = &program.inputs[index];
    let dims: Vec<i64> = match (&program.mesh, &spec.sharding) {
        (Some(mesh), Some(sharding)) => mesh
            .shard_bounds(sharding, &spec.ty.shape, pos)
            .map_err(|e| anyhow!("\"{}\": {e}", spec.name))?
            .iter()
            .map(|b| b.1)
            .collect(),
        _ => spec.ty.shape.to_vec(),
    };
    Ok((spec.ty.dtype, dims))
}

impl Compiled {
    /// Pairs a loaded executable (compiled here, or deserialized) with the program it was
    /// compiled from.
    pub fn new(program: &Program, executable: LoadedExecutable) -> Result<Compiled> {
        let positions = match &program.mesh {
            Some(mesh) => executable
                .addressable_devices()
                .iter()
                .map(|d| {
                    mesh.device_ids()
                        .iter()
                        .position(|&id| id == d.id as i64)
                        .ok_or_else(|| anyhow!("device {} is not in the mesh", d.id))
                })
                .collect::<Result<_>>()?,
            None => vec![0],
        };
        let blocks = positions
            .iter()
            .map(|&pos| (0..program.inputs.len()).map(|i| block_shape(program, i, pos)).collect())
            .collect::<Result<_>>()?;
        Ok(Compiled { program: program.clone(), executable, positions, blocks })
    }

    pub fn input_index(&self, name: &str) -> Result<usize> {
        self.find_input(name).ok_or_else(|| anyhow!("the program has no input \"{name}\""))
    }

    /// The index of input `name`, if the program has one: for asking, where a missing input is
    /// no error (an `anyhow` error captures a backtrace when `RUST_BACKTRACE` is set: a fifth
    /// of a pipelined step's CPU time when its stages probed each program this way).
    pub fn find_input(&self, name: &str) -> Option<usize> {
        self.program.inputs.iter().position(|i| i.name == name)
    }

    pub fn output_index(&self, name: &str) -> Result<usize> {
        self.program
            .outputs
            .iter()
            .position(|o| o.name == name)
            .ok_or_else(|| anyhow!("the program has no output \"{name}\""))
    }

    /// Copies the global host array for input `index` to the devices, each getting its block.
    pub fn put(&self, client: &Client, index: usize, host: &HostTensor) -> Result<DeviceArray> {
        let spec = &self.program.inputs[index];
        if host.ty != spec.ty.dtype || host.dims[..] != spec.ty.shape[..] {
            bail!("input \"{}\" must be {}, got {}", spec.name, spec.ty, host.shape_string());
        }
        self.to_devices(client, |d, _| match (&self.program.mesh, &spec.sharding) {
            (Some(mesh), Some(sharding)) => shard(host, mesh, sharding, self.positions[d]),
            _ => Ok(host.clone()),
        })
    }

    /// The rows (first dimension) of input `index` that this process's devices hold: all of
    /// them on one process; on several, the span of the blocks of its devices.
    pub fn local_rows(&self, index: usize) -> Result<std::ops::Range<usize>> {
        let spec = &self.program.inputs[index];
        let rows = *spec.ty.shape.first().ok_or_else(|| anyhow!("input \"{}\" has no rows", spec.name))?;
        let (Some(mesh), Some(sharding)) = (&self.program.mesh, &spec.sharding) else { return Ok(0..rows as usize) };
        let (mut first, mut end) = (rows, 0);
        for &pos in &self.positions {
            let bounds =
                mesh.shard_bounds(sharding, &spec.ty.shape, pos).map_err(|e| anyhow!("\"{}\": {e}", spec.name))?;
            first = first.min(bounds[0].0);
            end = end.max(bounds[0].0 + bounds[0].1);
        }
        Ok(first as usize..end as usize)
    }

    /// The type and shape of the block of input `index` on each of this process's devices (in
    /// device order): what a buffer handed to the program for it must be.
    pub fn input_block_shapes(&self, index: usize) -> Vec<(crate::host::DType, Vec<i64>)> {
        self.blocks.iter().map(|device| device[index].clone()).collect()
    }

    /// Like [`Compiled::put`] for a process that holds only some rows of the global array:
    /// `local` is rows `first_row..` of it, and must contain every block of this process's devices.
    pub fn put_rows(&self, client: &Client, index: usize, local: &HostTensor, first_row: i64) -> Result<DeviceArray> {
        let spec = &self.program.inputs[index];
        let global = &spec.ty.shape;
        let rows = local.dims.first().copied().unwrap_or(0);
        if local.ty != spec.ty.dtype || local.dims[1..] != global[1..] || first_row + rows > global[0] {
            bail!("rows {first_row}.. of input \"{}\" ({}) cannot be {}", spec.name, spec.ty, local.shape_string());
        }
        self.to_devices(client, |d, device| match (&self.program.mesh, &spec.sharding) {
            (Some(mesh), Some(sharding)) => {
                let mut bounds = mesh
                    .shard_bounds(sharding, global, self.positions[d])
                    .map_err(|e| anyhow!("\"{}\": {e}", spec.name))?;
                bounds[0].0 -= first_row;
                if bounds[0].0 < 0 || bounds[0].0 + bounds[0].1 > rows {
                    bail!(
                        "device {} holds rows {}..{} of \"{}\", outside this process's rows {first_row}..{}",
                        device.id,
                        bounds[0].0 + first_row,
                        bounds[0].0 + first_row + bounds[0].1,
                        spec.name,
                        first_row + rows
                    );
                }
                Ok(block_of(local, &bounds))
            }
            _ if first_row == 0 && rows == global[0] => Ok(local.clone()),
            _ => bail!("input \"{}\" is not sharded, so every process needs all of its rows", spec.name),
        })
    }

    /// Copies `block(d, device)` to each addressable device `d` (in execution order).
    fn to_devices(&self, client: &Client, block: impl Fn(usize, &Device) -> Result<HostTensor>) -> Result<DeviceArray> {
        let devices = self.executable.addressable_devices();
        devices.iter().enumerate().map(|(d, device)| Ok(client.to_device(&block(d, device)?, device)?)).collect()
    }

    /// Runs on arrays already on the devices (one per input, in input order); returns one array
    /// per output. Donated inputs are consumed.
    pub fn execute(&self, args: &[&DeviceArray]) -> Result<Vec<DeviceArray>> {
        let num_devices = self.positions.len();
        let per_device: Vec<Vec<&Buffer>> = (0..num_devices).map(|d| args.iter().map(|a| &a[d]).collect()).collect();
        let results = self.executable.execute_blocks(&per_device, &self.blocks)?;
        let mut outputs: Vec<DeviceArray> =
            (0..self.program.outputs.len()).map(|_| Vec::with_capacity(num_devices)).collect();
        for device_outputs in results {
            for (j, buffer) in device_outputs.into_iter().enumerate() {
                outputs[j].push(buffer);
            }
        }
        Ok(outputs)
    }

    /// Every device's block of input `index` ((start, length) per dimension), in mesh order,
    /// with the process holding it (`granules`: the device ids of each process). An unsharded
    /// input is one whole block on process 0.
    pub fn input_blocks(&self, index: usize, granules: &[Vec<i64>]) -> Result<Vec<(usize, Bounds)>> {
        let spec = &self.program.inputs[index];
        let (Some(mesh), Some(sharding)) = (&self.program.mesh, &spec.sharding) else {
            return Ok(vec![(0, whole(&spec.ty.shape))]);
        };
        mesh.device_ids()
            .iter()
            .enumerate()
            .map(|(pos, id)| {
                let process = granules
                    .iter()
                    .position(|g| g.contains(id))
                    .ok_or_else(|| anyhow!("device {id} of the mesh belongs to no process"))?;
                Ok((
                    process,
                    mesh.shard_bounds(sharding, &spec.ty.shape, pos).map_err(|e| anyhow!("\"{}\": {e}", spec.name))?,
                ))
            })
            .collect()
    }

    /// The distinct blocks of output `index` that this process's devices hold, copied to the
    /// host (replicas once).
    pub fn fetch_blocks(&self, index: usize, array: &DeviceArray) -> Result<Vec<(Bounds, HostTensor)>> {
        let spec = &self.program.outputs[index];
        let (Some(mesh), Some(sharding)) = (&self.program.mesh, &spec.sharding) else {
            let buffer = array.first().ok_or_else(|| anyhow!("no output shards"))?;
            return Ok(vec![(whole(&spec.ty.shape), buffer.to_host()?)]);
        };
        let mut out: Vec<(Bounds, HostTensor)> = Vec::new();
        for (buffer, &pos) in array.iter().zip(&self.positions) {
            let bounds =
                mesh.shard_bounds(sharding, &spec.ty.shape, pos).map_err(|e| anyhow!("\"{}\": {e}", spec.name))?;
            if !out.iter().any(|(b, _)| *b == bounds) {
                out.push((bounds, buffer.to_host()?));
            }
        }
        Ok(out)
    }

    /// Input `index` put onto this process's devices, each device's block given by `block`
    /// (from its bounds in the global array).
    pub fn put_blocks(
        &self,
        client: &Client,
        index: usize,
        block: impl Fn(&[(i64, i64)]) -> Result<HostTensor>,
    ) -> Result<DeviceArray> {
        let spec = &self.program.inputs[index];
        self.to_devices(client, |d, _| {
            let bounds = match (&self.program.mesh, &spec.sharding) {
                (Some(mesh), Some(sharding)) => mesh
                    .shard_bounds(sharding, &spec.ty.shape, self.positions[d])
                    .map_err(|e| anyhow!("\"{}\": {e}", spec.name))?,
                _ => whole(&spec.ty.shape),
            };
            let host = block(&bounds)?;
            let dims: Vec<i64> = bounds.iter().map(|b| b.1).collect();
            if host.ty != spec.ty.dtype || host.dims != dims {
                bail!("input \"{}\": a block of {dims:?} must be {}, got {}", spec.name, spec.ty, host.shape_string());
            }
            Ok(host)
        })
    }

    /// The global host value of output `index` from its per-device shards.
    pub fn fetch(&self, index: usize, array: &DeviceArray) -> Result<HostTensor> {
        let spec = &self.program.outputs[index];
        match (&self.program.mesh, &spec.sharding) {
            (Some(mesh), Some(sharding)) => {
                let shards: Vec<HostTensor> =
                    array.iter().map(|b| b.to_host()).collect::<std::result::Result<_, _>>()?;
                assemble(&shards, &self.positions, mesh, sharding, &spec.ty.shape)
            }
            _ => Ok(array.first().ok_or_else(|| anyhow!("no output shards"))?.to_host()?),
        }
    }

    /// Runs on global host inputs (each split per its sharding); returns global outputs.
    pub fn run(&self, client: &Client, inputs: &Tree<HostTensor>) -> Result<Tree<HostTensor>> {
        let mut args = Vec::with_capacity(self.program.inputs.len());
        for (i, spec) in self.program.inputs.iter().enumerate() {
            let host = inputs.get(&spec.name).ok_or_else(|| anyhow!("missing input \"{}\"", spec.name))?;
            args.push(self.put(client, i, host)?);
        }
        let results = self.execute(&args.iter().collect::<Vec<_>>())?;
        let mut outputs = Tree::new();
        for (j, array) in results.iter().enumerate() {
            outputs.insert(self.program.outputs[j].name.clone(), self.fetch(j, array)?);
        }
        Ok(outputs)
    }
}
