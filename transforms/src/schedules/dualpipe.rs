//! DeepSeek's DualPipe and DualPipeV per-rank orders (`step()` of `dualpipe.py` / `dualpipev.py`),
//! as phases over two directions.
//!
//! For rank `r` with `n` half-pipeline ranks (`P/2` for DualPipe, `P` for DualPipeV), `m`
//! microbatches per direction (`M/2`, resp. `M`) and `h = min(r, P-1-r)` (resp. `r`); direction 0
//! is the one in which the rank sits in the first half of the pipeline:
//! 1. `2(n-h-1)` forwards of direction 0;
//! 2. `h+1` x (forward dir 0, forward dir 1);
//! 3. `n-h-1` x (backward dir 1, forward dir 1); with zero bubble the backward is I then its W;
//! 4. `m-2n+h+1` x (F dir 0 overlapped with B dir 1, F dir 1 overlapped with B dir 0); on the middle
//!    ranks the first pair is run as a plain forward then a plain backward;
//! 5. `n-h-1` x (backward dir 1, F dir 1 overlapped with B dir 0);
//! 6. `h+1` x (backward dir 1, backward dir 0); with zero bubble, from the middle iteration on the
//!    backwards are input-gradient only (DeepSeek's parity rule on `h` picks which one switches first);
//! 7. `n-h-1` x (one queued W, input-gradient backward dir 0);
//! 8. the queued Ws.
//!
//! The weight gradients of input-gradient-only backwards wait in a FIFO; each W runs the oldest.
//! Without zero bubble every backward is a full B and phases 7 and 8 hold only backwards.
//!
//! The phases need `M >= 2P` (DualPipe: `P` and `M` even too). Below that, [`DualShape::orders`]
//! gives the ZB-V order on the V placement and counter-flow 1F1B
//! ([`crate::schedules::counterflow`]) on DualPipe's layout.

use crate::schedules::counterflow;
use crate::schedules::zbv::{v_one_f_one_b, zbv_orders, Cooldown};
use pipeweave_core::{simulate, ChunkPlacement, DualKind, Layout, Plan, Task, Work};
use std::collections::VecDeque;

/// The shape of a bidirectional pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DualShape {
    /// Number of ranks `P`.
    pub ranks: u32,
    /// Number of microbatches `M`.
    pub microbatches: u32,
    /// DualPipeV (V placement, one route) rather than DualPipe (mirrored replicas, two routes).
    pub v: bool,
}

/// One direction as a rank sees it: its stage and the microbatches flowing through it.
#[derive(Clone, Copy, Debug)]
struct Direction {
    stage: u32,
    first_microbatch: u32,
}

impl DualShape {
    /// The bidirectional shape of a dual plan, read from its facts (None for any other plan).
    pub fn of_plan(plan: &Plan) -> Option<DualShape> {
        let Layout::Dual(kind) = plan.facts().layout else {
            return None;
        };
        Some(DualShape {
            ranks: plan.problem().ranks(),
            microbatches: plan.problem().microbatches(),
            v: kind == DualKind::DualPipeV,
        })
    }

    /// Stage index of the replica (DualPipe) or second chunk (DualPipeV) held by `rank`: both sit
    /// where the V placement puts a rank's second chunk.
    pub fn second_stage(&self, rank: u32) -> u32 {
        ChunkPlacement::V.stage(self.ranks, rank, 1).get()
    }

    /// Whether `rank` is where the two directions meet (DualPipe: the two middle ranks;
    /// DualPipeV: the last rank, where the V turns).
    fn is_middle(&self, rank: u32) -> bool {
        if self.v {
            rank == self.ranks - 1
        } else {
            rank + 1 == self.ranks / 2 || rank == self.ranks / 2
        }
    }

    fn parameters(&self, rank: u32) -> (u32, u32, u32, [Direction; 2]) {
        let own = Direction {
            stage: rank,
            first_microbatch: 0,
        };
        if self.v {
            let second = Direction {
                stage: self.second_stage(rank),
                first_microbatch: 0,
            };
            return (self.ranks, self.microbatches, rank, [own, second]);
        }
        let half = self.microbatches / 2;
        let replica = Direction {
            stage: self.second_stage(rank),
            first_microbatch: half,
        };
        let h = rank.min(self.ranks - 1 - rank);
        let directions = if rank < self.ranks / 2 {
            [own, replica]
        } else {
            [replica, own]
        };
        (self.ranks / 2, half, h, directions)
    }

    /// Whether DeepSeek's phases apply: `M >= 2P`; DualPipe also needs `P` and `M` even.
    pub fn deepseek_applies(&self) -> bool {
        self.microbatches >= 2 * self.ranks
            && (self.v || (self.ranks % 2 == 0 && self.microbatches % 2 == 0))
    }

