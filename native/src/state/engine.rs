//! A partition's state and Cassandra's rules for it, as `cdc_lib.state.reconcile` has them: partition states
//! joined with the last-write-wins rules (cells, tombstones, row markers, complex and range deletions, counter
//! shards), one cell-log record at a time. What a state shows is `images`; the events and the per-partition flow
//! are `events` and `partition`. Python's engine is the reference; the tests compare every output byte.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::BTreeMap;

use super::key::{self, Ck};
use super::rows::Rows;
use super::table::{ColId, Table};
use super::types::{self, Doubt, D};

pub const NO_TIMESTAMP: i64 = i64::MIN;
pub const NO_DELETION_TIME: i64 = (1 << 31) - 1;
pub const EXPIRED_LIVENESS_TTL: i32 = i32::MAX;

pub type Del = (i64, i64);
pub type Lv = (i64, i32, i64);

/// A cell's value or path: borrowed from the Arrow input it was read from (the stored rows or the cell log, both
/// alive for the whole batch), owned only where the engine makes one (a counter's shard). Values are copied
/// from state to state and into images many times per change; a borrowed one is copied as a pointer.
pub type Bytes<'a> = Cow<'a, [u8]>;

#[derive(Clone, Debug)]
pub struct Cell<'a> {
    pub ts: i64,
    pub ttl: i32,
    pub ldt: i64,
    pub tomb: bool,
    pub value: Bytes<'a>,
}

impl PartialEq for Cell<'_> {
    #[inline]
    fn eq(&self, o: &Self) -> bool {
        self.ts == o.ts && self.ttl == o.ttl && self.ldt == o.ldt && self.tomb == o.tomb && key::eq(&self.value, &o.value)
    }
}

#[derive(Clone, PartialEq, Debug, Default)]
pub struct Complex<'a> {
    pub del: Option<Del>,
    pub cells: BTreeMap<Bytes<'a>, Cell<'a>>,
}

/// One clustering row or the static row (`reconcile.RowState`); `cells` and `complex` sorted by column id.
#[derive(PartialEq, Debug, Default)]
pub struct RowState<'a> {
    pub liveness: Option<Lv>,
    pub deletion: Option<Del>,
    pub shadowable: Option<Del>,
    pub cells: Vec<(ColId, Cell<'a>)>,
    pub complex: Vec<(ColId, Complex<'a>)>,
}

/// A range tombstone's bounds: (start, start inclusive, end, end inclusive), borrowed from the batch's input.
pub type RtKey<'a> = (&'a [u8], bool, &'a [u8], bool);

/// What the MERGE source rows need of a partition's stored state once a batch has changed it
/// (`state_rows::StateRows::change_rows`): which of its records the new state may no longer hold.
#[derive(Default, Debug)]
pub struct StoredShape<'a> {
    /// a partition record: a partition deletion or range tombstones
    pub partition_record: bool,
    pub static_row: bool,
    /// the clustering rows' keys, in key order
    pub rows: Vec<Ck<'a>>,
}

/// One partition's state (`reconcile.PartitionState`). A thread keeps one, into which each partition's stored
/// state is decoded and which its batch then changes, cleared for the next (`clear`): its lists keep their room.
#[derive(PartialEq, Debug, Default)]
pub struct PartitionState<'a> {
    pub deletion: Option<Del>,
    /// sorted by bounds (a partition holds a few at most)
    pub rts: Vec<(RtKey<'a>, Del)>,
    pub static_row: RowState<'a>,
    pub rows: Rows<'a>,
}

impl<'a> RowState<'a> {
    pub fn is_empty(&self) -> bool {
        self.liveness.is_none() && self.deletion.is_none() && self.shadowable.is_none() && self.cells.is_empty()
            && self.complex.is_empty()
    }

