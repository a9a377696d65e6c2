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

use std::fs;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pipeweave_kernels::init::SplitMix64;
use serde::{Deserialize, Serialize};

use crate::batch::PAD_ID;
use crate::documents::{blank_line_blocks, pieces, Piece};
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

/// `seq_len + 1`, the bytes of one window; fails for `seq_len == 0`.
fn window_len(seq_len: usize) -> Result<usize> {
    if seq_len == 0 {
        return Err(TrainError::invalid("seq_len", 0, "must be positive"));
    }
    seq_len
        .checked_add(1)
        .ok_or_else(|| TrainError::invalid("seq_len", seq_len, "is too large"))
}

/// The number of windows of `seq_len + 1` bytes at stride `seq_len` in `len` bytes.
pub fn window_count(len: usize, seq_len: usize) -> usize {
    match seq_len {
        0 => 0,
        _ => len.saturating_sub(1) / seq_len,
    }
}

/// The sizes of a global batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchShape {
    /// Tokens per sequence, `T`.
    pub seq_len: usize,
    /// Sequences per microbatch, `B`.
    pub microbatch_size: usize,
    /// Microbatches per step over all data-parallel replicas, `D * M`.
    pub global_microbatches: usize,
}

impl BatchShape {
    /// A shape whose sizes are all positive.
    pub fn new(seq_len: usize, microbatch_size: usize, global_microbatches: usize) -> Result<Self> {
        let positive = |field: &'static str, value: usize| match value {
            0 => Err(TrainError::invalid(field, 0, "must be positive")),
            _ => Ok(()),
        };
        positive("seq_len", seq_len)?;
        positive("microbatch_size", microbatch_size)?;
        positive("global_microbatches", global_microbatches)?;
        let shape = BatchShape {
            seq_len,
            microbatch_size,
            global_microbatches,
        };
        shape.sequences_per_step()?;
        Ok(shape)
    }

    /// Sequences in a global batch, `D * M * B`.
    pub fn sequences_per_step(&self) -> Result<usize> {
        self.global_microbatches
            .checked_mul(self.microbatch_size)
            .ok_or_else(|| {
                TrainError::invalid("microbatch_size", self.microbatch_size, "overflows a step")
            })
    }

    /// Tokens (targets) in a microbatch, `B * T`.
    pub fn microbatch_tokens(&self) -> usize {
        self.microbatch_size.saturating_mul(self.seq_len)
    }
}

/// Where the loader stands: the epoch, and how many of its windows have been taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DataPosition {
    /// The epoch (0 first).
    pub epoch: u64,
    /// Windows of the epoch already taken.
    pub cursor: u64,
}

/// One step's data: per microbatch, `B * T` input ids and `B * T` target ids, row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalBatch {
    /// Input ids per microbatch, in microbatch order.
    pub inputs: Vec<Vec<u32>>,
    /// Target ids per microbatch (the next byte of each input).
    pub targets: Vec<Vec<u32>>,
    /// Sequences per microbatch, `B`.
    pub microbatch_size: usize,
    /// Tokens per sequence, `T`: every microbatch's, or with variable lengths the most a
    /// microbatch may have (each has `ids / microbatch_size`).
    pub seq_len: usize,
}

impl GlobalBatch {
    /// Tokens per sequence of each microbatch (its ids over `microbatch_size`).
    pub fn microbatch_lengths(&self) -> Vec<usize> {
        self.inputs
            .iter()
            .map(|ids| ids.len() / self.microbatch_size.max(1))
            .collect()
    }

    /// The part of data-parallel replica `d` when each replica takes `m` microbatches:
    /// microbatches `d*m .. (d+1)*m`.
    pub fn replica(&self, d: usize, m: usize) -> Result<GlobalBatch> {
        let range = d
            .checked_mul(m)
            .and_then(|start| Some(start..start.checked_add(m)?))
            .filter(|r| m > 0 && r.end <= self.inputs.len())
            .ok_or_else(|| {
                let reason = format!("with {m} microbatches each, beyond the global batch");
                TrainError::invalid("replica", d, reason)
            })?;
        Ok(GlobalBatch {
            inputs: self.inputs[range.clone()].to_vec(),
            targets: self.targets[range].to_vec(),
            ..*self
        })
    }
}

