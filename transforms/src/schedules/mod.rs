//! Order generators and rewriters that passes share: DualPipe's phases, Zero Bubble's lagged
//! weight gradients, the handcrafted ZB-V order, PipeOffload's group building block ([`group_block`]), V-Half and V-Min, the cost-model-driven list scheduler behind
//! `zero_bubble(policy=auto)`, the critical-path local search, the score they compete on, and the
//! memory relief `recompute` and `offload` share; and, for microbatches of different costs,
//! which data goes into which microbatch slot ([`microbatch_order`]).
//!
//! The list schedulers share one [`kernel`] (a timeline of per-rank clocks, memory and latency,
//! one event heap, one event loop with a choice rule per policy); what the searches remember
//! between calls is a [`cache::SearchCache`] its owner passes in, and what the rungs of one
//! ladder share a [`memo::RungMemo`] (runs reused where every comparison against the limit,
//! recorded as a [`threshold::Threshold`], comes out the same).

pub mod auto;
pub mod cache;
pub mod chunk_gate;
pub mod controllable;
pub mod counterflow;
pub mod dualpipe;
pub mod exact;
pub mod greedy;
pub mod group_block;
pub mod kernel;
pub mod ladder;
pub mod lagged;
pub mod memo;
pub mod microbatch_order;
pub mod refine;
pub mod relief;
pub mod score;
pub mod threshold;
pub mod zbv;
pub mod zbv_auto;
