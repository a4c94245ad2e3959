//! The state merge and its change events, as `cdc_lib.state.reconcile`, `state.events` and `state.batch` do
//! them: partition states joined with Cassandra's last-write-wins rules, mutations applied in write-time order,
//! visible-row images before and after each, and one event per changed row (JSON envelope and content-hash id
//! included, see `event`). Python's engine is the reference; the tests compare every output byte.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use super::key::{self, Key, KeyRef};
use super::table::{ColId, Role, Table};
use super::text::{json_str, push_hex, push_i128, push_i64, repr_bytes};
use super::out::Events;
use super::phases::{Clock, Phase};
use super::types::{self, Doubt, Ty, D};

pub const NO_TIMESTAMP: i64 = i64::MIN;
pub const NO_DELETION_TIME: i64 = (1 << 31) - 1;
pub const EXPIRED_LIVENESS_TTL: i32 = i32::MAX;

pub type Del = (i64, i64);
pub type Lv = (i64, i32, i64);

/// A cell's value or path: borrowed from the Arrow input it was read from (the stored rows or the cell log, both
/// alive for the whole batch), owned only where the engine makes one (a counter's shard). Values are copied
/// from state to state and into images many times per change; a borrowed one is copied as a pointer.
pub type Bytes<'a> = Cow<'a, [u8]>;

#[derive(Clone, PartialEq, Debug)]
pub struct Cell<'a> {
    pub ts: i64,
    pub ttl: i32,
    pub ldt: i64,
    pub tomb: bool,
    pub value: Bytes<'a>,
}

#[derive(Clone, PartialEq, Debug, Default)]
pub struct Complex<'a> {
    pub del: Option<Del>,
    pub cells: BTreeMap<Bytes<'a>, Cell<'a>>,
}

/// One clustering row or the static row (`reconcile.RowState`); `cells` and `complex` sorted by column id.
#[derive(Clone, PartialEq, Debug, Default)]
pub struct RowState<'a> {
    pub liveness: Option<Lv>,
    pub deletion: Option<Del>,
    pub shadowable: Option<Del>,
    pub cells: Vec<(ColId, Cell<'a>)>,
    pub complex: Vec<(ColId, Complex<'a>)>,
}

pub type RtKey = (Vec<u8>, bool, Vec<u8>, bool);

#[derive(Clone, PartialEq, Debug, Default)]
pub struct PartitionState<'a> {
    pub deletion: Option<Del>,
    pub rts: BTreeMap<RtKey, Del>,
    pub static_row: RowState<'a>,
    pub rows: BTreeMap<Key, RowState<'a>>,
}

