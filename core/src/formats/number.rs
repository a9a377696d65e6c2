//! Numbers as a user writes them, read one way wherever they are written: command-line options
//! (`--costs F=1e-3`, `--memory-limit 1e3`, `-p 4`), schedule expressions (`memory=1.5e2`) and
//! byte counts (`1.5e3MiB`). A number is an optional sign, digits with an optional decimal point,
//! and an optional exponent (`e` or `E`, an optional sign, digits); `inf`, `nan`, hex and
//! separators are not numbers, and a number too large for a finite `f64` is refused, not read as
//! infinity.

/// How a text fails to be a number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NumberError {
    /// Not in the grammar of the module doc.
    NotANumber,
    /// In the grammar, but beyond the largest finite `f64` (about 1.8e308).
    TooLarge,
    /// Not a whole number.
    NotWhole,
}

impl NumberError {
    /// The reason in words, about `text` (as written).
    pub fn describe(&self, text: &str) -> String {
        match self {
            NumberError::NotANumber => format!("`{text}` is not a number"),
            NumberError::TooLarge => format!("`{text}` is too large for a number"),
            NumberError::NotWhole => format!("`{text}` is not a whole number"),
        }
    }
}

/// The length of the number that starts `text` (0: none): the longest prefix in the grammar.
pub fn number_prefix(text: &str) -> usize {
    let bytes = text.as_bytes();
    let mut at = 0;
    if matches!(bytes.first(), Some(b'+' | b'-')) {
        at += 1;
    }
    let digits = |from: usize| {
        bytes[from..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count()
    };
    let whole = digits(at);
    at += whole;
    let mut fraction = 0;
    if bytes.get(at) == Some(&b'.') {
        fraction = digits(at + 1);
        if whole + fraction > 0 {
            at += 1 + fraction;
        }
    }
    if whole + fraction == 0 {
        return 0;
    }
    if matches!(bytes.get(at), Some(b'e' | b'E')) {
        let mut exponent = at + 1;
        if matches!(bytes.get(exponent), Some(b'+' | b'-')) {
            exponent += 1;
        }
        let count = digits(exponent);
        if count > 0 {
            at = exponent + count;
        }
    }
    at
}

/// Reads `text` (surrounding spaces ignored) as a finite number.
pub fn parse_number(text: &str) -> Result<f64, NumberError> {
    let text = text.trim();
    if text.is_empty() || number_prefix(text) != text.len() {
        return Err(NumberError::NotANumber);
    }
    let value: f64 = text.parse().map_err(|_| NumberError::NotANumber)?;
    if value.is_finite() {
        // `-0` as `0`.
        Ok(value + 0.0)
    } else {
        Err(NumberError::TooLarge)
    }
}

/// Reads `text` as a whole number (`4`, `4.0` and `4e0` alike), kept as an `i128` so that a
/// range check can name any value a user types (beyond `i128`, it saturates).
pub fn parse_whole(text: &str) -> Result<i128, NumberError> {
    let trimmed = text.trim();
    // Plain digits are read exactly, however many there are.
    let digits = trimmed.strip_prefix(['+', '-']).unwrap_or(trimmed);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        let negative = trimmed.starts_with('-');
        return Ok(trimmed
            .parse::<i128>()
            .unwrap_or(if negative { i128::MIN } else { i128::MAX }));
    }
    let value = parse_number(trimmed)?;
    if value.fract() != 0.0 {
        return Err(NumberError::NotWhole);
    }
    // Saturates beyond i128, which no range check accepts anyway.
    Ok(value as i128)
}

/// `value` as a message shows it: whole numbers without a fraction, large and small magnitudes
/// with an exponent (`1e308`, not 309 digits).
pub fn show_number(value: f64) -> String {
    let magnitude = value.abs();
    if value == value.trunc() && magnitude < 1e16 {
        format!("{value:.0}")
    } else if (1e-4..1e16).contains(&magnitude) {
        format!("{value}")
    } else {
        format!("{value:e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_and_exponents_read_alike() {
        for (text, value) in [
            ("1", 1.0),
            (" 1e3 ", 1000.0),
            ("1E3", 1000.0),
            ("1.5e-2", 0.015),
            ("-2", -2.0),
            ("+.5", 0.5),
            ("5.", 5.0),
            ("1e308", 1e308),
            ("-0", 0.0),
        ] {
            assert_eq!(parse_number(text), Ok(value), "{text}");
        }
    }

    #[test]
    fn what_is_not_a_number_is_refused() {
        for text in [
            "", "inf", "NaN", "infinity", "1e", "1e+", "0x10", "1_000", ".", "-", "1,5",
        ] {
            assert_eq!(parse_number(text), Err(NumberError::NotANumber), "{text}");
        }
        assert_eq!(parse_number("1e309"), Err(NumberError::TooLarge));
        assert_eq!(
            NumberError::TooLarge.describe("1e309"),
            "`1e309` is too large for a number"
        );
    }

    #[test]
    fn the_prefix_stops_where_a_unit_starts() {
        assert_eq!(number_prefix("1.5GiB"), 3);
        assert_eq!(number_prefix("1e3MiB"), 3);
        // An `e` without digits is the unit's, not an exponent.
        assert_eq!(number_prefix("2EB"), 1);
        assert_eq!(number_prefix("GiB"), 0);
    }

    #[test]
    fn whole_numbers_keep_their_sign_and_size() {
        assert_eq!(parse_whole("-4"), Ok(-4));
        assert_eq!(parse_whole("4.0"), Ok(4));
        assert_eq!(parse_whole("4e3"), Ok(4000));
        assert_eq!(
            parse_whole("99999999999999999999"),
            Ok(99_999_999_999_999_999_999)
        );
        assert_eq!(parse_whole("2.5"), Err(NumberError::NotWhole));
        assert_eq!(parse_whole("four"), Err(NumberError::NotANumber));
    }

    #[test]
    fn numbers_show_short() {
        assert_eq!(show_number(1e308), "1e308");
        assert_eq!(show_number(0.0), "0");
        assert_eq!(show_number(-4.0), "-4");
        assert_eq!(show_number(2.5), "2.5");
        assert_eq!(show_number(1e-7), "1e-7");
    }
}
