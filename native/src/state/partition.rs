//! One partition's batch, as `state.events.apply_batch` and `state.events.expiry_sweep` run it: the expiries
//! swept since the last batch, then the partition's mutations applied in write-time order, each with the
//! images of the rows it can change before and after it and an event per row that changed.
//!
//! A thread keeps one `Work` for all its partitions: the stored state and the one the batch changes, the image
//! sets and the lists a change needs, cleared and refilled partition after partition, so that a partition
//! allocates nothing once they have grown to its size.

use super::engine::{apply_record, Changed, Kind, PartitionState, Rec, RowState, StoredShape};
use super::events::Emitter;
use super::images::{ImageSet, RowKey};
use super::key::{self, Ck};
use super::out::Events;
use super::phases::{Clock, Phase};
use super::types::D;

/// A thread's room for one partition at a time.
#[derive(Default)]
pub struct Work<'a> {
    /// the partition's state: its stored one (`has_prior`: whether it had one, decoded here by the caller), then
    /// as the batch changes it
    pub state: PartitionState<'a>,
    pub has_prior: bool,
    /// what the stored state held that the batch may remove (`change_rows`' gone records)
    pub stored: StoredShape<'a>,
    /// whether any record changed the state (`apply_record`'s answers are exact): no copy of the stored state is
    /// kept to compare with, which took 3.5 % of the engine's instructions a change
    dirty: bool,
    pub before: ImageSet<'a>,
    pub after: ImageSet<'a>,
    /// whether `after` holds the images of every row of `state` as it is now (`final_images`)
    after_is_final: bool,
    /// the clustering keys a change can affect, sorted
    scope: Vec<Ck<'a>>,
    /// the rows an event may be for (`Emitter::diff`)
    keys: Vec<RowKey<'a>>,
    /// the records (indexes) in the order the changes apply, and each change's (write time, end in `order`)
    order: Vec<usize>,
    changes: Vec<(i64, usize)>,
    /// a sweep's expiry times and its rows' (`sweep`)
    times: Vec<i64>,
    row_times: Vec<(Ck<'a>, Vec<i64>)>,
}

impl<'a> Work<'a> {
    /// A partition's batch begins: its stored state is in `state` (decoded there by the caller,
    /// `Stored::partition`, which clears it first, so a partition with none starts empty; `has_prior`).
    pub fn start(&mut self) {
        if self.has_prior {
            self.state.shape_into(&mut self.stored);
        } else {
            debug_assert!(self.state.is_empty(), "a partition with no stored state starts empty");
        }
        self.dirty = false;
        self.after_is_final = false;
    }

    /// Whether the partition's state must be written back: it changed (or, new, holds anything), or a sweep
    /// ran over it.
    pub fn changed(&self, swept: bool) -> bool {
        swept || if self.has_prior { self.dirty } else { !self.state.is_empty() }
    }

    /// `partition_images(table, state, now, None)` into `after`: the images of every visible row of the state
    /// as it is now, for its state rows (the last change's, when they cover every row).
    pub fn final_images(&mut self, em: &Emitter, now: i64) -> D<()> {
        if !self.after_is_final {
            self.after.partition(em.t, &self.state, now, None)?;
            self.after_is_final = true;
        }
        Ok(())
    }

