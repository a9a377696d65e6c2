//! Files a plan or its programs can be written to or read from: PyTorch's schedule CSV (compute
//! and lowered, both directions), Chrome/Perfetto traces, SVG timelines, the text grid, and the
//! measured layer profiles that cost a cut of a model ([`profile`]); and how a user writes a
//! number ([`number`]), read one way in options, expressions and files. JSON of plans and programs
//! comes from serde on the report and [`crate::ProgramSet`].

pub mod csv;
pub mod grid;
pub mod number;
pub mod profile;
pub mod svg;
pub mod svg_markup;
pub mod trace;
