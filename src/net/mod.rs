//! Everything maxrs does over HTTP, in one place: the client (timeouts, TLS roots), the retry
//! policy every caller's loop follows ([`retry`]), Google credentials ([`credentials`]) and the
//! checks on the names and hosts they go with ([`google`]), and the one-line form of an error
//! with its causes ([`chain`]). Storage (`gs://`), `maxrs submit vertex`, plugin provisioning
//! (PyPI) and the cluster client (its registration retries) use it; it imports nothing of maxrs.

use std::time::Duration;

use anyhow::{anyhow, Result};
use reqwest::blocking::Client;

pub mod credentials;
pub mod google;
pub mod retry;

/// A blocking HTTP client. TLS trusts both the system's roots and the Mozilla roots reqwest
/// bundles (features `rustls-tls-native-roots` and `rustls-tls`), so a machine without a CA
/// bundle still reaches PyPI and Google. `timeout` bounds each connect and each read (reqwest's
/// blocking client applies it per operation): a large download is not cut off, a stalled one is.
pub fn client(timeout: Duration) -> Result<Client> {
    Client::builder()
        .user_agent(concat!("maxrs/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(Duration::from_secs(30))
        .timeout(timeout)
        .build()
        .map_err(|e| anyhow!("cannot create an HTTP client: {}", chain(&e)))
}

/// An error and its causes on one line, `a: b: c` (as anyhow's `{:#}`): reqwest's and
/// gcp_auth's own messages leave the cause (DNS, TLS, refused connection) to their sources.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
