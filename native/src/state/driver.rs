//! One table's batch, as `state.batch.process_table` and `sinks.delta.change_rows` do it, over Arrow input:
//! the table's cell-log records and the stored records of its partitions in, the MERGE source rows of the
//! changed partitions and the events out. A partition the engine is not sure of (`Doubt`) appends nothing and
//! is named in `doubted`: the Python engine processes it, and the caller puts its events at its place.

use std::borrow::Cow;
use std::collections::BTreeMap;

use super::arrow_in::{prefetch_line, Col};
use super::engine::{Cell, Complex, Kind, PartitionState, Rec};
use super::events::{EventCtx, Emitter};
use super::key::{self, Ck};
use super::out::{Events, Out, Validity};
use super::state_rows::StateRows;
use super::partition::Work;
use super::phases::{self, Clock, Phase};
use super::table::{ColId, Table};
use crate::fxhash::FxMap;
use super::types::D;


pub struct Output {
    /// every partition of the batch, in publish order: its key (binary) and token; None when they are the
    /// partitions of the `Grouping` given (`partition_keys` handed them over already)
    pub keys: Option<(Out, Vec<i64>)>,
    /// the threads' outputs, in publish order
    pub runs: Vec<Run>,
    /// whether the records were grouped as the `Grouping` given said, rather than sorted again
    pub grouped: bool,
}

/// The settings of one batch (`process_partition`'s arguments).
pub struct Settings<'a> {
    /// threads to spread the partitions over
    pub threads: usize,
    pub now: i64,
    pub prev_now: Option<i64>,
    pub batch_seq: i64,
    pub cluster: &'a str,
}

/// A record's place in the cell log: its chunk (record batch) and row.
#[derive(Clone, Copy)]
struct Rid {
    chunk: u32,
    row: u32,
}

impl Rid {
    /// As one number that orders records as the cell log does.
    fn packed(self) -> u64 {
        ((self.chunk as u64) << 32) | self.row as u64
    }

    fn unpack(x: u64) -> Rid {
        Rid { chunk: (x >> 32) as u32, row: x as u32 }
    }
}

/// One partition of the batch: its key, token and records (a range of the batch's records sorted by partition).
struct Part<'a> {
    pk: &'a [u8],
    token: i64,
    recs: std::ops::Range<usize>,
}

/// The cell log as the Python side hands it over: record batches read where they are, without joining them
/// into one (a copy of every column, as long as the engine's own work on a large batch).
struct CellLog<'a> {
    chunks: Vec<LogChunk<'a>>,
}

impl<'a> CellLog<'a> {
    fn new(chunks: &'a [Col]) -> Result<CellLog<'a>, String> {
        Ok(CellLog { chunks: chunks.iter().map(LogChunk::new).collect::<Result<_, _>>()? })
    }

    #[inline]
    fn at(&self, r: Rid) -> (&LogChunk<'a>, usize) {
        (&self.chunks[r.chunk as usize], r.row as usize)
    }

    /// `LogChunk::push_rec` of record `r`.
    #[inline]
    fn push_rec(&self, r: Rid, out: &mut Vec<Rec<'a>>) -> bool {
        let (c, i) = self.at(r);
        c.push_rec(i, out)
    }

    /// Each record batch's `partition_key` and `token` columns.
    fn key_columns(&self) -> (Vec<&'a Col>, Vec<&'a Col>) {
        self.chunks.iter().map(|c| (c.pk, c.token)).unzip()
    }

    fn intern(&mut self, t: &mut Table) {
        for c in &mut self.chunks {
            c.intern(t);
        }
    }

    /// Start loading a record's columns (the first of `LogChunk::prefetch`'s two steps).
    fn prefetch(&self, r: Rid) {
        let (c, i) = self.at(r);
        for col in c.columns() {
            col.prefetch(i);
        }
        if let Some(id) = c.col_ids.get(i) {
            prefetch_line(id as *const ColId as *const u8);
        }
    }

    /// Start loading a record's binary values (their offsets loaded by `prefetch` a while before).
    fn prefetch_data(&self, r: Rid) {
        let (c, i) = self.at(r);
        for col in c.columns() {
            col.prefetch_data(i);
        }
    }
}

/// One record batch of the cell log.
struct LogChunk<'a> {
    segment: &'a Col,
    segment_id: &'a Col,
    position: &'a Col,
    entry_index: &'a Col,
    seq: &'a Col,
    pk: &'a Col,
    token: &'a Col,
    clustering: &'a Col,
    clustering_end: &'a Col,
    start_incl: &'a Col,
    end_incl: &'a Col,
    is_static: &'a Col,
    kind: &'a Col,
    column: &'a Col,
    path: &'a Col,
    value: &'a Col,
    ts: &'a Col,
    ttl: &'a Col,
    ldt: &'a Col,
    mid: &'a Col,
    /// each record's column id (`intern`; `NO_COLUMN`: none)
    col_ids: Vec<ColId>,
}

/// A record without a column (a row or partition deletion, say).
const NO_COLUMN: ColId = ColId::MAX;

