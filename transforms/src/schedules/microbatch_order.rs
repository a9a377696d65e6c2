//! Which data goes into which microbatch slot when microbatches cost different amounts
//! (variable-length microbatches): [`microbatch_order`].
//!
//! A pipeline's fill waits on the first microbatch's forwards and its drain on the last one's
//! backwards, so the cheapest microbatches belong there. The candidates are the data's own order,
//! the cheapest first and the next cheapest last (the rest in data order), and the microbatches
//! by increasing cost with the second cheapest moved last; each is priced by the caller (the
//! simulated makespan of the plan built with those costs) and the cheapest wins, the data's own
//! order on ties. The loss does not depend on the slots (Megatron's normaliser counts the
//! tokens of the whole batch), so any order trains the same model.

/// The candidates [`microbatch_order`] prices: permutations `order` with slot `s` holding data
/// microbatch `order[s]`, the data's own order first.
pub fn candidate_orders(costs: &[f64]) -> Vec<Vec<usize>> {
    let n = costs.len();
    let identity: Vec<usize> = (0..n).collect();
    let mut by_cost = identity.clone();
    by_cost.sort_by(|&a, &b| costs[a].total_cmp(&costs[b]).then(a.cmp(&b)));
    let mut candidates = vec![identity.clone()];
    if n >= 2 {
        let (first, last) = (by_cost[0], by_cost[1]);
        let mut ends = vec![first];
        ends.extend(
            identity
                .iter()
                .copied()
                .filter(|&m| m != first && m != last),
        );
        ends.push(last);
        let mut rising = by_cost.clone();
        let second = rising.remove(1);
        rising.push(second);
        for candidate in [ends, rising] {
            if !candidates.contains(&candidate) {
                candidates.push(candidate);
            }
        }
    }
    candidates
}

/// The slot order of the microbatches (slot `s` takes data microbatch `order[s]`) whose price
/// is least; `price` gets the costs in slot order. The data's own order wins ties.
pub fn microbatch_order(costs: &[f64], price: &mut dyn FnMut(&[f64]) -> f64) -> Vec<usize> {
    let mut best: Option<(f64, Vec<usize>)> = None;
    for order in candidate_orders(costs) {
        let in_slots: Vec<f64> = order.iter().map(|&m| costs[m]).collect();
        let value = price(&in_slots);
        if best.as_ref().is_none_or(|(b, _)| value < *b) {
            best = Some((value, order));
        }
    }
    best.map_or_else(Vec::new, |(_, order)| order)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cheapest_go_to_the_ends_when_that_prices_lower() {
        let costs = [1.0, 0.2, 0.9, 0.5, 0.8];
        let candidates = candidate_orders(&costs);
        assert_eq!(candidates[0], [0, 1, 2, 3, 4]);
        assert_eq!(candidates[1], [1, 0, 2, 4, 3]);
        assert_eq!(candidates[2], [1, 4, 2, 0, 3]);
        // Priced by what the fill and the drain wait on: the first and the last slot.
        let mut ends = |c: &[f64]| c[0] + c[c.len() - 1];
        assert_eq!(microbatch_order(&costs, &mut ends), [1, 0, 2, 4, 3]);
        // Equal costs: the data's own order.
        let mut flat = |_: &[f64]| 1.0;
        assert_eq!(microbatch_order(&[0.5, 0.5, 0.5], &mut flat), [0, 1, 2]);
        assert_eq!(microbatch_order(&[], &mut flat), Vec::<usize>::new());
    }
}
