//! Forward values of the Tensor API against host-side references, through the CPU plugin:
//! einsum forms, composites, data movement, integer and 16-bit paths. (The finite-difference
//! test checks derivatives of whatever the ops compute; this checks they compute the right thing.)

use crate::common::{batched_row_gather, f64_tensor, max_rel_diff, rng, run, uniform};
use maxrs::ir::{DType, Prim, RaggedDotMode, Signature};
use maxrs::tensor::{concatenate, einsum, sort, trace, where_, Tensor, Trace, Tree};

/// Runs `f` on f64 inputs of the given shapes (random values) and returns inputs and output.
fn eval(
    shapes: &[&[i64]],
    seed: u64,
    f: impl FnOnce(&Trace, &[Tensor]) -> Tensor,
) -> (Vec<Vec<f64>>, Vec<f64>, Vec<i64>) {
    let mut sig = Signature::new(None);
    let mut r = rng(seed);
    let mut host = Tree::new();
    let mut values = Vec::new();
    for (i, dims) in shapes.iter().enumerate() {
        sig.input(&format!("x{i}"), DType::F64, dims);
        let v = uniform(&mut r, dims.iter().product::<i64>() as usize, -1.0, 1.0);
        host.insert(format!("x{i}"), f64_tensor(dims, &v));
        values.push(v);
    }
    let p = trace(&sig, |ctx, inp| {
        let xs: Vec<Tensor> = (0..shapes.len()).map(|i| inp[&format!("x{i}")].clone()).collect();
        Tree::new().with("y", f(ctx, &xs))
    })
    .unwrap();
    let out = run(&p, &host);
    (values, out["y"].to_f64(), out["y"].dims.clone())
}

/// Two-operand einsum by brute force over all label values.
fn reference_einsum(spec: &str, a: &[f64], a_dims: &[i64], b: &[f64], b_dims: &[i64]) -> Vec<f64> {
    let (ins, out) = spec.split_once("->").unwrap();
    let (la, lb) = ins.split_once(',').unwrap();
    let mut labels: Vec<(char, i64)> = Vec::new();
    for (l, dims) in [(la, a_dims), (lb, b_dims)] {
        for (c, &d) in l.chars().zip(dims) {
            if !labels.iter().any(|x| x.0 == c) {
                labels.push((c, d));
            }
        }
    }
    let offset = |l: &str, assign: &[i64]| {
        l.chars().fold(0i64, |acc, c| {
            let k = labels.iter().position(|x| x.0 == c).unwrap();
            acc * labels[k].1 + assign[k]
        }) as usize
    };
    let out_len: i64 = out.chars().map(|c| labels.iter().find(|x| x.0 == c).unwrap().1).product();
    let mut result = vec![0.0; out_len as usize];
    let total: i64 = labels.iter().map(|x| x.1).product();
    let mut assign = vec![0i64; labels.len()];
    for _ in 0..total {
        result[offset(out, &assign)] += a[offset(la, &assign)] * b[offset(lb, &assign)];
        for k in (0..labels.len()).rev() {
            assign[k] += 1;
            if assign[k] < labels[k].1 {
                break;
            }
            assign[k] = 0;
        }
    }
    result
}

#[test]
fn einsum_forms_match_brute_force() {
    let forms: [(&str, &[i64], &[i64]); 6] = [
        ("btd,dhk->bthk", &[2, 3, 4], &[4, 2, 3]),
        ("bthk,bshk->bhts", &[2, 3, 2, 4], &[2, 5, 2, 4]),
        ("bhts,bshk->bthk", &[2, 2, 3, 5], &[2, 5, 2, 4]),
        ("bthk,hkd->btd", &[2, 3, 2, 4], &[2, 4, 5]),
        ("ij,jk->ki", &[3, 4], &[4, 2]),
        ("ij,kj->", &[3, 4], &[2, 4]),
    ];
    for (k, (spec, a, b)) in forms.iter().enumerate() {
        let (x, y, _) = eval(&[a, b], k as u64, |_, t| einsum(spec, &[&t[0], &t[1]]));
        let want = reference_einsum(spec, &x[0], a, &x[1], b);
        assert!(max_rel_diff(&y, &want) < 1e-12, "{spec}");
    }
}