impl<'a> RowState<'a> {
    pub fn is_empty(&self) -> bool {
        self.liveness.is_none() && self.deletion.is_none() && self.shadowable.is_none() && self.cells.is_empty()
            && self.complex.is_empty()
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

impl PartitionState<'_> {
    pub fn is_empty(&self) -> bool {
        self.deletion.is_none() && self.rts.is_empty() && self.static_row.is_empty() && self.rows.is_empty()
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Records (cell-log rows)

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
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
    pub fn parse(s: &[u8]) -> Option<Kind> {
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

/// A cell-log record as the engine applies it (the identity columns are compared by the caller).
#[derive(Clone, Debug)]
pub struct Rec<'a> {
    pub segment: &'a [u8],
    pub segment_id: i64,
    pub position: i64,
    pub kind: Kind,
    pub clustering: &'a [u8],
    pub clustering_end: &'a [u8],
    pub start_incl: bool,
    pub end_incl: bool,
    pub is_static: bool,
    pub column: Option<ColId>,
    pub path: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub ts: i64,
    pub ttl: i32,
    pub ldt: i64,
    pub mid: Option<&'a [u8]>,
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
    let s = decode_clustering(&rk.0);
    let e = decode_clustering(&rk.2);
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
        for (rk, d) in part.rts.iter() {
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
fn shard_rank(c: &Cell) -> (u8, i64, i64) {
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

/// What an applied record may have changed (`Row`: the record's own row, whose key the caller has).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Changed {
    Nothing,
    AllRows,
    Static,
    Row,
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
        part.rts.retain(|_, rd| rd.0 > ts);
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
        let rk: RtKey = (rec.clustering.to_vec(), rec.start_incl, rec.clustering_end.to_vec(), rec.end_incl);
        let d = (ts, ldt);
        if matches!(part.rts.get(&rk), Some(cur) if *cur >= d) {
            return Ok(Changed::Nothing);
        }
        part.rts.insert(rk.clone(), d);
        let mut covered = Vec::new();
        for ck in part.rows.keys() {
            if range_covers(t, &rk, &decode_clustering(ck))? {
                covered.push(ck.clone());
            }
        }
        for ck in covered {
            let row = part.rows.get_mut(&ck).unwrap();
            purge_row(row, ts);
            normalize_row_deletion(row, ts);
            if row.is_empty() {
                part.rows.remove(&ck);
            }
        }
        return Ok(Changed::AllRows);
    }
    if rec.is_static {
        let changed = apply_to_row(t, &mut part.static_row, rec)?;
        return Ok(if changed { Changed::Static } else { Changed::Nothing });
    }
    let ck = rec.clustering;
    if !part.rts.is_empty() && ts <= row_shadow_ts(t, part, ck)? {
        return Ok(Changed::Nothing);
    }
    let k = KeyRef::new(ck);
    if !part.rows.contains_key(k) {
        part.rows.insert(Key::from(ck), RowState::default());
    }
    let row = part.rows.get_mut(k).expect("inserted above");
    let res = apply_to_row(t, row, rec);
    if row.is_empty() {
        part.rows.remove(k);
    }
    Ok(if res? { Changed::Row } else { Changed::Nothing })
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

// ---------------------------------------------------------------------------------------------------------------
// Images (what a row shows at `now`)

/// A column's value in an image: value bytes, a counter's total, or a complex column's (path, value) items
/// (paths None for lists).
#[derive(Clone, PartialEq, Debug)]
pub enum IVal<'a> {
    Bytes(Bytes<'a>),
    Counter(i128),
    Items(Vec<Item<'a>>),
}

/// A complex column's live (path, value) item.
pub type Item<'a> = (Option<Bytes<'a>>, Bytes<'a>);

/// {column: value}, sorted by column id.
pub type Image<'a> = Vec<(ColId, IVal<'a>)>;

/// (static values, row image): the static part is the static row's image (empty when it has none) for a
/// clustering row, and the image itself for the static-only row, whose row part is None.
pub type Images<'a> = (Image<'a>, Option<Image<'a>>);

/// Row keys: Some(clustering bytes), or None for the static-only row.
pub type RowKey = Option<Key>;

fn liveness_live(lv: &Option<Lv>, now: i64) -> bool {
    match lv {
        None => false,
        Some(l) if l.1 == EXPIRED_LIVENESS_TTL => false,
        Some(l) => l.1 == 0 || now < l.2,
    }
}

/// `_row_image`: None when the row is not live.
pub fn row_image<'a>(t: &Table, row: &RowState<'a>, now: i64) -> D<Option<Image<'a>>> {
    let extra_shadow = NO_TIMESTAMP;
    let lv = row.liveness;
    let shadow = match row.shadowable {
        None => extra_shadow,
        Some(s) if matches!(lv, Some(l) if l.0 > s.0) || s.0 <= extra_shadow => extra_shadow,
        Some(s) => s.0,
    };
    let live = matches!(lv, Some(l) if l.0 > shadow) && liveness_live(&lv, now);
    let mut image: Image<'a> = Vec::new();
    for (col, cell) in &row.cells {
        let c = t.c(*col);
        if cell.tomb || cell.ts <= shadow || (cell.ttl != 0 && now >= cell.ldt) || !c.current {
            continue;
        }
        if matches!(c.drop_time, Some(d) if cell.ts <= d) {
            continue;
        }
        image.push((*col, IVal::Bytes(cell.value.clone())));
    }
    for (col, e) in &row.complex {
        let c = t.c(*col);
        if !c.current {
            continue;
        }
        let floor = match c.drop_time {
            Some(d) => shadow.max(d),
            None => shadow,
        };
        if c.counter {
            if matches!(row.cell(*col), Some(tomb) if tomb.ts > shadow) {
                continue;
            }
            // `_counter_shards_total`: per counter id the best shard no deletion covers, summed
            let mut best: Vec<(&[u8], (u8, i64, i64))> = Vec::new();
            for (p, sc) in &e.cells {
                if sc.ts > floor {
                    if sc.value.len() < 17 {
                        return Err(Doubt);
                    }
                    let r = shard_rank(sc);
                    let cid = p.get(..16).unwrap_or(&p[..]);
                    match best.iter_mut().find(|x| x.0 == cid) {
                        Some(x) => {
                            if r > x.1 {
                                x.1 = r;
                            }
                        }
                        None => best.push((cid, r)),
                    }
                }
            }
            if !best.is_empty() {
                let total: i128 = best.iter().map(|x| x.1 .2 as i128).sum();
                image.push((*col, IVal::Counter(total)));
            }
            continue;
        }
        // BTreeMap order: (path, value) sorted by path bytes (paths are unique)
        let mut items: Vec<Item<'a>> = e.cells.iter()
            .filter(|(_, x)| x.ts > floor && !x.tomb && (x.ttl == 0 || now < x.ldt))
            .map(|(p, x)| (Some(p.clone()), x.value.clone()))
            .collect();
        if items.is_empty() {
            continue;
        }
        if c.list {
            // values in cell-path (timeuuid) order, the paths themselves invisible
            let mut err = None;
            items.sort_by(|a, b| {
                types::sort_key_cmp(&Ty::TimeUuid, a.0.as_ref().unwrap(), b.0.as_ref().unwrap()).unwrap_or_else(|d| {
                    err = Some(d);
                    Ordering::Equal
                })
            });
            if let Some(d) = err {
                return Err(d);
            }
            for it in items.iter_mut() {
                it.0 = None;
            }
        }
        image.push((*col, IVal::Items(items)));
    }
    image.sort_by_key(|x| x.0);
    if !live && image.is_empty() {
        return Ok(None);
    }
    Ok(Some(image))
}

/// `partition_images(table, part, now, only)`: {row key: images} of the visible CQL rows.
pub fn partition_images<'a>(t: &Table, part: &PartitionState<'a>, now: i64, only: Option<&[&[u8]]>)
                            -> D<BTreeMap<RowKey, Images<'a>>> {
    let static_img = if part.static_row.is_empty() { None } else { row_image(t, &part.static_row, now)? };
    let static_vals: Image<'a> = static_img.clone().unwrap_or_default();
    let mut out = BTreeMap::new();
    match only {
        None => {
            for (ck, row) in &part.rows {
                if let Some(img) = row_image(t, row, now)? {
                    out.insert(Some(ck.clone()), (static_vals.clone(), Some(img)));
                }
            }
        }
        Some(keys) => {
            for &ck in keys {
                if let Some(row) = part.rows.get(KeyRef::new(ck)) {
                    if let Some(img) = row_image(t, row, now)? {
                        out.insert(Some(Key(ck.to_vec())), (static_vals.clone(), Some(img)));
                    }
                }
            }
        }
    }
    if let Some(si) = static_img {
        let none_visible = if !out.is_empty() {
            false
        } else if only.is_none() {
            true
        } else {
            let mut any = false;
            for row in part.rows.values() {
                if row_image(t, row, now)?.is_some() {
                    any = true;
                    break;
                }
            }
            !any
        };
        if none_visible {
            out.insert(None, (si, None));
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------------------------
// Events

/// What the caller gives every event: who and when.
pub struct EventCtx<'a> {
    pub cluster: &'a str,
    pub node: &'a str,
    pub ts_ms: i64,
}


fn order_keys<'k>(t: &Table, keys: Vec<&'k RowKey>) -> D<Vec<&'k RowKey>> {
    if keys.len() <= 1 {
        return Ok(keys);
    }
    let mut stat = Vec::new();
    let mut rest = Vec::new();
    for k in keys {
        if k.is_none() {
            stat.push(k);
        } else {
            rest.push(k);
        }
    }
    let mut err = None;
    // Python sorts a set's iteration order with the clustering comparator: rows that compare equal with
    // different bytes have no defined order there; here they follow their bytes
    rest.sort_by(|a, b| {
        let (a, b) = (a.as_ref().unwrap(), b.as_ref().unwrap());
        match compare_clustering(t, &decode_clustering(a), &decode_clustering(b)) {
            Ok(c) => c,
            Err(d) => {
                err = Some(d);
                Ordering::Equal
            }
        }
    });
    if let Some(d) = err {
        return Err(d);
    }
    stat.extend(rest);
    Ok(stat)
}

pub struct Emitter<'a> {
    pub t: &'a Table,
    pub ctx: &'a EventCtx<'a>,
}

