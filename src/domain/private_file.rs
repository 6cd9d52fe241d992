//! Files that hold tenant data outside the HTTP API (exports, backups, the redb file) are
//! created owner-only, whatever the umask, and never through a link someone planted at
//! the name: the data directory and the export's directory may be shared with other
//! users, and a symlink at `FILE.partial` would otherwise send the data wherever it points.

use std::ffi::OsString;
use std::fs::{DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;

/// Owner read and write, nothing for group or others.
pub const FILE_MODE: u32 = 0o600;
/// Owner only, for directories this process creates to hold such files.
pub const DIR_MODE: u32 = 0o700;

/// `FILE.partial`, where a file is written before it is renamed to FILE: the whole name
/// with `.partial` appended, so `out.csv` and `out.jsonl` never share one.
pub fn partial_path(path: &Path) -> PathBuf {
    let mut name = OsString::from(path.as_os_str());
    name.push(".partial");
    PathBuf::from(name)
}

/// Creates `path`, mode 0600, for reading and writing. Fails if anything is at the name,
/// a symlink included: `O_CREAT | O_EXCL` never follows one, and `O_NOFOLLOW` refuses a
/// final component that is a link even where `O_EXCL` is not honoured.
pub fn create_new(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .custom_flags(OFlag::O_NOFOLLOW.bits())
        .open(path)
}

/// [`create_new`] after removing what a previous run left at `path` (a crash leaves its
/// `.partial` behind). Removing a symlink removes the link, never its target; a link
/// planted again in between makes the create fail rather than follow it.
pub fn replace(path: &Path) -> io::Result<File> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    create_new(path)
}

/// Creates `dir` and any missing parents with mode 0700. Directories that already exist
/// keep their mode: the operator may have chosen it.
pub fn create_dir_all(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn partial_keeps_the_whole_name() {
        assert_eq!(partial_path(Path::new("/x/out.csv")), PathBuf::from("/x/out.csv.partial"));
        assert_eq!(partial_path(Path::new("backup")), PathBuf::from("backup.partial"));
    }

    #[test]
    fn files_and_directories_are_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("a/b");
        create_dir_all(&nested).unwrap();
        assert_eq!(mode(&dir.path().join("a")), DIR_MODE);
        assert_eq!(mode(&nested), DIR_MODE);
        let file = nested.join("f");
        drop(create_new(&file).unwrap());
        assert_eq!(mode(&file), FILE_MODE);
        assert_eq!(create_new(&file).unwrap_err().kind(), io::ErrorKind::AlreadyExists);
    }

    #[test]
    fn a_planted_symlink_is_never_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let link = dir.path().join("out.partial");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        assert!(create_new(&link).is_err());
        let mut file = replace(&link).unwrap();
        io::Write::write_all(&mut file, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert!(!std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(mode(&link), FILE_MODE);
    }
}
