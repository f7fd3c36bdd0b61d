//! `gs://` through the Cloud Storage JSON API (<https://cloud.google.com/storage/docs/json_api>),
//! the API Google's own client libraries use, over blocking `reqwest`:
//! - small files: one `uploadType=media` request; streamed files: a resumable upload session
//!   (`uploadType=resumable`), sent in `PART_BYTES` chunks and completed by the last one, so the
//!   object appears only when whole; an abandoned session is cancelled;
//! - reads: `alt=media`, streamed; listings: `prefix` + `delimiter=/`, every page;
//! - idempotent requests are retried on 429, 5xx and transport errors with exponential backoff.
//!
//! Credentials: Application Default Credentials ([`crate::net::credentials`]: a service account
//! key named by `GOOGLE_APPLICATION_CREDENTIALS`, gcloud's user credentials, the metadata server),
//! with the `devstorage.read_write` scope. `STORAGE_EMULATOR_HOST=http://host:port` sends every
//! request to that emulator instead, without credentials (as Google's client libraries do). The
//! token is attached only to `https://*.googleapis.com` URLs (checked on every request, the upload
//! session URL the API answers with included), and URLs are built from percent-encoded path
//! segments.

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use reqwest::blocking::{Client, Request, RequestBuilder, Response};
use reqwest::{StatusCode, Url};

use super::Entry;
use crate::net::credentials::Credentials;
use crate::net::retry::RetryPolicy;
use crate::net::{self, chain, google};

/// The environment variable Google's client libraries read to reach an emulator.
pub const EMULATOR_ENV: &str = "STORAGE_EMULATOR_HOST";
const GCS: &str = "https://storage.googleapis.com";
const SCOPE: &str = "https://www.googleapis.com/auth/devstorage.read_write";
/// The end of the error when no credentials are found.
const HOW_TO_GET_CREDENTIALS: &str = "gs:// needs them: run `gcloud auth application-default login`, or set \
    GOOGLE_APPLICATION_CREDENTIALS to a service account key file";

/// Chunk of a resumable upload (a multiple of 256 KiB, as the API requires).
const PART_BYTES: usize = 16 << 20;

/// How long one request may wait for an answer (to connect, for the response, for each read of
/// its body) before it is given up and tried again: 60 s, the default of Google's own storage
/// clients (python-storage `docs/retry_timeout.rst`; googleapis
/// `google/storage/v2/storage_grpc_service_config.json`: 60 s, 5 attempts). An endpoint that
/// accepts and never answers so fails in 5 x 60 s, each try announced, not 25 silent minutes.
const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// The environment variable that sets [`DEFAULT_REQUEST_TIMEOUT`] otherwise (seconds), for a
/// slow link or a test.
pub const TIMEOUT_ENV: &str = "MAXRS_GCS_TIMEOUT";

/// The request timeout: `$MAXRS_GCS_TIMEOUT` seconds (a positive number up to a day), else 60 s.
fn request_timeout() -> Result<Duration> {
    let Some(text) = std::env::var_os(TIMEOUT_ENV) else { return Ok(DEFAULT_REQUEST_TIMEOUT) };
    let text = text.to_string_lossy();
    text.trim().parse::<f64>().ok().filter(|s| *s > 0.0 && *s <= 86_400.0).map(Duration::from_secs_f64).ok_or_else(
        || anyhow!("{TIMEOUT_ENV}={text:?}: give the seconds a Cloud Storage request may wait, from 0 to 86400"),
    )
}

/// Idempotent requests: 5 tries, waits of 0.25, 0.5, 1 and 2 s.
fn retry_policy() -> RetryPolicy {
    RetryPolicy {
        attempts: 5,
        base_delay: Duration::from_millis(250),
        max_delay: Duration::from_secs(2),
        jitter: false,
        deadline: None,
    }
}

/// The endpoint and how requests authenticate, fixed for the process at first use.
struct Service {
    base: Url,
    http: Client,
    /// Each request's wait for an answer ([`request_timeout`]).
    timeout: Duration,
    /// `None` for an emulator.
    credentials: Option<Credentials>,
}