    /// `_partition_changes`: the partition's records as changes (one per mutation), in the order they apply: by
    /// write time (the highest timestamp of a mutation's records), then mutation id; each change's records in
    /// the order they came.
    fn plan(&mut self, recs: &[Rec<'a>]) {
        self.order.clear();
        self.changes.clear();
        if recs.is_empty() {
            return;
        }
        let first = recs[0].mid;
        if recs.iter().all(|r| key::opt_eq(r.mid, first)) {
            self.order.extend(0..recs.len());
            self.changes.push((recs.iter().map(|r| r.ts).max().unwrap(), recs.len()));
            return;
        }
        // mutations by first appearance: (write time, id, first record)
        let mut groups: Vec<(i64, &[u8], usize)> = Vec::new();
        let mut group_of: Vec<usize> = Vec::with_capacity(recs.len());
        for (i, r) in recs.iter().enumerate() {
            match (0..groups.len()).find(|&g| key::opt_eq(recs[groups[g].2].mid, r.mid)) {
                Some(g) => {
                    groups[g].0 = groups[g].0.max(r.ts);
                    group_of.push(g);
                }
                None => {
                    groups.push((r.ts, r.mid.unwrap_or(b""), i));
                    group_of.push(groups.len() - 1);
                }
            }
        }
        let mut ranked: Vec<usize> = (0..groups.len()).collect();
        ranked.sort_by(|&a, &b| groups[a].0.cmp(&groups[b].0).then_with(|| groups[a].1.cmp(groups[b].1)));
        for g in ranked {
            self.order.extend((0..recs.len()).filter(|&i| group_of[i] == g));
            self.changes.push((groups[g].0, self.order.len()));
        }
    }

    /// `apply_batch` for one partition's (deduplicated) records, its events written into `out`.
    pub fn apply(&mut self, em: &Emitter, pk: &[u8], recs: &[Rec<'a>], now: i64, out: &mut Events) -> D<()> {
        let t = em.t;
        self.plan(recs);
        let mut start = 0;
        for c in 0..self.changes.len() {
            let (ts, end) = self.changes[c];
            let group = start..end;
            start = end;
            let rec = |i: usize| &recs[self.order[i]];
            let whole = group.clone().any(|i| {
                let r = rec(i);
                matches!(r.kind, Kind::PartitionDeletion | Kind::RangeTombstone) || r.is_static
            });
            self.scope.clear();
            if !whole {
                for i in group.clone() {
                    self.scope.push(Ck(rec(i).clustering));
                }
                self.scope.sort_unstable();
                self.scope.dedup();
            }
            // the rows in scope (all of them for a whole-partition group), before and after the group: the
            // before images are computed first, so no row has to be copied aside and put back to see them
            let only = if whole { None } else { Some(&self.scope[..]) };
            let mut clock = Clock::start();
            self.before.partition(t, &self.state, now, only)?;
            clock.lap(Phase::MergeImages);
            let mut changed = false;
            for i in group.clone() {
                match apply_record(t, &mut self.state, rec(i))? {
                    Changed::Nothing => {}
                    // no image changed: no event, as the Python engine's `apply_record` reports nothing
                    Changed::Silently => self.dirty = true,
                    _ => changed = true,
                }
            }
            self.dirty |= changed;
            clock.lap(Phase::MergeApply);
            if !changed {
                continue;
            }
            self.after.partition(t, &self.state, now, only)?;
            // the images of a scope that holds every row are those of the whole partition
            self.after_is_final = whole || self.state.rows.keys().all(|k| self.scope.binary_search(&k).is_ok());
            clock.lap(Phase::MergeImages);
            // the copy with the smallest (segment id, position, segment) names the source (the first of equals)
            let src = group.map(rec).reduce(|a, b| if b.read_before(a) { b } else { a }).unwrap();
            em.diff(pk, &self.state, &self.before, &self.after, ts, Some((src.segment, src.position)), false, out,
                    &mut self.keys)?;
            clock.lap(Phase::MergeEvents);
        }
        Ok(())
    }

    /// `expiry_sweep` of the state over `(now_before, now]`: an event per row that stops showing or changes
    /// when its cells or row marker expire, at each expiry time in turn.
    pub fn sweep(&mut self, em: &Emitter, pk: &[u8], now_before: i64, now: i64, out: &mut Events) -> D<()> {
        if now <= now_before {
            return Ok(());
        }
        let part = &self.state;
        let mut static_times = Vec::new();
        expiries(&part.static_row, now_before, now, &mut static_times);
        self.times.clear();
        self.times.extend(&static_times);
        self.row_times.clear();
        for (ck, row) in part.rows.iter() {
            let mut acc = Vec::new();
            expiries(row, now_before, now, &mut acc);
            if !acc.is_empty() {
                for x in &acc {
                    if !self.times.contains(x) {
                        self.times.push(*x);
                    }
                }
                self.row_times.push((ck, acc));
            }
        }
        self.times.sort();
        let mut t_prev = now_before;
        for k in 0..self.times.len() {
            let tm = self.times[k];
            let whole = static_times.contains(&tm);
            if !whole {
                self.scope.clear();
                self.scope.extend(self.row_times.iter().filter(|(_, acc)| acc.contains(&tm)).map(|(ck, _)| *ck));
            }
            let only = if whole { None } else { Some(&self.scope[..]) };
            self.before.partition(em.t, &self.state, t_prev, only)?;
            self.after.partition(em.t, &self.state, tm, only)?;
            em.diff(pk, &self.state, &self.before, &self.after, tm * 1_000_000, None, true, out, &mut self.keys)?;
            t_prev = tm;
        }
        // `after` holds images at an expiry time, not at `now`
        self.after_is_final = false;
        Ok(())
    }
}

fn expiries(row: &RowState, lo: i64, hi: i64, acc: &mut Vec<i64>) {
    let mut add = |x: i64| {
        if !acc.contains(&x) {
            acc.push(x);
        }
    };
    if let Some(l) = row.liveness {
        if l.1 != 0 && lo < l.2 && l.2 <= hi {
            add(l.2);
        }
    }
    for (_, c) in &row.cells {
        if c.ttl != 0 && !c.tomb && lo < c.ldt && c.ldt <= hi {
            add(c.ldt);
        }
    }
    for (_, e) in &row.complex {
        for c in e.cells.values() {
            if c.ttl != 0 && !c.tomb && lo < c.ldt && c.ldt <= hi {
                add(c.ldt);
            }
        }
    }
}

/// The earliest time in `(after, 2^62]` at which something of `row` expires (`expiries`' times' least).
fn row_next_expiry(row: &RowState, after: i64) -> Option<i64> {
    let mut next: Option<i64> = None;
    let mut see = |x: i64| {
        if after < x && x <= 1 << 62 && next.is_none_or(|n| x < n) {
            next = Some(x);
        }
    };
    if let Some(l) = row.liveness {
        if l.1 != 0 {
            see(l.2);
        }
    }
    for (_, c) in &row.cells {
        if c.ttl != 0 && !c.tomb {
            see(c.ldt);
        }
    }
    for (_, e) in &row.complex {
        for c in e.cells.values() {
            if c.ttl != 0 && !c.tomb {
                see(c.ldt);
            }
        }
    }
    next
}

/// `partition_next_expiry(part, after)`.
pub fn next_expiry(part: &PartitionState, after: i64) -> Option<i64> {
    std::iter::once(&part.static_row).chain(part.rows.values()).filter_map(|r| row_next_expiry(r, after)).min()
}
