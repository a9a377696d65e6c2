//! Byte counts as a user writes them (`2GiB`, `512 MiB`, `1.5GB`): what a memory limit in bytes
//! is read with, beside the profiles that count memory in bytes.

use crate::formats::number::{number_prefix, parse_number, NumberError};

/// Parses a byte count: a plain number of bytes, or one with a unit `B`, `KiB`, `MiB`, `GiB`,
/// `TiB` (powers of 1024) or `KB`, `MB`, `GB`, `TB` (powers of 1000): `2GiB`, `512 MiB`, `1.5GB`.
/// `None` when `text` has no unit (a plain number is then the caller's to read).
pub fn parse_bytes(text: &str) -> Option<Result<f64, String>> {
    let text = text.trim();
    // The number is read as everywhere else (`1.5e3MiB`): the unit is what follows it.
    let split = number_prefix(text);
    let (number, unit) = (text[..split].trim(), text[split..].trim());
    if !unit.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return None;
    }
    let factor = match unit {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "TiB" => 1024.0f64.powi(4),
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        _ => {
            return Some(Err(format!(
                "unknown unit `{unit}` in `{text}` (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
            )))
        }
    };
    Some(match parse_number(number) {
        Ok(n) if n > 0.0 && (n * factor).is_finite() => Ok(n * factor),
        Ok(_) | Err(NumberError::NotANumber) => {
            Err(format!("`{number}` in `{text}` is not a positive number"))
        }
        Err(e) => Err(e.describe(text)),
    })
}
