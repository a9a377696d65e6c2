//! Byte-level training data: a [`Corpus`] of UTF-8 text, its [`Split`] into training and
//! held-out bytes, a seeded [`Loader`] of global batches, and [`eval_microbatches`] for `--eval`.
//!
//! **Tokens.** The vocabulary is the 256 byte values; a token is a byte, as a `u32`. Where a
//! microbatch needs padding (only the last microbatch of an evaluation), inputs are padded with
//! byte 0 and targets with [`PAD_ID`] = 256, outside the vocabulary, so a cross-entropy with pad
//! id 256 ignores them. Training windows are never padded.
//!
//! **Windows.** A window is `seq_len + 1` consecutive bytes: its inputs are the first `seq_len`
//! bytes and its targets the last `seq_len` (the next byte of each input). Window `i` starts at
//! byte `i * seq_len`, so consecutive windows overlap by one byte; an incomplete last window is
//! dropped. Training and evaluation cut text the same way.
//!
//! **Order.** Each epoch visits every training window once, in a Fisher-Yates shuffle seeded by
//! `(seed, epoch)`. A step takes the next `global_microbatches * microbatch_size` windows (running
//! into the next epoch when one ends) and groups them into microbatches of `microbatch_size`
//! sequences, in order. The batch of a step is a pure function of the seed and the
//! [`DataPosition`] before it (equivalently, the number of steps before it), so a resumed run
//! draws exactly the data of an uninterrupted one.
//!
//! **Data parallelism.** The loader returns the whole global batch in microbatch order; with `D`
//! replicas of `M` microbatches each, replica `d` takes microbatches `d*M .. (d+1)*M`
//! ([`GlobalBatch::replica`]), so `--dp D --microbatches M` trains on the same data as
//! `--dp 1 --microbatches D*M`.
//!
//! The parts: this file reads a [`Corpus`] and splits it; `windows.rs` cuts text into windows
//! and evaluation microbatches ([`eval_microbatches`]); `loader.rs` holds the batch's sizes
//! ([`BatchShape`]), the loader's [`DataPosition`] and the seeded [`Loader`] of
//! [`GlobalBatch`]es.

mod loader;
mod windows;

pub use loader::{BatchShape, DataPosition, GlobalBatch, Loader};
use windows::window_len;
pub use windows::{eval_microbatches, eval_windows, window_count};

use std::fs;
use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::documents::blank_line_blocks;
use crate::error::{Result, TrainError};

/// The input id of padding (any byte would do: padded positions have no loss).
pub const PAD_INPUT: u32 = 0;

/// The folders of the checkout that [`Corpus::default_sources`] reads.
pub const SOURCE_DIRS: [&str; 8] = [
    "core",
    "transforms",
    "backends",
    "kernels",
    "train",
    "src",
    "examples",
    "tests",
];

/// The file extensions that [`Corpus::default_sources`] reads.
pub const SOURCE_EXTENSIONS: [&str; 3] = ["rs", "md", "toml"];

/// The files of the checkout's root that [`Corpus::default_sources`] reads.
pub const SOURCE_ROOT_FILES: [&str; 2] = ["README.md", "ARCHITECTURE.md"];

/// UTF-8 text as bytes, with where it came from.
#[derive(Debug, Clone)]
pub struct Corpus {
    origin: PathBuf,
    bytes: Vec<u8>,
    files: usize,
    documents: Vec<Range<usize>>,
}

/// A corpus cut into training bytes and held-out bytes (its last tenth).
#[derive(Debug, Clone, Copy)]
pub struct Split<'a> {
    /// The training part: the corpus without its last tenth.
    pub train: &'a [u8],
    /// The held-out part: the last tenth of the corpus, at least one window.
    pub held_out: &'a [u8],
}

