//! The MERGE source rows of the changed partitions, as `sinks.delta.change_rows` makes them: for every stored
//! record of a partition's new state (its partition record, static row and clustering rows) the typed CQL columns
//! of its visible row (`sinks.delta.arrow_type`/`to_arrow_value`) and the `_cdc_*` metadata that holds the row
//! state exactly, and a deleting row for each record its stored state had and the new one has not.
//!
//! The typed columns' Arrow types depend on the table (`out::Out`, built by `out::arrow_value`); the metadata's
//! do not, so each metadata column is a builder of its own type, appended to without a type check per value.

use crate::columns::Bits;

use super::engine::{self, Cell, PartitionState, RowState, StoredShape, NO_DELETION_TIME};
use super::events::partition_key_parts;
use super::images::{ImageSet, Img, IV};
use super::out::{arrow_complex, arrow_value, builder, Out, Validity};
use super::partition::next_expiry;
use super::table::{ColId, Role, Table};
use super::types::{Doubt, D};

// ---- builders of one Arrow type each ---------------------------------------------------------------------------

/// A binary or string column.
pub struct VarCol {
    offsets: Vec<i32>,
    data: Vec<u8>,
    valid: Validity,
}

impl Default for VarCol {
    fn default() -> VarCol {
        VarCol { offsets: vec![0], data: Vec::new(), valid: Validity::default() }
    }
}

impl VarCol {
    #[inline]
    pub fn push(&mut self, b: &[u8]) {
        crate::columns::append(&mut self.data, b);
        self.offsets.push(self.data.len() as i32);
        self.valid.push(true);
    }

    #[inline]
    pub fn null(&mut self) {
        self.offsets.push(self.data.len() as i32);
        self.valid.push(false);
    }

    #[inline]
    pub fn opt(&mut self, b: Option<&[u8]>) {
        match b {
            Some(b) => self.push(b),
            None => self.null(),
        }
    }

    fn truncate(&mut self, n: usize) {
        if n < self.valid.len() {
            self.offsets.truncate(n + 1);
            self.data.truncate(self.offsets[n] as usize);
            self.valid.truncate(n);
        }
    }

    fn reserve_scaled(&mut self, factor: f64) {
        let more = |n: usize| (n as f64 * factor) as usize;
        self.offsets.reserve(more(self.offsets.len()));
        self.data.reserve(more(self.data.len()));
        self.valid.reserve(more(self.valid.len()));
    }

    fn overflowed(&self) -> bool {
        self.data.len() > i32::MAX as usize
    }

    fn into_out(self) -> Out {
        Out::Var { offsets: self.offsets, data: self.data, valid: self.valid }
    }
}

/// A fixed-width column's value type.
pub trait Fixed: Copy + Default {
    fn out(v: Vec<Self>, valid: Validity) -> Out;
}

impl Fixed for i64 {
    fn out(v: Vec<i64>, valid: Validity) -> Out {
        Out::I64 { v, valid }
    }
}

impl Fixed for i32 {
    fn out(v: Vec<i32>, valid: Validity) -> Out {
        Out::I32 { v, valid }
    }
}

/// A fixed-width column; as `Out`'s, its nulls after the last value are written only if a value follows them.
#[derive(Default)]
pub struct FixedCol<T> {
    v: Vec<T>,
    valid: Validity,
}

impl<T: Fixed> FixedCol<T> {
    #[inline]
    pub fn push(&mut self, x: T) {
        if self.v.len() < self.valid.len() {
            self.v.resize(self.valid.len(), T::default());
        }
        self.v.push(x);
        self.valid.push(true);
    }

    #[inline]
    pub fn null(&mut self) {
        self.valid.push(false);
    }

    #[inline]
    pub fn opt(&mut self, x: Option<T>) {
        match x {
            Some(x) => self.push(x),
            None => self.null(),
        }
    }

