//! The plan IR: typed ids, ops and tasks, the problem, the cost and memory models (and how a
//! model's blocks are cut into stages), a model's layers as plain data and what a cut of them
//! costs ([`layers`]), how a sequence is cut into chunks ([`sequence`]), typed facts, the
//! dependency rule, the op numbering and the plan itself.
//! Nothing here analyses a plan; the analyses ([`crate::analysis`]) and the SPMD projection
//! ([`crate::spmd`]) build on it.

/// `PartialEq`, `Eq` and `Hash` of `$ty` through its `key()`: its figures compared and hashed as
/// data (floats by their bits), so that equal values hash alike.
macro_rules! eq_and_hash_by_key {
    ($ty:ty) => {
        impl PartialEq for $ty {
            fn eq(&self, other: &$ty) -> bool {
                self.key() == other.key()
            }
        }

        impl Eq for $ty {}

        impl ::std::hash::Hash for $ty {
            fn hash<H: ::std::hash::Hasher>(&self, state: &mut H) {
                ::std::hash::Hash::hash(&self.key(), state);
            }
        }
    };
}

pub mod all_to_all;
pub mod blocks;
pub mod cost;
pub mod deps;
pub mod facts;
pub mod ids;
pub mod layers;
pub mod memory;
pub mod op;
pub mod plan;
pub mod problem;
pub mod sequence;
pub mod slots;