impl<'a> Emitter<'a> {
    /// `_Emitter.diff`: one event per row whose images differ, rows in clustering order.
    #[allow(clippy::too_many_arguments)]
    pub fn diff(&self, pk: &[u8], part: &PartitionState, before: &BTreeMap<RowKey, Images>,
                after: &BTreeMap<RowKey, Images>, ts_us: i64, source: Option<(&[u8], i64)>, expired: bool,
                out: &mut Events) -> D<()> {
        let mut keys: Vec<&RowKey> = before.keys().collect();
        for k in after.keys() {
            if !before.contains_key(k) {
                keys.push(k);
            }
        }
        for key in order_keys(self.t, keys)? {
            let b = before.get(key);
            let a = after.get(key);
            if a == b {
                continue;
            }
            self.event(pk, part, key, b, a, ts_us, source, expired, out)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    /// One event, written into `out`'s columns (the caller drops what a doubted partition wrote).
    #[allow(clippy::too_many_arguments)]
    fn event(&self, pk: &[u8], part: &PartitionState, key: &RowKey, b: Option<&Images>, a: Option<&Images>,
             ts_us: i64, source: Option<(&[u8], i64)>, expired: bool, out: &mut Events) -> D<()> {
        let t = self.t;
        let op = if b.is_none() { b'c' } else if a.is_none() { b'd' } else { b'u' };
        let mut clock = Clock::start();
        event_id_text(t, pk, key, op, ts_us, expired, part, a, &mut out.scratch)?;
        clock.lap(Phase::EventsIdText);
        let digest = event_id_of(&out.scratch);
        clock.lap(Phase::EventsIdHash);
        out.event_id.push_str_with(|id| {
            push_hex(id, &digest);
            Ok(())
        })?;
        out.event_json.push_str_with(|ej| self.event_json(ej, pk, key, b, a, ts_us, source, expired, op, &digest))?;
        clock.lap(Phase::EventsJson);
        out.key_json.push_str_with(|kj| key_json(kj, t, pk, key))?;
        clock.lap(Phase::EventsKey);
        out.op.bytes(&[op]);
        out.ts_us.push(ts_us);
        out.partition.push(out.current);
        Ok(())
    }

    /// The event's JSON envelope (`outbox_row`'s `event_json`).
    #[allow(clippy::too_many_arguments)]
    fn event_json(&self, ej: &mut String, pk: &[u8], key: &RowKey, b: Option<&Images>, a: Option<&Images>, ts_us: i64,
                  source: Option<(&[u8], i64)>, expired: bool, op: u8, digest: &[u8]) -> D<()> {
        let t = self.t;
        ej.push_str("{\"before\":");
        row_json(ej, t, pk, key, b)?;
        ej.push_str(",\"after\":");
        row_json(ej, t, pk, key, a)?;
        ej.push_str(",\"source\":{\"connector\":\"cassandra-cdc\",\"cluster\":");
        json_str(ej, self.ctx.cluster);
        ej.push_str(",\"node\":");
        json_str(ej, self.ctx.node);
        ej.push_str(&t.source_names_json);
        ej.push_str(",\"segment\":");
        match source {
            Some((seg, _)) => json_str(ej, std::str::from_utf8(seg).map_err(|_| Doubt)?),
            None => ej.push_str("null"),
        }
        ej.push_str(",\"position\":");
        match source {
            Some((_, pos)) => push_i64(ej, pos),
            None => ej.push_str("null"),
        }
        ej.push_str(",\"ts_us\":");
        push_i64(ej, ts_us);
        ej.push_str(if expired { ",\"expired\":true" } else { ",\"expired\":false" });
        ej.push_str(",\"snapshot\":false},\"op\":\"");
        ej.push(op as char);
        ej.push_str("\",\"ts_ms\":");
        push_i64(ej, self.ctx.ts_ms);
        ej.push_str(",\"id\":\"");
        push_hex(ej, digest);
        ej.push_str("\",\"changed\":[");
        let mut first = true;
        for (col, kind) in &t.change_plan {
            let differs = match kind {
                0 => b.is_none() || a.is_none(),
                1 => image_get(b.map(|x| &x.0), *col) != image_get(a.map(|x| &x.0), *col),
                _ => image_get(b.and_then(|x| x.1.as_ref()), *col) != image_get(a.and_then(|x| x.1.as_ref()), *col),
            };
            if differs {
                if !first {
                    ej.push(',');
                }
                first = false;
                ej.push_str(t.json_name(*col));
            }
        }
        ej.push_str("]}");
        Ok(())
    }
}

fn image_get<'i, 'a>(img: Option<&'i Image<'a>>, col: ColId) -> Option<&'i IVal<'a>> {
    let img = img?;
    img.binary_search_by_key(&col, |x| x.0).ok().map(|i| &img[i].1)
}

/// `split_partition_key`, as the components one at a time (a single-column key is the whole key).
pub fn partition_key_parts<'k>(t: &Table, key: &'k [u8]) -> impl Iterator<Item = &'k [u8]> {
    let single = t.pk.len() <= 1;
    let mut i = 0;
    std::iter::from_fn(move || {
        if single {
            if i > 0 {
                return None;
            }
            i = 1;
            return Some(key);
        }
        if i >= key.len() {
            return None;
        }
        let ln = if i + 2 <= key.len() {
            ((key[i] as usize) << 8) | key[i + 1] as usize
        } else {
            key[i] as usize
        };
        let a = (i + 2).min(key.len());
        let part = &key[a..(i + 2 + ln).min(key.len())];
        i += 3 + ln;
        Some(part)
    })
}

