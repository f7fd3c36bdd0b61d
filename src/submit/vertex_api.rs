//! The Vertex AI and Cloud Logging REST calls `maxrs submit vertex` makes:
//! `projects.locations.customJobs.create` and `.get` (`https://{region}-aiplatform.googleapis.com/v1/`),
//! and Cloud Logging's `entries.list` (`https://logging.googleapis.com/v2/entries:list`) for the
//! job's logs (`resource.type="ml_job"`).
//!
//! Retries: a 429 (rate limit) or 503 (unavailable) means the request was not carried out, so it is
//! sent again after the `Retry-After` the API gives, or an exponential backoff. Any other error of
//! a create is final, a 500 included: the job may exist, and a second create would start a second
//! job. Reads (`get`, `entries.list`) also retry 500, 502 and 504. Errors carry the API's own
//! message. The token goes only into the `Authorization` header, and only to the endpoints: every
//! URL is built from an endpoint and percent-encoded path segments, and is checked right before
//! the token is attached ([`crate::net::google::check_token_destination`]). Tokens come from
//! [`crate::net::credentials`] ([`access_token`]).
//!
//! `CLOUDSDK_API_ENDPOINT_OVERRIDES_AIPLATFORM` and `CLOUDSDK_API_ENDPOINT_OVERRIDES_LOGGING` (gcloud's
//! variables) replace the endpoints, e.g. for a private endpoint or a local test server.

use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use reqwest::blocking::{Client, Response};
use reqwest::header::{CONTENT_TYPE, RETRY_AFTER};
use reqwest::{Method, StatusCode, Url};
use serde::Deserialize;

use super::vertex::CustomJob;
use crate::net::chain;
use crate::net::credentials::{AccessToken, Credentials};
use crate::net::google::{self, api_url, check_project, check_region};
use crate::net::retry::RetryPolicy;

/// gcloud's variables that replace the Vertex AI and Cloud Logging endpoints.
pub const AIPLATFORM_OVERRIDE: &str = "CLOUDSDK_API_ENDPOINT_OVERRIDES_AIPLATFORM";
pub const LOGGING_OVERRIDE: &str = "CLOUDSDK_API_ENDPOINT_OVERRIDES_LOGGING";
const LOGGING_ENDPOINT: &str = "https://logging.googleapis.com/";

/// The most log lines `--logs` prints (`--limit`): a page is at most 1000 entries.
pub const MAX_LOG_LINES: usize = 100_000;
/// Log pages read at most: Cloud Logging may answer pages without entries (it searches in time
/// slices), so the number of requests is bounded apart from the lines.
const MAX_LOG_PAGES: usize = 200;

/// The OAuth scope of Vertex AI and Cloud Logging.
pub const CLOUD_PLATFORM_SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";

/// What to do when no source has credentials.
const HOW_TO_GET_CREDENTIALS: &str = "to get credentials: run `gcloud auth application-default login` \
    (your user account), or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file, or set \
    GOOGLE_OAUTH_ACCESS_TOKEN=\"$(gcloud auth print-access-token)\"; on a Google Cloud VM the VM's \
    service account is used. The account needs the Vertex AI User role (roles/aiplatform.user)";

/// An access token for the cloud-platform scope from the first source that has credentials
/// (`GOOGLE_OAUTH_ACCESS_TOKEN` included: a submit is over within the token's hour).
pub fn access_token() -> Result<AccessToken> {
    Credentials::find_with_fixed_token(HOW_TO_GET_CREDENTIALS)?.token(CLOUD_PLATFORM_SCOPE)
}

/// A custom job as the API describes it (the fields maxrs shows).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct JobInfo {
    /// `projects/{number}/locations/{region}/customJobs/{id}`.
    pub name: String,
    #[serde(default)]
    pub display_name: String,
    #[serde(default)]
    pub state: String,
    pub create_time: Option<String>,
    pub start_time: Option<String>,
    pub end_time: Option<String>,
    pub error: Option<ApiStatus>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct ApiStatus {
    #[serde(default)]
    pub code: i64,
    #[serde(default)]
    pub message: String,
}

impl JobInfo {
    /// The job's numeric id (the last part of its name).
    pub fn id(&self) -> &str {
        self.name.rsplit('/').next().unwrap_or(&self.name)
    }
}