#[test]
fn composites_match_their_definitions() {
    let (x, y, _) = eval(&[&[2, 3], &[3]], 1, |_, t| {
        let sm = t[0].softmax(-1);
        let lsm = t[0].log_softmax(-1);
        let lse = t[0].logsumexp(-1).expand_dims(-1);
        let rms = t[0].rms_norm(&t[1], 1e-6);
        concatenate(&[&sm, &lsm, &lse, &rms], 1)
    });
    for row in 0..2 {
        let v = &x[0][row * 3..row * 3 + 3];
        let lse = v.iter().map(|a| a.exp()).sum::<f64>().ln();
        let rms = (v.iter().map(|a| a * a).sum::<f64>() / 3.0 + 1e-6).sqrt();
        let mut want: Vec<f64> = v.iter().map(|a| (a - lse).exp()).collect();
        want.extend(v.iter().map(|a| a - lse));
        want.push(lse);
        want.extend(v.iter().zip(&x[1]).map(|(a, s)| a / rms * s));
        assert!(max_rel_diff(&y[row * 10..row * 10 + 10], &want) < 1e-12, "row {row}");
    }
}

#[test]
fn data_movement() {
    let (x, y, dims) = eval(&[&[3, 4]], 2, |ctx, t| {
        let idx = ctx.constant(DType::S32, &[3], &[2.0, 0.0, 2.0]);
        let taken = t[0].take(&idx); // rows 2, 0, 2
        let padded = t[0].slice_strided(&[0, 1], &[3, 4], &[2, 2]).pad(9.0, &[1, 0], &[0, 1], &[0, 1]); // [2,2] -> [3,4]
        let moved = t[0].dynamic_update_slice(
            &t[0].dynamic_slice(&[&ctx.scalar(1.0, DType::S32), &ctx.scalar(2.0, DType::S32)], &[2, 2]),
            &[&ctx.scalar(0.0, DType::S32), &ctx.scalar(0.0, DType::S32)],
        );
        let scattered = t[0].zeros_like().scatter_add(&idx, &t[0]);
        concatenate(&[&taken, &padded, &moved, &scattered], 0).transpose(&[1, 0])
    });
    assert_eq!(dims, vec![4, 12]);
    let at = |r: usize, c: usize| x[0][r * 4 + c];
    // Expected rows before the final transpose: taken, padded, moved, scattered.
    let mut rows: Vec<[f64; 4]> = vec![];
    for r in [2, 0, 2] {
        rows.push([at(r, 0), at(r, 1), at(r, 2), at(r, 3)]);
    }
    rows.push([9.0; 4]);
    rows.push([at(0, 1), 9.0, at(0, 3), 9.0]);
    rows.push([at(2, 1), 9.0, at(2, 3), 9.0]);
    rows.push([at(1, 2), at(1, 3), at(0, 2), at(0, 3)]);
    rows.push([at(2, 2), at(2, 3), at(1, 2), at(1, 3)]);
    rows.push([at(2, 0), at(2, 1), at(2, 2), at(2, 3)]);
    rows.push([at(1, 0), at(1, 1), at(1, 2), at(1, 3)]);
    rows.push([0.0; 4]);
    rows.push([at(0, 0) + at(2, 0), at(0, 1) + at(2, 1), at(0, 2) + at(2, 2), at(0, 3) + at(2, 3)]);
    let want: Vec<f64> = (0..4).flat_map(|col| rows.iter().map(move |r| r[col])).collect();
    assert!(max_rel_diff(&y, &want) < 1e-15);
}

#[test]
fn reductions_broadcasts_and_selection() {
    let (x, y, dims) = eval(&[&[2, 3]], 3, |ctx, t| {
        let m = t[0].max_keepdims(&[1]);
        let picked = where_(&t[0].eq(&m), ctx.iota(DType::S32, &[2, 3], 1).astype(DType::F64), -1.0);
        let hot = picked.max(&[1]).astype(DType::S32).one_hot(3, DType::F64);
        let col_sums = t[0].sum(&[0]).broadcast_in_dim(&[2, 3], &[1]);
        concatenate(&[&hot, &col_sums, &t[0].mean_keepdims(&[0, 1]).broadcast_to(&[2, 3])], 0)
    });
    assert_eq!(dims, vec![6, 3]);
    let mut want = Vec::new();
    for r in 0..2 {
        let row = &x[0][r * 3..r * 3 + 3];
        let arg = (0..3).max_by(|&a, &b| row[a].partial_cmp(&row[b]).unwrap()).unwrap();
        want.extend((0..3).map(|c| if c == arg { 1.0 } else { 0.0 }));
    }
    for _ in 0..2 {
        want.extend((0..3).map(|c| x[0][c] + x[0][3 + c]));
    }
    let mean = x[0].iter().sum::<f64>() / 6.0;
    want.extend([mean; 6]);
    assert!(max_rel_diff(&y, &want) < 1e-12);
}

