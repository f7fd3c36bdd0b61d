//! The key-value store: insert (optionally without overwrite), blocking get (bounded by the
//! caller's gRPC deadline), try-get, directory get, increment, delete (recursive), on keys
//! normalized as XLA does.

// `tonic::Status` (the gRPC layer's error) is large; it is what every call returns anyway.
#![allow(clippy::result_large_err)]

use tonic::Status;

use super::{lock, Service};

/// XLA's key normalization: no leading, trailing or repeated slashes.
pub fn normalize_key(key: &str) -> String {
    key.split('/').filter(|part| !part.is_empty()).collect::<Vec<_>>().join("/")
}

impl Service {
    pub fn insert(&self, key: &str, value: Vec<u8>, allow_overwrite: bool) -> Result<(), Status> {
        let key = normalize_key(key);
        {
            let mut state = lock(&self.state);
            if !allow_overwrite && state.kv.contains_key(&key) {
                return Err(Status::already_exists(format!("key {key} already exists")));
            }
            state.kv.insert(key, value);
        }
        self.kv_changed.notify_waiters();
        Ok(())
    }

    /// Waits until `key` exists (the caller's deadline bounds the wait).
    pub async fn get(&self, key: &str) -> Result<Vec<u8>, Status> {
        let key = normalize_key(key);
        loop {
            let changed = self.kv_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let state = lock(&self.state);
                if state.stopped {
                    return Err(Self::stopped_error("the key-value get"));
                }
                if let Some(value) = state.kv.get(&key) {
                    return Ok(value.clone());
                }
            }
            changed.await;
        }
    }

    pub fn try_get(&self, key: &str) -> Option<Vec<u8>> {
        lock(&self.state).kv.get(&normalize_key(key)).cloned()
    }

    pub fn get_dir(&self, directory: &str) -> Vec<(String, Vec<u8>)> {
        let prefix = format!("{}/", normalize_key(directory));
        let state = lock(&self.state);
        state
            .kv
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Adds `increment` to the decimal integer at `key` (0 when absent); returns the new value.
    pub fn increment(&self, key: &str, increment: i64) -> Result<i64, Status> {
        let key = normalize_key(key);
        let value = {
            let mut state = lock(&self.state);
            let current = match state.kv.get(&key) {
                None => 0,
                Some(bytes) => std::str::from_utf8(bytes)
                    .ok()
                    .and_then(|s| s.parse::<i64>().ok())
                    .ok_or_else(|| Status::failed_precondition(format!("key {key} does not hold a decimal integer")))?,
            };
            let value =
                current.checked_add(increment).ok_or_else(|| Status::out_of_range(format!("key {key} overflows")))?;
            state.kv.insert(key, value.to_string().into_bytes());
            value
        };
        self.kv_changed.notify_waiters();
        Ok(value)
    }

    pub fn delete(&self, key: &str) {
        let key = normalize_key(key);
        let prefix = format!("{key}/");
        let mut state = lock(&self.state);
        state.kv.remove(&key);
        state.kv.retain(|k, _| !k.starts_with(&prefix));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_normalized_like_xla() {
        assert_eq!(normalize_key("///a//b/c//"), "a/b/c");
        assert_eq!(normalize_key("gpu:local_topology/cuda/0"), "gpu:local_topology/cuda/0");
        assert_eq!(normalize_key("/"), "");
    }
}
