//! Order generators and rewriters that passes share: DualPipe's phases, Zero Bubble's lagged
//! weight gradients, and the cost-model-driven list scheduler behind `zero_bubble(policy=auto)`.

pub mod dualpipe;
pub mod greedy;
pub mod lagged;
pub mod refine;
pub mod zbv;