impl Corpus {
    /// The UTF-8 text file at `path`, or every file under the folder `path` (recursively, sorted
    /// by path, joined by a newline). In a folder, entries whose names start with `.` and
    /// folders named `target` are skipped, as are symbolic links to folders; every other file
    /// must be UTF-8 text.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Corpus> {
        let path = path.as_ref();
        let metadata = fs::metadata(path).map_err(TrainError::io(path, "read"))?;
        let files = match metadata.is_dir() {
            true => files_under(path, &|_| true)?,
            false => vec![path.to_path_buf()],
        };
        Corpus::from_files(path, &files)
    }

    /// The source text of the checkout this crate was built from (the workspace root above
    /// `CARGO_MANIFEST_DIR`): see [`Corpus::from_sources`].
    pub fn default_sources() -> Result<Corpus> {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        Corpus::from_sources(manifest.parent().unwrap_or(manifest))
    }

    /// The files `*.rs`, `*.md`, `*.toml` under the folders [`SOURCE_DIRS`] of `root` and the
    /// files [`SOURCE_ROOT_FILES`] of `root`, sorted by path and joined by a newline; missing
    /// folders and files are skipped (hidden entries and `target` folders too).
    pub fn from_sources(root: impl AsRef<Path>) -> Result<Corpus> {
        let root = root.as_ref();
        let wanted = |path: &Path| {
            let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
            SOURCE_EXTENSIONS.contains(&ext)
        };
        let mut files = Vec::new();
        for dir in SOURCE_DIRS
            .iter()
            .map(|d| root.join(d))
            .filter(|d| d.is_dir())
        {
            files.extend(files_under(&dir, &wanted)?);
        }
        let root_files = SOURCE_ROOT_FILES.iter().map(|f| root.join(f));
        files.extend(root_files.filter(|f| f.is_file()));
        files.sort();
        Corpus::from_files(root, &files)
    }

    /// A corpus of `text`, said to come from `origin` in error messages.
    pub fn from_text(origin: impl Into<PathBuf>, text: impl Into<String>) -> Corpus {
        let bytes = text.into().into_bytes();
        Corpus {
            origin: origin.into(),
            documents: blank_line_blocks(&bytes),
            bytes,
            files: 1,
        }
    }

    /// Reads and joins `files` (already in order), each checked to be UTF-8.
    fn from_files(origin: &Path, files: &[PathBuf]) -> Result<Corpus> {
        let mut bytes = Vec::new();
        let mut documents = Vec::with_capacity(files.len());
        for (index, file) in files.iter().enumerate() {
            let contents = fs::read(file).map_err(TrainError::io(file, "read"))?;
            if let Err(e) = std::str::from_utf8(&contents) {
                return Err(TrainError::NotUtf8 {
                    path: file.clone(),
                    offset: e.valid_up_to(),
                });
            }
            if index > 0 {
                bytes.push(b'\n');
            }
            let start = bytes.len();
            bytes.extend_from_slice(&contents);
            documents.push(start..bytes.len());
        }
        // One file: its blank-line-separated blocks are the documents.
        if files.len() == 1 {
            documents = blank_line_blocks(&bytes);
        }
        Ok(Corpus {
            origin: origin.to_path_buf(),
            bytes,
            files: files.len(),
            documents,
        })
    }

    /// The text's bytes (valid UTF-8).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The file or folder the text came from.
    pub fn origin(&self) -> &Path {
        &self.origin
    }

    /// How many files were read.
    pub fn files(&self) -> usize {
        self.files
    }

    /// The documents as byte ranges: each file of a folder, or the blank-line-separated blocks
    /// of a single text (see [`crate::documents`]).
    pub fn documents(&self) -> &[Range<usize>] {
        &self.documents
    }

    /// The last tenth of the bytes held out (at least one window of `seq_len + 1` bytes), the
    /// rest for training (at least one window too); fails when the text is shorter than two
    /// windows.
    pub fn split(&self, seq_len: usize) -> Result<Split<'_>> {
        let window = window_len(seq_len)?;
        let len = self.bytes.len();
        let needed = window.saturating_mul(2);
        if len < needed {
            return Err(TrainError::DataTooShort {
                origin: self.origin.clone(),
                bytes: len,
                needed,
                why: format!(
                    "one training and one held-out sequence of seq_len + 1 = {window} bytes"
                ),
            });
        }
        let held_out = (len / 10).max(window);
        let (train, held_out) = self.bytes.split_at(len - held_out);
        Ok(Split { train, held_out })
    }
}