    fn truncate(&mut self, n: usize) {
        self.v.truncate(n);
        self.valid.truncate(n);
    }

    fn reserve_scaled(&mut self, factor: f64) {
        let more = |n: usize| (n as f64 * factor) as usize;
        self.v.reserve(more(self.v.len()));
        self.valid.reserve(more(self.valid.len()));
    }

    fn into_out(self) -> Out {
        T::out(self.v, self.valid)
    }
}

/// A boolean column.
#[derive(Default)]
pub struct BoolCol {
    v: Bits,
    valid: Validity,
}

impl BoolCol {
    #[inline]
    pub fn push(&mut self, x: bool) {
        self.v.push(x);
        self.valid.push(true);
    }

    #[inline]
    pub fn null(&mut self) {
        self.v.push(false);
        self.valid.push(false);
    }

    fn truncate(&mut self, n: usize) {
        self.v.truncate(n);
        self.valid.truncate(n);
    }

    fn reserve_scaled(&mut self, factor: f64) {
        let more = |n: usize| (n as f64 * factor) as usize;
        self.v.reserve(more(self.v.len));
        self.valid.reserve(more(self.valid.len()));
    }

    fn into_out(self) -> Out {
        Out::Bool { v: self.v, valid: self.valid }
    }
}

/// A list column's offsets and validity (its items are a struct's columns, kept by the caller).
pub struct ListOffsets {
    offsets: Vec<i32>,
    valid: Validity,
}

impl Default for ListOffsets {
    fn default() -> ListOffsets {
        ListOffsets { offsets: vec![0], valid: Validity::default() }
    }
}

impl ListOffsets {
    /// Close an entry: the items up to `items`.
    #[inline]
    fn end(&mut self, items: usize) {
        self.offsets.push(items as i32);
        self.valid.push(true);
    }

    #[inline]
    fn null(&mut self) {
        self.offsets.push(*self.offsets.last().expect("offsets start at 0"));
        self.valid.push(false);
    }

    /// Keep the first `n` entries; how many items they hold.
    fn truncate(&mut self, n: usize) -> usize {
        if n < self.valid.len() {
            self.offsets.truncate(n + 1);
            self.valid.truncate(n);
        }
        self.offsets[self.offsets.len() - 1] as usize
    }

    fn reserve_scaled(&mut self, factor: f64) {
        let more = |n: usize| (n as f64 * factor) as usize;
        self.offsets.reserve(more(self.offsets.len()));
        self.valid.reserve(more(self.valid.len()));
    }

    fn overflowed(&self, items: usize) -> bool {
        items > i32::MAX as usize
    }

    /// The list as Arrow wants it: `items` the struct of its items' columns (with the items' own validity).
    fn into_out(self, items: Validity, children: Vec<Out>) -> Out {
        Out::List { offsets: self.offsets, valid: self.valid,
                    child: Box::new(Out::Struct { valid: items, children }) }
    }
}

// ---- the list columns of the metadata --------------------------------------------------------------------------

/// `_cdc_cells`: list of (column, path, value, ts, ttl, ldt, tombstone).
#[derive(Default)]
struct CellsCol {
    list: ListOffsets,
    items: Validity,
    column: VarCol,
    path: VarCol,
    value: VarCol,
    ts: FixedCol<i64>,
    ttl: FixedCol<i32>,
    ldt: FixedCol<i64>,
    tomb: BoolCol,
}

impl CellsCol {
    #[inline]
    fn push(&mut self, name: &str, path: Option<&[u8]>, c: &Cell) {
        self.column.push(name.as_bytes());
        self.path.opt(path);
        self.value.push(&c.value);
        self.ts.push(c.ts);
        self.ttl.push(c.ttl);
        self.ldt.push(c.ldt);
        self.tomb.push(c.tomb);
        self.items.push(true);
    }