/// Draws global batches of windows from training bytes, in a seeded order.
#[derive(Debug, Clone)]
pub struct Loader {
    bytes: Arc<[u8]>,
    shape: BatchShape,
    seed: u64,
    windows: usize,
    /// Variable-length sequences cut at document boundaries; `None`: windows of `seq_len + 1`
    /// bytes at stride `seq_len` across the whole text.
    pieces: Option<Vec<Piece>>,
    order: Option<(u64, Vec<usize>)>,
}

impl Loader {
    /// A loader of `shape` batches over `bytes` (the training part), ordered by `seed`; fails
    /// unless the bytes hold at least one window.
    pub fn new(bytes: impl Into<Arc<[u8]>>, shape: BatchShape, seed: u64) -> Result<Loader> {
        let bytes = bytes.into();
        let window = window_len(shape.seq_len)?;
        shape.sequences_per_step()?;
        let windows = window_count(bytes.len(), shape.seq_len);
        if windows == 0 {
            return Err(TrainError::DataTooShort {
                origin: PathBuf::from("training data"),
                bytes: bytes.len(),
                needed: window,
                why: format!("one sequence of seq_len + 1 = {window} bytes"),
            });
        }
        Ok(Loader {
            bytes,
            shape,
            seed,
            windows,
            pieces: None,
            order: None,
        })
    }

    /// A loader of variable-length microbatches over `bytes`: the `documents` (byte ranges;
    /// clipped to `bytes`) cut into sequences of at most `shape.seq_len` tokens that never cross
    /// a document boundary, shuffled by `seed`, `shape.microbatch_size` to a microbatch, each
    /// microbatch as long as its longest sequence (shorter ones padded: inputs with byte 0,
    /// targets with [`crate::PAD_ID`]).
    pub fn variable(
        bytes: impl Into<Arc<[u8]>>,
        documents: &[Range<usize>],
        shape: BatchShape,
        seed: u64,
    ) -> Result<Loader> {
        let bytes = bytes.into();
        window_len(shape.seq_len)?;
        shape.sequences_per_step()?;
        let pieces = pieces(documents, bytes.len(), shape.seq_len);
        if pieces.is_empty() {
            return Err(TrainError::DataTooShort {
                origin: PathBuf::from("training data"),
                bytes: bytes.len(),
                needed: 2,
                why: "a document of at least 2 bytes (one input and its target)".to_string(),
            });
        }
        Ok(Loader {
            bytes,
            shape,
            seed,
            windows: pieces.len(),
            pieces: Some(pieces),
            order: None,
        })
    }

    /// The batch shape.
    pub fn shape(&self) -> BatchShape {
        self.shape
    }

    /// The number of windows in an epoch.
    pub fn windows_per_epoch(&self) -> usize {
        self.windows
    }

    /// The position after `steps` steps from the start.
    pub fn position_after(&self, steps: u64) -> DataPosition {
        let per_step = self.shape.sequences_per_step().unwrap_or(usize::MAX) as u128;
        let taken = per_step * u128::from(steps);
        let windows = self.windows as u128;
        DataPosition {
            epoch: u64::try_from(taken / windows).unwrap_or(u64::MAX),
            cursor: (taken % windows) as u64,
        }
    }

    /// The batch of the step after `steps` completed steps (the first step is
    /// `batch_for_step(0)`).
    pub fn batch_for_step(&mut self, steps: u64) -> Result<GlobalBatch> {
        let position = self.position_after(steps);
        Ok(self.batch_at(position)?.0)
    }

