//! Golden tests: every Megatron-Core reference order reproduced op for op.

mod common;

use common::*;
use pipeweave::{build_plan, PipelineConfig};

#[test]
fn every_megatron_reference_is_reproduced_op_for_op() {
    let files = references("megatron_");
    assert!(
        files.len() >= 9,
        "expected the Megatron reference files, found {}",
        files.len()
    );
    for (name, file) in files {
        let ranks = field(&file, "ranks");
        let stages = field(&file, "stages");
        let microbatches = field(&file, "microbatches");
        let chunks = stages / ranks;
        let expression = if chunks == 1 {
            "f1b(gpipe)".to_string()
        } else {
            let group = file["microbatch_group_size_per_vp_stage"]
                .as_u64()
                .unwrap_or(ranks as u64);
            format!("vpp(f1b(gpipe), chunks={chunks}, group={group})")
        };
        let config = PipelineConfig::new(ranks, microbatches).unwrap();
        let plan = build_plan(&expression, &config).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_same_order(&format!("{name} ({expression})"), &plan, &file);
    }
}