    fn truncate(&mut self, n: usize) {
        let m = self.list.truncate(n);
        self.items.truncate(m);
        self.column.truncate(m);
        self.path.truncate(m);
        self.value.truncate(m);
        self.ts.truncate(m);
        self.ttl.truncate(m);
        self.ldt.truncate(m);
        self.tomb.truncate(m);
    }

    fn reserve_scaled(&mut self, f: f64) {
        self.list.reserve_scaled(f);
        self.items.reserve((self.items.len() as f64 * f) as usize);
        self.column.reserve_scaled(f);
        self.path.reserve_scaled(f);
        self.value.reserve_scaled(f);
        self.ts.reserve_scaled(f);
        self.ttl.reserve_scaled(f);
        self.ldt.reserve_scaled(f);
        self.tomb.reserve_scaled(f);
    }

    fn overflowed(&self) -> bool {
        self.list.overflowed(self.items.len())
            || [&self.column, &self.path, &self.value].iter().any(|c| c.overflowed())
    }

    fn into_out(self) -> Out {
        let children = vec![self.column.into_out(), self.path.into_out(), self.value.into_out(), self.ts.into_out(),
                            self.ttl.into_out(), self.ldt.into_out(), self.tomb.into_out()];
        self.list.into_out(self.items, children)
    }
}

/// `_cdc_complex_deletions`: list of (column, ts, ldt).
#[derive(Default)]
struct ComplexDeletionsCol {
    list: ListOffsets,
    items: Validity,
    column: VarCol,
    ts: FixedCol<i64>,
    ldt: FixedCol<i64>,
}

impl ComplexDeletionsCol {
    fn push(&mut self, name: &str, ts: i64, ldt: i64) {
        self.column.push(name.as_bytes());
        self.ts.push(ts);
        self.ldt.push(ldt);
        self.items.push(true);
    }

    fn truncate(&mut self, n: usize) {
        let m = self.list.truncate(n);
        self.items.truncate(m);
        self.column.truncate(m);
        self.ts.truncate(m);
        self.ldt.truncate(m);
    }

    fn reserve_scaled(&mut self, f: f64) {
        self.list.reserve_scaled(f);
        self.items.reserve((self.items.len() as f64 * f) as usize);
        self.column.reserve_scaled(f);
        self.ts.reserve_scaled(f);
        self.ldt.reserve_scaled(f);
    }

    fn overflowed(&self) -> bool {
        self.list.overflowed(self.items.len()) || self.column.overflowed()
    }

    fn into_out(self) -> Out {
        let children = vec![self.column.into_out(), self.ts.into_out(), self.ldt.into_out()];
        self.list.into_out(self.items, children)
    }
}

/// `_cdc_range_tombstones`: list of (start, start_inclusive, end, end_inclusive, ts, ldt).
#[derive(Default)]
struct RangeTombstonesCol {
    list: ListOffsets,
    items: Validity,
    start: VarCol,
    start_incl: BoolCol,
    end: VarCol,
    end_incl: BoolCol,
    ts: FixedCol<i64>,
    ldt: FixedCol<i64>,
}

impl RangeTombstonesCol {
    fn push(&mut self, (s, si, e, ei): (&[u8], bool, &[u8], bool), (ts, ldt): (i64, i64)) {
        self.start.push(s);
        self.start_incl.push(si);
        self.end.push(e);
        self.end_incl.push(ei);
        self.ts.push(ts);
        self.ldt.push(ldt);
        self.items.push(true);
    }

    fn truncate(&mut self, n: usize) {
        let m = self.list.truncate(n);
        self.items.truncate(m);
        self.start.truncate(m);
        self.start_incl.truncate(m);
        self.end.truncate(m);
        self.end_incl.truncate(m);
        self.ts.truncate(m);
        self.ldt.truncate(m);
    }

