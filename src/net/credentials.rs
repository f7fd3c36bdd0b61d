//! Google Cloud credentials for every Google API maxrs calls (Cloud Storage for `gs://`, Vertex
//! AI and Cloud Logging for `maxrs submit vertex`), from Application Default Credentials through
//! `gcp_auth`. The sources are tried in the order Google's client libraries use, each with its
//! own error, so that "no credentials" says what was looked at:
//!
//! 1. `GOOGLE_OAUTH_ACCESS_TOKEN`: a ready token (the Terraform Google provider's variable; e.g.
//!    `$(gcloud auth print-access-token)`), only for one command's requests
//!    ([`Credentials::find_with_fixed_token`]): such a token expires within the hour, which a
//!    training run writing to `gs://` outlives.
//! 2. `GOOGLE_APPLICATION_CREDENTIALS`: a service-account key file.
//! 3. `~/.config/gcloud/application_default_credentials.json` (`gcloud auth application-default login`).
//! 4. The Compute Engine metadata server (on a Google Cloud VM); `NO_GCE_CHECK=true` skips it, as
//!    in google-auth.
//! 5. `gcloud auth print-access-token`, when `gcloud` is on PATH.
//!
//! Sources 2 to 5 refresh their token before it expires. A token is attached to a request only
//! after [`super::google::check_token_destination`] accepted its URL, and is never printed,
//! logged or put in an error message: [`AccessToken`]'s `Debug` hides it and its header is
//! marked sensitive.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, Result};
use gcp_auth::TokenProvider;
use reqwest::blocking::Request;
use reqwest::header::{HeaderValue, AUTHORIZATION};
use reqwest::Url;

use super::google::check_token_destination;

/// A bearer token. Only [`AccessToken::authorize`] shows it, in a request's header.
#[derive(Clone)]
pub struct AccessToken(String);

impl AccessToken {
    pub fn new(token: String) -> Self {
        AccessToken(token)
    }

    /// Puts the token into `request`'s `Authorization` header, after checking that the request
    /// goes to a Google API host over HTTPS or to one of the endpoints the user `named`.
    pub fn authorize(&self, request: &mut Request, named: &[&Url]) -> Result<()> {
        check_token_destination(request.url(), named)?;
        let mut value = HeaderValue::from_str(&format!("Bearer {}", self.0))
            .map_err(|_| anyhow!("the access token is not a valid header value"))?;
        value.set_sensitive(true);
        request.headers_mut().insert(AUTHORIZATION, value);
        Ok(())
    }
}

impl fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AccessToken(<redacted>)")
    }
}

/// The credentials found, kept for the process: tokens are asked for when needed.
pub struct Credentials {
    source: Source,
    /// What the tokens come from, for errors.
    from: String,
    /// What the caller's user should do to get credentials, ending the errors.
    hint: &'static str,
}

enum Source {
    Fixed(AccessToken),
    Provider { runtime: tokio::runtime::Runtime, provider: Arc<dyn TokenProvider> },
}

impl Credentials {
    /// The first of sources 2 to 5 that has credentials; `hint` ends the error when none has.
    pub fn find(hint: &'static str) -> Result<Credentials> {
        Self::default_credentials(Vec::new(), hint)
    }

    /// `GOOGLE_OAUTH_ACCESS_TOKEN`, else [`Credentials::find`].
    pub fn find_with_fixed_token(hint: &'static str) -> Result<Credentials> {
        if let Some(token) = std::env::var("GOOGLE_OAUTH_ACCESS_TOKEN").ok().filter(|t| !t.trim().is_empty()) {
            let token = AccessToken(token.trim().to_string());
            return Ok(Credentials { source: Source::Fixed(token), from: "GOOGLE_OAUTH_ACCESS_TOKEN".into(), hint });
        }
        Self::default_credentials(vec!["GOOGLE_OAUTH_ACCESS_TOKEN (unset)".into()], hint)
    }