    /// The batch drawn at `position`, and the position after it.
    pub fn batch_at(&mut self, position: DataPosition) -> Result<(GlobalBatch, DataPosition)> {
        let cursor = usize::try_from(position.cursor).unwrap_or(usize::MAX);
        if cursor >= self.windows {
            let reason = format!("an epoch has only {} windows", self.windows);
            return Err(TrainError::invalid("data cursor", cursor, reason));
        }
        let (mut epoch, mut cursor) = (position.epoch, cursor);
        let (sequences, seq_len) = (self.shape.sequences_per_step()?, self.shape.seq_len);
        let mut picked = Vec::with_capacity(sequences);
        while picked.len() < sequences {
            let order = self.order_of(epoch);
            let epoch_len = order.len();
            let take = (sequences - picked.len()).min(epoch_len - cursor);
            let chosen: Vec<usize> = order[cursor..cursor + take].to_vec();
            picked.extend(chosen.into_iter().map(|w| match &self.pieces {
                Some(pieces) => pieces[w],
                None => Piece {
                    start: w * seq_len,
                    len: seq_len + 1,
                },
            }));
            cursor += take;
            if cursor == epoch_len {
                (epoch, cursor) = (epoch.saturating_add(1), 0);
            }
        }
        let next = DataPosition {
            epoch,
            cursor: cursor as u64,
        };
        Ok((self.assemble(&picked), next))
    }

    /// The shuffled window indices of `epoch` (cached for the latest epoch asked).
    fn order_of(&mut self, epoch: u64) -> &[usize] {
        if self.order.as_ref().map(|(e, _)| *e) != Some(epoch) {
            let order = shuffled(self.windows, epoch_seed(self.seed, epoch));
            self.order = Some((epoch, order));
        }
        self.order
            .as_ref()
            .map(|(_, o)| o.as_slice())
            .unwrap_or(&[])
    }

    /// Groups the sequences `picked` into microbatches, each as long as its longest sequence
    /// (all `seq_len` long without variable lengths: no padding there).
    fn assemble(&self, picked: &[Piece]) -> GlobalBatch {
        let chunks = picked.chunks(self.shape.microbatch_size);
        let (inputs, targets) = chunks
            .map(|chunk| {
                let t = chunk.iter().map(Piece::tokens).max().unwrap_or(0);
                let mut input = Vec::with_capacity(chunk.len() * t);
                let mut target = Vec::with_capacity(chunk.len() * t);
                for piece in chunk {
                    let bytes = &self.bytes[piece.start..piece.start + piece.len];
                    let n = piece.tokens();
                    input.extend(bytes[..n].iter().map(|&b| u32::from(b)));
                    input.extend(std::iter::repeat_n(0, t - n));
                    target.extend(bytes[1..].iter().map(|&b| u32::from(b)));
                    target.extend(std::iter::repeat_n(PAD_ID, t - n));
                }
                (input, target)
            })
            .unzip();
        GlobalBatch {
            inputs,
            targets,
            microbatch_size: self.shape.microbatch_size,
            seq_len: self.shape.seq_len,
        }
    }
}

/// The seed of an epoch's shuffle, mixed from the run's seed and the epoch.
fn epoch_seed(seed: u64, epoch: u64) -> u64 {
    const DATA_DOMAIN: u64 = 0x6461_7461_6f72_6465; // "dataorde"
    let mut mixer = SplitMix64::new(seed ^ DATA_DOMAIN);
    let key = mixer.next_u64();
    SplitMix64::new(key ^ epoch.wrapping_mul(0xD1B5_4A32_D192_ED03)).next_u64()
}

/// `0..n` in a Fisher-Yates shuffle driven by SplitMix64 from `seed` (the same on every
/// machine: integer arithmetic only).
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut rng = SplitMix64::new(seed);
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        // A draw from 0..=i by multiply-high (bias below (i + 1) / 2^64).
        let j = ((u128::from(rng.next_u64()) * (i as u128 + 1)) >> 64) as usize;
        order.swap(i, j);
    }
    order
}

/// `text` cut into evaluation windows of `seq_len + 1` bytes (window `i` covers bytes
/// `i*T ..= i*T + T`; the incomplete last window dropped): `(inputs, targets)` per window.
pub fn eval_windows(text: &[u8], seq_len: usize) -> Vec<(Vec<u32>, Vec<u32>)> {
    (0..window_count(text.len(), seq_len))
        .map(|i| {
            let window = &text[i * seq_len..=i * seq_len + seq_len];
            let ids: Vec<u32> = window.iter().map(|&b| u32::from(b)).collect();
            (ids[..seq_len].to_vec(), ids[1..].to_vec())
        })
        .collect()
}