/// A job named by id (with the project and region given separately) or by its full resource name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobRef {
    pub project: String,
    pub region: String,
    pub id: String,
}

impl JobRef {
    /// `JOB` is `123` (then `project` and `region` are needed) or
    /// `projects/P/locations/R/customJobs/123`. Every part is checked: they go into request URLs.
    pub fn parse(job: &str, project: Option<&str>, region: Option<&str>) -> Result<JobRef> {
        let is_id = |id: &str| !id.is_empty() && id.len() <= 20 && id.chars().all(|c| c.is_ascii_digit());
        let parts: Vec<&str> = job.trim_matches('/').split('/').collect();
        if let ["projects", p, "locations", r, "customJobs", id] = parts.as_slice() {
            check_project(&format!("the project of job {job:?}:"), p)?;
            check_region(&format!("the region of job {job:?}:"), r)?;
            if !is_id(id) {
                bail!("job {job:?}: the custom job id {id:?} is not a number");
            }
            return Ok(JobRef { project: p.to_string(), region: r.to_string(), id: id.to_string() });
        }
        if parts.len() != 1 || !is_id(job) {
            bail!(
                "{job:?} is not a Vertex AI custom job: give its id (digits) or projects/P/locations/R/customJobs/ID"
            );
        }
        let (Some(project), Some(region)) = (project, region) else {
            bail!("job {job}: give --project and --region (or the full name projects/P/locations/R/customJobs/{job})");
        };
        check_project("--project", project)?;
        check_region("--region", region)?;
        Ok(JobRef { project: project.into(), region: region.into(), id: job.into() })
    }

    pub fn name(&self) -> String {
        format!("projects/{}/locations/{}/customJobs/{}", self.project, self.region, self.id)
    }

    /// The job's URL on the endpoint `base`.
    fn url(&self, base: &Url) -> Url {
        api_url(base, &["v1", "projects", &self.project, "locations", &self.region, "customJobs", &self.id])
    }

    /// The job's page in the Google Cloud console.
    pub fn console_url(&self) -> String {
        format!(
            "https://console.cloud.google.com/vertex-ai/locations/{}/training/{}/cpu?project={}",
            self.region, self.id, self.project
        )
    }
}

/// An endpoint, and whether the user named it (an override variable) rather than maxrs
/// deriving it: a named endpoint may receive the token whatever its host.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub url: Url,
    pub named: bool,
}

/// The endpoint the variable `var` names, or `default` when it is unset.
fn endpoint_from(var: &str, default: impl FnOnce() -> Result<String>) -> Result<Endpoint> {
    match std::env::var(var).ok().filter(|v| !v.trim().is_empty()) {
        Some(value) => Ok(Endpoint { url: google::endpoint(var, value.trim())?, named: true }),
        None => Ok(Endpoint { url: google::endpoint("the endpoint", &default()?)?, named: false }),
    }
}

/// Vertex AI's endpoint for `region` (or `CLOUDSDK_API_ENDPOINT_OVERRIDES_AIPLATFORM`).
pub fn aiplatform_endpoint(region: &str) -> Result<Endpoint> {
    endpoint_from(AIPLATFORM_OVERRIDE, || {
        check_region("--region", region)?;
        Ok(format!("https://{region}-aiplatform.googleapis.com/"))
    })
}

/// The URL `customJobs.create` is posted to, on the endpoint `base`.
pub fn create_url(base: &Url, project: &str, region: &str) -> Url {
    api_url(base, &["v1", "projects", project, "locations", region, "customJobs"])
}

/// One log line of a job.
#[derive(Clone, Debug, PartialEq)]
pub struct LogLine {
    pub timestamp: String,
    pub severity: String,
    /// The replica (`workerpool0-0`), when the entry names it.
    pub task: String,
    pub message: String,
}

/// The REST client.
pub struct VertexApi {
    http: Client,
    token: AccessToken,
    aiplatform: Endpoint,
    logging: Endpoint,
    retry: RetryPolicy,
}

