//! Byte counts as a user writes them (`2GiB`, `512 MiB`, `1.5GB`): what a memory limit in bytes
//! is read with, beside the profiles that count memory in bytes.

/// Parses a byte count: a plain number of bytes, or one with a unit `B`, `KiB`, `MiB`, `GiB`,
/// `TiB` (powers of 1024) or `KB`, `MB`, `GB`, `TB` (powers of 1000): `2GiB`, `512 MiB`, `1.5GB`.
/// `None` when `text` has no unit (a plain number is then the caller's to read).
pub fn parse_bytes(text: &str) -> Option<Result<f64, String>> {
    let text = text.trim();
    let split = text
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or(text.len());
    let (number, unit) = (text[..split].trim(), text[split..].trim());
    if unit.is_empty() {
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
    Some(match number.parse::<f64>() {
        Ok(n) if n.is_finite() && n > 0.0 => Ok(n * factor),
        _ => Err(format!("`{number}` in `{text}` is not a positive number")),
    })
}