    fn reserve_scaled(&mut self, f: f64) {
        self.list.reserve_scaled(f);
        self.items.reserve((self.items.len() as f64 * f) as usize);
        self.start.reserve_scaled(f);
        self.start_incl.reserve_scaled(f);
        self.end.reserve_scaled(f);
        self.end_incl.reserve_scaled(f);
        self.ts.reserve_scaled(f);
        self.ldt.reserve_scaled(f);
    }

    fn overflowed(&self) -> bool {
        self.list.overflowed(self.items.len()) || self.start.overflowed() || self.end.overflowed()
    }

    fn into_out(self) -> Out {
        let children = vec![self.start.into_out(), self.start_incl.into_out(), self.end.into_out(),
                            self.end_incl.into_out(), self.ts.into_out(), self.ldt.into_out()];
        self.list.into_out(self.items, children)
    }
}

// ---- the rows --------------------------------------------------------------------------------------------------

/// Builders of `merge_source_schema(table)`: the typed columns (`Table.value_cols`), then the metadata.
pub struct StateRows {
    pub n: usize,
    typed: Vec<Out>,
    partition_key: VarCol,
    row_kind: VarCol,
    clustering: VarCol,
    liveness_ts: FixedCol<i64>,
    liveness_ttl: FixedCol<i32>,
    liveness_ldt: FixedCol<i64>,
    deletion_ts: FixedCol<i64>,
    deletion_ldt: FixedCol<i64>,
    shadowable_ts: FixedCol<i64>,
    shadowable_ldt: FixedCol<i64>,
    cells: CellsCol,
    complex_deletions: ComplexDeletionsCol,
    range_tombstones: RangeTombstonesCol,
    token: FixedCol<i64>,
    live: BoolCol,
    next_expiry: FixedCol<i64>,
    updated_batch: FixedCol<i64>,
    oldest_deletion: FixedCol<i64>,
    delete: BoolCol,
}

impl StateRows {
    pub fn new(t: &Table) -> StateRows {
        StateRows {
            n: 0,
            typed: t.value_cols.iter().map(|c| builder(t.c(*c).ty.as_ref().expect("typed column"))).collect(),
            partition_key: VarCol::default(),
            row_kind: VarCol::default(),
            clustering: VarCol::default(),
            liveness_ts: FixedCol::default(),
            liveness_ttl: FixedCol::default(),
            liveness_ldt: FixedCol::default(),
            deletion_ts: FixedCol::default(),
            deletion_ldt: FixedCol::default(),
            shadowable_ts: FixedCol::default(),
            shadowable_ldt: FixedCol::default(),
            cells: CellsCol::default(),
            complex_deletions: ComplexDeletionsCol::default(),
            range_tombstones: RangeTombstonesCol::default(),
            token: FixedCol::default(),
            live: BoolCol::default(),
            next_expiry: FixedCol::default(),
            updated_batch: FixedCol::default(),
            oldest_deletion: FixedCol::default(),
            delete: BoolCol::default(),
        }
    }

    /// Room for `factor` times what the columns hold now: a run's columns sized from its first partitions,
    /// instead of growing by doubling, which copies every buffer and touches fresh pages again at each step.
    pub fn reserve_scaled(&mut self, f: f64) {
        for o in self.typed.iter_mut() {
            o.reserve_scaled(f);
        }
        for c in [&mut self.partition_key, &mut self.row_kind, &mut self.clustering] {
            c.reserve_scaled(f);
        }
        for c in [&mut self.liveness_ts, &mut self.liveness_ldt, &mut self.deletion_ts, &mut self.deletion_ldt,
                  &mut self.shadowable_ts, &mut self.shadowable_ldt, &mut self.token, &mut self.next_expiry,
                  &mut self.updated_batch, &mut self.oldest_deletion] {
            c.reserve_scaled(f);
        }
        self.liveness_ttl.reserve_scaled(f);
        self.cells.reserve_scaled(f);
        self.complex_deletions.reserve_scaled(f);
        self.range_tombstones.reserve_scaled(f);
        self.live.reserve_scaled(f);
        self.delete.reserve_scaled(f);
    }