impl<'a> LogChunk<'a> {
    fn new(c: &'a Col) -> Result<LogChunk<'a>, String> {
        let f = |name: &str, format: &str| c.field(name, format);
        Ok(LogChunk {
            segment: f("segment", "u")?, segment_id: f("segment_id", "l")?, position: f("position", "l")?,
            entry_index: f("entry_index", "i")?, seq: f("seq", "i")?, pk: f("partition_key", "z")?,
            token: f("token", "l")?, clustering: f("clustering", "z")?, clustering_end: f("clustering_end", "z")?,
            start_incl: f("start_inclusive", "b")?, end_incl: f("end_inclusive", "b")?,
            is_static: f("is_static", "b")?, kind: f("kind", "u")?, column: f("column", "u")?, path: f("path", "z")?,
            value: f("value", "z")?, ts: f("timestamp", "l")?, ttl: f("ttl", "i")?,
            ldt: f("local_deletion_time", "l")?, mid: f("mutation_id", "z")?, col_ids: Vec::new(),
        })
    }

    /// The columns processing a record reads (what to prefetch): not the partition key and token (the
    /// partition's, read from the grouping), nor the column name (its id is read from `col_ids`).
    fn columns(&self) -> [&'a Col; 17] {
        [self.segment, self.segment_id, self.position, self.entry_index, self.seq, self.clustering,
         self.clustering_end, self.start_incl, self.end_incl, self.is_static, self.kind, self.path, self.value,
         self.ts, self.ttl, self.ldt, self.mid]
    }

    /// Make every column name the records hold known to `t` (before the engine's threads share it), and note
    /// each record's column id (`col_ids`): read in passing here, in order, rather than hashed again by name for
    /// each record in partition order.
    fn intern(&mut self, t: &mut Table) {
        self.col_ids = (0..self.column.len).map(|i| match self.column.opt_bytes(i) {
            Some(c) => t.col(c),
            None => NO_COLUMN,
        }).collect();
    }

    /// Push record `i` onto `out` as the engine applies it (its column name known to `t`: `intern`), written in
    /// place rather than handed back and moved (a `Rec` is 160 bytes); false, pushing nothing, for a kind the
    /// engine does not know (the Python engine says what is wrong with it).
    #[inline]
    fn push_rec(&self, i: usize, out: &mut Vec<Rec<'a>>) -> bool {
        let Some(kind) = Kind::parse(self.kind.bytes(i)) else {
            return false;
        };
        out.push(Rec {
            segment: self.segment.bytes(i),
            segment_id: self.segment_id.i64(i),
            position: self.position.i64(i),
            entry_index: self.entry_index.i32(i),
            seq: self.seq.i32(i),
            kind,
            clustering: self.clustering.bytes(i),
            bounds: (self.clustering_end.opt_bytes(i), self.start_incl.opt_bool(i), self.end_incl.opt_bool(i)),
            is_static: self.is_static.bool(i),
            column: match self.col_ids[i] {
                NO_COLUMN => None,
                c => Some(c),
            },
            path: self.path.opt_bytes(i),
            value: self.value.opt_bytes(i),
            ts: self.ts.i64(i),
            ttl: self.ttl.i32(i),
            ldt: self.ldt.i64(i),
            mid: self.mid.opt_bytes(i),
        });
        true
    }
}

fn key_hash(pk: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut h = crate::fxhash::FxHasher::default();
    h.write(pk);
    h.finish()
}

const EMPTY: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Slot {
    hash: u64,
    /// the partition's first record (EMPTY: a free slot)
    first: u32,
    /// its last record, while the records are indexed (where the next one is chained): in the slot's padding
    last: u32,
}

/// Partition key -> first stored record: an open-addressing table (linear probing, at most half full) rather
/// than a HashMap, because the slot of a key can be asked for ahead of the lookup (`Stored::prefetch_slot`),
/// and the record it names before the key is compared (`guess`). The keys are the stored records' own.
struct ByKey {
    slots: Vec<Slot>,
    mask: usize,
}

impl ByKey {
    fn with_capacity(n: usize) -> ByKey {
        let size = (2 * n).next_power_of_two().max(16);
        ByKey { slots: vec![Slot { hash: 0, first: EMPTY, last: EMPTY }; size], mask: size - 1 }
    }

