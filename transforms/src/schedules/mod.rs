//! Order generators and rewriters that passes share: DualPipe's phases, Zero Bubble's lagged
//! weight gradients, the handcrafted ZB-V order, V-Half and V-Min, the cost-model-driven list scheduler behind
//! `zero_bubble(policy=auto)`, the critical-path local search, the score they compete on, and the
//! memory relief `recompute` and `offload` share; and, for microbatches of different costs,
//! which data goes into which microbatch slot ([`microbatch_order`]).

pub mod controllable;
pub mod counterflow;
pub mod dualpipe;
pub mod greedy;
pub mod ladder;
pub mod lagged;
pub mod microbatch_order;
pub mod refine;
pub mod relief;
pub mod score;
pub mod zbv;
pub mod zbv_auto;

/// Forgets what the searches remember for the process (`auto`'s searches per plan and limit,
/// V-Half and V-Min per size): a benchmark that measures cold searches calls it between runs.
pub fn forget_remembered() {
    ladder::forget();
    controllable::forget();
}
