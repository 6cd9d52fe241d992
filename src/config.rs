//! Settings for `serve`. Defaults live here so every entry point agrees on them.

use std::net::SocketAddr;
use std::path::PathBuf;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:7878";
pub const DEFAULT_DATA_DIR: &str = "/var/lib/commitpoint";
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub schema_dir: Option<PathBuf>,
    pub max_body_bytes: usize,
}