    /// The slot holding `pk` (whose hash is `h`), or the free slot where it goes; `key_of` gives a record's key.
    fn find<'k>(&self, h: u64, pk: &[u8], key_of: impl Fn(u32) -> &'k [u8]) -> usize {
        let mut i = h as usize & self.mask;
        loop {
            let s = &self.slots[i];
            if s.first == EMPTY || (s.hash == h && key::eq(key_of(s.first), pk)) {
                return i;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Start loading the slot where a key with hash `h` is looked for first.
    #[inline]
    fn prefetch(&self, h: u64) {
        prefetch_line(&self.slots[h as usize & self.mask] as *const Slot as *const u8);
    }

    /// The first record of the first key with hash `h`, its key not compared: what to prefetch.
    fn guess(&self, h: u64) -> Option<u32> {
        let mut i = h as usize & self.mask;
        loop {
            let s = &self.slots[i];
            if s.first == EMPTY {
                return None;
            }
            if s.hash == h {
                return Some(s.first);
            }
            i = (i + 1) & self.mask;
        }
    }
}

/// One record batch of the stored records (`reconcile.STATE_SCHEMA`), with the fields of its list columns' items.
struct StoredChunk<'a> {
    pk: &'a Col,
    kind: &'a Col,
    ck: &'a Col,
    lts: &'a Col,
    lttl: &'a Col,
    lldt: &'a Col,
    dts: &'a Col,
    dldt: &'a Col,
    sts: &'a Col,
    sldt: &'a Col,
    cells: &'a Col,
    cdels: &'a Col,
    rts: &'a Col,
    /// a cell's column, path, value, ts, ttl, ldt, tombstone
    cell: [&'a Col; 7],
    /// a complex deletion's column, ts, ldt
    cdel: [&'a Col; 3],
    /// a range tombstone's start, start_inclusive, end, end_inclusive, ts, ldt
    rt: [&'a Col; 6],
    /// each cell's and each complex deletion's column id (`Stored::column_ids`), read in order with the other fields
    /// instead of each name read and hashed again
    cell_col_ids: Vec<ColId>,
    cdel_col_ids: Vec<ColId>,
}

impl<'a> StoredChunk<'a> {
    fn new(c: &'a Col) -> Result<StoredChunk<'a>, String> {
        let f = Col::field;
        let (cells, cdels, rts) = (f(c, "cells", "+l")?, f(c, "complex_deletions", "+l")?,
                                   f(c, "range_tombstones", "+l")?);
        let (ce, de, re) = (&cells.children[0], &cdels.children[0], &rts.children[0]);
        Ok(StoredChunk {
            pk: f(c, "partition_key", "z")?, kind: f(c, "row_kind", "u")?, ck: f(c, "clustering", "z")?,
            lts: f(c, "liveness_ts", "l")?, lttl: f(c, "liveness_ttl", "i")?, lldt: f(c, "liveness_ldt", "l")?,
            dts: f(c, "deletion_ts", "l")?, dldt: f(c, "deletion_ldt", "l")?, sts: f(c, "shadowable_ts", "l")?,
            sldt: f(c, "shadowable_ldt", "l")?, cells, cdels, rts,
            cell: [f(ce, "column", "u")?, f(ce, "path", "z")?, f(ce, "value", "z")?, f(ce, "ts", "l")?,
                   f(ce, "ttl", "i")?, f(ce, "ldt", "l")?, f(ce, "tombstone", "b")?],
            cdel: [f(de, "column", "u")?, f(de, "ts", "l")?, f(de, "ldt", "l")?],
            rt: [f(re, "start", "z")?, f(re, "start_inclusive", "b")?, f(re, "end", "z")?,
                 f(re, "end_inclusive", "b")?, f(re, "ts", "l")?, f(re, "ldt", "l")?],
            cell_col_ids: Vec::new(), cdel_col_ids: Vec::new(),
        })
    }

    fn columns(&self) -> [&'a Col; 13] {
        [self.pk, self.kind, self.ck, self.lts, self.lttl, self.lldt, self.dts, self.dldt, self.sts, self.sldt,
         self.cells, self.cdels, self.rts]
    }
}

/// The stored records (`reconcile.STATE_SCHEMA`) of the batch's partitions, read one partition at a time
/// (`partition_from_records`) so that only one partition's state is in memory at once. They are the record
/// batches the Delta read gave, read where they are: joining them would copy every column first. A record is
/// known by a `u32` holding its chunk in the high bits and its row in the low `row_bits`.
struct Stored<'a> {
    chunks: Vec<StoredChunk<'a>>,
    row_bits: u32,
    /// the place of each chunk's first record among all of them (for `next`)
    starts: Vec<u32>,
    /// partition key -> its first record; `next` chains a partition's records (no list per partition)
    by_key: ByKey,
    next: Vec<u32>,
}

impl<'a> Stored<'a> {
    /// The stored records (their column names not yet known to the table, `column_ids`, nor indexed, `index`).
    fn new(chunks: &'a [Col]) -> Result<Stored<'a>, String> {
        let chunks = chunks.iter().map(StoredChunk::new).collect::<Result<Vec<_>, _>>()?;
        let longest = chunks.iter().map(|c| c.pk.len).max().unwrap_or(0);
        let row_bits = usize::BITS - longest.leading_zeros();
        // u32::MAX marks a free slot or the end of a chain: the last chunk's ids stay below it
        if row_bits > 31 || (chunks.len() as u64) << row_bits >= u32::MAX as u64 {
            let n = chunks.len();
            return Err(format!("{n} stored record batches of up to {longest} records: too many to number"));
        }
        let mut starts = vec![0u32];
        for c in &chunks {
            starts.push(starts.last().unwrap() + c.pk.len as u32);
        }
        Ok(Stored { chunks, row_bits, starts, by_key: ByKey::with_capacity(0), next: Vec::new() })
    }

    /// Each chunk's cells' and complex deletions' column ids, every name made known to `t` (for `set_column_ids`).
    fn column_ids(&self, t: &mut Table) -> Vec<(Vec<ColId>, Vec<ColId>)> {
        self.chunks.iter().map(|c| ((0..c.cell[0].len).map(|j| t.col(c.cell[0].bytes(j))).collect(),
                                    (0..c.cdel[0].len).map(|j| t.col(c.cdel[0].bytes(j))).collect())).collect()
    }

    fn set_column_ids(&mut self, ids: Vec<(Vec<ColId>, Vec<ColId>)>) {
        for (c, (cells, cdels)) in self.chunks.iter_mut().zip(ids) {
            (c.cell_col_ids, c.cdel_col_ids) = (cells, cdels);
        }
    }

    /// Record `r`'s chunk number and its row there.
    #[inline]
    fn split(&self, r: u32) -> (usize, usize) {
        ((r >> self.row_bits) as usize, (r & ((1 << self.row_bits) - 1)) as usize)
    }

    /// Record `r`'s chunk and its row there.
    #[inline]
    fn at(&self, r: u32) -> (&StoredChunk<'a>, usize) {
        let (c, i) = self.split(r);
        (&self.chunks[c], i)
    }

    /// Record `r`'s place among all the records.
    #[inline]
    fn place(&self, r: u32) -> usize {
        let (c, i) = self.split(r);
        self.starts[c] as usize + i
    }

    fn key(&self, r: u32) -> &'a [u8] {
        let (c, i) = self.at(r);
        c.pk.bytes(i)
    }

    /// The records by partition (`by_key` and `next`).
    fn index(&self) -> (ByKey, Vec<u32>) {
        let n = *self.starts.last().unwrap() as usize;
        let mut by_key = ByKey::with_capacity(n);
        let mut next = vec![u32::MAX; n];
        // keys are hashed `AHEAD` records before they are placed, and their slots asked for then: the table is
        // larger than the caches, and a slot waited for at each record took most of the index's time
        const AHEAD: usize = 8;
        let mut hashes = [0u64; AHEAD];
        for (ci, c) in self.chunks.iter().enumerate() {
            let ahead = |j: usize, hashes: &mut [u64; AHEAD], by_key: &ByKey| {
                if j < c.pk.len {
                    let h = key_hash(c.pk.bytes(j));
                    hashes[j % AHEAD] = h;
                    by_key.prefetch(h);
                }
            };
            for j in 0..AHEAD {
                ahead(j, &mut hashes, &by_key);
            }
            for j in 0..c.pk.len {
                let (pk, r, h) = (c.pk.bytes(j), (ci as u32) << self.row_bits | j as u32, hashes[j % AHEAD]);
                ahead(j + AHEAD, &mut hashes, &by_key);
                let k = by_key.find(h, pk, |r| self.key(r));
                let slot = &mut by_key.slots[k];
                if slot.first == EMPTY {
                    *slot = Slot { hash: h, first: r, last: r };
                } else {
                    next[self.place(slot.last)] = r;
                    slot.last = r;
                }
            }
        }
        (by_key, next)
    }

    /// The first stored record of partition `pk`, whose key hashes to `h` (`key_hash`).
    fn first(&self, pk: &[u8], h: u64) -> Option<u32> {
        let slot = &self.by_key.slots[self.by_key.find(h, pk, |r| self.key(r))];
        (slot.first != EMPTY).then_some(slot.first)
    }

    /// Start loading the slot of the partition whose key hashes to `h` (`key_hash`) in `by_key`.
    fn prefetch_slot(&self, h: u64) {
        self.by_key.prefetch(h);
    }

    /// Start loading the first stored record of the partition whose key hashes to `h`, as its slot (loaded by
    /// `prefetch_slot` a while before) guesses it, its key not compared; that record, or `EMPTY` for none.
    fn prefetch_first(&self, h: u64) -> u32 {
        let Some(first) = self.by_key.guess(h) else { return EMPTY };
        let (c, i) = self.at(first);
        for col in c.columns() {
            col.prefetch(i);
        }
        first
    }

    /// Start loading the bytes and cells of stored record `first` (its offsets loaded by `prefetch_first`), and the
    /// next of its partition's records.
    fn prefetch_cells(&self, first: u32) {
        let (c, i) = self.at(first);
        for col in c.columns() {
            col.prefetch_data(i);
        }
        if c.cells.valid(i) {
            let j = c.cells.list_range(i).start;
            for col in c.cell {
                col.prefetch(j);
            }
            if let Some(id) = c.cell_col_ids.get(j) {
                prefetch_line(id as *const ColId as *const u8);
            }
        }
        if let Some(next) = self.next.get(self.place(first)) {
            prefetch_line(next as *const u32 as *const u8);
        }
    }

    /// Start loading the values and paths of stored record `first`'s cells (their offsets loaded by
    /// `prefetch_cells`).
    fn prefetch_cell_data(&self, first: u32) {
        let (c, i) = self.at(first);
        if c.cells.valid(i) {
            let cells = c.cells.list_range(i);
            let [_, path, value, ..] = c.cell;
            for j in cells.start..cells.end.min(cells.start + 4) {
                value.prefetch_data(j);
                path.prefetch_data(j);
            }
        }
    }

    /// Whether the stored records of the partitions `order` come in that order, as far as the first
    /// `ORDER_SAMPLE` of them tell (a wrong answer costs time, not results).
    fn in_order_of(&self, order: &[Part]) -> bool {
        const ORDER_SAMPLE: usize = 32;
        let mut last = None;
        let mut seen = 0;
        for p in order.iter().take(ORDER_SAMPLE) {
            if let Some(first) = self.first(p.pk, key_hash(p.pk)) {
                let place = self.place(first);
                if last.is_some_and(|l| place <= l) {
                    return false;
                }
                last = Some(place);
                seen += 1;
            }
        }
        seen >= 2
    }

    /// The stored state of partition `pk` (its key's hash `h`), decoded into `part` (cleared first); false when it
    /// has none.
    fn partition(&self, pk: &[u8], h: u64, part: &mut PartitionState<'a>) -> Result<bool, String> {
        part.clear();
        let Some(first) = self.first(pk, h) else { return Ok(false) };
        let rows = std::iter::successors(Some(first), |&r| Some(self.next[self.place(r)]).filter(|&j| j != u32::MAX));
        for r in rows {
            let (c, i) = self.at(r);
            let [_, c_path, c_value, c_ts, c_ttl, c_ldt, c_tomb] = c.cell;
            let k = c.kind.bytes(i);
            if k == b"partition" {
                if let Some(ts) = c.dts.opt_i64(i) {
                    part.deletion = Some((ts, c.dldt.opt_i64(i).ok_or("partition deletion without ldt")?));
                }
                let [r_s, r_si, r_e, r_ei, r_ts, r_ldt] = c.rt;
                for j in if c.rts.valid(i) { c.rts.list_range(i) } else { 0..0 } {
                    part.set_rt((r_s.bytes(j), r_si.bool(j), r_e.bytes(j), r_ei.bool(j)), (r_ts.i64(j), r_ldt.i64(j)));
                }
                continue;
            }
            let liveness = match c.lts.opt_i64(i) {
                Some(ts) => Some((ts, c.lttl.opt_i32(i).unwrap_or(0), c.lldt.opt_i64(i).ok_or("liveness without ldt")?)),
                None => None,
            };
            let deletion = match c.dts.opt_i64(i) {
                Some(ts) => Some((ts, c.dldt.opt_i64(i).ok_or("deletion without ldt")?)),
                None => None,
            };
            let shadowable = match c.sts.opt_i64(i) {
                Some(ts) => Some((ts, c.sldt.opt_i64(i).ok_or("shadowable deletion without ldt")?)),
                None => None,
            };
            // a record replaces an earlier one of the same row
            let row = match k {
                b"static" => &mut part.static_row,
                b"row" => part.rows.entry(Ck(c.ck.bytes(i))),
                other => return Err(format!("unknown state row_kind {:?}", String::from_utf8_lossy(other))),
            };
            row.reset();
            (row.liveness, row.deletion, row.shadowable) = (liveness, deletion, shadowable);
            let [_, d_ts, d_ldt] = c.cdel;
            for j in if c.cdels.valid(i) { c.cdels.list_range(i) } else { 0..0 } {
                let (e, _) = row.complex_mut(c.cdel_col_ids[j]);
                *e = Complex { del: Some((d_ts.i64(j), d_ldt.i64(j))), cells: BTreeMap::new() };
            }
            for j in if c.cells.valid(i) { c.cells.list_range(i) } else { 0..0 } {
                let col = c.cell_col_ids[j];
                let cell = Cell { ts: c_ts.i64(j), ttl: c_ttl.i32(j), ldt: c_ldt.i64(j), tomb: c_tomb.bool(j),
                                  value: Cow::Borrowed(c_value.bytes(j)) };
                match c_path.opt_bytes(j) {
                    None => row.set_cell(col, cell),
                    Some(p) => {
                        row.complex_mut(col).0.cells.insert(Cow::Borrowed(p), cell);
                    }
                }
            }
        }
        Ok(true)
    }
}

/// `process_partition` for one partition: its events written into `events`, its new state in `w.state` (its
/// stored one decoded there by the caller); whether it must be written back (`clock` times its
/// phases: `phases`).
fn process_partition<'a>(em: &Emitter, pk: &[u8], recs: &[Rec<'a>], w: &mut Work<'a>, s: &Settings,
                         events: &mut Events, clock: &mut Clock) -> D<bool> {
    w.start();
    clock.lap(Phase::PartitionCopies);
    let mut swept = false;
    if let Some(prev) = s.prev_now {
        if w.has_prior && s.now > prev {
            w.sweep(em, pk, prev, s.now, events)?;
            swept = true;
        }
    }
    if !recs.is_empty() {
        w.apply(em, pk, recs, s.now, events)?;
    }
    clock.lap(Phase::PartitionMerge);
    let changed = w.changed(swept);
    clock.lap(Phase::PartitionCopies);
    Ok(changed)
}

/// A batch's records grouped into partitions (`group_partitions`): places, tokens and the partitions' keys.
struct Grouped {
    /// every record's place, sorted by token, then key bytes, then place: a partition's records are one run
    sorted: Vec<Rid>,
    /// the partitions, as each thread that grouped them found them, in publish order: each partition's token,
    /// the index in `sorted` of its first record (its records run to the next one's) and its key. Kept as the
    /// threads left them, not joined: a first batch of a process pays the kernel for every page a copy takes.
    spans: Vec<SpanGroups>,
    /// the records came in token order and were taken in place: `sorted` walks the cell log forwards
    in_log_order: bool,
}

impl Grouped {
    /// Each partition's key, token and records.
    fn parts(&self) -> Vec<Part<'_>> {
        let mut parts = Vec::with_capacity(self.spans.iter().map(|g| g.starts.len()).sum());
        for g in &self.spans {
            let mut key_start = 0;
            parts.extend(g.starts.iter().zip(&g.key_ends).map(|(&(token, start), &end)| {
                let pk = &g.key_data[key_start..end as usize];
                key_start = end as usize;
                Part { pk, token, recs: start..start }
            }));
        }
        // each partition's records run to the next one's first
        let mut end = self.sorted.len();
        for p in parts.iter_mut().rev() {
            p.recs.end = end;
            end = p.recs.start;
        }
        parts
    }

    /// The partitions as Arrow buffers: (binary keys, their tokens).
    fn keys_and_tokens(&self) -> (Out, Vec<i64>) {
        let n = self.spans.iter().map(|g| g.starts.len()).sum();
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0);
        let mut data = Vec::with_capacity(self.spans.iter().map(|g| g.key_data.len()).sum());
        for g in &self.spans {
            let base = data.len() as i32;
            offsets.extend(g.key_ends.iter().map(|e| base + *e as i32));
            data.extend_from_slice(&g.key_data);
        }
        let tokens = self.spans.iter().flat_map(|g| g.starts.iter().map(|s| s.0)).collect();
        (Out::Var { offsets, data, valid: Validity::valid(n) }, tokens)
    }
}

/// `Grouped` kept from `partition_keys` for `process_table` on the same records, so that a batch groups its
/// records once, with where the columns it was made from are, to tell that `process_table` was given the same.
pub struct Grouping {
    grouped: Grouped,
    /// per record batch: its `partition_key` column's place, then its `token` column's
    from: Vec<[usize; 10]>,
}

/// Where each record batch's `partition_key` and `token` columns are (`Col::place` of each).
fn columns_places(pks: &[&Col], tokens: &[&Col]) -> Vec<[usize; 10]> {
    pks.iter().zip(tokens).map(|(pk, tk)| {
        let (a, b) = (pk.place(), tk.place());
        [a[0], a[1], a[2], a[3], a[4], b[0], b[1], b[2], b[3], b[4]]
    }).collect()
}

impl Grouping {
    /// How `log`'s records are grouped, if this grouping was made from its columns (else None).
    fn of(&self, log: &CellLog) -> Option<&Grouped> {
        let (pks, tokens) = log.key_columns();
        (columns_places(&pks, &tokens) == self.from).then_some(&self.grouped)
    }
}

/// Group records given by their record batches' `partition_key` and `token` columns (one of each per batch, of
/// equal lengths) into partitions on up to `threads` threads. Tokens are hashes, spread evenly: the records are
/// placed by their token's top bits into buckets of a few hundred, each bucket sorted in cache by (token, place),
/// then each run of a token split by key. A bucket holds whole tokens, so threads take contiguous buckets.
fn group_partitions(pks: &[&Col], tokens: &[&Col], threads: usize) -> Grouped {
    let n: usize = tokens.iter().map(|c| c.len).sum();
    // records already in token order (a chunk as the Spark job's shuffle sorts it): taken as they are, in runs of
    // whole tokens, with no bucket to sort, their tokens read from the column (no (token, place) pairs: a first
    // batch of a process pays the kernel for every fresh page, 32 MB of pairs for 2M records)
    if tokens_in_order(tokens) {
        let (sorted, bounds) = in_log_order(tokens, n);
        let token = |r: &Rid| tokens[r.chunk as usize].i64(r.row as usize);
        grouped(pks, sorted, &bounds, threads, true, token)
    } else {
        let (sorted, bounds) = by_bucket(tokens, n);
        grouped(pks, sorted, &bounds, threads, false, |x: &(i64, u64)| x.0)
    }
}

/// A record's place in what `group_span` groups: with its token beside it (records bucketed by token), or alone
/// (records in token order, whose tokens are read from the column).
trait Placed: Copy + Send + Sized {
    fn rid(&self) -> Rid;
    /// a bucket's records sorted by token, then as the cell log is
    fn sort(recs: &mut [Self]);
    /// the places alone, in the order grouped
    fn into_rids(recs: Vec<Self>) -> Vec<Rid>;
}

impl Placed for Rid {
    #[inline]
    fn rid(&self) -> Rid {
        *self
    }

