//! Hub datasets (`hf_path=org/name`): the repository's files listed and read through the Hub's
//! own HTTP API, as `huggingface_hub` does for `datasets.load_dataset(..., streaming=True)`:
//!
//! - listing: `GET {endpoint}/api/datasets/{repo}/tree/{revision}?recursive=true&expand=false`,
//!   a JSON array of `{type, path, size, ...}`, continued by the `Link: <...>; rel="next"` header
//!   (`HfApi.list_repo_tree` and `utils/_pagination.py` in huggingface_hub);
//! - a file: `GET {endpoint}/datasets/{repo}/resolve/{revision}/{path}` (`hf_hub_url`), whole and
//!   streamed for JSON Lines / CSV / text / Arrow, in ranges for Parquet (its footer, then each
//!   row group's columns); a read that breaks resumes where it stopped with a `Range` request.
//! - the endpoint is `$HF_ENDPOINT`, else `https://huggingface.co`; the token `hf_access_token`,
//!   else `$HF_TOKEN`, sent as `Authorization: Bearer` only to the endpoint's own scheme, host and
//!   port. Redirects are followed here, not by the client, so a redirect to another host (the
//!   Hub's CDN for large files) never carries it, as huggingface_hub's session drops it there.
//!
//! Idempotent requests are retried on 429, 5xx and transport errors (5 tries, 0.25 s doubling to
//! 2 s, as [`crate::storage`]'s GCS client); other failures are one line naming the dataset, the
//! file and what to do (a 401 says to give a token).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use reqwest::blocking::{Client, Response};
use reqwest::header::{AUTHORIZATION, LINK, LOCATION, RANGE};
use reqwest::{StatusCode, Url};

use super::documents::Format;
use super::error::DataError;
use super::storage::{DataFile, Storage};
use crate::net::retry::RetryPolicy;

/// The Hub's address unless `$HF_ENDPOINT` says otherwise (huggingface_hub's `constants.ENDPOINT`).
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// The revision `load_dataset` reads when none is given.
const REVISION: &str = "main";
/// Each request's wait for an answer (connect, response, each read of a body), as GCS's.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Redirects followed for one request at most.
const MAX_REDIRECTS: usize = 10;

/// One Hub dataset repository and how to reach it.
pub struct Hub {
    repo: String,
    endpoint: Url,
    token: Option<String>,
    http: Client,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("Hub").field("repo", &self.repo).field("endpoint", &self.endpoint.as_str()).finish()
    }
}