#[test]
fn sixteen_bit_floats_and_integers() {
    let p = trace(&Signature::new(None), |ctx, _| {
        let x = ctx.constant(DType::F32, &[4], &[1.0, 0.1, -3.140625, 1e-3]);
        let rounded = x.astype(DType::BF16).astype(DType::F32);
        let halves = (x.astype(DType::F16) * 2.0).astype(DType::F32);
        let neg_inf = ctx.full(f64::NEG_INFINITY, DType::BF16, &[2]).max(&[0]).astype(DType::F32).reshape(&[1]);
        let u = ctx.constant(DType::U32, &[3], &[1.0, 0x8000_0000u32 as f64, 7.0]);
        let shifted = u.shift_left(1.0).bitwise_or(u.shift_right_logical(31.0));
        let ints = ctx.iota(DType::S32, &[3], 0) * 5 - 7;
        Tree::new().with("f", concatenate(&[&rounded, &halves, &neg_inf], 0)).with("u", shifted).with("i", ints)
    })
    .unwrap();
    let out = run(&p, &Tree::new());
    let want: Vec<f32> = vec![
        1.0,
        half::bf16::from_f32(0.1).to_f32(),
        -3.140625,
        half::bf16::from_f32(1e-3).to_f32(),
        2.0,
        half::f16::from_f32(0.1).to_f32() * 2.0,
        -6.28125,
        half::f16::from_f32(1e-3).to_f32() * 2.0,
        f32::NEG_INFINITY,
    ];
    assert_eq!(out["f"].to_f32(), want);
    assert_eq!(out["u"].to_u32(), vec![2, 1, 14]);
    assert_eq!(out["i"].to_i32(), vec![-7, -2, 3]);
}

fn ints(ctx: &Trace, dims: &[i64], values: &[i32]) -> Tensor {
    ctx.constant(DType::S32, dims, &values.iter().map(|&v| v as f64).collect::<Vec<_>>())
}

/// Stable sorts (ties keep their order), descending sorts, payloads, argsort and top_k (ties:
/// lower index first) against Rust's stable sort.
#[test]
fn sorting_and_top_k() {
    // Rows of keys with ties; a random payload rides along.
    let keys = [0.5, -1.0, 0.5, 2.0, -1.0, 0.5, 3.0, 3.0, -2.0, 0.0, 3.0, 1.0];
    let (x, y, dims) = eval(&[&[2, 6]], 4, |ctx, t| {
        let k = ctx.constant(DType::F64, &[2, 6], &keys);
        let up = sort(&[&k, &t[0]], 1, false);
        let down = sort(&[&k, &t[0]], 1, true);
        let order = k.argsort(1).astype(DType::F64);
        let (top, top_idx) = k.top_k(3);
        let top = concatenate(&[&top, &top_idx.astype(DType::F64)], 1);
        concatenate(&[&up[0], &up[1], &down[0], &down[1], &order, &top], 1)
    });
    assert_eq!(dims, vec![2, 36]);
    for row in 0..2 {
        let k = &keys[row * 6..row * 6 + 6];
        let p = &x[0][row * 6..row * 6 + 6];
        let mut up: Vec<usize> = (0..6).collect();
        up.sort_by(|&a, &b| k[a].partial_cmp(&k[b]).unwrap());
        let mut down: Vec<usize> = (0..6).collect();
        down.sort_by(|&a, &b| k[b].partial_cmp(&k[a]).unwrap());
        let mut want: Vec<f64> = up.iter().map(|&i| k[i]).collect();
        want.extend(up.iter().map(|&i| p[i]));
        want.extend(down.iter().map(|&i| k[i]));
        want.extend(down.iter().map(|&i| p[i]));
        want.extend(up.iter().map(|&i| i as f64));
        want.extend(down[..3].iter().map(|&i| k[i]));
        want.extend(down[..3].iter().map(|&i| i as f64));
        assert_eq!(&y[row * 36..row * 36 + 36], &want[..], "row {row}");
    }
}

#[test]
fn cumulative_sums() {
    let p = trace(&Signature::new(None), |ctx, _| {
        let i = ints(ctx, &[2, 3], &[1, 2, 3, 4, 5, 6]);
        let f = ctx.constant(DType::F32, &[2, 3], &[0.5, 1.0, -2.0, 4.0, 0.25, 8.0]);
        Tree::new()
            .with("i", concatenate(&[&i.cumsum(1), &i.cumsum_reverse(1), &i.cumsum(0)], 1))
            .with("f", concatenate(&[&f.cumsum(1), &f.cumsum_reverse(0)], 1))
    })
    .unwrap();
    let out = run(&p, &Tree::new());
    assert_eq!(out["i"].to_i32(), vec![1, 3, 6, 6, 5, 3, 1, 2, 3, 4, 9, 15, 15, 11, 6, 5, 7, 9]);
    assert_eq!(out["f"].to_f32(), vec![0.5, 1.5, -0.5, 4.5, 1.25, 6.0, 4.0, 4.25, 12.25, 4.0, 0.25, 8.0]);
}

