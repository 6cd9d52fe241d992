//! Settings for `serve`. Defaults live here so every entry point agrees on them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::providers::openai::ApiKey;
use crate::scheduler;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:7878";
pub const DEFAULT_DATA_DIR: &str = "/var/lib/commitpoint";
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
pub const DEFAULT_OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
pub const DEFAULT_OPENAI_KEY_ENV: &str = "OPENAI_API_KEY";
pub const DEFAULT_MODEL: &str = "gpt-4o-mini";

#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub schema_dir: Option<PathBuf>,
    pub max_body_bytes: usize,
    pub provider: ProviderOptions,
}

/// Which built-in provider drives pending work. `None` leaves it to external workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProviderChoice {
    None,
    Openai,
    /// The built-in OpenAI Batch API simulator on a loopback port: no key, no cost.
    Simulator,
}

#[derive(Debug, Clone)]
pub struct ProviderOptions {
    pub choice: ProviderChoice,
    pub base_url: String,
    pub key: KeySource,
    pub model: String,
    pub scheduler: scheduler::Settings,
}

impl Default for ProviderOptions {
    fn default() -> Self {
        Self {
            choice: ProviderChoice::None,
            base_url: DEFAULT_OPENAI_BASE_URL.to_string(),
            key: KeySource::Env(DEFAULT_OPENAI_KEY_ENV.to_string()),
            model: DEFAULT_MODEL.to_string(),
            scheduler: scheduler::Settings::default(),
        }
    }
}

/// Where an API key comes from. Never from a config value or a flag: those end up in
/// shell history, process listings and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    Env(String),
    File(PathBuf),
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the API key variable {0} is not set (or is empty); export it or use --provider-key-file")]
    MissingKeyEnv(String),
    #[error("{path}: cannot read the API key file")]
    KeyFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}: the API key file is readable by group or others; run `chmod 600` on it")]
    KeyFileTooOpen(PathBuf),
    #[error("{0}: the API key file is empty")]
    EmptyKeyFile(PathBuf),
}

impl KeySource {
    pub fn load(&self) -> Result<ApiKey, Error> {
        match self {
            KeySource::Env(name) => match std::env::var(name) {
                Ok(key) if !key.trim().is_empty() => Ok(ApiKey::new(key.trim().to_string())),
                _ => Err(Error::MissingKeyEnv(name.clone())),
            },
            KeySource::File(path) => load_key_file(path),
        }
    }
}

fn load_key_file(path: &Path) -> Result<ApiKey, Error> {
    use std::os::unix::fs::PermissionsExt;
    let read_error = |source| Error::KeyFile { path: path.to_path_buf(), source };
    let mode = std::fs::metadata(path).map_err(read_error)?.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(Error::KeyFileTooOpen(path.to_path_buf()));
    }
    let key = std::fs::read_to_string(path).map_err(read_error)?;
    let key = key.trim();
    if key.is_empty() {
        return Err(Error::EmptyKeyFile(path.to_path_buf()));
    }
    Ok(ApiKey::new(key.to_string()))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn key_files_must_be_private_and_non_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, "sk-test\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(KeySource::File(path.clone()).load(), Err(Error::KeyFileTooOpen(_))));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let key = KeySource::File(path.clone()).load().unwrap();
        assert_eq!(format!("{key:?}"), "ApiKey(<redacted>)");
        std::fs::write(&path, "  \n").unwrap();
        assert!(matches!(KeySource::File(path).load(), Err(Error::EmptyKeyFile(_))));
        assert!(matches!(KeySource::Env("COMMITPOINT_TEST_SURELY_UNSET".into()).load(), Err(Error::MissingKeyEnv(_))));
    }
}