/// Whether `hf_path` names a Hub dataset (`org/name`, or `name`), rather than a builder.
pub fn is_repo(hf_path: &str) -> bool {
    let parts: Vec<&str> = hf_path.split('/').collect();
    let ok = |p: &str| {
        !p.is_empty() && !p.starts_with('.') && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    parts.len() <= 2 && parts.iter().all(|p| ok(p))
}

impl Hub {
    /// The dataset `repo`, with `token` ('' for `$HF_TOKEN`, or none).
    pub fn new(repo: &str, token: &str) -> Result<Hub, DataError> {
        let text = std::env::var("HF_ENDPOINT").ok().filter(|e| !e.trim().is_empty());
        let text = text.as_deref().unwrap_or(DEFAULT_ENDPOINT).trim().trim_end_matches('/');
        let endpoint = Url::parse(&format!("{text}/"))
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
            .ok_or_else(|| {
                DataError::Invalid(format!("HF_ENDPOINT={text:?}: give the Hub's address, https://HOST[:PORT]"))
            })?;
        let token = match token {
            "" => std::env::var("HF_TOKEN").ok().filter(|t| !t.trim().is_empty()),
            given => Some(given.to_string()),
        };
        let http = Client::builder()
            .user_agent(concat!("maxrs/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(30))
            .timeout(REQUEST_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| DataError::Invalid(format!("cannot create an HTTP client: {}", crate::net::chain(&e))))?;
        Ok(Hub { repo: repo.to_string(), endpoint, token, http })
    }

    /// The `hf_path=...` every error starts with.
    fn culprit(&self) -> String {
        format!("hf_path={}", self.repo)
    }

    fn url(&self, tail: &str) -> Url {
        self.endpoint.join(tail).expect("a path below the endpoint")
    }

    /// A file's `resolve` URL; its path's segments percent-encoded.
    fn file_url(&self, path: &str) -> Url {
        let mut url = self.url(&format!("datasets/{}/resolve/{REVISION}/", self.repo));
        url.path_segments_mut().expect("an http URL").pop_if_empty().extend(path.split('/'));
        url
    }

    /// Whether the token may go to `url`: the endpoint's own scheme, host and port only.
    fn same_origin(&self, url: &Url) -> bool {
        url.scheme() == self.endpoint.scheme()
            && url.host_str() == self.endpoint.host_str()
            && url.port_or_known_default() == self.endpoint.port_or_known_default()
    }

    /// GETs `url` (from byte `from` when not 0), following redirects and retrying transient
    /// failures; a response that is not a success is an error naming `what`. `Ok(None)`: 404.
    fn get(&self, what: &str, url: Url, from: u64) -> Result<Option<Response>, DataError> {
        let policy = RetryPolicy {
            attempts: 5,
            base_delay: Duration::from_millis(250),
            max_delay: Duration::from_secs(2),
            jitter: false,
            deadline: None,
        };
        let mut tries = policy.tries();
        loop {
            let result = self.follow(url.clone(), from);
            let retry = match &result {
                Ok(r) => r.status() == StatusCode::TOO_MANY_REQUESTS || r.status().is_server_error(),
                Err(e) => e.is_connect() || e.is_timeout() || e.is_request() || e.is_body(),
            };
            if retry && !tries.last() {
                let delay = tries.next(None);
                tracing::debug!("{}: {what}: try {} failed; retrying in {delay:?}", self.culprit(), tries.attempt());
                std::thread::sleep(delay);
                continue;
            }
            let response = result
                .map_err(|e| DataError::Invalid(format!("{}: {what}: {}", self.culprit(), crate::net::chain(&e))))?;
            return match response.status() {
                s if s.is_success() => Ok(Some(response)),
                StatusCode::NOT_FOUND => Ok(None),
                status => Err(self.refused(what, status, response)),
            };
        }
    }

    /// One request and its redirects; the token only where [`Hub::same_origin`].
    fn follow(&self, mut url: Url, from: u64) -> reqwest::Result<Response> {
        let mut redirects = 0;
        loop {
            let mut request = self.http.get(url.clone());
            if from > 0 {
                request = request.header(RANGE, format!("bytes={from}-"));
            }
            if let Some(token) = self.token.as_ref().filter(|_| self.same_origin(&url)) {
                request = request.header(AUTHORIZATION, format!("Bearer {token}"));
            }
            let response = request.send()?;
            let next = response.headers().get(LOCATION).and_then(|l| l.to_str().ok()).and_then(|l| url.join(l).ok());
            match next {
                Some(next) if response.status().is_redirection() && redirects < MAX_REDIRECTS => {
                    redirects += 1;
                    url = next;
                }
                _ => return Ok(response),
            }
        }
    }

    /// A refusal as one line: the status, the Hub's message, what to do.
    fn refused(&self, what: &str, status: StatusCode, response: Response) -> DataError {
        let body = response.text().unwrap_or_default();
        let message = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string))
            .unwrap_or(body);
        let message: String = message.lines().next().unwrap_or("").chars().take(200).collect();
        let hint = match (status, &self.token) {
            (StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN, None) => {
                "; the dataset is private or gated, or does not exist: give a token with hf_access_token or HF_TOKEN"
            }
            (StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN, Some(_)) => {
                "; the token given (hf_access_token or HF_TOKEN) has no access to it, or it does not exist"
            }
            _ => "",
        };
        let message = if message.trim().is_empty() { String::new() } else { format!(": {}", message.trim()) };
        DataError::Invalid(format!("{}: {what}: the Hub answered {status}{message}{hint}", self.culprit()))
    }

    /// Every file of the repository at `main`: relative paths and sizes, sorted.
    pub fn list(&self) -> Result<Vec<(String, u64)>, DataError> {
        let mut url = self.url(&format!("api/datasets/{}/tree/{REVISION}", self.repo));
        url.query_pairs_mut().append_pair("recursive", "true").append_pair("expand", "false");
        let what = format!("listing its files ({})", self.endpoint.as_str().trim_end_matches('/'));
        let mut files = Vec::new();
        let mut next = Some(url);
        while let Some(url) = next.take() {
            let Some(response) = self.get(&what, url.clone(), 0)? else {
                return Err(DataError::Invalid(format!(
                    "{}: no such dataset on {} (404 for its files at revision {REVISION})",
                    self.culprit(),
                    self.endpoint.as_str().trim_end_matches('/')
                )));
            };
            next = next_page(&response, &url);
            let body = response
                .bytes()
                .map_err(|e| DataError::Invalid(format!("{}: {what}: {}", self.culprit(), crate::net::chain(&e))))?;
            let entries: Vec<serde_json::Value> = serde_json::from_slice(&body).map_err(|e| {
                DataError::Invalid(format!("{}: {what}: not the Hub's JSON listing: {e}", self.culprit()))
            })?;
            for entry in entries {
                if entry.get("type").and_then(|t| t.as_str()) != Some("file") {
                    continue;
                }
                let (Some(path), Some(size)) =
                    (entry.get("path").and_then(|p| p.as_str()), entry.get("size").and_then(|s| s.as_u64()))
                else {
                    continue;
                };
                files.push((path.to_string(), size));
            }
        }
        files.sort();
        Ok(files)
    }

    /// The text of the repository's file `path`, `None` if it has none (the dataset card).
    pub fn small_file(&self, path: &str) -> Result<Option<String>, DataError> {
        let Some(response) = self.get(&format!("reading {path}"), self.file_url(path), 0)? else { return Ok(None) };
        let text = response.text().map_err(|e| {
            DataError::Invalid(format!("{}: reading {path}: {}", self.culprit(), crate::net::chain(&e)))
        })?;
        Ok(Some(text))
    }
}

/// The `rel="next"` URL of a paginated answer.
fn next_page(response: &Response, base: &Url) -> Option<Url> {
    let link = response.headers().get(LINK)?.to_str().ok()?;
    link.split(',').find(|part| part.contains("rel=\"next\"")).and_then(|part| {
        let start = part.find('<')? + 1;
        let end = part.find('>')?;
        base.join(&part[start..end]).ok()
    })
}

/// The prefix of the paths [`HubFiles`] hands out (the library's `hf://` names).
fn prefix(repo: &str) -> String {
    format!("hf://datasets/{repo}/")
}

/// The chosen files of one split of a Hub dataset, all in one format.
pub struct HubFiles {
    hub: Arc<Hub>,
    /// Relative path and size of every file of the repository.
    sizes: Vec<(String, u64)>,
    format: Format,
}

impl HubFiles {
    /// The storage of `hub`'s files (`listing` from [`Hub::list`]) and the `hf://` paths of
    /// `chosen` among them.
    pub fn new(hub: Hub, listing: Vec<(String, u64)>, chosen: &[String], format: Format) -> (HubFiles, Vec<PathBuf>) {
        let paths = chosen.iter().map(|f| PathBuf::from(format!("{}{f}", prefix(&hub.repo)))).collect();
        (HubFiles { hub: Arc::new(hub), sizes: listing, format }, paths)
    }

    fn relative<'p>(&self, path: &'p Path) -> Option<&'p str> {
        path.to_str()?.strip_prefix(&prefix(&self.hub.repo))
    }
}