impl VertexApi {
    /// A client for `region`'s endpoint (or the override variables).
    pub fn new(http: Client, token: AccessToken, region: &str, retry: RetryPolicy) -> Result<Self> {
        let logging = endpoint_from(LOGGING_OVERRIDE, || Ok(LOGGING_ENDPOINT.to_string()))?;
        Ok(VertexApi { http, token, aiplatform: aiplatform_endpoint(region)?, logging, retry })
    }

    /// A client for explicit endpoints (base URLs; `v1/` and `v2/` are appended), which may
    /// receive the token whatever their host.
    pub fn with_endpoints(
        http: Client,
        token: AccessToken,
        aiplatform: &str,
        logging: &str,
        retry: RetryPolicy,
    ) -> Result<Self> {
        let named =
            |what: &str, url: &str| Ok::<_, anyhow::Error>(Endpoint { url: google::endpoint(what, url)?, named: true });
        Ok(VertexApi {
            http,
            token,
            aiplatform: named("the Vertex AI endpoint", aiplatform)?,
            logging: named("the Cloud Logging endpoint", logging)?,
            retry,
        })
    }

    /// `customJobs.create`.
    pub fn create_custom_job(&self, project: &str, region: &str, job: &CustomJob) -> Result<JobInfo> {
        let url = create_url(&self.aiplatform.url, project, region);
        let body = job.to_json();
        let text = self.send("creating the custom job", Method::POST, &url, Some(body), Retry::NotCarriedOut)?;
        serde_json::from_str(&text)
            .map_err(|e| anyhow!("Vertex AI accepted the job but its answer is not a CustomJob ({e}): {}", clip(&text)))
    }

    /// `customJobs.get`.
    pub fn get_custom_job(&self, job: &JobRef) -> Result<JobInfo> {
        let url = job.url(&self.aiplatform.url);
        let text = self.send(&format!("reading job {}", job.id), Method::GET, &url, None, Retry::Idempotent)?;
        serde_json::from_str(&text)
            .map_err(|e| anyhow!("the answer for job {} is not a CustomJob ({e}): {}", job.id, clip(&text)))
    }

    /// The job's log lines, oldest first, at most `limit` (at most [`MAX_LOG_LINES`]), from at
    /// most [`MAX_LOG_PAGES`] pages.
    pub fn logs(&self, job: &JobRef, limit: usize) -> Result<Vec<LogLine>> {
        let limit = limit.min(MAX_LOG_LINES);
        let url = api_url(&self.logging.url, &["v2", "entries:list"]);
        let filter = format!("resource.type=\"ml_job\" AND resource.labels.job_id=\"{}\"", job.id);
        let mut lines = Vec::new();
        let mut page_token: Option<String> = None;
        for page_number in 1.. {
            let mut request = serde_json::json!({
                "resourceNames": [format!("projects/{}", job.project)],
                "filter": filter,
                "orderBy": "timestamp asc",
                "pageSize": limit.clamp(1, 1000),
            });
            if let Some(t) = &page_token {
                request["pageToken"] = serde_json::Value::from(t.as_str());
            }
            let text =
                self.send("reading the job's logs", Method::POST, &url, Some(request.to_string()), Retry::Idempotent)?;
            let page: EntriesPage = serde_json::from_str(&text)
                .map_err(|e| anyhow!("Cloud Logging's answer is not an entry list ({e})"))?;
            lines.extend(page.entries.into_iter().map(LogEntry::into_line));
            match page.next_page_token.filter(|t| !t.is_empty()) {
                Some(_) if page_number == MAX_LOG_PAGES => {
                    eprintln!(
                        "reading the job's logs: stopped after {MAX_LOG_PAGES} pages; ask for fewer lines (--limit)"
                    );
                    break;
                }
                Some(t) if lines.len() < limit => page_token = Some(t),
                _ => break,
            }
        }
        lines.truncate(limit);
        Ok(lines)
    }

