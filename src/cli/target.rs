//! Where a client subcommand finds the server's API and the token it sends, the way an
//! operator on the host expects: flags and environment first, then what the packaged
//! installation and a running server leave on disk.

use std::path::{Path, PathBuf};

use anyhow::Context;

const DEFAULT_SERVER: &str = "http://127.0.0.1:7878";
/// Where the packaged unit loads the admin token from (`LoadCredential=admin-token:…`).
const PACKAGED_ADMIN_TOKEN: &str = "/etc/commitpoint/credentials/admin-token";
/// The packaged data directory (the unit's `--data-dir`).
const PACKAGED_DATA_DIR: &str = "/var/lib/commitpoint";

/// The server's API and how to authenticate to it, shared by every client subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct AdminUrl {
    /// The server's API. Default: $COMMITPOINT_ADMIN, else the listen address in the config
    /// file ($COMMITPOINT_CONFIG or /etc/commitpoint/config.toml), else (for a server bound
    /// to port 0) the address it wrote to <data dir>/address ($COMMITPOINT_DATA_DIR, the
    /// config's data_dir, or /var/lib/commitpoint), else http://127.0.0.1:7878.
    #[arg(long = "admin", visible_alias = "server", env = "COMMITPOINT_ADMIN")]
    admin: Option<String>,
    /// Bearer token (the admin token, or a tenant's own where the command allows it), when
    /// the server has access tokens configured. Default: --token-file, else the packaged
    /// admin credential (/etc/commitpoint/credentials/admin-token) when readable.
    #[arg(long, env = "COMMITPOINT_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A file whose first line is the bearer token (kept out of the process list and the
    /// shell history, unlike --token).
    #[arg(long, env = "COMMITPOINT_TOKEN_FILE", conflicts_with = "token")]
    token_file: Option<PathBuf>,
}

impl AdminUrl {
    pub fn resolve(&self) -> String {
        if let Some(url) = &self.admin {
            return url.trim_end_matches('/').to_string();
        }
        let config = std::env::var_os("COMMITPOINT_CONFIG")
            .map_or_else(|| PathBuf::from(crate::app::config::DEFAULT_CONFIG_PATH), PathBuf::from);
        let listen = crate::app::config::listen_in_file(&config);
        if let Some(addr) = listen.filter(|a| a.port() != 0) {
            return url_of(addr);
        }
        let data_dir = std::env::var_os("COMMITPOINT_DATA_DIR")
            .map(PathBuf::from)
            .or_else(|| crate::app::config::data_dir_in_file(&config))
            .unwrap_or_else(|| PathBuf::from(PACKAGED_DATA_DIR));
        written_address(&data_dir).unwrap_or_else(|| DEFAULT_SERVER.to_string())
    }

    /// The token to send, if any.
    pub fn token(&self) -> anyhow::Result<Option<String>> {
        token_from(self.token.as_deref(), self.token_file.as_deref(), Path::new(PACKAGED_ADMIN_TOKEN))
    }

    /// An HTTP client that sends this target's token on every request.
    pub fn client(&self) -> anyhow::Result<reqwest::Client> {
        super::http_client(self.token()?.as_deref())
    }
}

fn url_of(addr: std::net::SocketAddr) -> String {
    // A server bound to every interface is reached on loopback.
    let host = if addr.ip().is_unspecified() { "127.0.0.1".to_string() } else { addr.ip().to_string() };
    let host = if host.contains(':') { format!("[{host}]") } else { host };
    format!("http://{host}:{}", addr.port())
}

/// The address a running server wrote to `data_dir` (`app::server::write_address`).
fn written_address(data_dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(data_dir.join(crate::app::ADDRESS_FILE)).ok()?;
    let addr: std::net::SocketAddr = text.trim().parse().ok()?;
    Some(url_of(addr))
}

/// `--token`, else `--token-file`'s first line, else the packaged credential if this user
/// can read it. A named token file that cannot be read is an error, not a silent nothing.
fn token_from(token: Option<&str>, file: Option<&Path>, packaged: &Path) -> anyhow::Result<Option<String>> {
    if let Some(token) = token {
        return Ok(Some(token.trim().to_string()));
    }
    if let Some(file) = file {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("cannot read the token file {}", file.display()))?;
        let token = text.lines().next().unwrap_or_default().trim().to_string();
        anyhow::ensure!(!token.is_empty(), "the token file {} is empty", file.display());
        return Ok(Some(token));
    }
    Ok(std::fs::read_to_string(packaged)
        .ok()
        .and_then(|text| text.lines().next().map(|line| line.trim().to_string()))
        .filter(|token| !token.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_comes_from_the_flag_the_file_or_the_packaged_credential() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("token");
        let packaged = dir.path().join("admin-token");
        std::fs::write(&file, "tok-from-file\nignored\n").expect("write");
        std::fs::write(&packaged, "tok-packaged\n").expect("write");
        assert_eq!(token_from(Some("tok-flag"), Some(&file), &packaged).unwrap().as_deref(), Some("tok-flag"));
        assert_eq!(token_from(None, Some(&file), &packaged).unwrap().as_deref(), Some("tok-from-file"));
        assert_eq!(token_from(None, None, &packaged).unwrap().as_deref(), Some("tok-packaged"));
        assert_eq!(token_from(None, None, &dir.path().join("absent")).unwrap(), None);
        let missing = token_from(None, Some(&dir.path().join("absent")), &packaged).unwrap_err();
        assert!(format!("{missing:#}").contains("cannot read the token file"), "{missing:#}");
        std::fs::write(&file, "\n").expect("write");
        assert!(token_from(None, Some(&file), &packaged).is_err(), "an empty token file is refused");
    }

    #[test]
    fn a_written_address_is_reached_on_loopback() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert_eq!(written_address(dir.path()), None);
        crate::app::write_address(dir.path(), "0.0.0.0:41234".parse().expect("address"));
        assert_eq!(written_address(dir.path()).as_deref(), Some("http://127.0.0.1:41234"));
        crate::app::write_address(dir.path(), "[::1]:41235".parse().expect("address"));
        assert_eq!(written_address(dir.path()).as_deref(), Some("http://[::1]:41235"));
    }
}