    /// Empty again, its lists keeping their room.
    pub fn reset(&mut self) {
        self.liveness = None;
        self.deletion = None;
        self.shadowable = None;
        self.cells.clear();
        if !self.complex.is_empty() {
            self.complex.clear();
        }
    }

    pub fn cell(&self, c: ColId) -> Option<&Cell<'a>> {
        self.cells.binary_search_by_key(&c, |x| x.0).ok().map(|i| &self.cells[i].1)
    }

    pub(crate) fn set_cell(&mut self, c: ColId, cell: Cell<'a>) {
        match self.cells.binary_search_by_key(&c, |x| x.0) {
            Ok(i) => self.cells[i].1 = cell,
            Err(i) => self.cells.insert(i, (c, cell)),
        }
    }

    pub fn complex_of(&self, c: ColId) -> Option<&Complex<'a>> {
        self.complex.binary_search_by_key(&c, |x| x.0).ok().map(|i| &self.complex[i].1)
    }

    /// The complex entry of `c` (created empty when missing), and whether it was created.
    pub(crate) fn complex_mut(&mut self, c: ColId) -> (&mut Complex<'a>, bool) {
        match self.complex.binary_search_by_key(&c, |x| x.0) {
            Ok(i) => (&mut self.complex[i].1, false),
            Err(i) => {
                self.complex.insert(i, (c, Complex::default()));
                (&mut self.complex[i].1, true)
            }
        }
    }
}

impl<'a> PartitionState<'a> {
    pub fn is_empty(&self) -> bool {
        self.deletion.is_none() && self.rts.is_empty() && self.static_row.is_empty() && self.rows.is_empty()
    }

    /// Empty again (as a partition with no stored state), its lists keeping their room.
    pub fn clear(&mut self) {
        self.deletion = None;
        self.rts.clear();
        self.static_row.reset();
        self.rows.clear();
    }

    /// The records of this (stored) state that a batch may leave behind, into `out` (`StoredShape`).
    pub fn shape_into(&self, out: &mut StoredShape<'a>) {
        out.partition_record = self.deletion.is_some() || !self.rts.is_empty();
        out.static_row = !self.static_row.is_empty();
        out.rows.clear();
        out.rows.extend(self.rows.keys());
    }

    /// The range tombstone `rk`'s deletion.
    pub fn rt(&self, rk: &RtKey) -> Option<Del> {
        self.rts.binary_search_by(|x| x.0.cmp(rk)).ok().map(|i| self.rts[i].1)
    }