    /// Whether a 32-bit offset overflowed (the caller then hands the table to the Python engine).
    pub fn overflowed(&self) -> bool {
        self.typed.iter().any(|o| o.overflowed())
            || [&self.partition_key, &self.row_kind, &self.clustering].iter().any(|c| c.overflowed())
            || self.cells.overflowed() || self.complex_deletions.overflowed() || self.range_tombstones.overflowed()
    }

    /// Drop the rows after the first `n` (what a doubted partition appended, rows it completed or not): every
    /// complete row has an entry in every column.
    pub fn truncate(&mut self, n: usize) {
        self.n = n;
        for o in self.typed.iter_mut() {
            o.truncate(n);
        }
        for c in [&mut self.partition_key, &mut self.row_kind, &mut self.clustering] {
            c.truncate(n);
        }
        for c in [&mut self.liveness_ts, &mut self.liveness_ldt, &mut self.deletion_ts, &mut self.deletion_ldt,
                  &mut self.shadowable_ts, &mut self.shadowable_ldt, &mut self.token, &mut self.next_expiry,
                  &mut self.updated_batch, &mut self.oldest_deletion] {
            c.truncate(n);
        }
        self.liveness_ttl.truncate(n);
        self.cells.truncate(n);
        self.complex_deletions.truncate(n);
        self.range_tombstones.truncate(n);
        self.live.truncate(n);
        self.delete.truncate(n);
    }

    /// Every column, in `merge_source_schema` order.
    pub fn columns(self) -> Vec<Out> {
        let mut v = self.typed;
        v.extend([self.partition_key.into_out(), self.row_kind.into_out(), self.clustering.into_out(),
                  self.liveness_ts.into_out(), self.liveness_ttl.into_out(), self.liveness_ldt.into_out(),
                  self.deletion_ts.into_out(), self.deletion_ldt.into_out(), self.shadowable_ts.into_out(),
                  self.shadowable_ldt.into_out(), self.cells.into_out(), self.complex_deletions.into_out(),
                  self.range_tombstones.into_out(), self.token.into_out(), self.live.into_out(),
                  self.next_expiry.into_out(), self.updated_batch.into_out(), self.oldest_deletion.into_out(),
                  self.delete.into_out()]);
        v
    }

    /// The metadata of one stored record (`partition_to_records`): its kind, clustering, row state.
    fn meta(&mut self, t: &Table, pk: &[u8], kind: &str, ck: &[u8], row: Option<&RowState>,
            part_del: Option<&PartitionState>) {
        self.partition_key.push(pk);
        self.row_kind.push(kind.as_bytes());
        self.clustering.push(ck);
        match row {
            Some(r) => {
                self.liveness_ts.opt(r.liveness.map(|l| l.0));
                self.liveness_ttl.opt(r.liveness.map(|l| l.1));
                self.liveness_ldt.opt(r.liveness.map(|l| l.2));
                self.deletion_ts.opt(r.deletion.map(|d| d.0));
                self.deletion_ldt.opt(r.deletion.map(|d| d.1));
                self.shadowable_ts.opt(r.shadowable.map(|d| d.0));
                self.shadowable_ldt.opt(r.shadowable.map(|d| d.1));
                // simple cells by column name, then each complex column (by name): its deletion, its cells by path
                for (col, c) in t.in_name_order(&r.cells) {
                    self.cells.push(t.name_of(*col), None, c);
                }
                for (col, e) in t.in_name_order(&r.complex) {
                    if let Some(d) = e.del {
                        self.complex_deletions.push(t.name_of(*col), d.0, d.1);
                    }
                    for (p, c) in &e.cells {
                        self.cells.push(t.name_of(*col), Some(p), c);
                    }
                }
            }
            None => {
                self.liveness_ts.null();
                self.liveness_ttl.null();
                self.liveness_ldt.null();
                let d = part_del.and_then(|p| p.deletion);
                self.deletion_ts.opt(d.map(|d| d.0));
                self.deletion_ldt.opt(d.map(|d| d.1));
                self.shadowable_ts.null();
                self.shadowable_ldt.null();
            }
        }
        self.cells.list.end(self.cells.items.len());
        self.complex_deletions.list.end(self.complex_deletions.items.len());
        if let Some(p) = part_del {
            for (rk, d) in &p.rts {
                self.range_tombstones.push(*rk, *d);
            }
        }
        self.range_tombstones.list.end(self.range_tombstones.items.len());
    }

