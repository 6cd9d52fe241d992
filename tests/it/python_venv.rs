//! Python tools the tests run (moto's S3, the Cloud Storage emulator), installed from
//! PyPI into a venv under `target/` at the versions `tests/fixtures/python/<name>.txt`
//! pins, so that a new release upstream cannot change what a test ran against. The venv's
//! directory carries a digest of the pins: changing them makes a fresh one.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

static INSTALL: Mutex<()> = Mutex::new(());

/// The path of `command` in the venv for `name`, installing the venv first if the pinned
/// set is not there yet (one install at a time).
pub fn tool(name: &str, command: &str) -> PathBuf {
    let _guard = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let pins = manifest.join("tests").join("fixtures").join("python").join(format!("{name}.txt"));
    let text = std::fs::read(&pins).unwrap_or_else(|e| panic!("read {}: {e}", pins.display()));
    let digest = blake3::hash(&text).to_hex();
    let venv = manifest.join("target").join(format!("{name}-venv-{}", &digest[..12]));
    let bin = venv.join("bin").join(command);
    if bin.exists() {
        return bin;
    }
    let status = Command::new("python3").args(["-m", "venv"]).arg(&venv).status().expect("run python3 -m venv");
    assert!(status.success(), "python3 -m venv failed (Debian: apt-get install python3-venv)");
    let status = Command::new(venv.join("bin").join("pip"))
        .args(["install", "--quiet", "--disable-pip-version-check", "--requirement"])
        .arg(&pins)
        .status()
        .expect("run pip");
    assert!(status.success(), "pip install -r {} failed", pins.display());
    assert!(bin.exists(), "{} installed no {command}", pins.display());
    bin
}
