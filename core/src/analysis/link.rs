//! The order in which a rank's host link runs its transfers: the one home of that rule, read by
//! the replay engine ([`crate::analysis::replay`]) and by slack ([`crate::analysis::slack`]).
//!
//! A rank's link runs its transfers one at a time in the order they are issued, as a copy
//! stream runs what a rank's program enqueues on it. An offload is issued by the compute that
//! produced what it moves (its pair's I when that ran before the offload's place in the order,
//! the W's share; else its F): right after that compute, wherever the offload's own place is
//! (that place is where the device copy is freed, PipeOffload's "offload end"). A reload (and an
//! offload whose producer is not before it on the rank) is issued at its own place. So an
//! offload issued right after its forward goes on the link before a reload placed after that
//! forward, even when its device copy is freed later, after the reload's place.

use crate::ir::op::{OpKind, Task};
use crate::ir::slots::OpSlots;

const NONE: u32 = u32::MAX;

/// Per offload of `order` whose producer runs before it on the rank, `(producer, offload)`: the
/// position of the compute that issues it and its own position, sorted by producer (a compute
/// issues at most one offload: an F its pair's first round, an I the W's share).
pub fn offload_producers(order: &[Task], slots: OpSlots) -> Vec<(usize, usize)> {
    if !order.iter().any(|t| matches!(t, Task::Offload(_))) {
        return Vec::new();
    }
    // Per pair of this rank, the last positions of its F and its I so far.
    let mut last: Vec<(u32, u32)> = Vec::new();
    let mut found = Vec::new();
    for (position, task) in order.iter().enumerate() {
        if let Task::Offload(w) = task {
            let Some(pair) = slots.pair(w.stage, w.microbatch) else {
                continue;
            };
            let (forward, input) = last.get(pair).copied().unwrap_or((NONE, NONE));
            let producer = if input != NONE { input } else { forward };
            if producer != NONE {
                found.push((producer as usize, position));
            }
            continue;
        }
        let (ops, count) = task.op_array();
        for op in &ops[..count] {
            let Some(pair) = slots.pair(op.stage, op.microbatch) else {
                continue;
            };
            if last.len() <= pair {
                last.resize(slots.pairs(), (NONE, NONE));
            }
            match op.kind {
                OpKind::Forward => last[pair].0 = position as u32,
                OpKind::InputGrad => last[pair].1 = position as u32,
                OpKind::WeightGrad => {}
            }
        }
    }
    found.sort_unstable();
    found
}

/// The positions of `order`'s transfers in the order its link runs them (see the module doc).
pub fn link_order(order: &[Task], slots: OpSlots) -> Vec<usize> {
    if !order.iter().any(Task::on_link) {
        return Vec::new();
    }
    let producers = offload_producers(order, slots);
    let mut issued_by = vec![NONE; order.len()];
    for &(producer, offload) in &producers {
        issued_by[offload] = producer as u32;
    }
    // Issued right after the producer (2p + 1) or at the own place (2p).
    let mut keyed: Vec<(usize, usize)> = order
        .iter()
        .enumerate()
        .filter(|(_, t)| t.on_link())
        .map(|(p, _)| match issued_by[p] {
            NONE => (2 * p, p),
            producer => (2 * producer as usize + 1, p),
        })
        .collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, p)| p).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order_of(row: &str) -> (Vec<Task>, OpSlots) {
        let plan = crate::testing::plan(3, &[row]);
        (plan.orders()[0].clone(), plan.slots())
    }

    #[test]
    fn an_offload_is_issued_by_its_forward_and_goes_before_later_reloads() {
        // 0OFFLOAD1 frees at position 5 but is issued after 0F1 (position 2), before the
        // reload of pair 0 placed at 3.
        let (order, slots) =
            order_of("0F0 0OFFLOAD0 0F1 0RELOAD0 0B0 0OFFLOAD1 0F2 0RELOAD1 0B1 0B2");
        assert_eq!(offload_producers(&order, slots), vec![(0, 1), (2, 5)]);
        assert_eq!(link_order(&order, slots), vec![1, 5, 3, 7]);
    }

    #[test]
    fn what_a_w_keeps_is_issued_by_its_i() {
        let (order, slots) = order_of("0F0 0I0 0F1 0OFFLOAD0 0RELOAD0 0W0 0B1");
        assert_eq!(offload_producers(&order, slots), vec![(1, 3)]);
        assert_eq!(link_order(&order, slots), vec![3, 4]);
    }
}