    /// The typed columns of one record: the partition key always; for a visible row every column of its CQL
    /// row; for a row that is not visible its clustering; null elsewhere.
    fn typed_row(&mut self, t: &Table, pk: &[u8], ck: &[u8], imgs: Option<Img>, keyed: bool) -> D<()> {
        let cl = if ck.is_empty() { Vec::new() } else { engine::decode_clustering(ck) };
        let mut parts = partition_key_parts(t, pk);
        for (i, col) in t.value_cols.iter().enumerate() {
            let c = t.c(*col);
            let ty = c.ty.as_ref().ok_or(Doubt)?;
            let o = &mut self.typed[i];
            match c.role {
                // the key columns come first, in key order
                Role::PartitionKey => arrow_value(o, ty, Some(parts.next().ok_or(Doubt)?))?,
                Role::Clustering => {
                    if imgs.is_some() || keyed {
                        arrow_value(o, ty, cl.get(i - t.pk.len()).copied().flatten())?;
                    } else {
                        o.null();
                    }
                }
                role => match imgs.and_then(|im| im.get(role == Role::Static, *col).map(|v| (v, im.items))) {
                    None => o.null(),
                    Some((IV::Bytes(b), _)) => arrow_value(o, ty, Some(b))?,
                    Some((IV::Counter(total), _)) => o.i64(i64::try_from(*total).map_err(|_| Doubt)?),
                    Some((IV::Items(s, e), items)) => arrow_complex(o, ty, &items[*s as usize..*e as usize])?,
                },
            }
        }
        Ok(())
    }

    fn tail(&mut self, token: i64, live: bool, next_expiry: Option<i64>, batch_seq: i64, oldest: i64) {
        self.token.push(token);
        self.live.push(live);
        self.next_expiry.opt(next_expiry);
        self.updated_batch.push(batch_seq);
        self.oldest_deletion.push(oldest);
        self.delete.push(false);
        self.n += 1;
    }

    /// `change_rows(table, pk, prior, new, now, batch_seq, token)`; `images`: every visible row of `part` at
    /// `now` (`partition_images(table, part, now, None)`).
    #[allow(clippy::too_many_arguments)]
    pub fn change_rows(&mut self, t: &Table, pk: &[u8], token: i64, prior: Option<&StoredShape>,
                       part: &PartitionState, images: &ImageSet, now: i64, batch_seq: i64) -> D<()> {
        let next = next_expiry(part, now);
        let partition_record = part.deletion.is_some() || !part.rts.is_empty();
        if partition_record {
            self.typed_row(t, pk, b"", None, false)?;
            self.meta(t, pk, "partition", b"", None, Some(part));
            self.tail(token, false, next, batch_seq, oldest_deletion(t, None, Some(part)));
        }
        if !part.static_row.is_empty() {
            let imgs = images.get(None);
            self.typed_row(t, pk, b"", imgs, false)?;
            self.meta(t, pk, "static", b"", Some(&part.static_row), None);
            self.tail(token, imgs.is_some(), next, batch_seq, oldest_deletion(t, Some(&part.static_row), None));
        }
        // the rows' images in the same key order as the rows
        let mut row_images = images.rows.iter().peekable();
        for (ck, row) in part.rows.iter() {
            while row_images.next_if(|(k, _)| *k < ck).is_some() {}
            let imgs = row_images.next_if(|(k, _)| *k == ck).map(|&(_, s)| images.img(s));
            self.typed_row(t, pk, &ck, imgs, true)?;
            self.meta(t, pk, "row", &ck, Some(row), None);
            self.tail(token, imgs.is_some(), next, batch_seq, oldest_deletion(t, Some(row), None));
        }
        if let Some(prior) = prior {
            // the prior's records the new state no longer has: deleted from the table
            if prior.partition_record && !partition_record {
                self.gone(pk, token, "partition", b"");
            }
            if prior.static_row && part.static_row.is_empty() {
                self.gone(pk, token, "static", b"");
            }
            for ck in &prior.rows {
                if part.rows.get(ck).is_none() {
                    self.gone(pk, token, "row", ck);
                }
            }
        }
        Ok(())
    }