/// The JSON of a primary-key column's value (None: the column is absent from the typed row).
fn key_col_json(out: &mut String, t: &Table, pk: &[u8], key: &RowKey, col: ColId) -> D<()> {
    let c = t.c(col);
    let ty = c.ty.as_ref().ok_or(Doubt)?;
    match c.role {
        Role::PartitionKey => {
            // a key with fewer components than key columns: Python's event() fails on the missing one
            let i = t.pk.iter().position(|x| *x == col).unwrap();
            types::json_value(out, ty, partition_key_parts(t, pk).nth(i).ok_or(Doubt)?)
        }
        _ => {
            let i = t.ck.iter().position(|x| *x == col).unwrap();
            let vals = match key {
                Some(k) if !k.is_empty() => decode_clustering(k),
                _ => Vec::new(),
            };
            types::json_opt(out, ty, vals.get(i).copied().flatten())
        }
    }
}

/// `json.dumps(to_json_key(table, key))`.
fn key_json(out: &mut String, t: &Table, pk: &[u8], key: &RowKey) -> D<()> {
    out.push('{');
    for (i, col) in t.pk.iter().chain(&t.ck).enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&t.c(*col).json_key);
        key_col_json(out, t, pk, key, *col)?;
    }
    out.push('}');
    Ok(())
}