    /// Every rank's order on `plan` (a plan on this shape's layout): DeepSeek's phases where they
    /// apply (with `zero_bubble`, its split backwards and queued Ws). Below them, on the V
    /// placement, the ZB-V order (whole backwards without `zero_bubble`); on DualPipe's layout the
    /// best counter-flow order ([`counterflow`]) no slower than `plan`'s own orders, or those
    /// orders when none is (they are the `dual` pass's counter-flow order, itself a candidate).
    pub fn orders(&self, plan: &Plan, zero_bubble: bool) -> Vec<Vec<Task>> {
        if self.deepseek_applies() {
            return (0..self.ranks)
                .map(|r| self.order(r, zero_bubble))
                .collect();
        }
        if self.v {
            return if zero_bubble {
                zbv_orders(self.ranks, self.microbatches, Cooldown::Eager)
            } else {
                v_one_f_one_b(self.ranks, self.microbatches)
            };
        }
        let current = plan.orders();
        let bound = simulate(plan).ok().map(|s| s.makespan());
        counterflow::best(plan, zero_bubble, bound, Some(self.memory_budget(plan)))
            .unwrap_or_else(|| current.to_vec())
    }

    /// The activations per rank a counter-flow order may hold on `plan`: its declared limit, else
    /// DeepSeek's DualPipe peak, `P + 1` (in units of a rank's share), so that `dual` never holds
    /// more below DeepSeek's sizes than at them unless the user allows it.
    pub fn memory_budget(&self, plan: &Plan) -> f64 {
        plan.memory_limit()
            .unwrap_or_else(|| f64::from(self.ranks + 1))
    }

    /// The order of `rank`; with `zero_bubble`, DeepSeek's split backwards and queued Ws.
    fn order(&self, rank: u32, zero_bubble: bool) -> Vec<Task> {
        let (n, m, h, directions) = self.parameters(rank);
        let mut builder = Builder {
            directions,
            next_forward: [0, 0],
            next_backward: [0, 0],
            weights: VecDeque::new(),
            out: Vec::with_capacity(4 * m as usize),
            zero_bubble,
        };
        let b = &mut builder;
        let rest = n - h - 1;
        for _ in 0..2 * rest {
            b.forward(0);
        }
        for _ in 0..=h {
            b.forward(0);
            b.forward(1);
        }
        for _ in 0..rest {
            b.backward(1, true);
            b.weight();
            b.forward(1);
        }
        for i in 0..(m + h + 1).saturating_sub(2 * n) {
            if i == 0 && self.is_middle(rank) {
                b.forward(0);
                b.backward(1, false);
            } else {
                b.overlapped(0, 1);
            }
            b.overlapped(1, 0);
        }
        for _ in 0..rest {
            b.backward(1, false);
            b.overlapped(1, 0);
        }
        let step6 = h + 1;
        let mut split = false;
        for i in 0..step6 {
            if i == step6 / 2 && h % 2 == 1 {
                split = true;
            }
            b.backward(1, split);
            if i == step6 / 2 && h % 2 == 0 {
                split = true;
            }
            b.backward(0, split);
        }
        for _ in 0..rest {
            b.weight();
            b.backward(0, true);
        }
        for _ in 0..=h {
            b.weight();
        }
        builder.out
    }
}

struct Builder {
    directions: [Direction; 2],
    next_forward: [u32; 2],
    next_backward: [u32; 2],
    weights: VecDeque<Work>,
    out: Vec<Task>,
    zero_bubble: bool,
}

impl Builder {
    fn take_forward(&mut self, d: usize) -> Work {
        let dir = self.directions[d];
        let work = Work::new(dir.stage, dir.first_microbatch + self.next_forward[d]);
        self.next_forward[d] += 1;
        work
    }

    fn take_backward(&mut self, d: usize) -> Work {
        let dir = self.directions[d];
        let work = Work::new(dir.stage, dir.first_microbatch + self.next_backward[d]);
        self.next_backward[d] += 1;
        work
    }

    fn forward(&mut self, d: usize) {
        let work = self.take_forward(d);
        self.out.push(Task::Forward(work));
    }

    /// A backward of direction `d`; input-gradient only (its W queued) when `split` and zero
    /// bubble is on.
    fn backward(&mut self, d: usize, split: bool) {
        let work = self.take_backward(d);
        if split && self.zero_bubble {
            self.out.push(Task::InputGrad(work));
            self.weights.push_back(work);
        } else {
            self.out.push(Task::Backward(work));
        }
    }

    fn weight(&mut self) {
        if let Some(work) = self.weights.pop_front() {
            self.out.push(Task::WeightGrad(work));
        }
    }

    fn overlapped(&mut self, forward_direction: usize, backward_direction: usize) {
        let forward = self.take_forward(forward_direction);
        let backward = self.take_backward(backward_direction);
        self.out.push(Task::Overlapped { forward, backward });
    }
}