/// `take_along_axis` on both axes, `scatter_add_along_axis` with repeated positions, and a
/// gather with batching and window dims, against their index definitions.
#[test]
fn gathers_and_scatters_along_axes() {
    let idx1 = [3, 0, 1, 1, 2, 0];
    let idx0 = [2, 0, 1, 1, 0, 0, 2, 1];
    let rows = [4, 0, 4, 2, 1, 1, 3, 0];
    let (x, y, _) = eval(&[&[3, 4], &[3, 2], &[2, 5, 3]], 5, |ctx, t| {
        let along1 = t[0].take_along_axis(&ints(ctx, &[3, 2], &idx1), 1).reshape(&[-1]);
        let along0 = t[0].take_along_axis(&ints(ctx, &[2, 4], &idx0), 0).reshape(&[-1]);
        let scattered = t[0].scatter_add_along_axis(&ints(ctx, &[3, 2], &idx1), &t[1], 1).reshape(&[-1]);
        let batched = t[2].gather(&ints(ctx, &[2, 4, 1], &rows), batched_row_gather(3)).reshape(&[-1]);
        concatenate(&[&along1, &along0, &scattered, &batched], 0)
    });
    let a = &x[0];
    let mut want: Vec<f64> = (0..6).map(|j| a[(j / 2) * 4 + idx1[j] as usize]).collect();
    want.extend((0..8).map(|j| a[idx0[j] as usize * 4 + j % 4]));
    let mut scattered = a.clone();
    for j in 0..6 {
        scattered[(j / 2) * 4 + idx1[j] as usize] += x[1][j];
    }
    want.extend(scattered);
    for b in 0..2 {
        for i in 0..4 {
            let r = rows[b * 4 + i] as usize;
            want.extend((0..3).map(|c| x[2][b * 15 + r * 3 + c]));
        }
    }
    assert!(max_rel_diff(&y, &want) < 1e-15);
}

/// Every form of `ragged_dot` against per-row products, with an empty group, groups spanning
/// several tiles (tiles have at most 128 rows) and rows in no group.
#[test]
fn ragged_dot_forms_match_brute_force() {
    let (m, k, n) = (300usize, 3usize, 2usize);
    let sizes = [150, 0, 140];
    let group_of = |r: usize| match r {
        r if r < 150 => Some(0),
        r if r < 290 => Some(2),
        _ => None,
    };
    let (x, y, _) = eval(&[&[m as i64, k as i64], &[3, k as i64, n as i64], &[m as i64, n as i64]], 6, |ctx, t| {
        let sizes = ints(ctx, &[3], &sizes);
        let bind = |mode, a: &Tensor, b: &Tensor| ctx.bind1(Prim::RaggedDot(mode), &[a, b, &sizes]);
        let rows = t[0].ragged_dot(&t[1], &sizes).reshape(&[-1]);
        // rhs as [G, N, K]: the same products against the transposed weights.
        let transposed =
            bind(RaggedDotMode::NonContracting { rhs_transposed: true }, &t[0], &t[1].transpose(&[0, 2, 1]));
        let groups = bind(RaggedDotMode::Contracting, &t[0], &t[2]).reshape(&[-1]);
        concatenate(&[&rows, &transposed.reshape(&[-1]), &groups], 0)
    });
    let (lhs, w, rhs) = (&x[0], &x[1], &x[2]);
    let mut want = vec![0.0; 2 * m * n];
    for r in 0..m {
        if let Some(g) = group_of(r) {
            for c in 0..n {
                let v: f64 = (0..k).map(|i| lhs[r * k + i] * w[g * k * n + i * n + c]).sum();
                want[r * n + c] = v;
                want[m * n + r * n + c] = v;
            }
        }
    }
    for g in 0..3 {
        for i in 0..k {
            for c in 0..n {
                want.push((0..m).filter(|&r| group_of(r) == Some(g)).map(|r| lhs[r * k + i] * rhs[r * n + c]).sum());
            }
        }
    }
    let err = max_rel_diff(&y, &want);
    assert!(err < 1e-12, "max relative difference {err:e}");
}