impl Storage for HubFiles {
    fn glob(&self, key: &'static str, pattern: &str) -> Result<Vec<PathBuf>, DataError> {
        let bad = |message: String| DataError::BadGlob { key, pattern: pattern.to_string(), message };
        let matcher = glob::Pattern::new(pattern).map_err(|e| bad(e.to_string()))?;
        let options = glob::MatchOptions { require_literal_separator: true, ..Default::default() };
        let files: Vec<PathBuf> = self
            .sizes
            .iter()
            .filter(|(p, _)| matcher.matches_with(p, options))
            .map(|(p, _)| PathBuf::from(format!("{}{p}", prefix(&self.hub.repo))))
            .collect();
        if files.is_empty() {
            return Err(DataError::EmptyGlob { key, pattern: pattern.to_string() });
        }
        Ok(files)
    }

    fn open(&self, path: &Path) -> Result<DataFile, DataError> {
        let found = self.relative(path).and_then(|r| self.sizes.iter().find(|(p, _)| p == r));
        let Some((relative, size)) = found else {
            return Err(DataError::Invalid(format!("{}: no file {}", self.hub.culprit(), path.display())));
        };
        Ok(DataFile::Hub(HubFile { hub: self.hub.clone(), path: relative.clone(), size: *size }))
    }

