//! Files a plan or its programs can be written to or read from: PyTorch's schedule CSV (compute
//! and lowered, both directions), Chrome/Perfetto traces, SVG timelines, and the text grid. JSON of
//! plans and programs comes from serde on the report and [`crate::ProgramSet`].

pub mod csv;
pub mod grid;
pub mod svg;
pub mod trace;
