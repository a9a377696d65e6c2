//! The layer table's tests: its checks, the per-token model, and comparing and hashing as data.

use super::*;
use crate::ir::cost::{CostModel, StageCosts, StageCostsSpec};
use crate::ir::memory::{MemoryModel, StageMemory};
use crate::ir::problem::ProblemSpec;
use std::collections::hash_map::DefaultHasher;

fn spec(name: &str, placement: LayerPlacement, f: f64) -> LayerCostsSpec {
    LayerCostsSpec::builder()
        .name(name)
        .placement(placement)
        .forward(f)
        .input_grad(f)
        .weight_grad(f / 2.0)
        .activation_bytes(100)
        .weight_grad_bytes(50)
        .build()
}

/// `input` placed first, three free layers, `output` placed last.
fn table() -> LayerTable {
    let mut layers = vec![spec("input", LayerPlacement::First, 0.5)];
    layers.extend((0..3).map(|k| spec(&format!("layer.{k}"), LayerPlacement::Any, 1.0)));
    layers.push(spec("output", LayerPlacement::Last, 2.0));
    LayerTable::new(layers, 0.25).unwrap()
}

fn hash_of(value: &impl Hash) -> u64 {
    let mut hasher = DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

#[test]
fn a_table_checks_its_layers_and_its_send() {
    let t = table();
    assert_eq!((t.free_layers(), t.layers().len(), t.comm()), (3, 5, 0.25));
    assert_eq!(
        t.pinned(),
        PinnedEnds::new(Some("`input`"), Some("`output`"))
    );
    assert_eq!(t.even_cut(2), [1, 2]);
    assert_eq!(t.stage_layers(&[1, 2]).unwrap(), [0..2, 2..5]);
    let err = LayerTable::new(Vec::new(), 0.0).unwrap_err().to_string();
    assert!(err.contains("no layers listed"), "{err}");
    let err = LayerTable::new(vec![spec("x", LayerPlacement::Any, f64::NAN)], 0.0)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("layer `x`: forward = NaN must be finite"),
        "{err}"
    );
    let err = LayerTable::new(vec![spec("x", LayerPlacement::Any, 1.0)], -1.0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("send seconds = -1 must be finite"), "{err}");
    let err = LayerTable::new(
        vec![
            spec("a", LayerPlacement::Any, 1.0),
            spec("b", LayerPlacement::First, 1.0),
        ],
        0.0,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("layer 1 (`b`) is placed `first` after layer 0"),
        "{err}"
    );
    let err = t.cut(&[]).unwrap_err().to_string();
    assert!(err.contains("needs one count per stage"), "{err}");
}

#[test]
fn the_per_token_model_is_linear_without_half_length_times() {
    let t = table();
    assert!((t.length_scale(0.5) - 0.5).abs() < 1e-12);
    let quadratic = LayerTable::new(
        vec![LayerCostsSpec::builder()
            .name("attention")
            .forward(4.0)
            .input_grad(4.0)
            .weight_grad(0.0)
            .activation_bytes(1)
            .weight_grad_bytes(1)
            .half_length(PhaseTimes {
                forward: 1.0,
                input_grad: 1.0,
                weight_grad: 0.0,
            })
            .build()],
        0.0,
    )
    .unwrap();
    assert!((quadratic.length_scale(0.5) - 0.25).abs() < 1e-12);
    assert_eq!(linear_share(2.0, 1.0), 1.0);
    assert_eq!(linear_share(2.0, 0.75), 0.5);
    assert_eq!(linear_share(0.0, 0.0), 1.0);
}

#[test]
fn a_layout_needs_a_positive_memory_unit() {
    for unit in [0.0, -1.0, f64::INFINITY, f64::NAN] {
        let err = LayerLayout::new(table(), None, unit)
            .unwrap_err()
            .to_string();
        assert!(err.contains("must be finite and > 0"), "{err}");
    }
    let layout = LayerLayout::new(table(), Some(vec![1, 2]), 100.0).unwrap();
    assert_eq!(
        (layout.shares(), layout.bytes_per_unit()),
        (Some(&[1, 2][..]), 100.0)
    );
    assert_eq!(layout.table(), &table());
    // A problem of one route through stages on ranks [0, 1]: one count per rank.
    let problem = ProblemSpec::builder()
        .ranks(2)
        .microbatches(2)
        .build()
        .validate()
        .unwrap();
    let (costs, memory) = layout.stages_of(&problem).unwrap().unwrap();
    assert_eq!((costs.len(), memory.len()), (2, 2));
    assert_eq!(costs[0].forward(), 1.5);
}

#[test]
fn costs_and_memory_compare_and_hash_as_data() {
    let layout = || LayerLayout::new(table(), Some(vec![1, 2]), 100.0).unwrap();
    let model = |layers: Option<LayerLayout>| {
        let m = CostModel::uniform(2, StageCosts::default(), 0.5).unwrap();
        match layers {
            Some(l) => m.with_layer_layout(l),
            None => m,
        }
    };
    // Two layouts built apart are equal, and hash alike: no pointer is compared.
    let (a, b) = (model(Some(layout())), model(Some(layout())));
    assert_eq!(a, b);
    assert_eq!(hash_of(&a), hash_of(&b));
    assert_ne!(a, model(None));
    let other = LayerLayout::new(table(), None, 100.0).unwrap();
    assert_ne!(a, model(Some(other)));
    assert_ne!(hash_of(&a), hash_of(&model(None)));
    // A zero given as -0 is the same figure.
    let negative_zero = StageCostsSpec::builder()
        .forward(-0.0)
        .build()
        .validate()
        .unwrap();
    let zero = StageCostsSpec::builder()
        .forward(0.0)
        .build()
        .validate()
        .unwrap();
    assert_eq!(negative_zero, zero);
    assert_eq!(hash_of(&negative_zero), hash_of(&zero));
    let memory = MemoryModel::uniform(2, StageMemory::default());
    assert_eq!(hash_of(&memory), hash_of(&memory.clone()));
    assert_ne!(memory, MemoryModel::uniform(3, StageMemory::default()));
    // Scales are part of the data.
    let scaled = model(None).with_microbatch_scales(vec![1.0, 0.5]).unwrap();
    assert_ne!(scaled, model(None));
    assert_eq!(
        hash_of(&scaled),
        hash_of(&model(None).with_microbatch_scales(vec![1.0, 0.5]).unwrap())
    );
}
