//! Output files written while the checks still run, and put in place only once every check passed.
//!
//! A rendered file is written beside its destination under a temporary name
//! (`.NAME.PID.pipeweave-partial` in the same folder) and renamed onto the destination when the
//! command commits it: a reader sees the old file or the whole new one, never a part, and a plan
//! that fails a check leaves no file behind (the temporary is removed when the staged file is
//! dropped uncommitted). A destination that is not a regular file (a terminal, a pipe,
//! `/dev/stdout`, a symbolic link) is written directly at commit time, as is any file whose
//! temporary could not be written (the direct write then reports what is wrong with the
//! destination).

use crate::error::Error;
use std::fs;
use std::path::{Path, PathBuf};

/// One output file, staged until [`Staged::commit`].
pub struct Staged {
    path: String,
    pending: Option<Pending>,
}

/// What is left to do to put a staged file in place.
enum Pending {
    /// The contents are in this temporary file, to be renamed onto the destination.
    Temporary(PathBuf),
    /// The contents, to be written straight to the destination.
    Direct(String),
}

impl Staged {
    /// Writes `contents` beside `path` under a temporary name, or keeps them for a direct write
    /// (see the module doc).
    pub fn new(path: &str, contents: String) -> Staged {
        let pending = match temporary_beside(Path::new(path)) {
            Some(temporary) if fs::write(&temporary, &contents).is_ok() => {
                Pending::Temporary(temporary)
            }
            Some(temporary) => {
                let _ = fs::remove_file(temporary);
                Pending::Direct(contents)
            }
            None => Pending::Direct(contents),
        };
        Staged {
            path: path.to_string(),
            pending: Some(pending),
        }
    }

    /// Puts the file in place (a rename, or the direct write).
    pub fn commit(mut self) -> Result<(), Error> {
        let io_error = |source| Error::Io {
            path: self.path.clone(),
            source,
        };
        match self.pending.take() {
            Some(Pending::Temporary(temporary)) => {
                fs::rename(&temporary, &self.path).map_err(|source| {
                    let _ = fs::remove_file(&temporary);
                    io_error(source)
                })
            }
            Some(Pending::Direct(contents)) => fs::write(&self.path, contents).map_err(io_error),
            None => Ok(()),
        }
    }
}

impl Drop for Staged {
    /// An uncommitted file leaves nothing behind.
    fn drop(&mut self) {
        if let Some(Pending::Temporary(temporary)) = &self.pending {
            let _ = fs::remove_file(temporary);
        }
    }
}

/// The temporary name beside `path`, when `path` is a regular file or does not exist yet; the
/// temporary gets the destination's permissions, which the rename keeps.
fn temporary_beside(path: &Path) -> Option<PathBuf> {
    let existing = match fs::symlink_metadata(path) {
        Ok(metadata) if metadata.file_type().is_file() => Some(metadata),
        Ok(_) => return None,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
        Err(_) => return None,
    };
    let name = path.file_name()?.to_str()?;
    let temporary =
        path.with_file_name(format!(".{name}.{}.pipeweave-partial", std::process::id()));
    if let Some(metadata) = existing {
        // Created empty with the destination's permissions before the contents go in.
        fs::write(&temporary, "").ok()?;
        if fs::set_permissions(&temporary, metadata.permissions()).is_err() {
            let _ = fs::remove_file(&temporary);
            return None;
        }
    }
    Some(temporary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("pipeweave-staged-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("the temporary folder is writable");
        dir
    }

    /// A fresh folder `name` holding `file` with the contents `old`: the folder and the file.
    fn with_old(name: &str, file: &str) -> (PathBuf, PathBuf) {
        let dir = scratch(name);
        let path = dir.join(file);
        fs::write(&path, "old").unwrap();
        (dir, path)
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .expect("the folder exists")
            .map(|e| {
                e.expect("an entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_committed_file_replaces_the_old_one_whole() {
        let (dir, path) = with_old("commit", "out.csv");
        let staged = Staged::new(path.to_str().unwrap(), "new contents".to_string());
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            "old",
            "nothing moves before the commit"
        );
        assert_eq!(
            entries(&dir).len(),
            2,
            "the temporary sits beside the destination"
        );
        staged.commit().unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "new contents");
        assert_eq!(entries(&dir), ["out.csv"]);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_uncommitted_file_leaves_nothing_behind() {
        let (dir, kept) = with_old("drop", "kept.svg");
        let fresh = dir.join("fresh.svg");
        drop(Staged::new(fresh.to_str().unwrap(), "x".to_string()));
        drop(Staged::new(kept.to_str().unwrap(), "y".to_string()));
        assert_eq!(entries(&dir), ["kept.svg"]);
        assert_eq!(fs::read_to_string(&kept).unwrap(), "old");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_unwritable_destination_is_reported_by_its_own_path() {
        let dir = scratch("missing");
        let path = dir.join("no-such-folder").join("out.json");
        let staged = Staged::new(path.to_str().unwrap(), "{}".to_string());
        let error = staged.commit().unwrap_err();
        assert!(
            matches!(&error, Error::Io { path: p, .. } if p == path.to_str().unwrap()),
            "{error}"
        );
        fs::remove_dir_all(dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_link_or_a_device_is_written_directly() {
        let (dir, target) = with_old("link", "target.csv");
        let link = dir.join("link.csv");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let staged = Staged::new(link.to_str().unwrap(), "through the link".to_string());
        assert_eq!(
            entries(&dir),
            ["link.csv", "target.csv"],
            "no temporary for a link"
        );
        staged.commit().unwrap();
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(fs::read_to_string(&target).unwrap(), "through the link");
        Staged::new("/dev/null", "discarded".to_string())
            .commit()
            .unwrap();
        fs::remove_dir_all(dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_replaced_file_keeps_its_permissions() {
        use std::os::unix::fs::PermissionsExt;
        let (dir, path) = with_old("mode", "programs.json");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        Staged::new(path.to_str().unwrap(), "new".to_string())
            .commit()
            .unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
        fs::remove_dir_all(dir).unwrap();
    }
}