/// The JSON of a non-key column from an image value (`typed_row` then `to_json`).
pub fn ival_json(out: &mut String, ty: &Ty, v: &IVal) -> D<()> {
    match v {
        IVal::Bytes(b) => types::json_value(out, ty, b),
        IVal::Counter(total) => {
            push_i128(out, *total);
            Ok(())
        }
        IVal::Items(items) => complex_json(out, ty, items),
    }
}

/// A complex column's value from its live items (`decode_cells` of the items in path order, then `to_json`).
fn complex_json(out: &mut String, ty: &Ty, items: &[Item]) -> D<()> {
    match ty {
        Ty::List(e, _) => types::json_list(out, items.iter().map(|(_, v)| (&**e, Some(&v[..])))),
        Ty::Set(e, _) => {
            let ordered = in_path_order(e, items)?;
            types::json_list(out, ordered.iter().map(|(p, _)| (&**e, Some(*p))))
        }
        Ty::Map(k, v, _) => {
            let ordered = in_path_order(k, items)?;
            let pairs: Vec<(Option<&[u8]>, Option<&[u8]>)> = ordered.iter().map(|(p, x)| (Some(*p), Some(*x))).collect();
            types::json_map(out, k, v, &pairs)
        }
        Ty::Udt(names, fields, _) => {
            let mut vals: Vec<Option<&[u8]>> = vec![None; fields.len()];
            for (p, v) in items {
                let p = p.as_ref().ok_or(Doubt)?;
                if p.len() != 2 {
                    return Err(Doubt);
                }
                let i = i16::from_be_bytes([p[0], p[1]]);
                if i < 0 || i as usize >= fields.len() {
                    return Err(Doubt);
                }
                vals[i as usize] = Some(v);
            }
            types::json_udt(out, names, fields, |i| vals[i])
        }
        _ => Err(Doubt),
    }
}

