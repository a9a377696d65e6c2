#![no_main]
//! See `run_csv_import` in `src/harness.rs` for what this target asserts.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| pipeweave_fuzz::run_csv_import(data));
