//! The learning-rate schedule against golden values from MaxText's own construction, and the
//! traced schedule (what the train step computes from its counter) against the host one.
//!
//! The golden values were computed with optax 0.2.8 / JAX 0.12.0.1 (float64) by re-creating
//! `create_learning_rate_schedule` of `src/maxtext/utils/maxtext_utils.py` (MaxText main,
//! e591f30, 2026-08-22): `optax.join_schedules` over `optax.linear_schedule(0, lr, W)`, its
//! `make_cos_schedule`, `optax.constant_schedule(lr)` and, for WSD,
//! `optax.linear_schedule(lr, final, D - 1)` or the cosine.

use maxrs::config::WsdDecayStyle;
use maxrs::ir::{DType, Signature};
use maxrs::tensor::{trace, Tree};
use maxrs::train::schedule::LearningRateSchedule;

/// (learning_rate, final_fraction, warmup_fraction, wsd, schedule_steps, steps, [(step, lr)]).
type Case = (f64, f64, f64, Option<(f64, WsdDecayStyle)>, i64, i64, &'static [(u64, f64)]);

const CASES: &[(&str, Case)] = &[
    (
        "cosine, 101 steps: W = int(10.1) = 10, the peak at step 10",
        (
            1e-3,
            0.1,
            0.1,
            None,
            101,
            101,
            &[
                (0, 0.0),
                (1, 9.999999999999994e-05),
                (5, 0.0005),
                (9, 0.0009000000000000001),
                (10, 0.001),
                (11, 0.000999725872158593),
                (55, 0.00055),
                (99, 0.00010027412784140692),
                (100, 0.0001),
            ],
        ),
    ),
    (
        "cosine with a zero tail (schedule 50 of 100 steps)",
        (
            1.0,
            0.1,
            0.1,
            None,
            50,
            100,
            &[(0, 0.0), (4, 0.8), (5, 1.0), (6, 0.9988534515746141), (49, 0.1), (50, 0.0), (99, 0.0)],
        ),
    ),
    (
        "a schedule longer than the run",
        (
            1.0,
            0.1,
            0.1,
            None,
            200,
            100,
            &[(0, 0.0), (19, 0.95), (20, 1.0), (21, 0.9999306949224985), (99, 0.6324589372294618)],
        ),
    ),
    ("no warmup", (2.0, 0.5, 0.0, None, 10, 10, &[(0, 2.0), (1, 1.9698463103929542), (9, 1.0)])),
    ("a one-step warmup", (2.0, 0.5, 0.1, None, 10, 10, &[(0, 0.0), (1, 2.0), (2, 1.9619397662556435), (9, 1.0)])),
    (
        "all warmup: the peak is never reached",
        (2.0, 0.5, 1.0, None, 5, 5, &[(0, 0.0), (1, 0.3999999999999999), (4, 1.6)]),
    ),
    (
        "wsd, linear decay over the last 20%",
        (
            1.0,
            0.1,
            0.1,
            Some((0.2, WsdDecayStyle::Linear)),
            100,
            100,
            &[
                (0, 0.0),
                (9, 0.9),
                (10, 1.0),
                (11, 1.0),
                (50, 1.0),
                (79, 1.0),
                (80, 1.0),
                (81, 0.9526315789473685),
                (90, 0.5263157894736843),
                (99, 0.1),
            ],
        ),
    ),
    (
        "wsd, cosine decay, zero tail",
        (
            1.0,
            0.1,
            0.1,
            Some((0.2, WsdDecayStyle::Cosine)),
            100,
            110,
            &[
                (0, 0.0),
                (10, 1.0),
                (79, 1.0),
                (80, 1.0),
                (81, 0.9938625865312251),
                (90, 0.5128392945374505),
                (99, 0.1),
                (100, 0.0),
                (109, 0.0),
            ],
        ),
    ),
    (
        "wsd with a one-step linear decay (optax's zero-step transition holds its start)",
        (1.0, 0.1, 0.0, Some((0.1, WsdDecayStyle::Linear)), 10, 10, &[(0, 1.0), (8, 1.0), (9, 1.0)]),
    ),
];

fn schedule(case: &Case) -> LearningRateSchedule {
    let (lr, ff, wf, wsd, ss, steps, _) = *case;
    LearningRateSchedule::new(lr, ff, wf, wsd, ss, steps).unwrap()
}

#[test]
fn host_schedule_matches_maxtexts() {
    for (name, case) in CASES {
        let s = schedule(case);
        for &(step, want) in case.6 {
            let got = s.at(step);
            assert!((got - want).abs() <= 1e-12 * want.abs().max(1e-12), "{name}: step {step}: {got} vs {want}");
        }
    }
}

#[test]
fn traced_schedule_matches_the_host_one_at_every_step() {
    for (name, case) in CASES {
        let s = schedule(case);
        let steps = case.5;
        let mut sig = Signature::new(None);
        sig.input("steps", DType::S32, &[steps]);
        let program = trace(&sig, |_, inp| {
            let (_, lrs) = maxrs::tensor::scan(&Tree::new(), &Tree::new().with("t", inp["steps"].clone()), |_, x| {
                (Tree::new(), Tree::new().with("lr", s.traced(&x["t"])))
            });
            lrs
        })
        .unwrap();
        let ids: Vec<i32> = (0..steps as i32).collect();
        let out =
            crate::common::run(&program, &Tree::new().with("steps", maxrs::host::HostTensor::from_i32(&[steps], &ids)));
        for (step, got) in out["lr"].to_f64().into_iter().enumerate() {
            let want = s.at(step as u64);
            assert!((got - want).abs() <= 1e-6 * want.abs().max(1e-6), "{name}: step {step}: traced {got} vs {want}");
        }
    }
}

#[test]
fn bad_values_name_the_key() {
    let new = |w: f64, wsd, ss: i64, steps: i64| {
        LearningRateSchedule::new(1.0, 0.1, w, wsd, ss, steps).unwrap_err().to_string()
    };
    assert!(new(1.5, None, -1, 10).contains("warmup_steps_fraction=1.5"));
    assert!(new(0.1, None, 0, 10).contains("learning_rate_schedule_steps=0"));
    assert!(new(0.1, None, -1, 0).contains("steps=0"));
    let e = new(0.5, Some((0.6, WsdDecayStyle::Linear)), -1, 10);
    assert!(e.contains("wsd_decay_steps_fraction=0.6") && e.contains("warmup_steps_fraction=0.5"), "{e}");
    let e = LearningRateSchedule::new(-1.0, 0.1, 0.1, None, -1, 10).unwrap_err().to_string();
    assert!(e.contains("learning_rate=-1"), "{e}");
}