/// Items sorted by `path_type.sort_key(path)` (stable), as (path, value) slices.
pub fn in_path_order<'i>(pt: &Ty, items: &'i [Item]) -> D<Vec<(&'i [u8], &'i [u8])>> {
    let mut v: Vec<(&[u8], &[u8])> = items.iter().map(|(p, x)| (p.as_deref().unwrap_or(b""), &x[..])).collect();
    let mut err = None;
    v.sort_by(|a, b| types::sort_key_cmp(pt, a.0, b.0).unwrap_or_else(|d| {
        err = Some(d);
        Ordering::Equal
    }));
    match err {
        Some(d) => Err(d),
        None => Ok(v),
    }
}

/// `json.dumps(to_json_row(table, typed_row(...)))` or null.
fn row_json(out: &mut String, t: &Table, pk: &[u8], key: &RowKey, imgs: Option<&Images>) -> D<()> {
    let imgs = match imgs {
        None => {
            out.push_str("null");
            return Ok(());
        }
        Some(i) => i,
    };
    out.push('{');
    for (i, col) in t.value_cols.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let c = t.c(*col);
        out.push_str(&c.json_key);
        match c.role {
            Role::PartitionKey | Role::Clustering => key_col_json(out, t, pk, key, *col)?,
            role => {
                let src = if role == Role::Static { Some(&imgs.0) } else { imgs.1.as_ref() };
                match image_get(src, *col) {
                    None => out.push_str("null"),
                    Some(v) => ival_json(out, c.ty.as_ref().ok_or(Doubt)?, v)?,
                }
            }
        }
    }
    out.push('}');
    Ok(())
}

// ---- event ids: sha256 of Python reprs ------------------------------------------------------------------------

fn repr_del(out: &mut String, d: &Option<Del>) {
    match d {
        None => out.push_str("None"),
        Some((a, b)) => {
            out.push('(');
            push_i64(out, *a);
            out.push_str(", ");
            push_i64(out, *b);
            out.push(')');
        }
    }
}

fn repr_cell(out: &mut String, c: &Cell) {
    out.push('(');
    push_i64(out, c.ts);
    out.push_str(", ");
    push_i64(out, c.ttl as i64);
    out.push_str(", ");
    push_i64(out, c.ldt);
    out.push_str(if c.tomb { ", True, " } else { ", False, " });
    repr_bytes(out, &c.value);
    out.push(')');
}

/// Python's repr of a tuple, its items written in place: `(a, b)`, `(a,)`, `()`.
struct ReprTuple {
    n: usize,
}

impl ReprTuple {
    fn open(out: &mut String) -> ReprTuple {
        out.push('(');
        ReprTuple { n: 0 }
    }

    /// Call before writing each item.
    fn item(&mut self, out: &mut String) {
        if self.n > 0 {
            out.push_str(", ");
        }
        self.n += 1;
    }

    fn close(self, out: &mut String) {
        if self.n == 1 {
            out.push(',');
        }
        out.push(')');
    }
}

fn repr_name(out: &mut String, t: &Table, col: ColId) -> D<()> {
    out.push_str(t.c(col).repr.as_deref().ok_or(Doubt)?);
    Ok(())
}

/// The start of a `(column name, ...)` item of `tup`; the caller writes the rest and the `)`.
fn named_item(out: &mut String, tup: &mut ReprTuple, t: &Table, col: ColId) -> D<()> {
    tup.item(out);
    out.push('(');
    repr_name(out, t, col)?;
    out.push_str(", ");
    Ok(())
}

/// `_row_state_repr(row)`.
fn repr_row_state(out: &mut String, t: &Table, row: Option<&RowState>) -> D<()> {
    let row = match row {
        None => {
            out.push_str("()");
            return Ok(());
        }
        Some(r) => r,
    };
    out.push('(');
    match row.liveness {
        None => out.push_str("None"),
        Some((a, b, c)) => {
            out.push('(');
            push_i64(out, a);
            out.push_str(", ");
            push_i64(out, b as i64);
            out.push_str(", ");
            push_i64(out, c);
            out.push(')');
        }
    }
    out.push_str(", ");
    repr_del(out, &row.deletion);
    out.push_str(", ");
    repr_del(out, &row.shadowable);
    out.push_str(", ");
    let mut tup = ReprTuple::open(out);
    for (col, c) in t.in_name_order(&row.cells) {
        named_item(out, &mut tup, t, *col)?;
        repr_cell(out, c);
        out.push(')');
    }
    tup.close(out);
    out.push_str(", ");
    let mut tup = ReprTuple::open(out);
    for (col, e) in t.in_name_order(&row.complex) {
        named_item(out, &mut tup, t, *col)?;
        repr_del(out, &e.del);
        out.push_str(", ");
        let mut inner = ReprTuple::open(out);
        for (p, c) in &e.cells {
            inner.item(out);
            out.push('(');
            repr_bytes(out, p);
            out.push_str(", ");
            repr_cell(out, c);
            out.push(')');
        }
        inner.close(out);
        out.push(')');
    }
    tup.close(out);
    out.push(')');
    Ok(())
}