    /// The MERGE source row deleting a stored record (`_cdc_delete`).
    fn gone(&mut self, pk: &[u8], token: i64, kind: &str, ck: &[u8]) {
        for o in self.typed.iter_mut() {
            o.null();
        }
        self.partition_key.push(pk);
        self.row_kind.push(kind.as_bytes());
        self.clustering.push(ck);
        for c in [&mut self.liveness_ts, &mut self.liveness_ldt, &mut self.deletion_ts, &mut self.deletion_ldt,
                  &mut self.shadowable_ts, &mut self.shadowable_ldt, &mut self.next_expiry, &mut self.updated_batch,
                  &mut self.oldest_deletion] {
            c.null();
        }
        self.liveness_ttl.null();
        self.cells.list.null();
        self.complex_deletions.list.null();
        self.range_tombstones.list.null();
        self.live.null();
        self.token.push(token);
        self.delete.push(true);
        self.n += 1;
    }
}

/// `state.purge.oldest_deletion_time` of one stored record (a row's, or the partition record's): the earliest
/// time from which `gc_grace_seconds` counts for anything in it, `DROPPED_DATA` (0) when it holds data of a
/// dropped column written at or before the drop.
fn oldest_deletion(t: &Table, row: Option<&RowState>, part: Option<&PartitionState>) -> i64 {
    const DROPPED_DATA: i64 = 0;
    let mut oldest: Option<i64> = None;
    let mut see = |x: i64| oldest = Some(oldest.map_or(x, |o| o.min(x)));
    if let Some(r) = row {
        let hidden = |col: ColId, ts: i64| t.c(col).drop_time.is_some_and(|d| ts <= d);
        if r.cells.iter().any(|(c, cell)| hidden(*c, cell.ts))
            || r.complex.iter().any(|(c, e)| e.del.is_some_and(|d| hidden(*c, d.0))
                || e.cells.values().any(|cell| hidden(*c, cell.ts))) {
            return DROPPED_DATA;
        }
        if let Some(d) = r.deletion {
            see(d.1);
        }
        if let Some(d) = r.shadowable {
            see(d.1);
        }
        if let Some(l) = r.liveness {
            if l.1 != 0 {
                see(l.2);
            }
        }
        let cell_time = |c: &Cell| {
            if c.tomb {
                Some(c.ldt)
            } else if c.ttl != 0 {
                Some(c.ldt - c.ttl as i64)
            } else {
                None
            }
        };
        for (_, c) in &r.cells {
            if let Some(x) = cell_time(c) {
                see(x);
            }
        }
        for (_, e) in &r.complex {
            for c in e.cells.values() {
                if let Some(x) = cell_time(c) {
                    see(x);
                }
            }
            if let Some(d) = e.del {
                see(d.1);
            }
        }
    }
    if let Some(p) = part {
        if let Some(d) = p.deletion {
            see(d.1);
        }
        for (_, d) in &p.rts {
            see(d.1);
        }
    }
    oldest.unwrap_or(NO_DELETION_TIME)
}
