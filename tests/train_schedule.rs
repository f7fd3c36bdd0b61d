//! The host learning-rate schedule at MaxText's boundaries.

use maxrs::train::schedule::LearningRateSchedule;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1e-12)
}

#[test]
fn warmup_cosine_and_boundaries() {
    // MaxText defaults: 10% warmup, cosine to 10% of the peak. 101 steps: W = int(10.1) = 10,
    // cosine over C = 91 steps with pct = (step - 10) / 90, so step 55 is exactly halfway.
    let s = LearningRateSchedule::new(1e-3, 0.1, 0.1, -1, 101).unwrap();
    assert_eq!(s.schedule_steps, 101);
    assert_eq!(s.warmup_steps(), 10);
    assert_eq!(s.at(0), 0.0);
    assert!(close(s.at(1), 1e-3 / 9.0));
    assert!(close(s.at(9), 1e-3), "end of warmup reaches the peak: {}", s.at(9));
    assert!(close(s.at(10), 1e-3), "the cosine starts at the peak: {}", s.at(10));
    assert!(close(s.at(55), 0.5 * (1e-3 + 1e-4)), "middle of the cosine: {}", s.at(55));
    assert!(close(s.at(100), 1e-4), "last step ends at the final fraction: {}", s.at(100));
    for step in 10..100 {
        assert!(s.at(step + 1) <= s.at(step), "decays monotonically after warmup (step {step})");
    }
}

#[test]
fn shorter_schedule_leaves_a_zero_tail_longer_one_never_finishes() {
    let short = LearningRateSchedule::new(1.0, 0.1, 0.1, 50, 100).unwrap();
    assert!(close(short.at(49), 0.1));
    assert_eq!(short.at(50), 0.0);
    assert_eq!(short.at(99), 0.0);

    let long = LearningRateSchedule::new(1.0, 0.1, 0.1, 200, 100).unwrap();
    assert_eq!(long.warmup_steps(), 20);
    assert!(long.at(99) > 0.5, "halfway through its cosine: {}", long.at(99));
}

#[test]
fn degenerate_warmups() {
    // No warmup: the cosine starts at step 0.
    let none = LearningRateSchedule::new(2.0, 0.5, 0.0, -1, 10).unwrap();
    assert_eq!(none.at(0), 2.0);
    assert!(close(none.at(9), 1.0));
    // One warmup step is optax's zero-length linear schedule: 0.
    let one = LearningRateSchedule::new(2.0, 0.5, 0.1, -1, 10).unwrap();
    assert_eq!(one.warmup_steps(), 1);
    assert_eq!(one.at(0), 0.0);
    assert_eq!(one.at(1), 2.0);
    // All warmup: no cosine; the peak is held at the end.
    let all = LearningRateSchedule::new(2.0, 0.5, 1.0, -1, 5).unwrap();
    assert!(close(all.at(4), 2.0));
    // A single-step cosine sits at the final value.
    let single = LearningRateSchedule::new(2.0, 0.5, 0.5, -1, 3).unwrap();
    assert_eq!(single.warmup_steps(), 1);
    assert!(close(single.at(1), 2.0) && close(single.at(2), 1.0));
}

#[test]
fn bad_values_name_the_key() {
    let err = LearningRateSchedule::new(1.0, 0.1, 1.5, -1, 10).unwrap_err();
    assert!(err.contains("warmup_steps_fraction=1.5"), "{err}");
    let err = LearningRateSchedule::new(1.0, 0.1, 0.1, 0, 10).unwrap_err();
    assert!(err.contains("learning_rate_schedule_steps=0"), "{err}");
    let err = LearningRateSchedule::new(-1.0, 0.1, 0.1, -1, 10).unwrap_err();
    assert!(err.contains("learning_rate=-1"), "{err}");
    let err = LearningRateSchedule::new(1.0, 0.1, 0.1, -1, 0).unwrap_err();
    assert!(err.contains("steps=0"), "{err}");
}
