//! Google Cloud names that go into request URLs, and where a Google credential may be sent.
//!
//! A project, a region or a bucket from a flag or a settings file ends up in a URL that carries
//! a bearer token: `--region 'evil.example.com/x?'` would otherwise turn
//! `https://{region}-aiplatform.googleapis.com/` into a request to another host. So:
//! - each name is checked against Google's documented shape where it is parsed ([`check_project`],
//!   [`check_region`], [`check_bucket`], [`check_object_name`]), naming the flag, key or variable;
//! - URLs are built from a base and path segments ([`api_url`]), each segment percent-encoded,
//!   never by pasting text into a format string;
//! - right before a token is attached, [`check_token_destination`] checks the request's host: a
//!   `*.googleapis.com` host over HTTPS, or an endpoint the user named explicitly (gcloud's
//!   `CLOUDSDK_API_ENDPOINT_OVERRIDES_*` variables, an emulator), nothing else.
//!
//! The metadata server (`gcp_auth`) is reached at a fixed address no input changes.

use anyhow::{anyhow, bail, Result};
use reqwest::Url;

/// The domain of Google's APIs: a token may go to this domain's hosts (over HTTPS).
const GOOGLE_APIS_DOMAIN: &str = ".googleapis.com";

/// Checks a Google Cloud project as `what` (the flag or key that gave it) names it. Accepted:
/// a project id (6 to 30 lowercase letters, digits or hyphens, starting with a letter, not
/// ending with a hyphen: Resource Manager's `Project.projectId`), a project number (digits), or
/// the legacy domain-scoped form `example.com:my-project`.
pub fn check_project(what: &str, project: &str) -> Result<()> {
    let id_chars = |s: &str| s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    let is_id = |s: &str| {
        (6..=30).contains(&s.len())
            && s.starts_with(|c: char| c.is_ascii_lowercase())
            && !s.ends_with('-')
            && id_chars(s)
    };
    let is_number = !project.is_empty() && project.len() <= 20 && project.chars().all(|c| c.is_ascii_digit());
    let domain_scoped = project.split_once(':').is_some_and(|(domain, id)| is_domain(domain) && is_id(id));
    if is_id(project) || is_number || domain_scoped {
        return Ok(());
    }
    bail!(
        "{what} {project:?} is not a Google Cloud project: give its id (6 to 30 lowercase letters, digits or `-`, \
         starting with a letter and not ending with `-`, e.g. my-project-123), its number, or a domain-scoped id \
         (example.com:my-project)"
    )
}

/// Checks a Vertex AI region as `what` names it: Google Cloud's region names, a lowercase
/// geography, `-`, a lowercase area and a number (`us-central1`, `europe-west4`,
/// `northamerica-northeast1`); the region becomes part of the endpoint's host name.
pub fn check_region(what: &str, region: &str) -> Result<()> {
    let shape = region.split_once('-').is_some_and(|(geo, rest)| {
        let digits = rest.trim_start_matches(|c: char| c.is_ascii_lowercase());
        let area = rest.len() - digits.len();
        !geo.is_empty()
            && geo.chars().all(|c| c.is_ascii_lowercase())
            && area > 0
            && (1..=2).contains(&digits.len())
            && digits.chars().all(|c| c.is_ascii_digit())
    });
    if shape && region.len() <= 30 {
        return Ok(());
    }
    bail!(
        "{what} {region:?} is not a Google Cloud region: give a region name such as us-central1, europe-west4 or \
         asia-southeast1 (lowercase letters, one `-`, letters, then its number)"
    )
}

/// Checks a Cloud Storage bucket name (`gs://BUCKET/...`) against the documented rules: 3 to 63
/// characters (up to 222 with dots, each dot-separated part at most 63), lowercase letters,
/// digits, `-`, `_` and `.`, starting and ending with a letter or digit, not an IP address.
pub fn check_bucket(location: &str, bucket: &str) -> Result<()> {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let ok = (3..=222).contains(&bucket.len())
        && (bucket.contains('.') || bucket.len() <= 63)
        && bucket.split('.').all(|part| !part.is_empty() && part.len() <= 63)
        && bucket.chars().all(|c| alnum(c) || "-_.".contains(c))
        && bucket.starts_with(alnum)
        && bucket.ends_with(alnum)
        && bucket.parse::<std::net::Ipv4Addr>().is_err();
    if ok {
        return Ok(());
    }
    bail!(
        "{location:?}: {bucket:?} is not a Cloud Storage bucket name: 3 to 63 lowercase letters, digits, `-`, `_` or `.`, \
         starting and ending with a letter or digit (e.g. gs://my-bucket/path)"
    )
}