/// The service of the endpoint the environment names now (an emulator's or Google's), for
/// `what` (the request it serves, named in an error: a user without credentials learns which
/// location needed them). Each endpoint is connected once and kept (its connections and
/// credentials reused), so one process may use an emulator and Cloud Storage in turn, whichever
/// it uses first.
fn service(what: &str) -> Result<Arc<Service>> {
    type Services = BTreeMap<Option<String>, Result<Arc<Service>, String>>;
    static SERVICES: Mutex<Services> = Mutex::new(BTreeMap::new());
    let emulator = std::env::var(EMULATOR_ENV).ok().map(|h| h.trim().to_string()).filter(|h| !h.is_empty());
    let mut services = SERVICES.lock().unwrap_or_else(PoisonError::into_inner);
    let service = services
        .entry(emulator.clone())
        .or_insert_with(|| connect(emulator.as_deref()).map(Arc::new).map_err(|e| format!("{e:#}")));
    service.clone().map_err(|e| anyhow!("{what}: {e}"))
}

/// The service of an emulator at `emulator` (`host:port` or a URL), or of Google's endpoint.
fn connect(emulator: Option<&str>) -> Result<Service> {
    let timeout = request_timeout()?;
    let http = net::client(timeout)?;
    if let Some(host) = emulator {
        let base = if host.contains("://") { host.to_string() } else { format!("http://{host}") };
        return Ok(Service { base: google::endpoint(EMULATOR_ENV, &base)?, http, timeout, credentials: None });
    }
    let credentials = Credentials::find(HOW_TO_GET_CREDENTIALS)?;
    let base = google::endpoint("the Cloud Storage endpoint", GCS)?;
    Ok(Service { base, http, timeout, credentials: Some(credentials) })
}

impl Service {
    fn url(&self, path: &[&str], query: &[(&str, &str)]) -> Url {
        let mut url = google::api_url(&self.base, path);
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        url
    }

    fn object_url(&self, bucket: &str, key: &str, query: &[(&str, &str)]) -> Url {
        // The object name is one path segment: its `/` are percent-encoded.
        self.url(&["storage", "v1", "b", bucket, "o", key], query)
    }

    /// The request `builder` makes, with the token when there are credentials: only for a
    /// Google API host (an emulator gets none).
    fn authorized(&self, builder: RequestBuilder) -> Result<Request> {
        let mut request = builder.build().map_err(|e| anyhow!("GCS request: {}", chain(&e)))?;
        if let Some(credentials) = &self.credentials {
            credentials.authorize(&mut request, SCOPE, &[])?;
        }
        Ok(request)
    }

    /// What a try that waited out the timeout is told: `no answer within 60 s`.
    fn no_answer(&self) -> String {
        format!("no answer within {} s", self.timeout.as_secs_f64())
    }

    /// Sends the request `make` builds, retrying transient failures; returns the response
    /// (any status) or the last transport error.
    fn send(&self, what: &str, make: impl Fn() -> RequestBuilder) -> Result<Response> {
        let policy = retry_policy();
        let mut tries = policy.tries();
        loop {
            let result = self.http.execute(self.authorized(make())?);
            let retry = match &result {
                Ok(r) => r.status() == StatusCode::TOO_MANY_REQUESTS || r.status().is_server_error(),
                Err(e) => e.is_connect() || e.is_timeout() || e.is_request(),
            };
            let timed_out = matches!(&result, Err(e) if e.is_timeout());
            if !retry || tries.last() {
                return result.map_err(|e| {
                    let waited = match timed_out {
                        true => format!(
                            " ({} in each of {} tries; {TIMEOUT_ENV} sets the wait, {EMULATOR_ENV} the endpoint)",
                            self.no_answer(),
                            tries.attempt()
                        ),
                        false => String::new(),
                    };
                    anyhow!("{what}: {}{waited}", chain(&e))
                });
            }
            let attempt = tries.attempt();
            let delay = tries.next(None);
            if timed_out {
                // A silent wait of minutes looks like a hang: say what is waited for, and until when.
                tracing::warn!(
                    "{what}: {}; try {} of {} in {delay:.2?} ({TIMEOUT_ENV} sets the wait)",
                    self.no_answer(),
                    attempt + 1,
                    tries.attempts()
                );
            } else {
                tracing::debug!("{what}: attempt {attempt} failed; retrying in {delay:?}");
            }
            std::thread::sleep(delay);
        }
    }
}

