//! Issue 43 on this CPU-only machine: `quantization=fp8` compiled deviceless for one H100
//! (`train-compile --topology=h100-1`) reaches XLA's optimized HLO as fp8 GEMMs. Every dot that
//! XLA is given on 8-bit operands (the quantized products) is still a GEMM on 8-bit operands
//! after optimization (a cuBLASLt `__cublas$lt$matmul$f8` call, or a Triton GEMM fusion whose
//! dot reads them): none was dequantized to a bf16 GEMM; and the scanned layers' loop bodies
//! hold the 7 forward products (query, key, value, out, `wi_0`, `wi_1`, `wo`) and their 14
//! backward ones; a Mixtral's hold its expert products too. The CUDA plugin and `ptxas` are downloaded on first use
//! (see `skip_offline`
//! in tests/common/provision.rs).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use crate::common::cli::{command, finish};
use crate::common::provision::provisioned;
use maxrs::aot::topology::lookup;

/// A small bf16 Llama whose products have the sizes fp8 GEMMs take (multiples of 16).
const MODEL: &[&str] = &[
    "base_emb_dim=128",
    "base_num_query_heads=2",
    "base_num_kv_heads=2",
    "head_dim=64",
    "base_mlp_dim=256",
    "base_num_decoder_layers=2",
    "vocab_size=256",
    "per_device_batch_size=1",
    "max_target_length=128",
    "dtype=bfloat16",
    "quantization=fp8",
];

/// The test binary's cheapest-compile flags (tests/main.rs) without the two that take GEMMs
/// away from Triton and cuBLASLt: XLA picks the GEMMs as a run does, with the heuristic
/// configurations of a compile that cannot autotune.
const XLA_FLAGS: &str = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true \
                         --xla_gpu_autotune_level=0 --xla_gpu_disable_gpuasm_optimizations=true";

/// One instruction of an HLO module's text: its result type, operation, operands and the
/// computations it calls.
struct Instruction {
    name: String,
    ty: String,
    op: String,
    operands: Vec<String>,
    calls: Vec<String>,
    line: String,
}

/// An HLO module's text: each computation's instructions.
struct Module {
    computations: HashMap<String, Vec<Instruction>>,
}

/// A GEMM's operands' element types, in the computation that holds it.
struct Gemm {
    computation: String,
    operands: [String; 2],
}

impl Gemm {
    fn f8(&self) -> bool {
        self.operands.iter().all(|t| t.starts_with("f8"))
    }
}

impl Module {
    fn parse(text: &str) -> Module {
        let mut computations: HashMap<String, Vec<Instruction>> = HashMap::new();
        let mut current: Option<String> = None;
        for line in text.lines() {
            if line.ends_with('{') && !line.starts_with(' ') {
                let header = line.trim_start_matches("ENTRY ");
                let name = header.split(' ').next().unwrap_or_default().trim_start_matches('%');
                current = Some(name.to_string());
                computations.entry(name.to_string()).or_default();
            } else if line.starts_with('}') {
                current = None;
            } else if let (Some(c), Some(i)) = (&current, Instruction::parse(line)) {
                computations.get_mut(c).expect("opened").push(i);
            }
        }
        Module { computations }
    }

    /// Every GEMM: each `dot` (alone, or in the fusion XLA runs it as) and each cuBLAS GEMM
    /// call, with its two operands' element types.
    fn gemms(&self) -> Vec<Gemm> {
        let mut found = Vec::new();
        for (name, instructions) in &self.computations {
            let types: HashMap<&str, &str> = instructions.iter().map(|i| (i.name.as_str(), i.ty.as_str())).collect();
            let cublas = |i: &Instruction| i.op == "custom-call" && i.line.contains("custom_call_target=\"__cublas$");
            for i in instructions.iter().filter(|i| i.op == "dot" || cublas(i)) {
                let operand = |k: usize| element_type(&types, &i.operands[k]);
                found.push(Gemm { computation: name.clone(), operands: [operand(0), operand(1)] });
            }
        }
        found
    }

    /// The computations `root` runs: itself and every one it calls, transitively.
    fn reachable(&self, root: &str) -> HashSet<String> {
        let mut seen = HashSet::from([root.to_string()]);
        let mut stack = vec![root.to_string()];
        while let Some(c) = stack.pop() {
            for callee in self.computations.get(&c).into_iter().flatten().flat_map(|i| &i.calls) {
                if seen.insert(callee.clone()) {
                    stack.push(callee.clone());
                }
            }
        }
        seen
    }

