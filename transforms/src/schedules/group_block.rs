//! PipeOffload's group building block (Wan et al., "PipeOffload", ICML 2025; sail-sg
//! `group_interleaved_1f1b.py`, `GroupBuildingBlockScheduler`): interleaved 1F1B on the standard
//! layout whose microbatches run in groups of `g`, which may be fewer than the ranks.
//!
//! The block is laid out on slots of a third of a chunk's forward, input gradient and weight
//! gradient (F, B, W each one slot). Rank `d`'s forward of chunk `c`, microbatch `i` of the group
//! (`0 <= i < g`) sits at slot `3kgc + 3i + d + 3g⌊c / (C / gcd(C, k))⌋`, where `C` is the chunk
//! count and `k = ⌈m / g⌉` for the *minimum group* `m` (the microbatches a chunk must keep in
//! flight so that its forward comes back to rank 0 after the other ranks: `⌈(P + 1) / 2⌉`, raised
//! until `m` slots of a rank's heaviest F+B+W cover the pipeline's F and B). Its backwards run
//! chunks in reverse, starting `3(P - 1 - d) + 1` slots after its last chunk's first forward, at
//! the same spacing, each weight gradient right after its input gradient. The block repeats every
//! `3gC` slots with the next group's microbatches; a rank's order is its ops sorted by slot.
//! Fewer microbatches than a whole group in the last repetition are dropped from it.
//!
//! Here a backward is whole (its W right after its B, as in the block), so the order is a
//! one-forward-one-backward interleaving that `vpp` hands on; the slots give only the order, the
//! simulator gives the times. A block exists when no two ops of a rank share a slot modulo
//! `3gC` and the warm-up offset `2P - 3kg` stays below `P` (sail-sg's own assertions): [`orders`]
//! returns `None` otherwise.

use pipeweave_core::{Task, Work};

/// A rank's share of the model's costs (every chunk of it summed): what the minimum group is
/// derived from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShareCosts {
    /// The forward.
    pub forward: f64,
    /// The input gradient.
    pub input: f64,
    /// The weight gradient.
    pub weight: f64,
}

/// The least group that keeps every chunk's forwards flowing (sail-sg's `create_schedule`):
/// `⌈(P + 1) / 2⌉`, raised while `m` times the heaviest rank's F + B + W is below the pipeline's
/// summed F or summed B, at most `P`.
pub fn minimum_group(shares: &[ShareCosts]) -> u32 {
    let ranks = u32::try_from(shares.len()).unwrap_or(u32::MAX).max(1);
    let heaviest = shares
        .iter()
        .map(|s| s.forward + s.input + s.weight)
        .fold(0.0, f64::max);
    let forwards: f64 = shares.iter().map(|s| s.forward).sum();
    let inputs: f64 = shares.iter().map(|s| s.input).sum();
    let mut least = ranks.div_ceil(2).max(1);
    while least < ranks && heaviest * f64::from(least) < forwards.max(inputs) {
        least += 1;
    }
    least
}

