//! The handcrafted ZB-V order (Qi et al., "Pipeline Parallelism with Controllable Memory"; sail-sg
//! `zbv.py`) for the V placement: rank `r` holds chunk 0 = stage `r` and chunk 1 = stage
//! `2P - 1 - r`.
//!
//! Per rank, as a sequence of intents (an intent whose microbatches are used up is skipped, which
//! is how fewer than `2P - 1` microbatches are handled):
//! 1. warm-up: `2(P - r) - 1` x F0, then `r` x (F1, F0), then `P - r` x (F1, I1, W1);
//! 2. steady: (F0, I0, W0, F1, I1, W1) while forwards remain;
//! 3. cool-down, in one of two styles: `Eager` keeps each W right after its I; `Deferred` runs
//!    `r` x (I0, I1) with their Ws queued, then `P - r` x (I0, W0), then the remaining I and W.
//!
//! Ws of a chunk run in the order of their Is. At unit costs the order has no bubble and 1F1B's
//! peak memory (`2P` chunk activations, i.e. `P` in units of a rank's share).

use pipeweave_core::{ChunkPlacement, Task, Work};
use std::collections::VecDeque;

/// How the cool-down places Ws.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cooldown {
    /// Each W right after its I.
    Eager,
    /// Is first, their Ws queued into the tail.
    Deferred,
}

struct RankBuilder {
    stages: [u32; 2],
    microbatches: u32,
    forwarded: [u32; 2],
    input_done: [u32; 2],
    weights: [VecDeque<u32>; 2],
    out: Vec<Task>,
}

impl RankBuilder {
    fn forward(&mut self, c: usize) -> bool {
        if self.forwarded[c] >= self.microbatches {
            return false;
        }
        self.out
            .push(Task::Forward(Work::new(self.stages[c], self.forwarded[c])));
        self.forwarded[c] += 1;
        true
    }

    fn input(&mut self, c: usize) -> bool {
        if self.input_done[c] >= self.forwarded[c] {
            return false;
        }
        let mb = self.input_done[c];
        self.out
            .push(Task::InputGrad(Work::new(self.stages[c], mb)));
        self.weights[c].push_back(mb);
        self.input_done[c] += 1;
        true
    }

    fn weight(&mut self, c: usize) -> bool {
        match self.weights[c].pop_front() {
            Some(mb) => {
                self.out
                    .push(Task::WeightGrad(Work::new(self.stages[c], mb)));
                true
            }
            None => false,
        }
    }

    /// F, I and W of chunk `c` (each skipped when its microbatches are used up).
    fn forward_and_backward(&mut self, c: usize) {
        self.forward(c);
        self.input(c);
        self.weight(c);
    }

    fn unfinished(&self) -> bool {
        self.input_done.iter().any(|&i| i < self.microbatches)
            || self.weights.iter().any(|w| !w.is_empty())
    }
}

/// Every rank's ZB-V order for `ranks` ranks and `microbatches` microbatches.
pub fn zbv_orders(ranks: u32, microbatches: u32, cooldown: Cooldown) -> Vec<Vec<Task>> {
    (0..ranks)
        .map(|r| {
            let mut b = RankBuilder {
                stages: [0, 1].map(|chunk| ChunkPlacement::V.stage(ranks, r, chunk).get()),
                microbatches,
                forwarded: [0, 0],
                input_done: [0, 0],
                weights: [VecDeque::new(), VecDeque::new()],
                out: Vec::with_capacity(6 * microbatches as usize),
            };
            for _ in 0..2 * (ranks - r) - 1 {
                b.forward(0);
            }
            for _ in 0..r {
                b.forward(1);
                b.forward(0);
            }
            for _ in 0..ranks - r {
                b.forward_and_backward(1);
            }
            while b.forwarded.iter().any(|&f| f < microbatches) {
                b.forward_and_backward(0);
                b.forward_and_backward(1);
            }
            if cooldown == Cooldown::Deferred {
                for _ in 0..r {
                    b.input(0);
                    b.input(1);
                }
                for _ in 0..ranks - r {
                    b.input(0);
                    b.weight(0);
                }
            }
            while b.unfinished() {
                let progressed = [b.input(0), b.weight(0), b.input(1), b.weight(1)];
                if !progressed.contains(&true) {
                    break;
                }
            }
            b.out
        })
        .collect()
}

/// 1F1B on the V placement: the handcrafted ZB-V order with every backward kept whole (each W
/// right after its I, fused into B), which keeps 1F1B's memory (`P` of a rank's share) and, unlike
/// a Megatron table on the V, keeps both chunks busy. `vpp(.., layout=v)` and `dual` below
/// DeepSeek's sizes use it.
pub fn v_one_f_one_b(ranks: u32, microbatches: u32) -> Vec<Vec<Task>> {
    zbv_orders(ranks, microbatches, Cooldown::Eager)
        .into_iter()
        .map(|order| {
            let mut fused = Vec::with_capacity(order.len());
            for task in order {
                match (fused.last(), task) {
                    (Some(&Task::InputGrad(i)), Task::WeightGrad(w)) if i == w => {
                        fused.pop();
                        fused.push(Task::Backward(w));
                    }
                    _ => fused.push(task),
                }
            }
            fused
        })
        .collect()
}