    /// Per `while` loop whose body runs GEMMs on f8 operands: how many are e4m3 by e4m3, and
    /// how many take an e5m2 operand.
    fn f8_gemms_per_loop_body(&self, gemms: &[Gemm]) -> Vec<(usize, usize)> {
        let per_body = self.loop_bodies().into_iter().map(|body| {
            let runs = self.reachable(&body);
            let inside: Vec<&Gemm> = gemms.iter().filter(|g| runs.contains(&g.computation) && g.f8()).collect();
            let e5m2 = inside.iter().filter(|g| g.operands.iter().any(|t| t == "f8e5m2")).count();
            (inside.len() - e5m2, e5m2)
        });
        per_body.filter(|&(e4m3, e5m2)| e4m3 + e5m2 > 0).collect()
    }

    /// The body computation of every `while` loop.
    fn loop_bodies(&self) -> Vec<String> {
        let instructions = self.computations.values().flatten();
        instructions.filter(|i| i.op == "while").filter_map(|i| attribute(&i.line, "body=%")).collect()
    }
}

impl Instruction {
    /// `[ROOT ]%name = TYPE op(operands), attributes`; `None` for any other line.
    fn parse(line: &str) -> Option<Instruction> {
        let line = line.trim_start().trim_start_matches("ROOT ");
        let (name, rest) = line.strip_prefix('%')?.split_once(" = ")?;
        // A tuple type holds spaces: it ends at its matching parenthesis.
        let type_end = match rest.starts_with('(') {
            true => closing(rest, 0)? + 1,
            false => rest.find(' ')?,
        };
        let (ty, rest) = rest.split_at(type_end);
        let rest = rest.trim_start();
        let open = rest.find('(')?;
        let args = &rest[open + 1..closing(rest, open)?];
        let operands = split_top_level(args)
            .iter()
            .filter_map(|a| a.split_whitespace().last().and_then(|t| t.strip_prefix('%')).map(str::to_string))
            .collect();
        let calls = ["calls=%", "body=%", "condition=%", "to_apply=%"].iter().filter_map(|k| attribute(line, k));
        let listed = ["calls={", "called_computations={", "branch_computations={"].iter().flat_map(|k| {
            let list = line.split_once(k).and_then(|(_, r)| r.split_once('}')).map_or("", |(l, _)| l);
            list.split(',').map(|c| c.trim().trim_start_matches('%').to_string()).filter(|c| !c.is_empty())
        });
        Some(Instruction {
            name: name.to_string(),
            ty: ty.to_string(),
            op: rest[..open].to_string(),
            operands,
            calls: calls.chain(listed).collect(),
            line: line.to_string(),
        })
    }
}

/// The element type of the operand `name` (`%fusion#2` names element 2 of a tuple result).
fn element_type(types: &HashMap<&str, &str>, name: &str) -> String {
    let (name, index) = match name.split_once('#') {
        Some((name, index)) => (name, index.parse::<usize>().ok()),
        None => (name, None),
    };
    let Some(ty) = types.get(name) else { return "?".into() };
    let array = match index {
        // Tuple elements may carry an `/*index=5*/` comment before their type.
        Some(k) => split_top_level(&ty[1..ty.len() - 1]).get(k).map_or("?", |t| t.rsplit("*/").next().unwrap_or(t)),
        None => ty,
    };
    array.trim().split('[').next().unwrap_or("?").to_string()
}

/// The name after `key` in `line` (`body=%region_1`: `region_1`).
fn attribute(line: &str, key: &str) -> Option<String> {
    let rest = line.split_once(key)?.1;
    Some(rest.split([',', ' ', '}']).next()?.to_string())
}

/// The index of the parenthesis closing the one at `open`.
fn closing(text: &str, open: usize) -> Option<usize> {
    let mut depth = 0;
    for (i, c) in text.char_indices().skip_while(|&(i, _)| i < open) {
        match c {
            '(' | '{' | '[' => depth += 1,
            ')' | '}' | ']' => depth -= 1,
            _ => {}
        }
        if depth == 0 {
            return Some(i);
        }
    }
    None
}

