//! Property tests of a profile's figures on the layouts passes build: where `vpp` gives a rank
//! several positions, each position is costed by the layers the trainer places there (the
//! rank's share spread over its positions, earlier positions taking the extra block, the blocks
//! in position order), checked against that placement worked out here; a share that would leave
//! a middle position empty is refused with the reason.

use pipeweave::core_ir::{
    LayerPlacement, PhaseTimes, ProfiledModel, SendProfile, PROFILE_FORMAT, TOLERANCE,
};
use pipeweave::{build_plan, simulate, LayerProfile, PipelineConfig, Profile};
use proptest::prelude::*;

/// A profile of `costs.len() - 2` blocks: layer `k` takes `costs[k]` seconds forward (I the
/// same, W half) and leaves `bytes[k]` bytes (W holds a fifth more).
fn synthetic(costs: &[f64], bytes: &[u64]) -> Profile {
    let last = costs.len() - 1;
    let layers = costs
        .iter()
        .zip(bytes)
        .enumerate()
        .map(|(k, (&f, &b))| {
            let (name, placement) = match k {
                0 => ("embedding".to_string(), LayerPlacement::First),
                k if k == last => ("head".to_string(), LayerPlacement::Last),
                k => (format!("block.{}", k - 1), LayerPlacement::Any),
            };
            LayerProfile {
                name,
                placement,
                forward: f,
                input_grad: f,
                weight_grad: f / 2.0,
                backward: None,
                activation_bytes: b,
                weight_grad_bytes: b + b / 5,
                half_length: Some(PhaseTimes {
                    forward: f / 2.0,
                    input_grad: f / 2.0,
                    weight_grad: f / 4.0,
                }),
            }
        })
        .collect();
    Profile {
        format: PROFILE_FORMAT.to_string(),
        model: ProfiledModel {
            name: Some("synthetic".to_string()),
            seq_len: Some(32),
            microbatch_size: Some(2),
            dtype: Some("f32".to_string()),
            extra: serde_json::Map::new(),
        },
        threads_per_rank: 1,
        repeats: 3,
        calibrated: false,
        layers,
        send: SendProfile {
            bytes: 1024,
            seconds: 0.001,
        },
        runtime: None,
        action_seconds: None,
    }
}

/// A model of 2..10 blocks with random layer figures, 2..4 ranks and one share per rank (the
/// first and the last may be empty).
fn case() -> impl Strategy<Value = (Vec<f64>, Vec<u64>, Vec<usize>)> {
    (2usize..=10, 2usize..=4).prop_flat_map(|(blocks, ranks)| {
        (
            prop::collection::vec(0.1f64..3.0, blocks + 2),
            prop::collection::vec(1u64..5000, blocks + 2),
            prop::collection::vec(0usize..=blocks, ranks - 1),
        )
            .prop_map(move |(costs, bytes, marks)| {
                // Cut points, sorted: share k is the blocks between mark k-1 and mark k.
                let mut marks = marks;
                marks.sort_unstable();
                let mut shares = Vec::with_capacity(ranks);
                let mut previous = 0;
                for m in marks.into_iter().chain([blocks]) {
                    shares.push(m - previous);
                    previous = m;
                }
                (costs, bytes, shares)
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_position_is_costed_by_the_layers_the_trainer_places_there(
        (costs, bytes, shares) in case(),
        layout in prop::sample::select(vec![
            "vpp(f1b(gpipe), chunks=2)",
            "vpp(f1b(gpipe), chunks=3)",
            "vpp(f1b(gpipe), chunks=2, layout=v)",
            "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))",
        ]),
    ) {
        let profile = synthetic(&costs, &bytes);
        let ranks = shares.len() as u32;
        let costed = PipelineConfig::new(ranks, 2 * ranks)
            .unwrap()
            .with_profile(&profile, Some(&shares));
        let (config, cut) = match costed {
            Ok(c) => c,
            // The rank-share cut itself is refused (a middle rank without a block).
            Err(e) => {
                prop_assert!(e.to_string().contains("empty"), "{e}");
                return Ok(());
            }
        };
        let plan = match build_plan(layout, &config) {
            Ok(plan) => plan,
            Err(e) => {
                // Only a share spread so thin that a middle position gets no block.
                let text = e.to_string();
                prop_assert!(text.contains("spread over the") && text.contains("empty"), "{text}");
                return Ok(());
            }
        };
        let problem = plan.problem();
        // The placement, worked out independently: positions along the first route, each
        // rank's share spread over its positions in order, the blocks laid out position by
        // position, the embedding on the first and the head on the last.
        let route = problem.routes()[0].stages().to_vec();
        let owner = |k: usize| problem.rank_of(route[k]).unwrap().index();
        let mut counts = vec![0usize; route.len()];
        for (rank, &share) in shares.iter().enumerate() {
            let held: Vec<usize> = (0..route.len()).filter(|&k| owner(k) == rank).collect();
            for (n, &k) in held.iter().enumerate() {
                counts[k] = share / held.len() + usize::from(n < share % held.len());
            }
        }
        let mut expected = Vec::with_capacity(route.len());
        let mut next = 1;
        for (k, &count) in counts.iter().enumerate() {
            let mut f: f64 = costs[next..next + count].iter().sum();
            next += count;
            if k == 0 {
                f += costs[0];
            }
            if k + 1 == route.len() {
                f += costs[costs.len() - 1];
            }
            expected.push(f);
        }
        let mut per_rank = vec![0.0f64; ranks as usize];
        for (k, &stage) in route.iter().enumerate() {
            let c = plan.costs().stage(stage).unwrap();
            prop_assert!(
                (c.forward() - expected[k]).abs() < TOLERANCE,
                "position {k} (counts {counts:?}): F {} vs {}", c.forward(), expected[k]
            );
            prop_assert!((c.input_grad() - expected[k]).abs() < TOLERANCE);
            prop_assert!((c.weight_grad() - expected[k] / 2.0).abs() < TOLERANCE);
            per_rank[owner(k)] += c.forward() + c.input_grad() + c.weight_grad();
            // Charged the larger of what F and I leave (I's here), in the cut's units.
            let m = plan.memory().stages()[stage.index()];
            prop_assert!((m.total() - m.weight_grad()).abs() < 1e-12);
            prop_assert!(m.total() * cut.bytes_per_unit > 0.0);
        }
        let sim = simulate(&plan).unwrap();
        let busiest = per_rank
            .iter()
            .map(|work| f64::from(2 * ranks) * work)
            .fold(0.0, f64::max);
        prop_assert!(sim.makespan() >= busiest - TOLERANCE);
    }
}