/// A failed response as one line: status and the API's error message.
fn status_error(what: &str, response: Response) -> anyhow::Error {
    let status = response.status();
    let body = response.text().unwrap_or_default();
    let message = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| body.chars().take(200).collect::<String>().replace('\n', " "));
    anyhow!("{what}: HTTP {status}: {message}")
}

pub(super) fn put(bucket: &str, key: &str, bytes: &[u8]) -> Result<()> {
    let what = format!("writing gs://{bucket}/{key}");
    let service = service(&what)?;
    let url = service.url(&["upload", "storage", "v1", "b", bucket, "o"], &[("uploadType", "media"), ("name", key)]);
    let response = service.send(&what, || {
        service.http.post(url.clone()).header("content-type", "application/octet-stream").body(bytes.to_vec())
    })?;
    if !response.status().is_success() {
        return Err(status_error(&what, response));
    }
    Ok(())
}

pub(super) fn exists(bucket: &str, key: &str) -> Result<bool> {
    Ok(metadata(bucket, key, "name")?.is_some())
}

/// The object's metadata `fields` (JSON API), `None` when there is no such object.
fn metadata(bucket: &str, key: &str, fields: &str) -> Result<Option<serde_json::Value>> {
    let what = format!("looking up gs://{bucket}/{key}");
    let service = service(&what)?;
    let url = service.object_url(bucket, key, &[("fields", fields)]);
    let response = service.send(&what, || service.http.get(url.clone()))?;
    match response.status() {
        StatusCode::NOT_FOUND => Ok(None),
        s if s.is_success() => response.json_value(&what).map(Some),
        _ => Err(status_error(&what, response)),
    }
}

pub(super) fn list_dir(bucket: &str, key: &str) -> Result<Vec<Entry>> {
    let prefix = if key.is_empty() { String::new() } else { format!("{key}/") };
    let mut entries = Vec::new();
    let strip = |name: &str| name.strip_prefix(&prefix).unwrap_or(name).trim_end_matches('/').to_string();
    list(bucket, &prefix, true, |page| {
        for p in page["prefixes"].as_array().into_iter().flatten().filter_map(|p| p.as_str()) {
            entries.push(Entry { name: strip(p), is_dir: true });
        }
        for item in page["items"].as_array().into_iter().flatten() {
            if let Some(name) = item["name"].as_str().filter(|n| *n != prefix) {
                entries.push(Entry { name: strip(name), is_dir: false });
            }
        }
    })?;
    Ok(entries)
}

/// Every page of a listing of `prefix`, with `/` as delimiter or recursively.
fn list(bucket: &str, prefix: &str, delimited: bool, mut on_page: impl FnMut(&serde_json::Value)) -> Result<()> {
    let what = format!("listing gs://{bucket}/{prefix}");
    let service = service(&what)?;
    let mut token = String::new();
    loop {
        let mut query = vec![("prefix", prefix), ("fields", "items(name),prefixes,nextPageToken")];
        if delimited {
            query.push(("delimiter", "/"));
        }
        if !token.is_empty() {
            query.push(("pageToken", token.as_str()));
        }
        let url = service.url(&["storage", "v1", "b", bucket, "o"], &query);
        let response = service.send(&what, || service.http.get(url.clone()))?;
        if !response.status().is_success() {
            return Err(status_error(&what, response));
        }
        let page: serde_json::Value = response.json_value(&what)?;
        on_page(&page);
        match page["nextPageToken"].as_str() {
            Some(next) if !next.is_empty() => token = next.to_string(),
            _ => return Ok(()),
        }
    }
}

trait JsonBody {
    fn json_value(self, what: &str) -> Result<serde_json::Value>;
}

impl JsonBody for Response {
    fn json_value(self, what: &str) -> Result<serde_json::Value> {
        let text = self.text().map_err(|e| anyhow!("{what}: {}", chain(&e)))?;
        serde_json::from_str(&text).map_err(|e| anyhow!("{what}: unreadable answer ({e})"))
    }
}