/// `args` split at the commas outside brackets.
fn split_top_level(args: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in args.char_indices() {
        match c {
            '(' | '{' | '[' => depth += 1,
            ')' | '}' | ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&args[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&args[start..]);
    parts
}

/// The dumped module of the train step whose file name ends with `suffix` (the largest, should
/// there be several).
fn dumped(dir: &Path, suffix: &str) -> Module {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    files.sort_by_key(|p| std::fs::metadata(p).unwrap().len());
    let file = files.last().unwrap_or_else(|| panic!("no *{suffix} under {}", dir.display()));
    Module::parse(&std::fs::read_to_string(file).unwrap())
}

/// The step of `model` compiled deviceless for one H100: the dots XLA is given and its
/// optimized module; `None` where the CUDA plugin cannot be provisioned.
fn compile(model: &[&str]) -> Option<(Vec<Gemm>, Module)> {
    if !provisioned(&lookup("h100-1", 1).unwrap()) {
        return None;
    }
    let dump = tempfile::tempdir().unwrap();
    let flags = format!("{XLA_FLAGS} --xla_dump_to={} --xla_dump_hlo_as_text", dump.path().display());
    let args: Vec<&str> = ["train-compile", "--topology=h100-1"].iter().chain(model).copied().collect();
    let out = finish(command(&args, &[("XLA_FLAGS", &flags)]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let given = dumped(dump.path(), ".before_optimizations.txt").gemms();
    Some((given, dumped(dump.path(), "sm_9.0a_gpu_after_optimizations.txt")))
}

/// Every dot given on f8 operands is a GEMM on f8 operands after optimization, and the others
/// are the unquantized products only; returns the f8
/// GEMMs per layer body (e4m3 x e4m3, e5m2 x e4m3).
fn f8_gemms_per_body(what: &str, given: &[Gemm], optimized: &Module) -> Vec<(usize, usize)> {
    let gemms = optimized.gemms();
    let count = |gemms: &[Gemm], f8: bool| gemms.iter().filter(|g| g.f8() == f8).count();
    println!(
        "{what}: dots given to XLA: {} on f8 operands, {} others; GEMMs after optimization: {} on f8 operands, {} others",
        count(given, true),
        count(given, false),
        count(&gemms, true),
        count(&gemms, false)
    );
    assert_eq!(count(&gemms, true), count(given, true), "{what}: every quantized product stays a GEMM on f8 operands");
    // Attention's products (scores, values and their gradients) and the logits' are not quantized.
    assert_eq!(count(&gemms, false), 11, "{what}: a quantized product fell back to a GEMM on wider operands");
    let per_body = optimized.f8_gemms_per_loop_body(&gemms);
    println!("{what}: per layer body (e4m3 x e4m3, e5m2 x e4m3 GEMMs): {per_body:?}");
    assert_eq!(per_body.len(), 2, "{what}: a forward and a backward layer body: {per_body:?}");
    per_body
}

#[test]
fn the_fp8_step_compiles_to_fp8_gemms_for_an_h100() {
    let Some((given, optimized)) = compile(MODEL) else { return };
    // The scanned layers' forward body holds the forward products (e4m3 by e4m3), the backward
    // body the gradients' (e5m2 by e4m3), besides any products it recomputes.
    let per_body = f8_gemms_per_body("llama", &given, &optimized);
    assert!(per_body.contains(&(7, 0)), "the forward body: {per_body:?}");
    assert!(per_body.iter().any(|&(_, e5m2)| e5m2 == 14), "the backward body: {per_body:?}");
}

/// The same Llama as a Mixtral of 4 experts, top 2, dropping tokens past a capacity
/// (`sparse_matmul=false`, `capacity_factor=1`: fp8 refuses the dropless path).
const MIXTRAL: &[&str] =
    &["decoder_block=mixtral", "num_experts=4", "num_experts_per_tok=2", "sparse_matmul=false", "capacity_factor=1"];

/// Mixtral's fp8 step: the layer's forward body holds 10 products on e4m3 operands (query, key,
/// value, out, the gate, and the experts' dispatch, `wi_0`, `wi_1`, `wo` and combine einsums,
/// each one batched GEMM over the experts), and the backward body the gradients' e5m2 GEMMs: two
/// per product, but none for the dispatch mask, which has no gradient (19).
#[test]
fn the_fp8_mixtral_step_compiles_its_expert_products_to_fp8_gemms_for_an_h100() {
    let model: Vec<&str> = MODEL.iter().chain(MIXTRAL).copied().collect();
    let Some((given, optimized)) = compile(&model) else { return };
    let per_body = f8_gemms_per_body("mixtral", &given, &optimized);
    assert!(per_body.contains(&(10, 0)), "the forward body: {per_body:?}");
    assert!(per_body.iter().any(|&(_, e5m2)| e5m2 == 19), "the backward body: {per_body:?}");
}