/// Checks a Cloud Storage object name: at most 1024 bytes and no carriage return or line feed
/// (the documented limits; everything else is percent-encoded in the URL).
pub fn check_object_name(location: &str, name: &str) -> Result<()> {
    if name.len() > 1024 {
        bail!("{location:?}: the object name is {} bytes; Cloud Storage allows at most 1024", name.len());
    }
    if name.contains(['\r', '\n']) {
        bail!("{location:?}: Cloud Storage object names cannot contain a carriage return or line feed");
    }
    Ok(())
}

/// A DNS name: dot-separated labels of letters, digits and `-`, none starting or ending with `-`.
fn is_domain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

/// Parses an endpoint (`base`, an `http(s)://host[:port]/[path]` URL) that `what` names.
pub fn endpoint(what: &str, base: &str) -> Result<Url> {
    let url = Url::parse(base).map_err(|e| anyhow!("{what}={base:?} is not a URL ({e}): give https://HOST[:PORT]/"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        bail!("{what}={base:?}: give an http:// or https:// URL with a host, e.g. https://HOST[:PORT]/");
    }
    if url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() || url.password().is_some() {
        bail!("{what}={base:?}: give the endpoint without a query, fragment or credentials");
    }
    Ok(url)
}

/// `base` with `segments` appended to its path, each one percent-encoded (a `/` or `?` in a
/// segment cannot change the path or the host).
pub fn api_url(base: &Url, segments: &[&str]) -> Url {
    let mut url = base.clone();
    url.path_segments_mut().expect("endpoints are http(s) URLs").pop_if_empty().extend(segments);
    url
}

/// Refuses to send a Google credential to `url` unless it is a Google API host over HTTPS or on
/// one of the endpoints the user named (`named`: same scheme, host and port).
pub fn check_token_destination(url: &Url, named: &[&Url]) -> Result<()> {
    let google = url.scheme() == "https" && url.host_str().is_some_and(|host| host.ends_with(GOOGLE_APIS_DOMAIN));
    if google || named.iter().any(|n| n.origin() == url.origin()) {
        return Ok(());
    }
    bail!(
        "refusing to send the Google Cloud access token to {}: credentials go only to https://*.googleapis.com \
         or to an endpoint set explicitly (CLOUDSDK_API_ENDPOINT_OVERRIDES_*, STORAGE_EMULATOR_HOST)",
        url.origin().ascii_serialization()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn projects() {
        for ok in ["my-project-123", "abcdef", "123456789012", "example.com:my-project"] {
            check_project("--project", ok).unwrap();
        }
        for bad in ["", "../../evil", "short", "Upper-case", "ends-with-", "1starts-digit", "a/b?c", "evil.com:x"] {
            let e = check_project("--project", bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--project {bad:?}")), "{e}");
        }
    }

    #[test]
    fn regions() {
        for ok in ["us-central1", "europe-west4", "northamerica-northeast1", "me-central2"] {
            check_region("--region", ok).unwrap();
        }
        for bad in ["evil.example.com/x?", "", "us", "us-central", "US-central1", "us-central1.evil", "global"] {
            assert!(check_region("--region", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn buckets_and_objects() {
        for ok in ["bucket", "maxrs-runs", "my_bucket.example.com", "a1b"] {
            check_bucket("gs://x", ok).unwrap();
        }
        for bad in ["ab", "Bucket", "-bucket", "bucket-", "192.168.1.1", "a..b", "evil.com:443", "b?x", &"a".repeat(64)]
        {
            assert!(check_bucket("gs://x", bad).is_err(), "{bad}");
        }
        assert!(check_object_name("gs://b/x", "a/b c/..").is_ok());
        assert!(check_object_name("gs://b/x", "a\nb").is_err());
        assert!(check_object_name("gs://b/x", &"a".repeat(1025)).is_err());
    }

    #[test]
    fn urls_escape_segments_and_tokens_stay_with_google() {
        let base = endpoint("X", "https://us-central1-aiplatform.googleapis.com/").unwrap();
        let url = api_url(&base, &["v1", "projects", "a/b?c", "customJobs"]);
        assert_eq!(url.as_str(), "https://us-central1-aiplatform.googleapis.com/v1/projects/a%2Fb%3Fc/customJobs");
        check_token_destination(&url, &[]).unwrap();
        let evil = Url::parse("https://evil.example.com/x?-aiplatform.googleapis.com/v1").unwrap();
        let e = check_token_destination(&evil, &[]).unwrap_err().to_string();
        assert!(e.contains("https://evil.example.com"), "{e}");
        let plain = Url::parse("http://logging.googleapis.com/v2").unwrap();
        assert!(check_token_destination(&plain, &[]).is_err(), "not over plain HTTP");
        let named = endpoint("STORAGE_EMULATOR_HOST", "http://127.0.0.1:4443").unwrap();
        check_token_destination(&api_url(&named, &["storage", "v1"]), &[&named]).unwrap();
        assert!(endpoint("X", "ftp://host/").is_err() && endpoint("X", "https://u:p@host/").is_err());
    }
}
