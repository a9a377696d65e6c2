//! JSON report.
