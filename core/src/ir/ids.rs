//! Typed ids for ranks, stages and microbatches.
//!
//! Each id is a `u32` newtype so that a rank can never be passed where a stage is expected. Ids are
//! plain values; whether one is in range is a property of a [`crate::Problem`], checked there.

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
}