    /// Sends one request, retrying what `retry` allows; the body of a 2xx answer, or an error
    /// naming `what`, the status and the API's message.
    fn send(&self, what: &str, method: Method, url: &Url, body: Option<String>, retry: Retry) -> Result<String> {
        let named: Vec<&Url> =
            [&self.aiplatform, &self.logging].into_iter().filter(|e| e.named).map(|e| &e.url).collect();
        let mut tries = self.retry.tries();
        loop {
            let (attempt, attempts) = (tries.attempt(), tries.attempts());
            let mut request = self.http.request(method.clone(), url.clone());
            if let Some(body) = &body {
                request = request.header(CONTENT_TYPE, "application/json; charset=utf-8").body(body.clone());
            }
            let mut request =
                request.build().map_err(|e| anyhow!("{what}: no answer from {}: {}", host(url), chain(&e)))?;
            self.token.authorize(&mut request, &named).map_err(|e| anyhow!("{what}: {e}"))?;
            let response = match self.http.execute(request) {
                Ok(r) => r,
                // Nothing reached the server: safe to try again whatever the request.
                Err(e) if e.is_connect() && !tries.last() => {
                    let wait = tries.next(None);
                    eprintln!("{what}: cannot connect ({}); retrying in {wait:?} ({attempt}/{attempts})", chain(&e));
                    std::thread::sleep(wait);
                    continue;
                }
                Err(e) => bail!("{what}: no answer from {}: {}", host(url), chain(&e)),
            };
            let status = response.status();
            if status.is_success() {
                return response.text().map_err(|e| anyhow!("{what}: cannot read the answer: {}", chain(&e)));
            }
            if retry.allows(status) && !tries.last() {
                let wait = tries.next(retry_after(&response));
                eprintln!("{what}: {} answered {status}; retrying in {wait:?} ({attempt}/{attempts})", host(url));
                std::thread::sleep(wait);
                continue;
            }
            let text = response.text().unwrap_or_default();
            return Err(api_error(what, status, &text, retry, attempt));
        }
    }
}

/// Which failed answers a request may be sent again after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Retry {
    /// Only answers that mean the request was not carried out (429, 503): for creates.
    NotCarriedOut,
    /// Also server errors (500, 502, 504): for reads.
    Idempotent,
}

impl Retry {
    fn allows(self, status: StatusCode) -> bool {
        match status.as_u16() {
            429 | 503 => true,
            500 | 502 | 504 => self == Retry::Idempotent,
            _ => false,
        }
    }
}

