//! PyPI access: reads a project's simple index (PEP 691 JSON, or PEP 503 HTML as mirrors serve
//! it), picks the pinned wheel for this machine, and downloads it with a progress bar into a
//! temporary file that is kept only when its sha256 matches the index.

use std::io::{IsTerminal, Read, Write};
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use indicatif::{HumanBytes, ProgressBar, ProgressStyle};
use reqwest::blocking::Client;
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use reqwest::Url;
use sha2::{Digest, Sha256};
use tempfile::NamedTempFile;

use super::python::normalize;
use super::{WheelPin, INDEX_ENV};
use crate::net::{self, chain};

const PEP691_JSON: &str = "application/vnd.pypi.simple.v1+json";

/// One file listed by a simple index, with the hash the index vouches for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct WheelFile {
    pub filename: String,
    pub url: String,
    pub sha256: String,
}

/// How long a request to the index may wait for an answer (to connect, for the response, for
/// each read of a download) before it fails.
const TIMEOUT: Duration = Duration::from_secs(120);

/// An HTTP client for index pages and wheels: each connect and read within [`TIMEOUT`].
pub(super) fn client() -> Result<Client> {
    net::client(TIMEOUT)
}

/// A failed request in one line; a timeout says how long it waited.
fn failure(e: reqwest::Error) -> String {
    let waited = if e.is_timeout() { format!(" (no answer within {} s)", TIMEOUT.as_secs()) } else { String::new() };
    format!("{}{waited}", chain(&e.without_url()))
}

/// The project page of `package` on the simple index `index_url` (`$MAXRS_PYPI_INDEX`): an
/// http(s) URL, the package appended as a path segment. Credentials in the index URL (a private
/// mirror's `https://user:token@host/simple`) go only to that host: reqwest sends them for its
/// URLs alone and drops them on a redirect to another host.
pub(super) fn index_page(index_url: &str, package: &str) -> Result<Url> {
    let fail = |why: String| {
        let shown = Url::parse(index_url).map_or_else(|_| index_url.to_string(), |u| shown(&u));
        anyhow!(
            "{INDEX_ENV}={shown:?} {why}: give the http(s) URL of a simple package index, e.g. https://pypi.org/simple"
        )
    };
    let mut url = Url::parse(index_url.trim()).map_err(|e| fail(format!("is not a URL ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(fail("is not an http(s) URL with a host".into()));
    }
    url.set_fragment(None);
    url.path_segments_mut().expect("an http(s) URL").pop_if_empty().extend([&package.to_ascii_lowercase(), ""]);
    Ok(url)
}

/// A URL as maxrs prints it: a password in it replaced by `***`.
pub(super) fn shown(url: &Url) -> String {
    let mut shown = url.clone();
    if shown.password().is_some() {
        let _ = shown.set_password(Some("***"));
    }
    shown.to_string()
}

/// Finds the wheel of `pin` for this machine's architecture in the index at `index_url`.
pub(super) fn find_wheel(client: &Client, index_url: &str, pin: &WheelPin) -> Result<WheelFile> {
    let page_url = index_page(index_url, pin.package)?;
    let page = shown(&page_url);
    let response = client
        .get(page_url.clone())
        .header(ACCEPT, format!("{PEP691_JSON}, text/html;q=0.1"))
        .send()
        .and_then(|r| r.error_for_status())
        .map_err(|e| anyhow!("cannot read the package index {page}: {}", failure(e)))?;
    let content_type = response.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let body = response.text().map_err(|e| anyhow!("cannot read the package index {page}: {}", failure(e)))?;
    let files = parse_index(&body, &content_type, &page_url)?;
    let arch = std::env::consts::ARCH;
    match pick(&files, pin.package, pin.version, arch) {
        Some(file) => Ok(file.clone()),
        None => {
            let listed: Vec<&str> = files
                .iter()
                .filter(|f| wheel_version(&f.filename) == Some(pin.version))
                .map(|f| f.filename.as_str())
                .collect();
            bail!(
                "{page} lists no Linux {arch} wheel with a sha256 for {}; files of that version: {}",
                pin.requirement(),
                if listed.is_empty() { "none".to_string() } else { listed.join(", ") }
            )
        }
    }
}

/// Parses an index page by its content type: PEP 691 JSON, else PEP 503 HTML.
/// Files without a sha256 are left out: maxrs never installs what it cannot verify.
pub(super) fn parse_index(body: &str, content_type: &str, page: &Url) -> Result<Vec<WheelFile>> {
    if content_type.starts_with(PEP691_JSON) {
        parse_json(body, page)
    } else {
        Ok(parse_html(body, page))
    }
}

fn parse_json(body: &str, page: &Url) -> Result<Vec<WheelFile>> {
    #[derive(serde::Deserialize)]
    struct Project {
        files: Vec<File>,
    }
    #[derive(serde::Deserialize)]
    struct File {
        filename: String,
        url: String,
        #[serde(default)]
        hashes: std::collections::HashMap<String, String>,
    }
    let project: Project = serde_json::from_str(body)
        .map_err(|e| anyhow!("the package index {} sent JSON maxrs cannot read: {e}", shown(page)))?;
    Ok(project
        .files
        .into_iter()
        .filter_map(|f| {
            let sha256 = f.hashes.get("sha256")?.to_ascii_lowercase();
            let url = page.join(&f.url).ok()?.to_string();
            Some(WheelFile { filename: f.filename, url, sha256 })
        })
        .collect())
}

/// Reads the `<a href="URL#sha256=HEX">FILENAME</a>` links of a PEP 503 page.
fn parse_html(html: &str, page: &Url) -> Vec<WheelFile> {
    // ASCII lowercasing keeps byte offsets, so positions found in `lower` index `html`.
    let lower = html.to_ascii_lowercase();
    let mut files = Vec::new();
    let mut pos = 0;
    while let Some(start) = lower[pos..].find("<a ").map(|i| pos + i) {
        let Some(tag_end) = lower[start..].find('>').map(|i| start + i) else {
            break;
        };
        let text_end = lower[tag_end..].find("</a>").map_or(html.len(), |i| tag_end + i);
        pos = text_end;
        let Some(href) = attribute(&html[start..tag_end], &lower[start..tag_end], "href") else {
            continue;
        };
        let Ok(mut url) = page.join(&unescape(href)) else {
            continue;
        };
        let Some(sha256) = url.fragment().and_then(|f| f.strip_prefix("sha256=")).map(str::to_ascii_lowercase) else {
            continue;
        };
        url.set_fragment(None);
        let text = unescape(html[tag_end + 1..text_end].trim());
        let filename = if text.is_empty() {
            url.path_segments().and_then(|mut s| s.next_back()).unwrap_or("").to_string()
        } else {
            text
        };
        files.push(WheelFile { filename, url: url.to_string(), sha256 });
    }
    files
}

/// The quoted value of attribute `name` in a tag (`tag` as written, `lower` its lowercase copy).
fn attribute<'a>(tag: &'a str, lower: &str, name: &str) -> Option<&'a str> {
    let at = lower.find(&format!(" {name}="))? + name.len() + 2;
    let quote = tag[at..].chars().next().filter(|c| *c == '"' || *c == '\'')?;
    let value = &tag[at + 1..];
    value.find(quote).map(|end| &value[..end])
}

