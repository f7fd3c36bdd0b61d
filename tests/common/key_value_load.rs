//! The coordination service's key-value load: every client a number of operations, checked value
//! by value. The cluster test asserts that nothing is lost (16 clients x 250: in a debug build
//! each operation costs ~1.3 ms of CPU, and 1000 each made it a 21 CPU-s test);
//! `benches/cluster.rs` includes this file (`#[path]`) and times 16 x 1000.

use std::sync::Arc;
use std::time::{Duration, Instant};

use maxrs::cluster::CoordinationClient;

/// Connects every client at once (registration waits for all of them).
pub fn connect_all(clients: &[Arc<CoordinationClient>]) {
    let threads: Vec<_> = clients.iter().cloned().map(|c| std::thread::spawn(move || c.connect().unwrap())).collect();
    threads.into_iter().for_each(|t| {
        t.join().unwrap();
    });
}

/// Per client, concurrently, `ops` operations (a multiple of 4): `ops / 2` sets under
/// `prefix/RANK/I`, `ops / 4` reads of its own keys, `ops / 4 - 1` blocking gets of the next
/// client's keys, and 1 increment of `prefix_count`. Returns the wall time of the whole load.
pub fn run(clients: &[Arc<CoordinationClient>], prefix: &'static str, ops: usize) -> Duration {
    let n = clients.len();
    let start = Instant::now();
    let threads: Vec<_> = clients
        .iter()
        .cloned()
        .enumerate()
        .map(|(r, c)| {
            std::thread::spawn(move || {
                for i in 0..ops / 2 {
                    c.key_value_set(&format!("{prefix}/{r}/{i}"), format!("{r}:{i}").as_bytes(), false).unwrap();
                }
                for i in 0..ops / 4 {
                    let v = c.key_value_try_get(&format!("{prefix}/{r}/{}", 2 * i)).unwrap();
                    assert_eq!(v.as_deref(), Some(format!("{r}:{}", 2 * i).as_bytes()));
                }
                let next = (r + 1) % n;
                for i in 0..ops / 4 - 1 {
                    let v = c.blocking_key_value_get(&format!("{prefix}/{next}/{i}"), Duration::from_secs(30)).unwrap();
                    assert_eq!(v, format!("{next}:{i}").as_bytes());
                }
                c.key_value_increment(&format!("{prefix}_count"), 1).unwrap();
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    start.elapsed()
}