    fn format(&self, _: &Path) -> Result<Format, DataError> {
        Ok(self.format)
    }
}

/// One file of a Hub dataset.
#[derive(Clone, Debug)]
pub struct HubFile {
    hub: Arc<Hub>,
    path: String,
    size: u64,
}

impl HubFile {
    /// The file from its start, streamed.
    pub fn reader(self) -> Box<dyn Read + Send> {
        Box::new(HubReader { file: self, at: 0, body: None, failures: 0 })
    }

    /// The response for the bytes from `from` on.
    fn open_at(&self, from: u64) -> std::io::Result<Response> {
        let what = format!("reading {}", self.path);
        match self.hub.get(&what, self.hub.file_url(&self.path), from) {
            Ok(Some(response)) if from > 0 && response.status() != StatusCode::PARTIAL_CONTENT => {
                Err(std::io::Error::other(format!("{}: {what}: the Hub ignored the byte range", self.hub.culprit())))
            }
            Ok(Some(response)) => Ok(response),
            Ok(None) => Err(std::io::Error::other(format!("{}: {what}: 404, the file is gone", self.hub.culprit()))),
            Err(e) => Err(std::io::Error::other(e.to_string())),
        }
    }
}

/// A sequential read of a Hub file that resumes with a range request when its connection breaks.
struct HubReader {
    file: HubFile,
    at: u64,
    body: Option<Response>,
    /// Broken reads in a row.
    failures: u32,
}

impl Read for HubReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if self.at >= self.file.size || buf.is_empty() {
                return Ok(0);
            }
            if self.body.is_none() {
                self.body = Some(self.file.open_at(self.at)?);
            }
            match self.body.as_mut().expect("opened above").read(buf) {
                Ok(0) => {
                    return Err(std::io::Error::other(format!(
                        "{}: {} ended at byte {} of {}",
                        self.file.hub.culprit(),
                        self.file.path,
                        self.at,
                        self.file.size
                    )))
                }
                Ok(n) => {
                    self.at += n as u64;
                    self.failures = 0;
                    return Ok(n);
                }
                Err(e) if self.failures < 4 => {
                    tracing::debug!(
                        "{}: reading {} broke at byte {}: {e}; resuming",
                        self.file.hub.culprit(),
                        self.file.path,
                        self.at
                    );
                    self.failures += 1;
                    self.body = None;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl parquet::file::reader::Length for HubFile {
    fn len(&self) -> u64 {
        self.size
    }
}

impl parquet::file::reader::ChunkReader for HubFile {
    type T = std::io::Take<Box<dyn Read + Send>>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        let reader: Box<dyn Read + Send> =
            Box::new(HubReader { file: self.clone(), at: start, body: None, failures: 0 });
        Ok(reader.take(self.size.saturating_sub(start)))
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<bytes::Bytes> {
        let mut bytes = vec![0u8; length];
        let mut reader = HubReader { file: self.clone(), at: start, body: None, failures: 0 };
        reader.read_exact(&mut bytes).map_err(|e| parquet::errors::ParquetError::External(e.into()))?;
        Ok(bytes.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_names_and_builders() {
        assert!(is_repo("HuggingFaceH4/ultrachat_200k") && is_repo("Anthropic/hh-rlhf") && is_repo("c4"));
        assert!(!is_repo("a/b/c") && !is_repo("./data") && !is_repo("/abs/dir") && !is_repo("gs://b/x"));
    }

    #[test]
    fn the_token_goes_to_the_endpoint_only() {
        let hub = Hub {
            repo: "o/d".into(),
            endpoint: Url::parse("https://huggingface.co/").unwrap(),
            token: None,
            http: Client::new(),
        };
        assert!(hub.same_origin(&Url::parse("https://huggingface.co/datasets/o/d/resolve/main/a").unwrap()));
        assert!(!hub.same_origin(&Url::parse("https://cdn-lfs.huggingface.co/x").unwrap()));
        assert!(!hub.same_origin(&Url::parse("http://huggingface.co/x").unwrap()));
        assert!(!hub.same_origin(&Url::parse("https://huggingface.co:8443/x").unwrap()));
        let url = hub.file_url("data/train 1.parquet");
        assert_eq!(url.as_str(), "https://huggingface.co/datasets/o/d/resolve/main/data/train%201.parquet");
    }
}
