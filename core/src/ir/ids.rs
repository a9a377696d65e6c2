//! Typed ids for ranks, stages and microbatches.
//!
//! Each id is a `u32` newtype so that a rank can never be passed where a stage is expected. Ids are
//! plain values; whether one is in range is a property of a [`crate::Problem`], checked there.
//! [`push_decimal`] writes an id (or any `u32`) as `Display` does, as bytes and without the
//! formatting machinery, for the writers of large files.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! typed_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(u32);

        impl $name {
            /// Wraps a raw index.
            pub const fn new(value: u32) -> Self {
                Self(value)
            }

            /// The raw value.
            pub const fn get(self) -> u32 {
                self.0
            }

            /// The value as an index into a slice.
            pub const fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }

        impl From<u32> for $name {
            fn from(value: u32) -> Self {
                Self(value)
            }
        }
    };
}

/// Appends `value` in decimal (ASCII) to `out`: the bytes `write!(out, "{value}")` appends,
/// several times faster (the CSV writers and the notation emit hundreds of thousands of numbers).
#[inline]
pub fn push_decimal(out: &mut Vec<u8>, value: u32) {
    // Fixed-size appends for the short numbers that make up a plan's files.
    let digit = |x: u32| b'0' + (x % 10) as u8;
    let four = |x: u32| [digit(x / 1000), digit(x / 100), digit(x / 10), digit(x)];
    match value {
        0..=9 => out.push(digit(value)),
        10..=99 => out.extend_from_slice(&[digit(value / 10), digit(value)]),
        100..=999 => out.extend_from_slice(&[digit(value / 100), digit(value / 10), digit(value)]),
        1000..=9999 => out.extend_from_slice(&four(value)),
        _ => {
            let mut digits = [0u8; 10];
            let mut at = digits.len();
            let mut rest = value;
            while rest > 0 {
                at -= 1;
                digits[at] = digit(rest);
                rest /= 10;
            }
            out.extend_from_slice(&digits[at..]);
        }
    }
}

typed_id!(
    /// A pipeline rank (one device or process).
    RankId
);
typed_id!(
    /// A global (virtual) stage: one contiguous piece of the model, placed on one rank.
    StageId
);
typed_id!(
    /// A microbatch of the global batch.
    MicrobatchId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_display() {
        let stage = StageId::new(7);
        assert_eq!(stage.get(), 7);
        assert_eq!(stage.index(), 7);
        assert_eq!(stage.to_string(), "7");
        assert_eq!(RankId::from(3), RankId::new(3));
        assert_eq!(serde_json::to_string(&MicrobatchId::new(5)).unwrap(), "5");
    }

    #[test]
    fn decimals_are_written_as_display_writes_them() {
        for value in [
            0,
            1,
            9,
            10,
            99,
            100,
            999,
            1000,
            4095,
            9999,
            10_000,
            10_001,
            65_536,
            1 << 20,
            100_000_000,
            u32::MAX - 1,
            u32::MAX,
        ] {
            let mut out = b"x".to_vec();
            push_decimal(&mut out, value);
            assert_eq!(out, format!("x{value}").into_bytes());
        }
    }
}