/// The entities an index may use in URLs and file names.
fn unescape(s: &str) -> String {
    s.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&#39;", "'").replace("&amp;", "&")
}

/// The version field of a wheel file name (`{name}-{version}[-{build}]-{py}-{abi}-{platform}.whl`).
fn wheel_version(filename: &str) -> Option<&str> {
    filename.strip_suffix(".whl")?.split('-').nth(1)
}

/// The wheel of `package==version` for Linux on `arch` (or for any platform). Wheels that do not depend on the Python
/// ABI come first; otherwise the first listed (libtpu ships one per CPython with the same library).
pub(super) fn pick<'a>(files: &'a [WheelFile], package: &str, version: &str, arch: &str) -> Option<&'a WheelFile> {
    let arch_suffix = format!("_{arch}");
    let mut matching = files
        .iter()
        .filter_map(|f| {
            let parts: Vec<&str> = f.filename.strip_suffix(".whl")?.split('-').collect();
            let [name, ver, .., abi, platform] = parts[..] else {
                return None;
            };
            // Pure-Python wheels (`any`) carry data files maxrs reads (tokenizer models, corpora).
            let linux_here = platform == "any"
                || platform.split('.').any(|tag| {
                    (tag.starts_with("manylinux") || tag.starts_with("linux")) && tag.ends_with(&arch_suffix)
                });
            let fits = (parts.len() == 5 || parts.len() == 6)
                && normalize(name) == normalize(package)
                && ver == version
                && linux_here;
            fits.then_some((abi != "none", f))
        })
        .collect::<Vec<_>>();
    matching.sort_by_key(|(abi_specific, _)| *abi_specific);
    matching.first().map(|(_, f)| *f)
}

/// Downloads `file` into a temporary file in `dir`, checking its sha256. On any failure the
/// partial file is deleted (dropped); a killed process leaves only a `.partial` name behind.
pub(super) fn download(client: &Client, file: &WheelFile, dir: &Path) -> Result<NamedTempFile> {
    let url = Url::parse(&file.url).map_or_else(|_| file.url.clone(), |u| shown(&u));
    let failed = |what: String| anyhow!("downloading {} from {url} failed: {what}", file.filename);
    let mut response =
        client.get(&file.url).send().and_then(|r| r.error_for_status()).map_err(|e| failed(failure(e)))?;
    let progress = progress_bar(&file.filename, &url, response.content_length());
    let mut tmp = tempfile::Builder::new()
        .prefix(".download-")
        .suffix(".partial")
        .tempfile_in(dir)
        .map_err(|e| failed(format!("cannot create a temporary file in {}: {e}", dir.display())))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut received = 0u64;
    loop {
        let n = response
            .read(&mut buf)
            .map_err(|e| failed(format!("connection lost after {}: {}", HumanBytes(received), chain(&e))))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        tmp.write_all(&buf[..n]).map_err(|e| failed(format!("cannot write {}: {e}", tmp.path().display())))?;
        received += n as u64;
        progress.inc(n as u64);
    }
    progress.finish_and_clear();
    let actual = super::hex(&hasher.finalize());
    if actual != file.sha256 {
        bail!(
            "sha256 mismatch for {} downloaded from {}: the index says {}, the {} received hash to {}; \
             the download was discarded (a truncated transfer or an intercepting proxy causes this)",
            file.filename,
            url,
            file.sha256,
            HumanBytes(received),
            actual
        );
    }
    Ok(tmp)
}

/// A byte progress bar on a terminal; elsewhere (logs, CI) one line saying what is downloaded.
fn progress_bar(filename: &str, url: &str, total: Option<u64>) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        let size = total.map(|t| format!(" ({})", HumanBytes(t))).unwrap_or_default();
        eprintln!("maxrs: downloading {filename}{size} from {url}");
        return ProgressBar::hidden();
    }
    let (bar, template) = match total {
        Some(total) => (ProgressBar::new(total), "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}"),
        None => (ProgressBar::no_length(), "{msg} {spinner} {bytes} {bytes_per_sec}"),
    };
    let style =
        ProgressStyle::with_template(template).expect("progress templates are fixed and valid").progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(format!("downloading {filename}"));
    bar
}

#[cfg(test)]
mod tests;
