//! Packed attention equals attention over the documents run separately: a batch of two rows
//! holding four documents (and padding), with `inputs_segmentation` and `inputs_position` as the
//! input pipeline builds them, runs through the model (`maxrs::model`, the tiny default Llama in
//! float32, random parameters); every layer's output at each document's tokens is compared with
//! an independent f64 reference that runs each document alone as its own sequence from
//! position 0. Without the segment ids the later documents' outputs differ, so the test sees the
//! mask.

use std::collections::BTreeMap;

use crate::common::llama_ref::{self, random_params, scaled_err, RefParams};
use maxrs::host::HostTensor;
use maxrs::ir::{DType, Signature};
use maxrs::model::Model;
use maxrs::tensor::{trace, Tree};
use ndarray::{s, Array2};

const ROWS: usize = 2;
const SEQ: usize = 16;
/// Documents per row, by length; what is left of a row is padding.
const LAYOUT: [&[usize]; ROWS] = [&[5, 7], &[9, 6]];

/// One document alone, in f64: every layer's output, `[len, emb]` each.
fn reference_document(c: &Model, p: &RefParams, tokens: &[i32]) -> Vec<Array2<f64>> {
    let (len, e) = (tokens.len(), c.config.emb as usize);
    let mut x = Array2::<f64>::zeros((len, e));
    for (r, &tok) in tokens.iter().enumerate() {
        x.row_mut(r).assign(&p.embedding.row(tok as usize));
    }
    let mut outs = Vec::new();
    for l in &p.layers {
        x = llama_ref::layer_with(c, l, &x, attention);
        outs.push(x.clone());
    }
    outs
}

fn rope(c: &Model, x: &Array2<f64>, heads: usize) -> Array2<f64> {
    let d = c.config.head_dim as usize;
    let mut y = x.clone();
    for pos in 0..x.nrows() {
        for h in 0..heads {
            for i in 0..d / 2 {
                let angle = pos as f64 / c.config.rope_max_timescale.powf(2.0 * i as f64 / d as f64);
                let (x1, x2) = (x[[pos, h * d + i]], x[[pos, h * d + i + d / 2]]);
                y[[pos, h * d + i]] = x1 * angle.cos() - x2 * angle.sin();
                y[[pos, h * d + i + d / 2]] = x2 * angle.cos() + x1 * angle.sin();
            }
        }
    }
    y
}

/// Causal grouped-query attention over one sequence.
fn attention(c: &Model, l: &BTreeMap<&str, Array2<f64>>, h: &Array2<f64>) -> Array2<f64> {
    let (heads, kvh, d, len) =
        (c.config.heads as usize, c.config.kv_heads as usize, c.config.head_dim as usize, h.nrows());
    // Unscaled: Llama's stored query kernel holds `1/sqrt(head_dim)`, as MaxText's.
    let q = rope(c, &h.dot(&l["self_attention.query.kernel"]), heads);
    let k = rope(c, &h.dot(&l["self_attention.key.kernel"]), kvh);
    let v = h.dot(&l["self_attention.value.kernel"]);
    let mut out = Array2::<f64>::zeros((len, heads * d));
    for hh in 0..heads {
        let g = hh / (heads / kvh);
        for t in 0..len {
            let qi = q.slice(s![t, hh * d..(hh + 1) * d]);
            let scores: Vec<f64> = (0..=t).map(|u| qi.dot(&k.slice(s![u, g * d..(g + 1) * d]))).collect();
            let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let ex: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
            let z: f64 = ex.iter().sum();
            for (u, e) in ex.iter().enumerate() {
                out.slice_mut(s![t, hh * d..(hh + 1) * d]).scaled_add(e / z, &v.slice(s![u, g * d..(g + 1) * d]));
            }
        }
    }
    out.dot(&l["self_attention.out.kernel"])
}