    /// records in token order are in order already
    fn sort(_: &mut [Rid]) {}

    fn into_rids(recs: Vec<Rid>) -> Vec<Rid> {
        recs
    }
}

/// (token, `Rid::packed`): sorted by token, then as the cell log is
impl Placed for (i64, u64) {
    #[inline]
    fn rid(&self) -> Rid {
        Rid::unpack(self.1)
    }

    fn sort(recs: &mut [(i64, u64)]) {
        recs.sort_unstable();
    }

    fn into_rids(recs: Vec<(i64, u64)>) -> Vec<Rid> {
        recs.into_iter().map(|x| Rid::unpack(x.1)).collect()
    }
}

/// `group_partitions`' work on `sorted` (records, in buckets of whole tokens that `bounds` delimits; `token`: a
/// record's token): contiguous buckets per thread, each thread's run grouped by `group_span`, the runs' partitions
/// kept in order.
fn grouped<P: Placed, T: Fn(&P) -> i64 + Sync>(pks: &[&Col], mut sorted: Vec<P>, bounds: &[usize], threads: usize,
                                                 in_log_order: bool, token: T) -> Grouped {
    let n = sorted.len();
    // contiguous buckets per thread, about as many records each (a small batch: one thread)
    let threads = threads.clamp(1, (n / 65536).max(1));
    let mut cuts: Vec<usize> = (1..threads).map(|i| bounds.partition_point(|&b| b < n * i / threads))
        .filter(|&b| b > 0 && b < bounds.len() - 1).collect();
    cuts.dedup();
    let mut spans = Vec::with_capacity(cuts.len() + 1);
    let mut rest: &mut [P] = &mut sorted;
    let mut first = 0;
    for b in cuts.into_iter().chain([bounds.len() - 1]) {
        let (mine, others) = rest.split_at_mut(bounds[b] - bounds[first]);
        spans.push((mine, &bounds[first..=b]));
        (rest, first) = (others, b);
    }
    let token = &token;
    let done: Vec<SpanGroups> = if spans.len() == 1 {
        spans.into_iter().map(|(recs, bounds)| group_span(pks, recs, bounds, token)).collect()
    } else {
        std::thread::scope(|scope| {
            let handles: Vec<_> = spans.into_iter()
                .map(|(recs, bounds)| scope.spawn(move || group_span(pks, recs, bounds, token)))
                .collect();
            handles.into_iter().map(|h| h.join().expect("grouping a batch's records panicked")).collect()
        })
    };
    Grouped { sorted: P::into_rids(sorted), spans: done, in_log_order }
}

/// Whether the records' tokens never decrease, record batch after record batch.
fn tokens_in_order(tokens: &[&Col]) -> bool {
    let mut last = i64::MIN;
    tokens.iter().all(|tk| (0..tk.len).all(|row| {
        let t = tk.i64(row);
        let ok = t >= last;
        last = t;
        ok
    }))
}

/// The records in cell-log order (already in token order), and bounds of runs of about 4,096 of them cut where the
/// token changes: the buckets `group_partitions` spreads over threads.
fn in_log_order(tokens: &[&Col], n: usize) -> (Vec<Rid>, Vec<usize>) {
    let mut sorted = Vec::with_capacity(n);
    for (c, tk) in tokens.iter().enumerate() {
        sorted.extend((0..tk.len).map(|row| Rid { chunk: c as u32, row: row as u32 }));
    }
    let token = |r: Rid| tokens[r.chunk as usize].i64(r.row as usize);
    let mut bounds = vec![0];
    let mut at = 0;
    while at < n {
        let mut end = (at + 4096).min(n);
        while end < n && token(sorted[end]) == token(sorted[end - 1]) {
            end += 1;
        }
        bounds.push(end);
        at = end;
    }
    if n == 0 {
        bounds.push(0);
    }
    (sorted, bounds)
}

/// The records placed by their token's top bits into buckets of a few hundred (`group_partitions`), unsorted
/// within each, and the buckets' bounds.
fn by_bucket(tokens: &[&Col], n: usize) -> (Vec<(i64, u64)>, Vec<usize>) {
    let bits = (n / 512).max(1).ilog2().min(12);
    // the token's order as unsigned, its top `bits` bits
    let bucket = |tk: i64| if bits == 0 { 0 } else { (((tk as u64) ^ (1 << 63)) >> (64 - bits)) as usize };
    let mut bounds = vec![0usize; (1 << bits) + 1];
    for tk in tokens {
        (0..tk.len).for_each(|row| bounds[bucket(tk.i64(row)) + 1] += 1);
    }
    for b in 1..bounds.len() {
        bounds[b] += bounds[b - 1];
    }
    let mut sorted: Vec<(i64, u64)> = vec![(0, 0); n];
    let mut next = bounds.clone();
    for (c, tk) in tokens.iter().enumerate() {
        for row in 0..tk.len {
            let token = tk.i64(row);
            let at = &mut next[bucket(token)];
            sorted[*at] = (token, Rid { chunk: c as u32, row: row as u32 }.packed());
            *at += 1;
        }
    }
    (sorted, bounds)
}

/// What `group_span` makes of a run of buckets: its partitions' (token, first record) and their keys (each key
/// ending at its `key_ends` in `key_data`).
struct SpanGroups {
    starts: Vec<(i64, usize)>,
    key_ends: Vec<u32>,
    key_data: Vec<u8>,
}

/// `group_partitions`' work on one run of buckets: `recs`, the records of the buckets `bounds` delimits (indexes
/// of the whole batch's records), each bucket sorted first (`Placed::sort`); its partitions by those indexes, and
/// their keys. `token`: a record's token.
fn group_span<P: Placed>(pks: &[&Col], recs: &mut [P], bounds: &[usize], token: &impl Fn(&P) -> i64) -> SpanGroups {
    let base = bounds[0];
    for w in bounds.windows(2) {
        P::sort(&mut recs[w[0] - base..w[1] - base]);
    }
    let at = |x: &P| {
        let r = x.rid();
        (pks[r.chunk as usize], r.row as usize)
    };
    let pk = |x: &P| {
        let (col, row) = at(x);
        col.bytes(row)
    };
    let mut out = SpanGroups { starts: Vec::with_capacity(recs.len()), key_ends: Vec::with_capacity(recs.len()),
                               key_data: Vec::with_capacity(recs.len() * 8) };
    let mut i = 0;
    while i < recs.len() {
        // the keys' bytes are read in token order, scattered over the record batches: asked for ahead
        if let Some(x) = recs.get(i + 16) {
            let (col, row) = at(x);
            col.prefetch(row);
        }
        if let Some(x) = recs.get(i + 8) {
            let (col, row) = at(x);
            col.prefetch_data(row);
        }
        let tk = token(&recs[i]);
        let end = i + recs[i..].iter().take_while(|x| token(x) == tk).count();
        let first = pk(&recs[i]);
        if recs[i + 1..end].iter().any(|x| !key::eq(pk(x), first)) {
            // keys sharing a token: by key, each in cell-log order (a stable sort)
            recs[i..end].sort_by(|a, b| pk(a).cmp(pk(b)));
        }
        let mut j = i;
        while j < end {
            let key = pk(&recs[j]);
            out.starts.push((tk, base + j));
            crate::columns::append(&mut out.key_data, key);
            out.key_ends.push(out.key_data.len() as u32);
            j += 1 + recs[j + 1..end].iter().take_while(|x| key::eq(pk(x), key)).count();
        }
        i = end;
    }
    out
}

/// The partitions `order` as Arrow buffers: (binary keys, their tokens). For a batch that sweeps partitions the
/// grouping did not hold (else `Grouped::keys_and_tokens` copies the grouping's keys at once).
fn keys_and_tokens(order: &[Part]) -> (Out, Vec<i64>) {
    let mut keys = Out::var_with_capacity(order.len(), order.iter().map(|p| p.pk.len()).sum());
    for p in order {
        keys.bytes(p.pk);
    }
    (keys, order.iter().map(|p| p.token).collect())
}

/// The distinct partitions of a table's cell-log records, in publish order (token, then key): the partitions a
/// batch reads the stored records of before `process_table`, which gives them in the same order. `pks`, `tokens`:
/// the record batches' `partition_key` (binary) and `token` (int64) columns. Also the grouping, for
/// `process_table` on the same record batches. On up to `threads` threads.
pub fn partition_keys(pks: &[Col], tokens: &[Col], threads: usize) -> Result<(Out, Vec<i64>, Grouping), String> {
    if pks.len() != tokens.len() {
        return Err(format!("{} partition_key chunks against {} token chunks", pks.len(), tokens.len()));
    }
    for (c, (pk, tk)) in pks.iter().zip(tokens).enumerate() {
        pk.expect("z")?;
        tk.expect("l")?;
        if pk.len != tk.len {
            return Err(format!("chunk {c}: {} partition keys against {} tokens", pk.len, tk.len));
        }
        if let Some(row) = (0..pk.len).find(|&row| !pk.valid(row) || !tk.valid(row)) {
            return Err(format!("chunk {c}, record {row}: a null partition key or token"));
        }
    }
    let (pks, tokens): (Vec<&Col>, Vec<&Col>) = (pks.iter().collect(), tokens.iter().collect());
    let grouped = group_partitions(&pks, &tokens, threads);
    let (keys, toks) = grouped.keys_and_tokens();
    Ok((keys, toks, Grouping { from: columns_places(&pks, &tokens), grouped }))
}

/// One table's batch. `cell_log`: the table's records (record batches of `CELL_LOG_SCHEMA`); `stored`: the stored
/// records of every partition the batch touches (record batches of `STATE_SCHEMA`); `expiring`: partitions to
/// sweep that have no records.
pub fn process_table(t: &mut Table, cell_log: &[Col], stored: &[Col], expiring: &[Vec<u8>],
                     grouping: Option<&Grouping>, s: &Settings) -> Result<Output, String> {
    let mut log = CellLog::new(cell_log)?;
    let mut stored = Stored::new(stored)?;
    // the records as `partition_keys` grouped them, or else grouped here first, on every thread
    let given = grouping.and_then(|g| g.of(&log));
    let own = given.is_none().then(|| {
        let (pks, tokens) = log.key_columns();
        group_partitions(&pks, &tokens, s.threads)
    });
    let grouped_by = given.or(own.as_ref()).expect("given or grouped here");
    // then the stored records are indexed by partition on one core while the other makes every column name known
    // (the records', then the stored cells') and lists the partitions (unless partitions to sweep join them, below)
    let (mut order, listed, column_ids, (by_key, next)) = std::thread::scope(|scope| {
        let index = scope.spawn(|| stored.index());
        log.intern(t);
        let column_ids = stored.column_ids(t);
        let order = grouped_by.parts();
        let listed = (expiring.is_empty() && given.is_none()).then(|| grouped_by.keys_and_tokens());
        (order, listed, column_ids, index.join().expect("the stored records' index panicked"))
    });
    let log = log;
    (stored.by_key, stored.next) = (by_key, next);
    stored.set_column_ids(column_ids);
    let (sorted, forwards) = (&grouped_by.sorted[..], grouped_by.in_log_order);
    let by_order = |a: &Part, b: &Part| (a.token, a.pk).cmp(&(b.token, b.pk));
    let mut swept = false;
    for pk in expiring {
        let p = Part { pk: pk.as_slice(), token: crate::murmur3::token(pk), recs: 0..0 };
        if order.binary_search_by(|x| by_order(x, &p)).is_err() {
            order.push(p);
            swept = true;
        }
    }
    // the partitions in publish order, as Arrow buffers, unless they are the given grouping's (no copy of
    // them: a first batch of a process pays the kernel for every fresh page)
    let keys = if swept {
        order.sort_by(by_order);
        order.dedup_by(|a, b| a.pk == b.pk && a.token == b.token);
        Some(keys_and_tokens(&order))
    } else if given.is_some() {
        None
    } else {
        Some(listed.unwrap_or_else(|| grouped_by.keys_and_tokens()))
    };
    let t: &Table = t;
    let ctx = EventCtx { cluster: s.cluster, node: "", ts_ms: s.now * 1000 };
    let em = Emitter::new(t, &ctx);
    // partitions are independent: contiguous runs of them, which `threads` threads take in turn (a thread the
    // machine slows down takes fewer), outputs joined in order
    let threads = s.threads.clamp(1, order.len().max(1));
    let spans = runs_of(&order, threads);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut runs: Vec<(usize, Result<Run, String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads.min(spans.len()))
            .map(|_| {
                let (em, stored, log, order, spans, next) = (&em, &stored, &log, &order, &spans, &next);
                scope.spawn(move || {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= spans.len() {
                            return mine;
                        }
                        let span = spans[i].clone();
                        let run = &order[span.clone()];
                        mine.push((i, process_run(em, stored, log, sorted, run, span.start, forwards, s)));
                    }
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().expect("a state engine thread panicked")).collect()
    });
    runs.sort_by_key(|r| r.0);
    let runs = runs.into_iter().map(|r| r.1);
    let mut runs = runs.into_iter().collect::<Result<Vec<Run>, String>>()?;
    if runs.iter_mut().any(|r| r.overflowed()) {
        return Err("a batch too large for 32-bit Arrow offsets".into());
    }
    Ok(Output { keys, runs, grouped: given.is_some() })
}

/// The fewest records worth a run of their own: below it, handing a run to another thread costs more than it saves.
const MIN_RUN_RECORDS: usize = 16_384;

/// How many runs each thread is given to take, when the batch is large enough (`MIN_RUN_RECORDS`). The threads
/// take runs in turn, so one ends at most about a run after the other: with runs small, a core the machine slows
/// down for a while leaves the other idle for less. On the project's 2-core VMs, runs of the same number of
/// records took up to 1.8 times as long as each other within one 1M-change call; with 2 runs per thread the
/// first thread to end waited 0.13-0.23 s on average for the other (up to 0.5 s, in calls of 1.3-1.9 s); with 32,
/// 0.016-0.019 s (docs/benchmarks.md). A run costs buffers of its own and a chunk of each output, which Python
/// wraps in about 0.3 ms (16-28 ms for the 64 runs of such a call, against 2-3 ms for 4).
const RUNS_PER_THREAD: usize = 32;

/// Contiguous runs of `order` for `threads` threads: about `RUNS_PER_THREAD` per thread, cut by records, not by
/// partitions, so that a batch of a few wide partitions (a time series' day, say) is spread as well as one of
/// many small ones. A partition with no records (a TTL sweep's) counts as one; a run holds at least
/// `MIN_RUN_RECORDS` records or the rest of the batch, and whole partitions.
fn runs_of(order: &[Part], threads: usize) -> Vec<std::ops::Range<usize>> {
    let weight = |p: &Part| p.recs.len().max(1);
    if order.is_empty() {
        return Vec::new();
    }
    if threads <= 1 {
        return vec![0..order.len()];
    }
    let records = order.iter().map(weight).sum::<usize>();
    let per = records.div_ceil(threads * RUNS_PER_THREAD).max(MIN_RUN_RECORDS);
    let mut runs = Vec::new();
    let (mut start, mut n) = (0, 0);
    for (i, p) in order.iter().enumerate() {
        n += weight(p);
        if n >= per {
            runs.push(start..i + 1);
            (start, n) = (i + 1, 0);
        }
    }
    if start < order.len() {
        runs.push(start..order.len());
    }
    runs
}

/// What a thread made of a contiguous run of partitions: its outputs are one chunk of the batch's (Python
/// joins them as Arrow chunks, without a copy).
pub struct Run {
    /// indexes into `Output::keys` of the partitions left to the Python engine
    pub doubted: Vec<usize>,
    pub events: Events,
    pub state: StateRows,
    /// partitions whose state rows were written
    pub changed: usize,
}

impl Run {
    fn overflowed(&mut self) -> bool {
        self.state.overflowed()
            || [&self.events.event_json, &self.events.key_json, &self.events.partition_key].iter().any(|o| o.overflowed())
    }
}

/// One partition's records without replica copies (`dedupe_records`), into `out`: one record per identity
/// (`Rec::same`), the copy with the smallest source, at the place of the first copy. False when a record is of
/// a kind the engine does not know.
fn partition_records<'a>(log: &CellLog<'a>, rids: &[Rid], out: &mut Vec<Rec<'a>>) -> bool {
    out.clear();
    let mut known = true;
    // each record is written onto `out`; a copy of one kept before it is taken off again, and replaces the kept
    // one when its source is smaller
    let settle = |out: &mut Vec<Rec<'a>>, slot: Option<usize>| {
        if let Some(k) = slot {
            let rec = out.pop().expect("the record just pushed");
            if rec.source() < out[k].source() {
                out[k] = rec;
            }
        }
    };
    if rids.len() <= 16 {
        for &r in rids {
            if !log.push_rec(r, out) {
                known = false;
                continue;
            }
            let (rec, kept) = out.split_last().expect("the record just pushed");
            let slot = kept.iter().position(|k| k.same(rec));
            settle(out, slot);
        }
    } else {
        let mut first = FxMap::with_capacity_and_hasher(rids.len(), Default::default());
        for &r in rids {
            if !log.push_rec(r, out) {
                known = false;
                continue;
            }
            let last = out.len() - 1;
            let slot = match first.entry(out[last].identity()) {
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(last);
                    None
                }
                std::collections::hash_map::Entry::Occupied(o) => Some(*o.get()),
            };
            settle(out, slot);
        }
    }
    known
}