/// The evaluation windows of `text` grouped into microbatches of `microbatch_size` sequences,
/// the last one padded (inputs [`PAD_INPUT`], targets [`PAD_ID`]); fails unless `text` holds
/// at least one window. `origin` names the text in the error.
pub fn eval_microbatches(
    origin: &Path,
    text: &[u8],
    seq_len: usize,
    microbatch_size: usize,
) -> Result<GlobalBatch> {
    let window = window_len(seq_len)?;
    if microbatch_size == 0 {
        return Err(TrainError::invalid(
            "microbatch_size",
            0,
            "must be positive",
        ));
    }
    let windows = eval_windows(text, seq_len);
    if windows.is_empty() {
        return Err(TrainError::DataTooShort {
            origin: origin.to_path_buf(),
            bytes: text.len(),
            needed: window,
            why: format!("one evaluation sequence of seq_len + 1 = {window} bytes"),
        });
    }
    let mut batch = GlobalBatch {
        inputs: Vec::new(),
        targets: Vec::new(),
        microbatch_size,
        seq_len,
    };
    for chunk in windows.chunks(microbatch_size) {
        let pad = (microbatch_size - chunk.len()) * seq_len;
        let input = chunk.iter().flat_map(|(i, _)| i.iter().copied());
        let target = chunk.iter().flat_map(|(_, t)| t.iter().copied());
        let padded = |ids: &mut Vec<u32>, id: u32| ids.extend(std::iter::repeat_n(id, pad));
        let (mut input, mut target): (Vec<u32>, Vec<u32>) = (input.collect(), target.collect());
        padded(&mut input, PAD_INPUT);
        padded(&mut target, PAD_ID);
        batch.inputs.push(input);
        batch.targets.push(target);
    }
    Ok(batch)
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

    fn shape(t: usize, b: usize, g: usize) -> BatchShape {
        BatchShape::new(t, b, g).unwrap()
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

    #[test]
    fn windows_overlap_by_one_byte_and_targets_are_the_next_bytes() {
        let windows = eval_windows(b"abcdefgh", 3);
        let bytes = |s: &str| s.bytes().map(u32::from).collect::<Vec<_>>();
        assert_eq!(windows.len(), 2);
        assert_eq!(windows[0], (bytes("abc"), bytes("bcd")));
        assert_eq!(windows[1], (bytes("def"), bytes("efg")));
        assert_eq!(window_count(8, 3), 2);
        assert_eq!(window_count(3, 3), 0);
    }

    #[test]
    fn the_last_eval_microbatch_is_padded() {
        let batch = eval_microbatches(Path::new("e"), b"abcdefgh", 3, 3).unwrap();
        assert_eq!(batch.inputs.len(), 1);
        assert_eq!(batch.inputs[0][6..], [PAD_INPUT; 3]);
        assert_eq!(batch.targets[0][6..], [PAD_ID; 3]);
        assert_eq!(batch.targets[0][..3], [98, 99, 100]);
        let err = eval_microbatches(Path::new("e"), b"abc", 3, 2).unwrap_err();
        assert!(matches!(
            err,
            TrainError::DataTooShort {
                bytes: 3,
                needed: 4,
                ..
            }
        ));
    }

    #[test]
    fn batches_have_the_shape_and_next_byte_targets() {
        let text: Vec<u8> = (0..=200u8).collect();
        let mut loader = Loader::new(text.as_slice(), shape(4, 2, 3), 7).unwrap();
        let batch = loader.batch_for_step(0).unwrap();
        assert_eq!(batch.inputs.len(), 3);
        for (input, target) in batch.inputs.iter().zip(&batch.targets) {
            assert_eq!((input.len(), target.len()), (8, 8));
            for row in 0..2 {
                let (i, t) = (&input[row * 4..row * 4 + 4], &target[row * 4..row * 4 + 4]);
                assert_eq!(i[0] % 4, 0, "windows start at multiples of seq_len");
                assert!(i.iter().zip(t).all(|(a, b)| a + 1 == *b));
            }
        }
    }

    #[test]
    fn an_epoch_takes_every_window_once_then_reshuffles() {
        let text: Vec<u8> = (0..=24u8).collect(); // 6 windows of 5 bytes at stride 4
        let mut loader = Loader::new(text.as_slice(), shape(4, 1, 3), 1).unwrap();
        assert_eq!(loader.windows_per_epoch(), 6);
        let first = |b: &GlobalBatch| b.inputs.iter().map(|i| i[0]).collect::<Vec<_>>();
        let mut epoch0: Vec<u32> = [0, 1]
            .iter()
            .flat_map(|&k| first(&loader.batch_for_step(k).unwrap()))
            .collect();
        let epoch1: Vec<u32> = [2, 3]
            .iter()
            .flat_map(|&k| first(&loader.batch_for_step(k).unwrap()))
            .collect();
        assert_ne!(epoch0, epoch1, "each epoch has its own order");
        epoch0.sort();
        assert_eq!(epoch0, vec![0, 4, 8, 12, 16, 20]);
    }

    #[test]
    fn a_resumed_loader_draws_the_same_batches() {
        let text: Vec<u8> = (0..=250u8).collect();
        let mut loader = Loader::new(text.as_slice(), shape(5, 3, 4), 42).unwrap(); // 50 windows
        let mut position = DataPosition::default();
        let mut sequential = Vec::new();
        for _ in 0..10 {
            let (batch, next) = loader.batch_at(position).unwrap();
            sequential.push(batch);
            position = next;
        }
        assert_eq!(position, loader.position_after(10));
        assert_eq!(
            position,
            DataPosition {
                epoch: 2,
                cursor: 20
            }
        );
        let json = serde_json::to_string(&loader.position_after(7)).unwrap();
        let resumed: DataPosition = serde_json::from_str(&json).unwrap();
        let mut fresh = Loader::new(text.as_slice(), shape(5, 3, 4), 42).unwrap();
        assert_eq!(fresh.batch_at(resumed).unwrap().0, sequential[7]);
        for (k, batch) in sequential.iter().enumerate().rev() {
            assert_eq!(&fresh.batch_for_step(k as u64).unwrap(), batch);
        }
        let mut other_seed = Loader::new(text.as_slice(), shape(5, 3, 4), 43).unwrap();
        assert_ne!(other_seed.batch_for_step(0).unwrap(), sequential[0]);
    }

    #[test]
    fn a_step_larger_than_an_epoch_runs_through_several() {
        let text: Vec<u8> = (0..=8u8).collect(); // 2 windows at stride 4
        let mut loader = Loader::new(text.as_slice(), shape(4, 5, 1), 3).unwrap();
        let (batch, next) = loader.batch_at(DataPosition::default()).unwrap();
        assert_eq!(batch.inputs[0].len(), 20);
        assert_eq!(
            next,
            DataPosition {
                epoch: 2,
                cursor: 1
            }
        );
        assert_eq!(next, loader.position_after(1));
    }

    #[test]
    fn replica_d_takes_microbatches_d_m_to_d_plus_one_m() {
        let text: Vec<u8> = (0..=100u8).collect();
        let mut loader = Loader::new(text.as_slice(), shape(4, 1, 6), 0).unwrap();
        let batch = loader.batch_for_step(0).unwrap();
        let replica = batch.replica(1, 3).unwrap();
        assert_eq!(replica.inputs, &batch.inputs[3..6]);
        assert_eq!(replica.targets, &batch.targets[3..6]);
        assert!(batch.replica(2, 3).is_err());
        assert!(batch.replica(0, 0).is_err());
    }

    #[test]
    fn bad_positions_and_shapes_are_refused() {
        let text: Vec<u8> = (0..=20u8).collect();
        let mut loader = Loader::new(text.as_slice(), shape(4, 1, 1), 0).unwrap();
        let bad = DataPosition {
            epoch: 0,
            cursor: 5,
        };
        assert!(loader.batch_at(bad).is_err());
        assert!(BatchShape::new(4, 0, 1).is_err());
        assert!(Loader::new(&b"abcd"[..], shape(4, 1, 1), 0).is_err());
    }
}