/// The packed rows: tokens, segment ids (1, 2 per row; 0 on padding), positions (restarting at 0
/// per document), and where each document lies.
struct Packed {
    tokens: Vec<i32>,
    segs: Vec<i32>,
    pos: Vec<i32>,
    /// (row, start, length) of each document.
    docs: Vec<(usize, usize, usize)>,
}

fn packed(vocab: i32) -> Packed {
    let mut rng = crate::common::rng(31);
    let (mut tokens, mut segs, mut pos, mut docs) =
        (vec![0; ROWS * SEQ], vec![0; ROWS * SEQ], vec![0; ROWS * SEQ], Vec::new());
    for (row, lengths) in LAYOUT.iter().enumerate() {
        let mut start = 0;
        for (i, &len) in lengths.iter().enumerate() {
            for t in 0..len {
                let at = row * SEQ + start + t;
                tokens[at] = rand::Rng::gen_range(&mut rng, 0..vocab);
                segs[at] = i as i32 + 1;
                pos[at] = t as i32;
            }
            docs.push((row, start, len));
            start += len;
        }
    }
    Packed { tokens, segs, pos, docs }
}

fn layer_outputs(c: &Model, p: &RefParams, tokens: &[i32], segs: &[i32], pos: &[i32], with_segments: bool) -> Vec<f64> {
    let mut sig = Signature::new(None);
    c.declare_params(&mut sig, "params");
    let names: &[&str] =
        if with_segments { &["inputs", "inputs_position", "inputs_segmentation"] } else { &["inputs"] };
    for name in names {
        sig.input(name, DType::S32, &[ROWS as i64, SEQ as i64]);
    }
    let program = trace(&sig, |_, inp| {
        let fwd = c.forward(&inp.subtree("params"), inp, true);
        Tree::new().with("layers", fwd.layer_outputs.expect("layer outputs"))
    })
    .expect("the model traces");
    let mut inputs = llama_ref::host_params(c, p);
    let dims = [ROWS as i64, SEQ as i64];
    inputs.insert("inputs", HostTensor::from_i32(&dims, tokens));
    if with_segments {
        inputs.insert("inputs_position", HostTensor::from_i32(&dims, pos));
        inputs.insert("inputs_segmentation", HostTensor::from_i32(&dims, segs));
    }
    crate::common::run(&program, &inputs)["layers"].to_f64()
}

fn check(scan_layers: bool) {
    let c = llama_ref::config(scan_layers, &[]);
    let p = random_params(&c, 7);
    let e = c.config.emb as usize;
    let Packed { tokens, segs, pos, docs } = packed(c.config.vocab as i32);
    let packed_out = layer_outputs(&c, &p, &tokens, &segs, &pos, true);
    let plain_out = layer_outputs(&c, &p, &tokens, &segs, &pos, false);
    let per_layer = ROWS * SEQ * e;
    for (d, &(row, start, len)) in docs.iter().enumerate() {
        let want = reference_document(&c, &p, &tokens[row * SEQ + start..row * SEQ + start + len]);
        for (l, want) in want.iter().enumerate() {
            let slice = |out: &[f64]| -> Vec<f64> {
                let from = l * per_layer + (row * SEQ + start) * e;
                out[from..from + len * e].to_vec()
            };
            let flat: Vec<f64> = want.iter().copied().collect();
            let err = scaled_err(&slice(&packed_out), &flat);
            println!("scan_layers={scan_layers} document {d} (row {row}, tokens {start}..{}) layer {l}: scaled error {err:e}", start + len);
            assert!(err < 1e-4, "document {d} layer {l}: packed differs from the document alone ({err:e})");
            if start > 0 {
                let unmasked = scaled_err(&slice(&plain_out), &flat);
                assert!(
                    unmasked > 1e-2,
                    "document {d}: without segment ids it should see the previous document ({unmasked:e})"
                );
            }
        }
    }
}

#[test]
fn packed_attention_equals_documents_run_separately() {
    check(true);
}
