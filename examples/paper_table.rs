//! Prints the Zero Bubble paper's bubble-rate table next to ours:
//! `cargo run --release --example paper_table [-- PATH]` (default ../shared/reference/zb_paper_table.json).

fn main() -> Result<(), pipeweave::Error> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "../shared/reference/zb_paper_table.json".to_string());
    let table = pipeweave::paper_table::read_table(&path)?;
    print!("{}", pipeweave::paper_table::render(&table)?);
    Ok(())
}
