//! The fingerprint of what a rank is about to run, compared across the ranks of an MPI job
//! before anything runs: the problem (sizes, placement, routes, tied stages) and the programs,
//! hashed with 64-bit FNV-1a written out here so that it does not depend on the build.

use pipeweave_core::{Problem, ProgramSet};

/// 64-bit FNV-1a, written out so that fingerprints do not depend on the build.
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn u32s(&mut self, values: impl IntoIterator<Item = u32>) {
        let values: Vec<u32> = values.into_iter().collect();
        self.bytes(&(values.len() as u64).to_le_bytes());
        for v in values {
            self.bytes(&v.to_le_bytes());
        }
    }
}

/// The fingerprint of what a rank is about to run: the problem (sizes, placement, routes, tied
/// stages) and the programs (their JSON).
pub fn fingerprint(problem: &Problem, programs: &ProgramSet) -> u64 {
    let mut h = Fnv::new();
    h.u32s([problem.ranks(), problem.microbatches()]);
    h.u32s(problem.stage_to_rank().iter().map(|r| r.get()));
    for route in problem.route_specs() {
        h.u32s([route.first, route.end]);
        h.u32s(route.stages);
    }
    for group in problem.tied_stages() {
        h.u32s(group.iter().map(|s| s.get()));
    }
    match serde_json::to_vec(programs) {
        Ok(json) => h.bytes(&json),
        // Plain data always serialises; the debug form is as deterministic, should it not.
        Err(_) => h.bytes(format!("{programs:?}").as_bytes()),
    }
    h.0
}

/// Compares every rank's fingerprint with rank 0's; `Err` names the ranks that differ.
pub(crate) fn compare_fingerprints(fingerprints: &[u64]) -> Result<(), String> {
    let Some(&first) = fingerprints.first() else {
        return Ok(());
    };
    let differ: Vec<String> = fingerprints
        .iter()
        .enumerate()
        .filter(|(_, f)| **f != first)
        .map(|(r, f)| format!("rank {r} ({f:016x})"))
        .collect();
    if differ.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the ranks were given different programs: ranks whose fingerprint differs from rank \
             0's ({first:016x}): {}",
            differ.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_name_the_ranks_that_differ() {
        assert!(compare_fingerprints(&[7, 7, 7]).is_ok());
        let err = compare_fingerprints(&[7, 7, 9, 8]).unwrap_err();
        assert!(
            err.contains("(0000000000000007): rank 2 (0000000000000009), rank 3"),
            "{err}"
        );
        assert!(!err.contains("rank 1 "), "{err}");
    }

    #[test]
    fn fnv_is_the_published_one() {
        let mut h = Fnv::new();
        h.bytes(b"a");
        assert_eq!(h.0, 0xaf63_dc4c_8601_ec8c);
    }
}