pub(super) fn remove_prefix(bucket: &str, key: &str) -> Result<()> {
    let service = service(&format!("deleting gs://{bucket}/{key}"))?;
    let mut names = vec![key.to_string()];
    list(bucket, &format!("{key}/"), false, |page| {
        names.extend(
            page["items"].as_array().into_iter().flatten().filter_map(|i| i["name"].as_str().map(String::from)),
        );
    })?;
    for name in names {
        let what = format!("deleting gs://{bucket}/{name}");
        let url = service.object_url(bucket, &name, &[]);
        let response = service.send(&what, || service.http.delete(url.clone()))?;
        if !(response.status().is_success() || response.status() == StatusCode::NOT_FOUND) {
            return Err(status_error(&what, response));
        }
    }
    Ok(())
}

/// A resumable upload: bytes are buffered into `PART_BYTES` chunks, each sent as it fills; the
/// last chunk (sent by `finish`) states the total size, which completes the object.
pub(super) struct ObjectUpload {
    what: String,
    session: Option<Url>,
    buffer: Vec<u8>,
    sent: u64,
}

impl ObjectUpload {
    pub(super) fn start(bucket: &str, key: &str) -> Result<ObjectUpload> {
        let what = format!("writing gs://{bucket}/{key}");
        let service = service(&what)?;
        let url =
            service.url(&["upload", "storage", "v1", "b", bucket, "o"], &[("uploadType", "resumable"), ("name", key)]);
        let response = service.send(&what, || service.http.post(url.clone()).header("content-length", "0"))?;
        if !response.status().is_success() {
            return Err(status_error(&what, response));
        }
        let location = response
            .headers()
            .get("location")
            .and_then(|l| l.to_str().ok())
            .ok_or_else(|| anyhow!("{what}: the upload session has no Location"))?;
        let session = Url::parse(location).map_err(|e| anyhow!("{what}: bad upload session URL: {e}"))?;
        Ok(ObjectUpload { what, session: Some(session), buffer: Vec::with_capacity(PART_BYTES), sent: 0 })
    }

    /// Sends the buffer as the next chunk; `last` states the total size.
    fn send_chunk(&mut self, last: bool) -> Result<()> {
        let service = service(&self.what)?;
        let session = self.session.clone().expect("open until finished");
        let len = self.buffer.len() as u64;
        let total = if last { (self.sent + len).to_string() } else { "*".to_string() };
        let range = if len == 0 {
            format!("bytes */{total}")
        } else {
            format!("bytes {}-{}/{total}", self.sent, self.sent + len - 1)
        };
        let body = std::mem::take(&mut self.buffer);
        // Not retried: a resent chunk would need the session's status first. A failed save is
        // reported and the next save starts afresh.
        let request = service.authorized(service.http.put(session).header("content-range", range).body(body))?;
        let response = service.http.execute(request);
        let response = response.map_err(|e| anyhow!("{}: {}", self.what, chain(&e)))?;
        let done = response.status().is_success();
        let more = response.status().as_u16() == 308;
        if (last && !done) || (!last && !more) {
            return Err(status_error(&self.what, response));
        }
        self.sent += len;
        self.buffer = Vec::with_capacity(PART_BYTES);
        Ok(())
    }

    pub(super) fn write(&mut self, mut buf: &[u8]) -> std::io::Result<usize> {
        let n = buf.len();
        while !buf.is_empty() {
            let take = (PART_BYTES - self.buffer.len()).min(buf.len());
            self.buffer.extend_from_slice(&buf[..take]);
            buf = &buf[take..];
            if self.buffer.len() == PART_BYTES {
                self.send_chunk(false).map_err(|e| std::io::Error::other(format!("{e:#}")))?;
            }
        }
        Ok(n)
    }

    pub(super) fn finish(mut self) -> Result<u64> {
        self.send_chunk(true)?;
        self.session = None;
        Ok(self.sent)
    }
}

impl Drop for ObjectUpload {
    fn drop(&mut self) {
        // Cancels the session (the API answers 499), so no object appears.
        if let (Some(session), Ok(service)) = (self.session.take(), service(&self.what)) {
            if let Ok(request) = service.authorized(service.http.delete(session)) {
                let _ = service.http.execute(request);
            }
        }
    }
}