/// The partitions `order` (publish order; the first is partition number `first` of the batch). `forwards`: their
/// records are read in cell-log order (`Grouped::in_log_order`).
#[allow(clippy::too_many_arguments)]
fn process_run<'a>(em: &Emitter, stored: &Stored<'a>, log: &CellLog<'a>, sorted: &[Rid], order: &[Part], first: usize,
                   forwards: bool, s: &Settings) -> Result<Run, String> {
    let t = em.t;
    let mut out = Run { doubted: Vec::new(), events: Events::with_capacity(order.len()), state: StateRows::new(t),
                        changed: 0 };
    let mut recs: Vec<Rec> = Vec::new();
    let mut work = Work::default();
    // the state columns are sized once from what the first partitions wrote (a sample large enough to be typical)
    let sample = (order.len() / 32).max(1024);
    // what partition i reads is asked for ahead, in steps that each need the one before done: the records'
    // offsets, then the bytes they point to, then the key's slot among the stored partitions, then the stored
    // record it names, then that record's bytes and its cells' offsets, then the cells' values. Records read
    // forwards are left to the processor's own prefetcher: asking for them too cost about 1,000 instructions a
    // change (callgrind) for lines already on their way. So are stored records read forwards (a state of one
    // file in token order, as a first load writes it and a MERGE leaves it): asking for them cost 640
    // instructions a change, 5 % of the engine's, and about 8 % of its time. Stored records read in any other
    // order (a state of several files, each over the whole ring, read one after the other; rows in no order)
    // are asked for: in no order at all, that saves a sixth of the engine's time (docs/benchmarks.md, "The
    // round after 70dfef1").
    let records_ahead = |i: usize, step: fn(&CellLog, Rid)| {
        if let Some(p) = order.get(i) {
            sorted[p.recs.clone()].iter().for_each(|&r| step(log, r));
        }
    };
    // each partition's key is hashed once, four partitions ahead (its slot asked for then, looked up when its
    // turn comes), and its first stored record guessed from the slot once, three ahead: rings of the partitions
    // in between (`AHEAD` > 4)
    const AHEAD: usize = 8;
    let (mut hashes, mut firsts) = ([0u64; AHEAD], [EMPTY; AHEAD]);
    for (j, p) in order.iter().enumerate().take(4) {
        hashes[j] = key_hash(p.pk);
    }
    let stored_forwards = stored.in_order_of(order);
    for (i, part) in order.iter().enumerate() {
        if !forwards {
            records_ahead(i + 6, |log, r| log.prefetch(r));
            records_ahead(i + 5, |log, r| log.prefetch_data(r));
        }
        if let Some(p) = order.get(i + 4) {
            let h = key_hash(p.pk);
            hashes[(i + 4) % AHEAD] = h;
            stored.prefetch_slot(h);
        }
        if !stored_forwards {
            if i + 3 < order.len() {
                firsts[(i + 3) % AHEAD] = stored.prefetch_first(hashes[(i + 3) % AHEAD]);
            }
            // (a slot of the rings is read only for a partition that is there: one past the end holds an old one)
            let first = firsts[(i + 2) % AHEAD];
            if first != EMPTY && i + 2 < order.len() {
                stored.prefetch_cells(first);
            }
            let first = firsts[(i + 1) % AHEAD];
            if first != EMPTY && i + 1 < order.len() {
                stored.prefetch_cell_data(first);
            }
        }
        if i == sample {
            let factor = (order.len() - i) as f64 / i as f64 * 1.1;
            out.state.reserve_scaled(factor);
        }
        let (pk, token) = (part.pk, part.token);
        let idx = first + i;
        let mut clock = Clock::start();
        let known = partition_records(log, &sorted[part.recs.clone()], &mut recs);
        // a name not valid UTF-8 cannot be hashed into the event ids as the Python engine hashes it
        if !known || !t.names_exact {
            out.doubted.push(idx);
            continue;
        }
        clock.lap(Phase::PartitionRecords);
        work.has_prior = stored.partition(pk, hashes[i % AHEAD], &mut work.state)?;
        clock.lap(Phase::PartitionStored);
        let mark = out.state.n;
        let events_mark = out.events.len();
        out.events.start_partition(idx as i32, token);
        let done = process_partition(em, pk, &recs, &mut work, s, &mut out.events, &mut clock).and_then(|changed| {
            if changed {
                work.final_images(em, s.now)?;
                let prior = work.has_prior.then_some(&work.stored);
                out.state.change_rows(t, pk, token, prior, &work.state, &work.after, s.now, s.batch_seq)?;
            }
            clock.lap(Phase::PartitionStateRows);
            Ok(changed)
        });
        match done {
            Ok(changed) => out.changed += changed as usize,
            Err(_) => {
                out.state.truncate(mark);
                out.events.truncate(events_mark);
                out.doubted.push(idx);
            }
        }
    }
    em.finish_ids(&mut out.events);
    phases::flush();
    Ok(out)
}
