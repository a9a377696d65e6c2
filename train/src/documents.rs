//! Documents and the variable-length pieces cut from them (`train_gpt --variable-length`).
//!
//! A document is a file of a folder corpus (the default corpus: one source file each) or, in a
//! single text, a block separated from the next by a blank line. [`pieces`] cuts every
//! document into sequences of at most `seq_len + 1` bytes (inputs and next-byte targets) that
//! never cross a document boundary: consecutive windows of `seq_len + 1` bytes at stride
//! `seq_len`, the last one shorter where the document ends. A loader then groups them into
//! microbatches whose length is that of their longest sequence, so padding is only what a
//! microbatch needs.

use std::ops::Range;

/// The blocks of `text` separated by blank lines (a line holding only whitespace counts as
/// blank), as byte ranges of `text`, the separators left out; empty blocks are dropped.
pub fn blank_line_blocks(text: &[u8]) -> Vec<Range<usize>> {
    let mut blocks = Vec::new();
    let mut start: Option<usize> = None;
    let mut end = 0;
    let mut line_start = 0;
    for i in 0..=text.len() {
        if i < text.len() && text[i] != b'\n' {
            continue;
        }
        let line = &text[line_start..i];
        if line.iter().all(u8::is_ascii_whitespace) {
            if let Some(s) = start.take() {
                blocks.push(s..end);
            }
        } else {
            start.get_or_insert(line_start);
            end = i;
        }
        line_start = i + 1;
    }
    if let Some(s) = start {
        blocks.push(s..end);
    }
    blocks
}

/// A sequence cut from a document: `len` bytes from `start` (inputs `len - 1`, targets the
/// next byte of each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// First byte in the corpus.
    pub start: usize,
    /// Bytes, 2 to `seq_len + 1`.
    pub len: usize,
}

impl Piece {
    /// Tokens (inputs, and targets) of the piece.
    pub fn tokens(&self) -> usize {
        self.len - 1
    }
}

/// Every document of `documents` that lies within `0..limit` (clipped to it) cut into pieces
/// of at most `seq_len + 1` bytes at stride `seq_len`; pieces shorter than 2 bytes (no target)
/// are dropped.
pub fn pieces(documents: &[Range<usize>], limit: usize, seq_len: usize) -> Vec<Piece> {
    let mut out = Vec::new();
    if seq_len == 0 {
        return out;
    }
    for doc in documents {
        let (start, end) = (doc.start.min(limit), doc.end.min(limit));
        let mut at = start;
        while at + 1 < end {
            let len = (seq_len + 1).min(end - at);
            out.push(Piece { start: at, len });
            if at + len >= end {
                break;
            }
            at += seq_len;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_separated_by_blank_lines() {
        let text = b"one\ntwo\n\n  \nthree\n\nfour";
        let blocks = blank_line_blocks(text);
        let shown: Vec<&[u8]> = blocks.iter().map(|r| &text[r.clone()]).collect();
        assert_eq!(shown, [&b"one\ntwo"[..], b"three", b"four"]);
        assert!(blank_line_blocks(b"\n\n").is_empty());
    }

    #[test]
    fn pieces_stay_inside_their_documents_and_overlap_by_one_byte() {
        // A document of 10 bytes at seq_len 4: 0..5, 4..9, 8..10; another of 1 byte: none.
        let docs = [0..10, 10..11, 11..14];
        let p = pieces(&docs, 100, 4);
        let spans: Vec<(usize, usize)> = p.iter().map(|p| (p.start, p.len)).collect();
        assert_eq!(spans, [(0, 5), (4, 5), (8, 2), (11, 3)]);
        assert_eq!(p[2].tokens(), 1);
        // Clipped at the limit (the held-out split).
        let clipped = pieces(&docs, 7, 4);
        let spans: Vec<(usize, usize)> = clipped.iter().map(|p| (p.start, p.len)).collect();
        assert_eq!(spans, [(0, 5), (4, 3)]);
    }
}