/// Every rank's order of PipeOffload's building block for `ranks` x `microbatches`, `chunks`
/// chunks (stage `c·P + d` for chunk `c` of rank `d`), groups of `group` and the minimum group
/// `minimum`; `None` where the block does not exist for these sizes (see the module doc) or a
/// size is 0.
pub fn orders(
    ranks: u32,
    microbatches: u32,
    chunks: u32,
    group: u32,
    minimum: u32,
) -> Option<Vec<Vec<Task>>> {
    if ranks == 0 || microbatches == 0 || chunks == 0 || group == 0 || minimum == 0 {
        return None;
    }
    let (p, c_n, g) = (u64::from(ranks), u64::from(chunks), u64::from(group));
    let k = u64::from(minimum.div_ceil(group));
    let period = 3 * g * c_n;
    if (2 * p).saturating_sub(3 * k * g) >= p {
        return None;
    }
    let stride = c_n / gcd(c_n, k);
    // The slot of the c-th op of each kind, i-th of the group, before the rank's own offset.
    let spaced = |c: u64, i: u64| 3 * k * g * c + 3 * i + 3 * g * (c / stride);
    let mut out = Vec::with_capacity(ranks as usize);
    for d in 0..p {
        let last_forward = spaced(c_n - 1, 0) + d;
        let first_backward = last_forward + 3 * (p - 1 - d) + 1;
        // (slot, is backward, chunk, index in group) of the block's ops.
        let mut block: Vec<(u64, bool, u64, u64)> = Vec::with_capacity(2 * (c_n * g) as usize);
        for c in 0..c_n {
            for i in 0..g {
                block.push((spaced(c, i) + d, false, c, i));
                block.push((first_backward + spaced(c, i), true, c_n - 1 - c, i));
            }
        }
        let mut taken = vec![false; period as usize];
        for &(slot, backward, ..) in &block {
            // A backward's weight gradient takes the slot after it.
            let cells = if backward { 2 } else { 1 };
            for s in slot..slot + cells {
                let cell = &mut taken[(s % period) as usize];
                if *cell {
                    return None;
                }
                *cell = true;
            }
        }
        let mut ops: Vec<(u64, Task)> =
            Vec::with_capacity(2 * (c_n * u64::from(microbatches)) as usize);
        for repeat in 0..u64::from(microbatches).div_ceil(g) {
            for &(slot, backward, chunk, i) in &block {
                let microbatch = repeat * g + i;
                if microbatch >= u64::from(microbatches) {
                    continue;
                }
                let stage = u32::try_from(chunk * p + d).ok()?;
                let work = Work::new(stage, u32::try_from(microbatch).ok()?);
                let task = if backward {
                    Task::Backward(work)
                } else {
                    Task::Forward(work)
                };
                ops.push((slot + repeat * period, task));
            }
        }
        ops.sort_by_key(|&(slot, _)| slot);
        out.push(ops.into_iter().map(|(_, task)| task).collect());
    }
    Some(out)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(ranks: usize) -> Vec<ShareCosts> {
        vec![
            ShareCosts {
                forward: 1.0,
                input: 1.0,
                weight: 1.0
            };
            ranks
        ]
    }

    #[test]
    fn the_minimum_group_is_half_the_ranks_at_unit_costs() {
        assert_eq!(minimum_group(&unit(4)), 2);
        assert_eq!(minimum_group(&unit(8)), 4);
        assert_eq!(minimum_group(&unit(5)), 3);
        // A pipeline whose forwards outweigh a rank's F+B+W raises it.
        let heavy_forward = vec![
            ShareCosts {
                forward: 3.0,
                input: 0.1,
                weight: 0.1
            };
            4
        ];
        assert_eq!(minimum_group(&heavy_forward), 4);
    }

    #[test]
    fn every_op_appears_once_forwards_before_their_backwards() {
        for (p, m, c, g) in [
            (4, 8, 3, 1),
            (4, 8, 3, 2),
            (8, 32, 3, 2),
            (4, 16, 2, 4),
            (4, 7, 3, 2),
        ] {
            let minimum = minimum_group(&unit(p as usize));
            let Some(orders) = orders(p, m, c, g, minimum) else {
                continue;
            };
            assert_eq!(orders.len(), p as usize);
            for (d, order) in orders.iter().enumerate() {
                assert_eq!(
                    order.len(),
                    (2 * m * c) as usize,
                    "P={p} M={m} C={c} g={g} rank {d}"
                );
                for (i, task) in order.iter().enumerate() {
                    if let Task::Backward(w) = task {
                        let forward = order.iter().position(|t| *t == Task::Forward(*w));
                        assert!(forward.is_some_and(|f| f < i));
                    }
                }
            }
        }
    }

    #[test]
    fn sizes_without_a_block_give_none() {
        assert!(orders(0, 8, 3, 1, 2).is_none());
        assert!(orders(4, 8, 3, 0, 2).is_none());
    }
}
