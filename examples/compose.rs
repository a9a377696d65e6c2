//! Compose passes and watch the plan after each one: `cargo run --example compose`.
//!
//! Builds `vpp(f1b(gpipe), chunks=2)` at 4 ranks and 8 microbatches, printing the verified plan's
//! grid and figures after every pass.

use pipeweave::{build_plan_observed, render_grid, simulate, PipelineConfig};

fn main() -> Result<(), pipeweave::Error> {
    let config = PipelineConfig::new(4, 8)?;
    build_plan_observed("vpp(f1b(gpipe), chunks=2)", &config, &mut |pass, plan| {
        let sim = simulate(plan).expect("the driver hands out verified plans only");
        println!(
            "after `{pass}`: makespan {:.2}, bubble rate {:.4}, peak activations {:?}",
            sim.makespan(),
            sim.bubble_rate(),
            sim.ranks()
                .iter()
                .map(|r| r.peak_activations)
                .collect::<Vec<_>>()
        );
        println!("{}", render_grid(plan, &sim));
    })?;
    Ok(())
}
