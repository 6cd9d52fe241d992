//! Secrets by reference: where a key comes from, how it is read, and the key type that
//! never prints. Config names a source; the layer that needs the secret loads it.

use std::fmt;
use std::path::{Path, PathBuf};

/// Where an API key comes from. Never from a config value or a flag: those end up in
/// shell history, process listings and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    Env(String),
    File(PathBuf),
    /// A systemd credential: `$CREDENTIALS_DIRECTORY/<name>`.
    Credential(String),
}

impl fmt::Display for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySource::Env(name) => write!(f, "environment variable {name}"),
            KeySource::File(path) => write!(f, "file {}", path.display()),
            KeySource::Credential(name) => write!(f, "systemd credential {name}"),
        }
    }
}

/// Why a secret could not be read. The messages name the source, never the secret.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("the secret variable {0} is not set (or is empty); export it or name a file instead")]
    MissingKeyEnv(String),
    #[error("{path}: cannot read the secret file")]
    KeyFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}: the secret file is readable by group or others; run `chmod 600` on it")]
    KeyFileTooOpen(PathBuf),
    #[error("{0}: the secret file is empty")]
    EmptyKeyFile(PathBuf),
    #[error("the credential {0} is named but $CREDENTIALS_DIRECTORY is not set (is LoadCredential= in the unit?)")]
    NoCredentialsDirectory(String),
}

impl KeySource {
    pub fn load(&self) -> Result<ApiKey, SecretError> {
        self.load_secret().map(ApiKey::new)
    }

    /// The secret's text, trimmed. Files must not be readable by group or others.
    pub fn load_secret(&self) -> Result<String, SecretError> {
        match self {
            KeySource::Env(name) => match std::env::var(name) {
                Ok(key) if !key.trim().is_empty() => Ok(key.trim().to_string()),
                _ => Err(SecretError::MissingKeyEnv(name.clone())),
            },
            KeySource::File(path) => load_key_file(path),
            KeySource::Credential(name) => {
                let dir = std::env::var_os("CREDENTIALS_DIRECTORY")
                    .ok_or_else(|| SecretError::NoCredentialsDirectory(name.clone()))?;
                load_key_file(&Path::new(&dir).join(name))
            }
        }
    }
}

fn load_key_file(path: &Path) -> Result<String, SecretError> {
    use std::os::unix::fs::PermissionsExt;
    let read_error = |source| SecretError::KeyFile { path: path.to_path_buf(), source };
    let mode = std::fs::metadata(path).map_err(read_error)?.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(SecretError::KeyFileTooOpen(path.to_path_buf()));
    }
    let key = std::fs::read_to_string(path).map_err(read_error)?;
    let key = key.trim();
    if key.is_empty() {
        return Err(SecretError::EmptyKeyFile(path.to_path_buf()));
    }
    Ok(key.to_string())
}

/// A provider API key. Its Debug form is redacted, and only adapters can read it.
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn new(key: String) -> Self {
        super::redact::register(&key);
        Self(key)
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
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
        assert!(matches!(KeySource::File(path.clone()).load(), Err(SecretError::KeyFileTooOpen(_))));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let key = KeySource::File(path.clone()).load().unwrap();
        assert_eq!(format!("{key:?}"), "ApiKey(<redacted>)");
        std::fs::write(&path, "  \n").unwrap();
        assert!(matches!(KeySource::File(path).load(), Err(SecretError::EmptyKeyFile(_))));
        assert!(matches!(
            KeySource::Env("COMMITPOINT_TEST_SURELY_UNSET".into()).load(),
            Err(SecretError::MissingKeyEnv(_))
        ));
    }
}
