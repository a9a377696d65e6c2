//! Reading the user's files as text: one reader for schedules, profiles, stage costs and tables,
//! whose errors say where: a byte that is not UTF-8 is placed at its line and column.

use crate::error::Error;

/// The contents of `path` as UTF-8 text, or the error naming the file and, for bytes that are
/// not text, the line and column of the first of them.
pub fn read_text(path: &str) -> Result<String, Error> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_string(),
        source,
    })?;
    String::from_utf8(bytes).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        let bytes = e.as_bytes();
        let (line, column) = place(&bytes[..valid]);
        Error::NotText {
            path: path.to_string(),
            line,
            column,
            byte: bytes[valid],
        }
    })
}

/// The line and column (both from 1, columns in characters) just after `text`.
fn place(text: &[u8]) -> (usize, usize) {
    // `text` is the valid prefix, so it decodes.
    let text = std::str::from_utf8(text).unwrap_or_default();
    let line = text.matches('\n').count() + 1;
    let column = text.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_that_are_not_text_are_placed() {
        let dir = std::env::temp_dir().join(format!("pipeweave-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("binary.csv");
        std::fs::write(&path, b"0F0,1F0\n\xc3\xa9F1,\xff\x00\n").unwrap();
        let path = path.to_string_lossy().into_owned();
        let error = read_text(&path).unwrap_err().to_string();
        assert_eq!(
            error,
            format!("{path}: line 2, column 5: byte 0xff is not UTF-8 text")
        );
        std::fs::write(&path, "0F0\n").unwrap();
        assert_eq!(read_text(&path).unwrap(), "0F0\n");
        std::fs::remove_dir_all(&dir).unwrap();
        let missing = read_text("/nonexistent/pipeweave.csv")
            .unwrap_err()
            .to_string();
        assert!(
            missing.starts_with("/nonexistent/pipeweave.csv: "),
            "{missing}"
        );
    }
}