    fn default_credentials(tried: Vec<String>, hint: &'static str) -> Result<Credentials> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| anyhow!("cannot start the async runtime for authentication: {e}"))?;
        let (provider, from) = runtime.block_on(find_provider(tried, hint))?;
        Ok(Credentials { source: Source::Provider { runtime, provider }, from, hint })
    }

    /// A token for `scope` (a fixed token whatever the scope).
    pub fn token(&self, scope: &str) -> Result<AccessToken> {
        match &self.source {
            Source::Fixed(token) => Ok(token.clone()),
            Source::Provider { runtime, provider } => {
                let token = runtime.block_on(provider.token(&[scope])).map_err(|e| {
                    anyhow!("cannot get an access token from {}: {}; {}", self.from, super::chain(&e), self.hint)
                })?;
                Ok(AccessToken(token.as_str().to_string()))
            }
        }
    }

    /// [`AccessToken::authorize`] with a token for `scope`; the destination is checked before a
    /// token is asked for.
    pub fn authorize(&self, request: &mut Request, scope: &str, named: &[&Url]) -> Result<()> {
        check_token_destination(request.url(), named)?;
        self.token(scope)?.authorize(request, named)
    }
}

async fn find_provider(mut tried: Vec<String>, hint: &str) -> Result<(Arc<dyn TokenProvider>, String)> {
    let describe = |e: &gcp_auth::Error| super::chain(e);
    match std::env::var_os("GOOGLE_APPLICATION_CREDENTIALS") {
        Some(path) => {
            let shown = PathBuf::from(&path).display().to_string();
            // A key file that is named but unusable is an error of its own: falling through to
            // other accounts would act as someone else.
            let provider = gcp_auth::CustomServiceAccount::from_env()
                .map_err(|e| anyhow!("GOOGLE_APPLICATION_CREDENTIALS={shown}: {}", describe(&e)))?
                .ok_or_else(|| anyhow!("GOOGLE_APPLICATION_CREDENTIALS={shown}: not readable"))?;
            return Ok((Arc::new(provider), format!("the service-account key {shown}")));
        }
        None => tried.push("GOOGLE_APPLICATION_CREDENTIALS (unset)".into()),
    }

    let adc = adc_file();
    match &adc {
        Some(path) if path.is_file() => {
            let provider = gcp_auth::ConfigDefaultCredentials::new()
                .await
                .map_err(|e| anyhow!("application-default credentials {}: {}", path.display(), describe(&e)))?;
            return Ok((Arc::new(provider), format!("application-default credentials {}", path.display())));
        }
        Some(path) => tried.push(format!("{} (absent)", path.display())),
        None => tried.push("~/.config/gcloud/application_default_credentials.json (no home directory)".into()),
    }

    if skip_metadata_server() {
        tried.push("the metadata server (skipped: NO_GCE_CHECK)".into());
    } else {
        match gcp_auth::MetadataServiceAccount::new().await {
            Ok(provider) => return Ok((Arc::new(provider), "the metadata server's service account".into())),
            Err(e) => tried.push(format!("the metadata server ({})", describe(&e))),
        }
    }

    if on_path("gcloud") {
        match gcp_auth::GCloudAuthorizedUser::new().await {
            Ok(provider) => return Ok((Arc::new(provider), "`gcloud auth print-access-token`".into())),
            Err(e) => tried.push(format!("gcloud ({})", describe(&e))),
        }
    } else {
        tried.push("gcloud (not on PATH)".into());
    }

    Err(anyhow!("no Google Cloud credentials found (looked at {}); {hint}", tried.join(", ")))
}

/// gcloud's application-default credentials file (what `gcp_auth` reads).
fn adc_file() -> Option<PathBuf> {
    dirs::home_dir().map(|home| home.join(".config/gcloud/application_default_credentials.json"))
}

fn skip_metadata_server() -> bool {
    std::env::var("NO_GCE_CHECK").is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "1" | "yes"))
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}
