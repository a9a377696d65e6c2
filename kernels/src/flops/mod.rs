//! Floating-point operation estimates per layer and per stage, for the three passes a pipeline
//! schedule runs (F, I, W): matrix products only, `2·m·n·k` each; the elementwise work (layer
//! norm, softmax, GELU, scatter-add) is ignored. The attention core is counted over the full
//! `T x T` score matrix (the CPU kernels do not skip the masked half).

//!
//! `passes.rs` holds the estimates per layer kind (what the layers' files use), `stage.rs` a
//! stage's sum (over the layers of a [`crate::StageLayout`]); this file only re-exports them.

pub(crate) mod passes;
mod stage;

pub use passes::{block_flops, head_flops, PassFlops};
pub use stage::stage_flops;