fn repr_ival(out: &mut String, v: &IVal) {
    match v {
        IVal::Bytes(b) => repr_bytes(out, b),
        IVal::Counter(n) => push_i128(out, *n),
        IVal::Items(items) => {
            let mut tup = ReprTuple::open(out);
            for (p, x) in items {
                tup.item(out);
                out.push('(');
                match p {
                    None => out.push_str("None"),
                    Some(p) => repr_bytes(out, p),
                }
                out.push_str(", ");
                repr_bytes(out, x);
                out.push(')');
            }
            tup.close(out);
        }
    }
}

/// `repr(sorted(img.items()))`.
fn repr_image(out: &mut String, t: &Table, img: &Image) -> D<()> {
    out.push('[');
    for (i, (col, v)) in t.in_name_order(img).enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push('(');
        repr_name(out, t, *col)?;
        out.push_str(", ");
        repr_ival(out, v);
        out.push(')');
    }
    out.push(']');
    Ok(())
}

/// The reprs `events._event_id` hashes, one after the other, written into `s` (`event_id_of` hashes them at once:
/// the same digest as hashing each in turn).
#[allow(clippy::too_many_arguments)]
pub fn event_id_text(t: &Table, pk: &[u8], key: &RowKey, op: u8, ts_us: i64, expired: bool, part: &PartitionState,
                     a_img: Option<&Images>, s: &mut String) -> D<()> {
    if !t.repr_ok {
        return Err(Doubt);
    }
    s.clear();
    s.push('(');
    s.push_str(t.id_repr.as_deref().ok_or(Doubt)?);
    s.push_str(", ");
    repr_bytes(s, pk);
    s.push_str(", ");
    match key {
        None => s.push_str("None"),
        Some(k) => repr_bytes(s, k),
    }
    s.push_str(", '");
    s.push(op as char);
    s.push_str("', ");
    push_i64(s, ts_us);
    s.push_str(if expired { ", True)" } else { ", False)" });
    repr_row_state(s, t, Some(&part.static_row))?;
    repr_del(s, &part.deletion);
    match key {
        Some(k) => {
            repr_row_state(s, t, part.rows.get(k))?;
            push_i64(s, row_shadow_ts(t, part, k)?);
        }
        None => {
            // the static-only row exists or not depending on the partition's clustering rows
            s.push('[');
            for (i, (k, r)) in part.rows.iter().enumerate() {
                if i > 0 {
                    s.push_str(", ");
                }
                s.push('(');
                repr_bytes(s, k);
                s.push_str(", ");
                repr_row_state(s, t, Some(r))?;
                s.push(')');
            }
            s.push(']');
        }
    }
    if let Some((st, row)) = a_img {
        s.push('(');
        repr_image(s, t, st)?;
        s.push_str(", ");
        match row {
            None => s.push_str("None"),
            Some(r) => repr_image(s, t, r)?,
        }
        s.push(')');
    }
    Ok(())
}

/// `events._event_id`: the first 16 bytes (32 hex digits) of SHA-256 over `event_id_text`.
pub fn event_id_of(text: &str) -> [u8; 16] {
    Sha256::digest(text.as_bytes())[..16].try_into().expect("a SHA-256 digest has 32 bytes")
}

// ---------------------------------------------------------------------------------------------------------------
// One partition's batch: changes, the sweep, process_partition