    /// Set range tombstone `rk`'s deletion (in its place by bounds).
    pub fn set_rt(&mut self, rk: RtKey<'a>, d: Del) {
        match self.rts.binary_search_by(|x| x.0.cmp(&rk)) {
            Ok(i) => self.rts[i].1 = d,
            Err(i) => self.rts.insert(i, (rk, d)),
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Records (cell-log rows)

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Kind {
    Cell,
    CellTombstone,
    RowLiveness,
    RowDeletion,
    RowDeletionShadowable,
    ComplexDeletion,
    PartitionDeletion,
    RangeTombstone,
}

impl Kind {
    /// The kind a record's `kind` names: a cell, nearly always, told by one compare; the others out of line.
    #[inline(always)]
    pub fn parse(s: &[u8]) -> Option<Kind> {
        if s.len() == 4 && u32::from_ne_bytes([s[0], s[1], s[2], s[3]]) == u32::from_ne_bytes(*b"cell") {
            return Some(Kind::Cell);
        }
        Kind::parse_other(s)
    }

    #[inline(never)]
    fn parse_other(s: &[u8]) -> Option<Kind> {
        Some(match s {
            b"cell" => Kind::Cell,
            b"cell_tombstone" => Kind::CellTombstone,
            b"row_liveness" => Kind::RowLiveness,
            b"row_deletion" => Kind::RowDeletion,
            b"row_deletion_shadowable" => Kind::RowDeletionShadowable,
            b"complex_deletion" => Kind::ComplexDeletion,
            b"partition_deletion" => Kind::PartitionDeletion,
            b"range_tombstone" => Kind::RangeTombstone,
            _ => return None,
        })
    }
}

/// A cell-log record as the engine applies it, with what tells its replica copies apart from other records
/// (`identity`) and which copy to keep (`source`).
#[derive(Clone, Debug)]
pub struct Rec<'a> {
    pub segment: &'a [u8],
    pub segment_id: i64,
    pub position: i64,
    pub entry_index: i32,
    pub seq: i32,
    pub kind: Kind,
    pub clustering: &'a [u8],
    /// a range tombstone's end, whether its start and end are inclusive (`clustering_end`, `start_inclusive`,
    /// `end_inclusive`), as the record has them: null for any other kind. Part of the identity
    pub bounds: (Option<&'a [u8]>, Option<bool>, Option<bool>),
    pub is_static: bool,
    pub column: Option<ColId>,
    pub path: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub ts: i64,
    pub ttl: i32,
    pub ldt: i64,
    pub mid: Option<&'a [u8]>,
}

impl<'a> Rec<'a> {
    /// Whether `o` is a copy of this record (`batch.IDENTITY_COLUMNS` within one partition of one table: every
    /// column but where it was read from). The fields cheapest to compare and likeliest to differ come first.
    #[inline]
    pub fn same(&self, o: &Rec) -> bool {
        self.ts == o.ts && self.ttl == o.ttl && self.ldt == o.ldt && self.is_static == o.is_static
            && self.kind == o.kind && self.column == o.column && self.bounds.1 == o.bounds.1
            && self.bounds.2 == o.bounds.2 && key::opt_eq(self.value, o.value) && key::opt_eq(self.path, o.path)
            && key::eq(self.clustering, o.clustering) && key::opt_eq(self.bounds.0, o.bounds.0)
            && key::opt_eq(self.mid, o.mid)
    }

    /// The fields `same` compares, for hashing.
    pub fn identity(&self) -> impl std::hash::Hash + Eq + 'a {
        (self.ts, self.ttl, self.ldt, self.is_static, self.kind, self.column, self.bounds, self.value, self.path,
         self.clustering, self.mid)
    }

    /// `dedupe_records`' order among copies: the smallest wins.
    #[inline]
    pub fn source(&self) -> (i64, i64, &'a [u8], i32, i32) {
        (self.segment_id, self.position, self.segment, self.entry_index, self.seq)
    }

    /// Whether this record's copy is read from before `o`'s: (segment id, position, segment), the order that names
    /// a change's source.
    #[inline]
    pub fn read_before(&self, o: &Rec) -> bool {
        match (self.segment_id, self.position).cmp(&(o.segment_id, o.position)) {
            Ordering::Equal => !key::eq(self.segment, o.segment) && self.segment < o.segment,
            c => c == Ordering::Less,
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Clustering order and range tombstones

/// `celllog.schema.decode_clustering`: composite bytes -> values (None for a null component).
pub fn decode_clustering(data: &[u8]) -> Vec<Option<&[u8]>> {
    let mut out = Vec::new();
    let mut i = 0;
    let n = data.len();
    while i < n {
        // int.from_bytes(data[i:i + 2]): one byte when only one is left
        let ln = if i + 2 <= n { ((data[i] as usize) << 8) | data[i + 1] as usize } else { data[i] as usize };
        i += 2;
        if ln == 0xFFFF {
            out.push(None);
        } else {
            out.push(Some(&data[i.min(n)..(i + ln).min(n)]));
            i += ln;
        }
        i += 1; // end-of-component byte
    }
    out
}

/// `compare_clustering(table, a, b)`: only the common prefix, DESC columns reversed.
pub fn compare_clustering(t: &Table, a: &[Option<&[u8]>], b: &[Option<&[u8]>]) -> D<Ordering> {
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let col = t.c(*t.ck.get(i).ok_or(Doubt)?);
        let c = match (x, y) {
            (Some(x), Some(y)) => types::compare_values(col.ty.as_ref().ok_or(Doubt)?, x, y)?,
            _ => x.is_some().cmp(&y.is_some()),
        };
        if c != Ordering::Equal {
            return Ok(if col.reversed { c.reverse() } else { c });
        }
    }
    Ok(Ordering::Equal)
}

/// `range_covers(table, rt_key, clustering)`.
pub fn range_covers(t: &Table, rk: &RtKey, clustering: &[Option<&[u8]>]) -> D<bool> {
    let s = decode_clustering(rk.0);
    let e = decode_clustering(rk.2);
    let c = if !s.is_empty() { compare_clustering(t, clustering, &s)? } else { Ordering::Equal };
    if c == Ordering::Less || (c == Ordering::Equal && !s.is_empty() && !rk.1) {
        return Ok(false);
    }
    let c = if !e.is_empty() { compare_clustering(t, clustering, &e)? } else { Ordering::Equal };
    if c == Ordering::Greater || (c == Ordering::Equal && !e.is_empty() && !rk.3) {
        return Ok(false);
    }
    Ok(true)
}

/// `_row_shadow_ts(table, part, ck, None)`: the highest regular deletion covering clustering row `ck`.
pub fn row_shadow_ts(t: &Table, part: &PartitionState, ck: &[u8]) -> D<i64> {
    let mut ts = part.deletion.map(|d| d.0).unwrap_or(NO_TIMESTAMP);
    if !part.rts.is_empty() {
        let cl = decode_clustering(ck);
        for (rk, d) in &part.rts {
            if d.0 > ts && range_covers(t, rk, &cl)? {
                ts = d.0;
            }
        }
    }
    Ok(ts)
}

// ---------------------------------------------------------------------------------------------------------------
// Reconciliation of single values (reconcile.reconcile_cells, ...)

pub fn reconcile_cells<'c, 'a>(a: &'c Cell<'a>, b: &'c Cell<'a>) -> &'c Cell<'a> {
    if a.ts != b.ts {
        return if a.ts > b.ts { a } else { b };
    }
    let a_dead = a.tomb || a.ttl != 0;
    let b_dead = b.tomb || b.ttl != 0;
    if a_dead || b_dead {
        if a_dead != b_dead {
            return if a_dead { a } else { b };
        }
        if a.tomb != b.tomb {
            return if a.tomb { a } else { b };
        }
        if a.ldt != b.ldt {
            return if a.ldt > b.ldt { a } else { b };
        }
    }
    if a.value != b.value {
        return if a.value > b.value { a } else { b };
    }
    if a.ttl >= b.ttl {
        a
    } else {
        b
    }
}

fn liveness_wins(a: &Lv, b: &Lv) -> bool {
    if a.0 != b.0 {
        return a.0 > b.0;
    }
    let a_exp = a.1 == EXPIRED_LIVENESS_TTL;
    let b_exp = b.1 == EXPIRED_LIVENESS_TTL;
    if a_exp != b_exp {
        return a_exp;
    }
    if (a.1 != 0) != (b.1 != 0) {
        return a.1 != 0;
    }
    if a.1 != 0 && a.2 != b.2 {
        return a.2 > b.2;
    }
    a.1 >= b.1
}

// ---------------------------------------------------------------------------------------------------------------
// Counters

const GLOBAL: u8 = 2;
const LOCAL: u8 = 1;
const REMOTE: u8 = 0;

/// `reconcile._parse_context`: {counter id: (kind rank, clock, count)} in body order, later ids overwriting.
fn parse_context(ctx: &[u8]) -> D<Vec<(Vec<u8>, (u8, i64, i64))>> {
    if ctx.len() < 2 {
        return Err(Doubt);
    }
    let n = (i16::from_be_bytes([ctx[0], ctx[1]]) as i32).unsigned_abs() as i64;
    let header = 2 + 2 * n;
    if (ctx.len() as i64 - header).rem_euclid(32) != 0 {
        return Err(Doubt);
    }
    let mut kinds: Vec<(i64, u8)> = Vec::new();
    for i in 0..n {
        let p = 2 + 2 * i as usize;
        let e = i16::from_be_bytes([*ctx.get(p).ok_or(Doubt)?, *ctx.get(p + 1).ok_or(Doubt)?]) as i64;
        let (idx, k) = if e < 0 { (e + 32768, GLOBAL) } else { (e, LOCAL) };
        match kinds.iter_mut().find(|x| x.0 == idx) {
            Some(x) => x.1 = k,
            None => kinds.push((idx, k)),
        }
    }
    let mut out: Vec<(Vec<u8>, (u8, i64, i64))> = Vec::new();
    let mut off = header as usize;
    let mut idx = 0i64;
    while off < ctx.len() {
        let cid = ctx[off..off + 16].to_vec();
        let clock = i64::from_be_bytes(ctx[off + 16..off + 24].try_into().unwrap());
        let count = i64::from_be_bytes(ctx[off + 24..off + 32].try_into().unwrap());
        let kind = kinds.iter().find(|x| x.0 == idx).map(|x| x.1).unwrap_or(REMOTE);
        match out.iter_mut().find(|x| x.0 == cid) {
            Some(x) => x.1 = (kind, clock, count),
            None => out.push((cid, (kind, clock, count))),
        }
        off += 32;
        idx += 1;
    }
    Ok(out)
}

/// `reconcile._shard_rank`: (kind rank, clock, count) of a stored shard.
pub fn shard_rank(c: &Cell) -> (u8, i64, i64) {
    let v = &c.value;
    (v[0], i64::from_be_bytes(v[1..9].try_into().unwrap()), i64::from_be_bytes(v[9..17].try_into().unwrap()))
}

/// `_apply_counter`: a live counter cell's shards become elements keyed by counter id + timestamp; per id
/// every shard no other shard of that id beats on both rank and timestamp is kept.
fn apply_counter(row: &mut RowState, column: ColId, ts: i64, context: &[u8]) -> D<bool> {
    if context.is_empty() {
        return Ok(false);
    }
    let shards = parse_context(context)?; // parsed first: Python creates the entry, then may raise
    let (entry, _) = row.complex_mut(column);
    let mut changed = false;
    for (cid, rank) in shards {
        let same: Vec<(Vec<u8>, (u8, i64, i64), i64)> = entry
            .cells
            .iter()
            .filter(|(p, _)| p.get(..16) == Some(&cid[..]))
            .map(|(p, c)| (p.to_vec(), shard_rank(c), c.ts))
            .collect();
        if same.iter().any(|(_, r, t)| *r >= rank && *t >= ts) {
            continue;
        }
        for (p, r, t) in &same {
            if *r <= rank && *t <= ts {
                entry.cells.remove(&p[..]);
            }
        }
        let (kind, clock, count) = rank;
        let mut value = Vec::with_capacity(17);
        value.push(kind);
        value.extend_from_slice(&clock.to_be_bytes());
        value.extend_from_slice(&count.to_be_bytes());
        let mut path = cid;
        path.extend_from_slice(&ts.to_be_bytes());
        entry.cells.insert(Cow::Owned(path), Cell { ts, ttl: 0, ldt: NO_DELETION_TIME, tomb: false,
                                                    value: Cow::Owned(value) });
        changed = true;
    }
    Ok(changed)
}

// ---------------------------------------------------------------------------------------------------------------
// Shadowing

fn purge_row(row: &mut RowState, shadow: i64) {
    if shadow == NO_TIMESTAMP {
        return;
    }
    if matches!(row.liveness, Some(l) if l.0 <= shadow) {
        row.liveness = None;
    }
    if matches!(row.shadowable, Some(s) if s.0 <= shadow) {
        row.shadowable = None;
    }
    row.cells.retain(|(_, c)| c.ts > shadow);
    row.complex.retain_mut(|(_, e)| {
        if matches!(e.del, Some(d) if d.0 <= shadow) {
            e.del = None;
        }
        e.cells.retain(|_, c| c.ts > shadow);
        !(e.del.is_none() && e.cells.is_empty())
    });
}

fn purge_complex(e: &mut Complex) {
    if let Some(d) = e.del {
        e.cells.retain(|_, c| c.ts > d.0);
    }
}

fn normalize_row_deletion(row: &mut RowState, part_shadow: i64) {
    if part_shadow != NO_TIMESTAMP && matches!(row.deletion, Some(d) if d.0 <= part_shadow) {
        row.deletion = None;
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Applying records (reconcile._apply_record)

/// What an applied record changed in the state (`Row`: the record's own row, whose key the caller has). Exact:
/// the state changed if and only if the answer is not `Nothing`, which is how a batch tells whether to write a
/// partition back (`partition::Work::changed`) without a copy of its stored state to compare with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Changed {
    Nothing,
    AllRows,
    Static,
    Row,
    /// the state changed where no row's image can: a counter write whose context holds no shard leaves an empty
    /// entry for its column, as the Python engine's does (whose `apply_record` then reports nothing)
    Silently,
}

pub fn apply_record<'a>(t: &Table, part: &mut PartitionState<'a>, rec: &Rec<'a>) -> D<Changed> {
    let ts = rec.ts;
    let ldt = rec.ldt;
    if rec.kind == Kind::PartitionDeletion {
        let d = (ts, ldt);
        if matches!(part.deletion, Some(cur) if cur >= d) {
            return Ok(Changed::Nothing);
        }
        part.deletion = Some(d);
        part.rts.retain(|(_, rd)| rd.0 > ts);
        purge_row(&mut part.static_row, ts);
        part.rows.retain(|_, row| {
            purge_row(row, ts);
            normalize_row_deletion(row, ts);
            !row.is_empty()
        });
        return Ok(Changed::AllRows);
    }
    if matches!(part.deletion, Some(d) if ts <= d.0) {
        return Ok(Changed::Nothing);
    }
    if rec.kind == Kind::RangeTombstone {
        let (end, start_incl, end_incl) = rec.bounds;
        let rk: RtKey<'a> = (rec.clustering, start_incl.unwrap_or(false), end.unwrap_or(b""), end_incl.unwrap_or(false));
        let d = (ts, ldt);
        if matches!(part.rt(&rk), Some(cur) if cur >= d) {
            return Ok(Changed::Nothing);
        }
        part.set_rt(rk, d);
        let mut err = None;
        part.rows.retain(|ck, row| {
            match range_covers(t, &rk, &decode_clustering(&ck)) {
                Ok(true) => {
                    purge_row(row, ts);
                    normalize_row_deletion(row, ts);
                }
                Ok(false) => {}
                Err(d) => err = Some(d),
            }
            !row.is_empty()
        });
        if let Some(d) = err {
            return Err(d);
        }
        return Ok(Changed::AllRows);
    }
    if rec.is_static {
        let entries = part.static_row.complex.len();
        let changed = apply_to_row(t, &mut part.static_row, rec)?;
        return Ok(row_change(changed, Changed::Static, part.static_row.complex.len() != entries));
    }
    let ck = rec.clustering;
    if !part.rts.is_empty() && ts <= row_shadow_ts(t, part, ck)? {
        return Ok(Changed::Nothing);
    }
    let row = part.rows.entry(Ck(ck));
    let entries = row.complex.len();
    let res = apply_to_row(t, row, rec);
    let grew = row.complex.len() != entries;
    if row.is_empty() {
        part.rows.remove(ck);
    }
    Ok(row_change(res?, Changed::Row, grew))
}

/// A row's change as `apply_record` reports it: `apply_to_row`'s answer (`changed`), or, when that is no, whether
/// the row holds a complex entry it did not (`grew`: only a counter write of no shard makes one without a change
/// `apply_to_row` reports; a row holding it is not empty, so it stays).
#[inline]
fn row_change(changed: bool, what: Changed, grew: bool) -> Changed {
    if changed {
        what
    } else if grew {
        Changed::Silently
    } else {
        Changed::Nothing
    }
}

fn apply_to_row<'a>(t: &Table, row: &mut RowState<'a>, rec: &Rec<'a>) -> D<bool> {
    let ts = rec.ts;
    let ldt = rec.ldt;
    if rec.kind == Kind::RowDeletion {
        let d = (ts, ldt);
        if matches!(row.deletion, Some(cur) if cur >= d) {
            return Ok(false);
        }
        row.deletion = Some(d);
        purge_row(row, ts);
        return Ok(true);
    }
    if matches!(row.deletion, Some(d) if ts <= d.0) {
        return Ok(false);
    }
    match rec.kind {
        Kind::Cell | Kind::CellTombstone => {
            let column = rec.column.ok_or(Doubt)?;
            let tomb = rec.kind == Kind::CellTombstone;
            let value: &'a [u8] = if tomb { b"" } else { rec.value.unwrap_or(b"") };
            let cell = Cell { ts, ttl: if tomb { 0 } else { rec.ttl }, ldt, tomb, value: Cow::Borrowed(value) };
            let col = t.c(column);
            if !tomb && col.counter {
                return apply_counter(row, column, ts, &cell.value);
            }
            if col.complex || (rec.path.is_some() && !col.current && col.drop_time.is_none()) {
                let path = rec.path.ok_or(Doubt)?;
                let existed = row.complex_of(column).is_some();
                if existed {
                    if let Some(d) = row.complex_of(column).unwrap().del {
                        if ts <= d.0 {
                            return Ok(false);
                        }
                    }
                }
                let (entry, _) = row.complex_mut(column);
                let new = match entry.cells.get(path) {
                    None => cell,
                    Some(cur) => {
                        let w = reconcile_cells(cur, &cell);
                        if *w == *cur {
                            return Ok(false);
                        }
                        w.clone()
                    }
                };
                entry.cells.insert(Cow::Borrowed(path), new);
                return Ok(true);
            }
            let new = match row.cell(column) {
                None => cell,
                Some(cur) => {
                    let w = reconcile_cells(cur, &cell);
                    if *w == *cur {
                        return Ok(false);
                    }
                    w.clone()
                }
            };
            row.set_cell(column, new);
            Ok(true)
        }
        Kind::RowLiveness => {
            let new = (ts, rec.ttl, ldt);
            let win = match &row.liveness {
                None => new,
                Some(cur) => {
                    if liveness_wins(cur, &new) {
                        *cur
                    } else {
                        new
                    }
                }
            };
            if Some(win) == row.liveness {
                return Ok(false);
            }
            row.liveness = Some(win);
            Ok(true)
        }
        Kind::RowDeletionShadowable => {
            let d = (ts, ldt);
            if matches!(row.shadowable, Some(cur) if cur >= d) {
                return Ok(false);
            }
            row.shadowable = Some(d);
            Ok(true)
        }
        Kind::ComplexDeletion => {
            let column = rec.column.ok_or(Doubt)?;
            let d = (ts, ldt);
            let (entry, created) = row.complex_mut(column);
            if created {
                entry.del = Some(d);
                return Ok(true);
            }
            if matches!(entry.del, Some(cur) if cur >= d) {
                return Ok(false);
            }
            entry.del = Some(d);
            purge_complex(entry);
            Ok(true)
        }
        Kind::RowDeletion | Kind::PartitionDeletion | Kind::RangeTombstone => unreachable!("handled above"),
    }
}

