//! What the searches remember between calls, as a value its owner holds and passes in (no
//! process-wide state): `auto`'s search per (plan, memory rung) and sail-sg's V-Half / V-Min orders
//! per size.
//!
//! A [`SearchCache`] is a cheap handle (clones share one store). The built-in registry makes one
//! and gives it to the `zero_bubble` passes it builds, so the searches of one registry's
//! expressions share it (the frontier builds every point through one registry and pays for each
//! rung once); a caller that wants cold searches makes a new registry or calls
//! [`SearchCache::clear`]. The store is bounded: past [`SearchCache::CAPACITY`] entries of a kind
//! it forgets them all.

use crate::schedules::controllable::{controllable_orders, Controllable};
use crate::schedules::score::Scored;
use pipeweave_core::Task;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

/// The key of a rung's search: (plan fingerprint, limit bits).
pub type RungKey = (u64, u64);

/// A size of V-Half / V-Min: (V-Half, ranks, microbatches).
type SizeKey = (bool, u32, u32);

/// One rung's search: filled once; a thread that finds it being filled waits for it.
type RungSlot = Arc<Mutex<Option<Option<Scored>>>>;

/// What is remembered.
#[derive(Default)]
struct Store {
    rungs: HashMap<RungKey, RungSlot>,
    controllable: HashMap<SizeKey, Option<Vec<Vec<Task>>>>,
}

/// A handle on remembered search results (see the module doc).
#[derive(Clone, Default)]
pub struct SearchCache {
    store: Arc<Mutex<Store>>,
}

impl fmt::Debug for SearchCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let store = self.lock();
        f.debug_struct("SearchCache")
            .field("rungs", &store.rungs.len())
            .field("controllable", &store.controllable.len())
            .finish()
    }
}

impl SearchCache {
    /// Most entries of one kind before the store forgets them.
    pub const CAPACITY: usize = 512;

    /// An empty cache.
    pub fn new() -> SearchCache {
        SearchCache::default()
    }

    /// The store; a panic of another holder cannot leave it inconsistent (every update is one
    /// insert), so a poisoned lock is taken over.
    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The remembered result of the search `key`, or `search`'s, remembered. Searches of
    /// different keys run at once (the rungs of a ladder, the candidates `tune` builds on several
    /// threads); a second caller of a key being searched waits for that search rather than
    /// repeating it.
    pub fn rung(&self, key: RungKey, search: impl FnOnce() -> Option<Scored>) -> Option<Scored> {
        let slot = {
            let mut store = self.lock();
            if store.rungs.len() >= Self::CAPACITY {
                store.rungs.clear();
            }
            store.rungs.entry(key).or_default().clone()
        };
        // A panicking search leaves the slot empty; the next caller searches again.
        let mut filled = slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = filled.as_ref() {
            return found.clone();
        }
        let found = search();
        *filled = Some(found.clone());
        found
    }

    /// sail-sg's V-Half or V-Min order at this size ([`controllable_orders`]), remembered.
    pub fn controllable(
        &self,
        kind: Controllable,
        ranks: u32,
        microbatches: u32,
    ) -> Option<Vec<Vec<Task>>> {
        let key = (kind == Controllable::Half, ranks, microbatches);
        if let Some(found) = self.lock().controllable.get(&key) {
            return found.clone();
        }
        let found = controllable_orders(kind, ranks, microbatches);
        let mut store = self.lock();
        if store.controllable.len() >= Self::CAPACITY {
            store.controllable.clear();
        }
        store.controllable.insert(key, found.clone());
        found
    }

    /// Forgets everything remembered.
    pub fn clear(&self) {
        let mut store = self.lock();
        store.rungs.clear();
        store.controllable.clear();
    }

    /// How many rung searches are remembered.
    pub fn rungs_remembered(&self) -> usize {
        let slots: Vec<RungSlot> = self.lock().rungs.values().cloned().collect();
        slots
            .iter()
            .filter(|slot| slot.lock().is_ok_and(|s| s.is_some()))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_search_runs_once_per_key_and_clones_share_the_store() {
        let cache = SearchCache::new();
        let shared = cache.clone();
        let mut runs = 0;
        for _ in 0..3 {
            shared.rung((1, 2), || {
                runs += 1;
                None
            });
        }
        assert_eq!(runs, 1);
        assert_eq!(cache.rungs_remembered(), 1);
        cache.clear();
        assert_eq!(shared.rungs_remembered(), 0);
        assert_eq!(
            cache.controllable(Controllable::Half, 4, 8),
            controllable_orders(Controllable::Half, 4, 8)
        );
    }
}
