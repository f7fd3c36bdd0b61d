//! Google Cloud access tokens for the Vertex AI and Cloud Logging REST calls, from Application
//! Default Credentials through `gcp_auth`. The sources are tried in the order Google's client
//! libraries use, each with its own error, so that "no credentials" says what was looked at:
//!
//! 1. `GOOGLE_OAUTH_ACCESS_TOKEN`: a ready token (the Terraform Google provider's variable; e.g.
//!    `$(gcloud auth print-access-token)`).
//! 2. `GOOGLE_APPLICATION_CREDENTIALS`: a service-account key file.
//! 3. `~/.config/gcloud/application_default_credentials.json` (`gcloud auth application-default login`).
//! 4. The Compute Engine metadata server (on a Google Cloud VM); `NO_GCE_CHECK=true` skips it, as
//!    in google-auth.
//! 5. `gcloud auth print-access-token`, when `gcloud` is on PATH.
//!
//! A token is never printed, logged or put in an error message: [`AccessToken`]'s `Debug` hides it.

use std::fmt;
use std::path::PathBuf;

use anyhow::{anyhow, Result};
use gcp_auth::TokenProvider;

/// The OAuth scope of Vertex AI and Cloud Logging.
pub const CLOUD_PLATFORM_SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";

/// A bearer token. Only [`AccessToken::secret`] shows it (to put it in a request header).
#[derive(Clone)]
pub struct AccessToken(String);

impl AccessToken {
    pub fn new(token: String) -> Self {
        AccessToken(token)
    }

    pub fn secret(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AccessToken(<redacted>)")
    }
}

/// What to do when no source has credentials.
const HOW_TO_GET_CREDENTIALS: &str = "to get credentials: run `gcloud auth application-default login` \
    (your user account), or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file, or set \
    GOOGLE_OAUTH_ACCESS_TOKEN=\"$(gcloud auth print-access-token)\"; on a Google Cloud VM the VM's \
    service account is used. The account needs the Vertex AI User role (roles/aiplatform.user)";

/// An access token for the cloud-platform scope from the first source that has credentials.
pub fn access_token() -> Result<AccessToken> {
    if let Some(token) = std::env::var("GOOGLE_OAUTH_ACCESS_TOKEN").ok().filter(|t| !t.trim().is_empty()) {
        return Ok(AccessToken(token.trim().to_string()));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow!("cannot start the async runtime for authentication: {e}"))?;
    runtime.block_on(from_default_credentials())
}

async fn from_default_credentials() -> Result<AccessToken> {
    let mut tried: Vec<String> = vec!["GOOGLE_OAUTH_ACCESS_TOKEN (unset)".into()];

    match std::env::var_os("GOOGLE_APPLICATION_CREDENTIALS") {
        Some(path) => {
            let shown = PathBuf::from(&path).display().to_string();
            // A key file that is named but unusable is an error of its own: falling through to
            // other accounts would run the job as someone else.
            let provider = gcp_auth::CustomServiceAccount::from_env()
                .map_err(|e| anyhow!("GOOGLE_APPLICATION_CREDENTIALS={shown}: {}", describe(&e)))?
                .ok_or_else(|| anyhow!("GOOGLE_APPLICATION_CREDENTIALS={shown}: not readable"))?;
            return token_from(&provider, &format!("the service-account key {shown}")).await;
        }
        None => tried.push("GOOGLE_APPLICATION_CREDENTIALS (unset)".into()),
    }

    let adc = adc_file();
    match &adc {
        Some(path) if path.is_file() => {
            let provider = gcp_auth::ConfigDefaultCredentials::new()
                .await
                .map_err(|e| anyhow!("application-default credentials {}: {}", path.display(), describe(&e)))?;
            return token_from(&provider, &format!("application-default credentials {}", path.display())).await;
        }
        Some(path) => tried.push(format!("{} (absent)", path.display())),
        None => tried.push("~/.config/gcloud/application_default_credentials.json (no home directory)".into()),
    }

    if skip_metadata_server() {
        tried.push("the metadata server (skipped: NO_GCE_CHECK)".into());
    } else {
        match gcp_auth::MetadataServiceAccount::new().await {
            Ok(provider) => return token_from(&provider, "the metadata server's service account").await,
            Err(e) => tried.push(format!("the metadata server ({})", describe(&e))),
        }
    }

    if on_path("gcloud") {
        match gcp_auth::GCloudAuthorizedUser::new().await {
            Ok(provider) => return token_from(&provider, "`gcloud auth print-access-token`").await,
            Err(e) => tried.push(format!("gcloud ({})", describe(&e))),
        }
    } else {
        tried.push("gcloud (not on PATH)".into());
    }

    Err(anyhow!("no Google Cloud credentials found (looked at {}); {HOW_TO_GET_CREDENTIALS}", tried.join(", ")))
}

async fn token_from(provider: &dyn TokenProvider, source: &str) -> Result<AccessToken> {
    let token = provider
        .token(&[CLOUD_PLATFORM_SCOPE])
        .await
        .map_err(|e| anyhow!("cannot get an access token from {source}: {}; {HOW_TO_GET_CREDENTIALS}", describe(&e)))?;
    Ok(AccessToken(token.as_str().to_string()))
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

/// A `gcp_auth` error with its causes, on one line.
fn describe(e: &gcp_auth::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
