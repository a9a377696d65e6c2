//! Text cut into windows of `seq_len + 1` bytes at stride `seq_len` (see [`super`]): their
//! count, the evaluation windows and the padded evaluation microbatches of `--eval`.

use std::path::Path;

use super::{GlobalBatch, PAD_INPUT};
use crate::batch::PAD_ID;
use crate::error::{Result, TrainError};

/// `seq_len + 1`, the bytes of one window; fails for `seq_len == 0`.
pub(crate) fn window_len(seq_len: usize) -> Result<usize> {
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
mod tests {
    use super::*;

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
}