/// `_partition_changes`: one partition's records as changes (one per mutation), in the order they apply.
pub fn partition_changes<'r, 'a>(recs: &'r [Rec<'a>]) -> Vec<(i64, Vec<&'r Rec<'a>>)> {
    if recs.is_empty() {
        return Vec::new();
    }
    let first_mid = recs[0].mid;
    if recs.iter().all(|r| r.mid == first_mid) {
        let wt = recs.iter().map(|r| r.ts).max().unwrap();
        return vec![(wt, recs.iter().collect())];
    }
    let mut groups: Vec<(Option<&[u8]>, Vec<&Rec>)> = Vec::new();
    for r in recs {
        match groups.iter_mut().find(|g| g.0 == r.mid) {
            Some(g) => g.1.push(r),
            None => groups.push((r.mid, vec![r])),
        }
    }
    let mut changes: Vec<(i64, &[u8], Vec<&Rec>)> = groups.into_iter()
        .map(|(mid, g)| (g.iter().map(|r| r.ts).max().unwrap(), mid.unwrap_or(b""), g))
        .collect();
    changes.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)));
    changes.into_iter().map(|(wt, _, g)| (wt, g)).collect()
}

/// `apply_batch` for one partition's (deduplicated) records.
pub fn apply_partition<'a>(em: &Emitter, pk: &[u8], part: &mut PartitionState<'a>, recs: &[Rec<'a>], now: i64,
                           out: &mut Events) -> D<()> {
    let t = em.t;
    for (ts, group) in partition_changes(recs) {
        let whole = group.iter().any(|r| matches!(r.kind, Kind::PartitionDeletion | Kind::RangeTombstone) || r.is_static);
        let mut scope: Vec<&[u8]> = Vec::new();
        if !whole {
            for r in &group {
                if !scope.iter().any(|s| key::eq(s, r.clustering)) {
                    scope.push(r.clustering);
                }
            }
        }
        // the rows in scope (all of them for a whole-partition group), before and after the group: the before
        // images are computed first, so no row has to be copied aside and put back to see them afterwards
        let only = if whole { None } else { Some(&scope[..]) };
        let mut clock = Clock::start();
        let before = partition_images(t, part, now, only)?;
        clock.lap(Phase::MergeImages);
        let mut changed = false;
        for r in &group {
            if apply_record(t, part, r)? != Changed::Nothing {
                changed = true;
            }
        }
        clock.lap(Phase::MergeApply);
        if !changed {
            continue;
        }
        let after = partition_images(t, part, now, only)?;
        clock.lap(Phase::MergeImages);
        // the copy with the smallest (segment id, position, segment) names the source
        let src = group.iter().min_by(|a, b| (a.segment_id, a.position, a.segment).cmp(&(b.segment_id, b.position, b.segment)))
            .unwrap();
        em.diff(pk, part, &before, &after, ts, Some((src.segment, src.position)), false, out)?;
        clock.lap(Phase::MergeEvents);
    }
    Ok(())
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

/// `partition_next_expiry(part, after)`.
pub fn next_expiry(part: &PartitionState, after: i64) -> Option<i64> {
    let mut acc = Vec::new();
    expiries(&part.static_row, after, 1 << 62, &mut acc);
    for row in part.rows.values() {
        expiries(row, after, 1 << 62, &mut acc);
    }
    acc.into_iter().min()
}

/// `expiry_sweep` of one partition over `(now_before, now]`.
pub fn sweep_partition(em: &Emitter, pk: &[u8], part: &PartitionState, now_before: i64, now: i64,
                       out: &mut Events) -> D<()> {
    if now <= now_before {
        return Ok(());
    }
    let mut static_times = Vec::new();
    expiries(&part.static_row, now_before, now, &mut static_times);
    let mut times = static_times.clone();
    let mut row_times: Vec<(&Key, Vec<i64>)> = Vec::new();
    for (ck, row) in &part.rows {
        let mut acc = Vec::new();
        expiries(row, now_before, now, &mut acc);
        if !acc.is_empty() {
            for x in &acc {
                if !times.contains(x) {
                    times.push(*x);
                }
            }
            row_times.push((ck, acc));
        }
    }
    times.sort();
    let mut t_prev = now_before;
    for tm in times {
        let only: Option<Vec<&[u8]>> = if static_times.contains(&tm) {
            None
        } else {
            Some(row_times.iter().filter(|(_, acc)| acc.contains(&tm)).map(|(ck, _)| &ck.0[..]).collect())
        };
        let before = partition_images(em.t, part, t_prev, only.as_deref())?;
        let after = partition_images(em.t, part, tm, only.as_deref())?;
        em.diff(pk, part, &before, &after, tm * 1_000_000, None, true, out)?;
        t_prev = tm;
    }
    Ok(())
}