/// The files under `dir` (recursively) whose paths pass `wanted`, sorted by path; skips entries
/// whose names start with `.`, folders named `target` and symbolic links to folders.
fn files_under(dir: &Path, wanted: &dyn Fn(&Path) -> bool) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = fs::read_dir(&dir).map_err(TrainError::io(&dir, "list the folder"))?;
        for entry in entries {
            let entry = entry.map_err(TrainError::io(&dir, "list the folder"))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') {
                continue;
            }
            let path = entry.path();
            let kind = entry.file_type().map_err(TrainError::io(&path, "read"))?;
            if kind.is_dir() {
                if name != "target" {
                    pending.push(path);
                }
            } else if (kind.is_file() || path.is_file()) && wanted(&path) {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fresh empty folder under the system's temporary folder (also the checkpoint tests').
    pub(crate) fn scratch_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("pipeweave-data-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A fresh folder `name` holding `files` (paths inside it, folders made as needed).
    fn folder_with(name: &str, files: &[(&str, &[u8])]) -> PathBuf {
        let dir = scratch_dir(name);
        for (path, contents) in files {
            let path = dir.join(path);
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent).unwrap();
            }
            fs::write(path, contents).unwrap();
        }
        dir
    }

    #[test]
    fn a_folder_is_read_sorted_and_joined_skipping_hidden_and_target() {
        let dir = folder_with(
            "folder",
            &[
                ("b/z.txt", b"zz"),
                ("a.txt", b"aa"),
                ("b/target/skip.txt", b"no"),
                (".git/skip", b"no"),
                (".hidden", b"no"),
            ],
        );
        let corpus = Corpus::from_path(&dir).unwrap();
        assert_eq!(corpus.bytes(), b"aa\nzz");
        assert_eq!(corpus.files(), 2);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_that_is_not_utf8_is_named_with_its_offset() {
        let dir = folder_with("utf8", &[("good.txt", b"fine"), ("bad.bin", b"ok\xff\xfe")]);
        match Corpus::from_path(&dir) {
            Err(TrainError::NotUtf8 { path, offset }) => {
                assert_eq!(path, dir.join("bad.bin"));
                assert_eq!(offset, 2);
            }
            other => panic!("expected NotUtf8, got {other:?}"),
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_path_is_an_io_error_naming_it() {
        let err = Corpus::from_path("/nonexistent/pipeweave/data").unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/pipeweave/data"),
            "{err}"
        );
        assert!(err.is_bad_input());
    }

    #[test]
    fn default_sources_read_this_checkout() {
        let corpus = Corpus::default_sources().unwrap();
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        if root.join("kernels/src/lib.rs").is_file() {
            let text = std::str::from_utf8(corpus.bytes()).unwrap();
            assert!(text.contains("GPT-2-architecture transformer layers"));
        }
    }

    #[test]
    fn sources_are_code_and_docs_of_the_listed_folders() {
        let dir = folder_with(
            "sources",
            &[
                ("kernels/src/lib.rs", b"code"),
                ("kernels/Cargo.toml", b"toml"),
                ("kernels/data.bin", b"\xff"),
                ("docs/skip.md", b"not listed"),
                ("README.md", b"readme"),
            ],
        );
        let corpus = Corpus::from_sources(&dir).unwrap();
        assert_eq!(corpus.bytes(), b"readme\ntoml\ncode");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_last_tenth_is_held_out() {
        let corpus = Corpus::from_text("t", "x".repeat(1000));
        let split = corpus.split(8).unwrap();
        assert_eq!((split.train.len(), split.held_out.len()), (900, 100));
        let split = corpus.split(199).unwrap(); // a held-out window is 200 bytes
        assert_eq!((split.train.len(), split.held_out.len()), (800, 200));
    }

    #[test]
    fn text_shorter_than_two_windows_is_refused_with_both_lengths() {
        let corpus = Corpus::from_text("short.txt", "abcdefghi");
        match corpus.split(4) {
            Err(TrainError::DataTooShort { bytes, needed, .. }) => {
                assert_eq!((bytes, needed), (9, 10))
            }
            other => panic!("expected DataTooShort, got {other:?}"),
        }
        assert!(corpus.split(3).is_ok());
        assert!(Corpus::from_text("t", "abc").split(0).is_err());
    }
}