/// The wait a `Retry-After: <seconds>` header asks for.
fn retry_after(response: &Response) -> Option<Duration> {
    let value = response.headers().get(RETRY_AFTER)?.to_str().ok()?;
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// Google's error body: `{"error": {"code": 403, "message": "...", "status": "PERMISSION_DENIED"}}`.
#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Deserialize)]
struct ErrorDetail {
    #[serde(default)]
    message: String,
    #[serde(default)]
    status: String,
}

fn api_error(what: &str, status: StatusCode, text: &str, retry: Retry, attempts: u32) -> anyhow::Error {
    let (api_status, message) = match serde_json::from_str::<ErrorBody>(text) {
        Ok(b) => (b.error.status, b.error.message),
        Err(_) => (String::new(), clip(text)),
    };
    let code = status.as_u16();
    let label = if api_status.is_empty() { format!("HTTP {code}") } else { format!("HTTP {code} {api_status}") };
    let hint = match code {
        400 => "the request was refused as invalid; the message says which field".to_string(),
        401 => "the access token was not accepted: refresh your credentials (`gcloud auth application-default login`)"
            .to_string(),
        403 => {
            "the account lacks permission (it needs roles/aiplatform.user on the project, and roles/logging.viewer for \
                logs), or the API is not enabled (`gcloud services enable aiplatform.googleapis.com`)"
                .to_string()
        }
        404 => "check --project and --region (and the job id)".to_string(),
        429 | 503 => format!("still refused after {attempts} attempts; try again later or ask for more quota"),
        500..=599 if retry == Retry::NotCarriedOut => "the job may or may not have been created: look with \
            `gcloud ai custom-jobs list` (or the console) before submitting again"
            .to_string(),
        _ => String::new(),
    };
    let hint = if hint.is_empty() { String::new() } else { format!(" ({hint})") };
    anyhow!("{what} failed: {label}: {message}{hint}")
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EntriesPage {
    #[serde(default)]
    entries: Vec<LogEntry>,
    next_page_token: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogEntry {
    #[serde(default)]
    timestamp: String,
    #[serde(default)]
    severity: String,
    text_payload: Option<String>,
    json_payload: Option<serde_json::Value>,
    #[serde(default)]
    labels: serde_json::Map<String, serde_json::Value>,
    resource: Option<serde_json::Value>,
}

impl LogEntry {
    fn into_line(self) -> LogLine {
        let message = match (self.text_payload, self.json_payload) {
            (Some(t), _) => t,
            (None, Some(j)) => match j.get("message").and_then(|m| m.as_str()) {
                Some(m) => m.to_string(),
                None => j.to_string(),
            },
            (None, None) => String::new(),
        };
        let resource_labels = self.resource.as_ref().and_then(|r| r.get("labels")).and_then(|l| l.as_object());
        let task = self
            .labels
            .iter()
            .chain(resource_labels.into_iter().flatten())
            .find(|(k, _)| k.ends_with("task_name"))
            .and_then(|(_, v)| v.as_str())
            .unwrap_or_default()
            .to_string();
        LogLine { timestamp: self.timestamp, severity: self.severity, task, message: message.trim_end().to_string() }
    }
}

fn host(url: &Url) -> &str {
    url.host_str().unwrap_or_default()
}

/// At most 500 characters of an answer, for error messages.
fn clip(text: &str) -> String {
    let t = text.trim();
    match t.char_indices().nth(500) {
        Some((i, _)) => format!("{}...", &t[..i]),
        None => t.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_refs() {
        let r = JobRef::parse("projects/my-project/locations/us-central1/customJobs/42", None, None).unwrap();
        assert_eq!((r.project.as_str(), r.region.as_str(), r.id.as_str()), ("my-project", "us-central1", "42"));
        assert_eq!(
            JobRef::parse("42", Some("123456"), Some("europe-west4")).unwrap().name(),
            "projects/123456/locations/europe-west4/customJobs/42"
        );
        assert!(JobRef::parse("42", None, Some("us-central1")).unwrap_err().to_string().contains("--project"));
        assert!(JobRef::parse("abc", Some("my-project"), Some("us-central1")).is_err());
        // Every part goes into a URL: a name that would change the path or the host is refused.
        let e = JobRef::parse("projects/p/../x/locations/us-central1/customJobs/42", None, None).unwrap_err();
        assert!(e.to_string().contains("is not a Vertex AI custom job"), "{e}");
        let e = JobRef::parse("projects/my-project/locations/evil.com?/customJobs/42", None, None).unwrap_err();
        assert!(e.to_string().contains("\"evil.com?\" is not a Google Cloud region"), "{e}");
        let e = JobRef::parse("42", Some("../../evil"), Some("us-central1")).unwrap_err();
        assert!(e.to_string().starts_with("--project \"../../evil\""), "{e}");
    }

    #[test]
    fn errors_carry_the_api_message_and_a_hint() {
        let body = r#"{"error": {"code": 403, "message": "Permission 'aiplatform.customJobs.create' denied", "status": "PERMISSION_DENIED"}}"#;
        let e = api_error("creating the custom job", StatusCode::FORBIDDEN, body, Retry::NotCarriedOut, 1).to_string();
        assert!(e.contains("HTTP 403 PERMISSION_DENIED: Permission 'aiplatform.customJobs.create' denied"), "{e}");
        assert!(e.contains("roles/aiplatform.user"), "{e}");
        let e = api_error("x", StatusCode::INTERNAL_SERVER_ERROR, "oops", Retry::NotCarriedOut, 1).to_string();
        assert!(e.contains("HTTP 500: oops") && e.contains("may or may not have been created"), "{e}");
    }

    #[test]
    fn log_entries_become_lines() {
        let page: EntriesPage = serde_json::from_str(
            r#"{"entries": [
                {"timestamp": "t1", "severity": "INFO", "textPayload": "step 1\n", "labels": {"ml.googleapis.com/task_name": "workerpool0-0"}},
                {"timestamp": "t2", "jsonPayload": {"message": "hello"}, "resource": {"labels": {"task_name": "workerpool1-0"}}}
            ]}"#,
        )
        .unwrap();
        let lines: Vec<LogLine> = page.entries.into_iter().map(LogEntry::into_line).collect();
        assert_eq!(lines[0].message, "step 1");
        assert_eq!(lines[0].task, "workerpool0-0");
        assert_eq!((lines[1].task.as_str(), lines[1].message.as_str()), ("workerpool1-0", "hello"));
    }
}