/// Reads an object front to back as it streams in.
pub(super) struct ObjectReader {
    response: Response,
}

impl ObjectReader {
    pub(super) fn open(bucket: &str, key: &str) -> Result<ObjectReader> {
        let what = format!("reading gs://{bucket}/{key}");
        let service = service(&what)?;
        let url = service.object_url(bucket, key, &[("alt", "media")]);
        let response = service.send(&what, || service.http.get(url.clone()))?;
        if response.status() == StatusCode::NOT_FOUND {
            bail!("{what}: no such object");
        }
        if !response.status().is_success() {
            return Err(status_error(&what, response));
        }
        Ok(ObjectReader { response })
    }
}

impl Read for ObjectReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.response.read(buf)
    }
}

/// The size of an object, in bytes; `None` when there is no such object.
pub(super) fn size(bucket: &str, key: &str) -> Result<Option<u64>> {
    let Some(meta) = metadata(bucket, key, "size")? else { return Ok(None) };
    // The JSON API writes sizes as decimal strings (uint64).
    let size = meta["size"].as_str().and_then(|s| s.parse().ok()).or_else(|| meta["size"].as_u64());
    size.map(Some).ok_or_else(|| anyhow!("looking up gs://{bucket}/{key}: no size in the answer: {meta}"))
}

/// Bytes `start..start + len` of an object (fewer at its end), with one `Range` request. A
/// connection that breaks while the body streams in (or a body cut short) is retried like a
/// failed request: the whole range is asked for again.
pub(super) fn read_range(bucket: &str, key: &str, start: u64, len: u64) -> Result<Vec<u8>> {
    if len == 0 {
        return Ok(Vec::new());
    }
    let what = format!("reading bytes {start}..{} of gs://{bucket}/{key}", start + len);
    let service = service(&what)?;
    let url = service.object_url(bucket, key, &[("alt", "media")]);
    let range = format!("bytes={start}-{}", start + len - 1);
    let policy = retry_policy();
    let mut tries = policy.tries();
    loop {
        let response = service.send(&what, || service.http.get(url.clone()).header("range", range.as_str()))?;
        let status = response.status();
        if status == StatusCode::NOT_FOUND {
            bail!("{what}: no such object");
        }
        if status == StatusCode::RANGE_NOT_SATISFIABLE {
            return Ok(Vec::new());
        }
        if !status.is_success() {
            return Err(status_error(&what, response));
        }
        let expected = response.content_length();
        let whole = status == StatusCode::OK;
        let mut timed_out = false;
        let failure = match response.bytes() {
            Ok(body) if expected.is_none_or(|n| n == body.len() as u64) => {
                // A server that ignores Range answers 200 with the whole object.
                let body = if whole { body.slice((start as usize).min(body.len())..) } else { body };
                return Ok(body[..body.len().min(len as usize)].to_vec());
            }
            Ok(body) => format!("the body ended after {} of {} bytes", body.len(), expected.unwrap_or(0)),
            Err(e) if e.is_timeout() => {
                timed_out = true;
                format!("{} ({TIMEOUT_ENV} sets the wait)", service.no_answer())
            }
            Err(e) => chain(&e),
        };
        if tries.last() {
            bail!("{what}: {failure} ({} tries)", tries.attempt());
        }
        let delay = tries.next(None);
        if timed_out {
            tracing::warn!("{what}: {failure}; try {} of {} in {delay:.2?}", tries.attempt(), tries.attempts());
        } else {
            tracing::debug!("{what}: {failure}; retrying in {delay:?}");
        }
        std::thread::sleep(delay);
    }
}

/// The names of every object under `prefix` (recursively), sorted.
pub(super) fn list_names(bucket: &str, prefix: &str) -> Result<Vec<String>> {
    let mut names = Vec::new();
    list(bucket, prefix, false, |page| {
        names.extend(
            page["items"].as_array().into_iter().flatten().filter_map(|i| i["name"].as_str().map(str::to_string)),
        );
    })?;
    names.sort();
    Ok(names)
}
