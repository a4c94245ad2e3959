//! Change events, as `cdc_lib.state.events` and `sinks.delta.outbox_row` make them: one per row whose images
//! differ across a change, with its JSON envelope (full `before` and `after` rows), its key JSON and its id (the
//! first half of a SHA-256 over the canonical encoding of the change and the row's state that `events._event_id`
//! hashes). Written straight into the outbox's Arrow columns (`out::Events`).

use std::cmp::Ordering;

use super::engine::{compare_clustering, decode_clustering, row_shadow_ts, Cell, Del, PartitionState, RowState};
use super::images::{in_path_order, ImageSet, Img, Item, RowKey, IV};
use super::out::{Events, PendingId};
use super::phases::{Clock, Phase};
use super::table::{ColId, Role, Table};
use super::text::{hex_into, json_str, push_i128, push_i64, push_text};
use super::types::{self, Doubt, Ty, D};

/// What the caller gives every event: who and when.
pub struct EventCtx<'a> {
    pub cluster: &'a str,
    pub node: &'a str,
    pub ts_ms: i64,
}

/// `_Emitter.ordered`: the static-only row first, then the clustering rows in clustering order. `keys` come in
/// the order of their bytes (the static-only row first); rows that compare equal with different bytes have no
/// defined order in Python (a set's), here they keep that one.
fn order_keys(t: &Table, keys: &mut [RowKey]) -> D<()> {
    let rest = match keys.first() {
        Some(None) => &mut keys[1..],
        _ => keys,
    };
    if rest.len() <= 1 {
        return Ok(());
    }
    let mut err = None;
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
    match err {
        Some(d) => Err(d),
        None => Ok(()),
    }
}

pub struct Emitter<'a> {
    pub t: &'a Table,
    pub ctx: &'a EventCtx<'a>,
    /// what every event's JSON envelope holds between its `after` row and its segment: the source's constant
    /// fields (`,"source":{"connector":...,"table":...,"segment":`)
    source_prefix: String,
    /// what it holds between its write time and its id, by `expired` and op (c, u, d):
    /// `,"expired":...,"snapshot":false},"op":"u","ts_ms":...,"id":"`
    id_prefix: [[String; 3]; 2],
    /// each non-key column of the rows, in the order they follow the key columns (`value_cols`: by name, which is
    /// by id), with `,` and its JSON key, and whether it is static
    row_cols: Vec<(ColId, String, bool)>,
    /// SHA-256 over what every event id of the table starts with (`event_id_input`'s tag and table id): a block
    /// hashed once instead of for each event
    id_hasher: crate::sha256::Prefixed,
}

impl<'a> Emitter<'a> {
    pub fn new(t: &'a Table, ctx: &'a EventCtx<'a>) -> Emitter<'a> {
        let mut source_prefix = String::from(",\"source\":{\"connector\":\"cassandra-cdc\",\"cluster\":");
        json_str(&mut source_prefix, ctx.cluster);
        source_prefix.push_str(",\"node\":");
        json_str(&mut source_prefix, ctx.node);
        source_prefix.push_str(&t.source_names_json);
        source_prefix.push_str(",\"segment\":");
        let id_prefix = [false, true].map(|expired| [b'c', b'u', b'd'].map(|op| {
            let mut s = format!(",\"expired\":{expired},\"snapshot\":false}},\"op\":\"{}\",\"ts_ms\":", op as char);
            push_i64(&mut s, ctx.ts_ms);
            s.push_str(",\"id\":\"");
            s
        }));
        let row_cols: Vec<(ColId, String, bool)> = t.value_cols[t.pk.len() + t.ck.len()..].iter().map(|col| {
            let c = t.c(*col);
            (*col, format!(",{}", c.json_key), c.role == Role::Static)
        }).collect();
        debug_assert!(row_cols.windows(2).all(|w| w[0].0 < w[1].0), "current columns' ids follow their names");
        let mut prefix = Vec::new();
        id_input_prefix(t, &mut prefix);
        Emitter { t, ctx, source_prefix, id_prefix, row_cols, id_hasher: crate::sha256::Prefixed::new(&prefix) }
    }

    /// `_Emitter.diff`: one event per row whose images differ, rows in clustering order. `keys`: room for the
    /// rows' keys.
    #[allow(clippy::too_many_arguments)]
    pub fn diff<'x>(&self, pk: &[u8], part: &PartitionState, before: &ImageSet<'x>, after: &ImageSet<'x>, ts_us: i64,
                    source: Option<(&[u8], i64)>, expired: bool, out: &mut Events, keys: &mut Vec<RowKey<'x>>)
                    -> D<()> {
        // the keys of both sets: the rows before (in key order), then those that only show after
        keys.clear();
        keys.extend(before.iter().map(|(k, _)| k));
        let n = keys.len();
        if after.static_only && !before.static_only {
            keys.push(None);
        }
        for &(ck, _) in &after.rows {
            if before.rows.binary_search_by(|r| r.0.cmp(&ck)).is_err() {
                keys.push(Some(ck));
            }
        }
        if keys.len() > n {
            // the static-only row first, the others as Python's stable sort of `set(before) | set(after)` would
            // leave them: before's, then after's
            if let Some(i) = keys[n..].iter().position(|k| k.is_none()) {
                keys[..=n + i].rotate_right(1);
            }
        }
        order_keys(self.t, keys)?;
        for &key in keys.iter() {
            let b = before.get(key);
            let a = after.get(key);
            if a == b {
                continue;
            }
            self.event(pk, part, key, b, a, ts_us, source, expired, out)?;
        }
        Ok(())
    }

    /// One event, written into `out`'s columns (the caller drops what a doubted partition wrote).
    #[allow(clippy::too_many_arguments)]
    fn event(&self, pk: &[u8], part: &PartitionState, key: RowKey, b: Option<Img>, a: Option<Img>, ts_us: i64,
             source: Option<(&[u8], i64)>, expired: bool, out: &mut Events) -> D<()> {
        let t = self.t;
        let op = if b.is_none() { b'c' } else if a.is_none() { b'd' } else { b'u' };
        let mut clock = Clock::start();
        event_id_input(t, pk, key, op, ts_us, expired, part, a, &mut out.scratch)?;
        clock.lap(Phase::EventsIdText);
        // ids are hashed two at a time (`sha256::Prefixed::digest16_pair`): the first of a pair waits, its digits
        // written as zeros until the second's event comes (`out::Events::pending_id`)
        let waits = out.pending_id.is_none();
        let hex = if waits {
            [b'0'; 32]
        } else {
            let (first, second) = self.id_hasher.digest16_pair(&out.pending_input, &out.scratch);
            out.fill_pending_id(&hex_id(&first));
            hex_id(&second)
        };
        clock.lap(Phase::EventsIdHash);
        // SAFETY: hex digits
        let hex = unsafe { std::str::from_utf8_unchecked(&hex) };
        let id_at = out.event_id.data_len();
        out.event_id.push_str_with(|id| {
            push_text(id, hex);
            Ok(())
        })?;
        // the key columns' JSON once: the key JSON's, and the first columns of both rows
        let key_text = &mut out.key_text;
        key_text.clear();
        key_columns_json(key_text, t, pk, key)?;
        let key_text = &out.key_text;
        let segments = &mut out.segments;
        let mut json_at = 0;
        out.event_json.push_str_with(|ej| {
            self.event_json(ej, key_text, b, a, ts_us, source, expired, op, hex, segments, &mut json_at)
        })?;
        clock.lap(Phase::EventsJson);
        out.key_json.push_str_with(|kj| {
            kj.push('{');
            push_text(kj, key_text);
            kj.push('}');
            Ok(())
        })?;
        clock.lap(Phase::EventsKey);
        out.push_partition_columns(pk, op, ts_us);
        if waits {
            out.pending_id = Some(PendingId { event: out.len() - 1, id_at, json_at });
            std::mem::swap(&mut out.scratch, &mut out.pending_input);
        }
        Ok(())
    }

    /// The id of the event still waiting for a second to be hashed with, hashed alone: at the end of a run.
    pub fn finish_ids(&self, out: &mut Events) {
        if out.pending_id.is_some() {
            let digest = self.id_hasher.digest16(&out.pending_input);
            out.fill_pending_id(&hex_id(&digest));
        }
    }

    /// `json.dumps(to_json_row(table, typed_row(...)))` or null; `key_text`: the key columns'
    /// (`key_columns_json`).
    fn row_json(&self, out: &mut String, key_text: &str, imgs: Option<Img>) -> D<()> {
        let Some(img) = imgs else {
            out.push_str("null");
            return Ok(());
        };
        out.push('{');
        push_text(out, key_text);
        // the other columns follow the key's in `value_cols`, by id as the images are: each image walked once
        let (row, mut at) = (img.row.unwrap_or(&[]), [0usize; 2]);
        for (col, json_key, in_static) in &self.row_cols {
            push_text(out, json_key);
            let (vals, i) = if *in_static { (img.stat, &mut at[0]) } else { (row, &mut at[1]) };
            while *i < vals.len() && vals[*i].0 < *col {
                *i += 1;
            }
            match vals.get(*i).filter(|v| v.0 == *col) {
                None => out.push_str("null"),
                Some((_, v)) => ival_json(out, self.t.c(*col).ty.as_ref().ok_or(Doubt)?, v, img.items)?,
            }
        }
        out.push('}');
        Ok(())
    }

    /// The event's JSON envelope (`outbox_row`'s `event_json`).
    #[allow(clippy::too_many_arguments)]
    fn event_json(&self, ej: &mut String, key_text: &str, b: Option<Img>, a: Option<Img>, ts_us: i64,
                  source: Option<(&[u8], i64)>, expired: bool, op: u8, hex: &str, segments: &mut SegmentJson,
                  id_at: &mut usize) -> D<()> {
        let t = self.t;
        ej.push_str("{\"before\":");
        self.row_json(ej, key_text, b)?;
        ej.push_str(",\"after\":");
        self.row_json(ej, key_text, a)?;
        push_text(ej, &self.source_prefix);
        match source {
            Some((seg, _)) => segment_json(ej, seg, segments)?,
            None => ej.push_str("null"),
        }
        ej.push_str(",\"position\":");
        match source {
            Some((_, pos)) => push_i64(ej, pos),
            None => ej.push_str("null"),
        }
        ej.push_str(",\"ts_us\":");
        push_i64(ej, ts_us);
        let op_index = match op {
            b'c' => 0,
            b'u' => 1,
            _ => 2,
        };
        push_text(ej, &self.id_prefix[expired as usize][op_index]);
        *id_at = ej.len();
        push_text(ej, hex);
        ej.push_str("\",\"changed\":[");
        let mut first = true;
        for &(col, kind) in &t.change_plan {
            let differs = match kind {
                0 => b.is_none() || a.is_none(),
                _ => {
                    let in_static = kind == 1;
                    let x = b.and_then(|i| i.get(in_static, col).map(|v| (v, i.items)));
                    let y = a.and_then(|i| i.get(in_static, col).map(|v| (v, i.items)));
                    match (x, y) {
                        (None, None) => false,
                        (Some((x, xi)), Some((y, yi))) => !super::images::iv_eq(x, xi, y, yi),
                        _ => true,
                    }
                }
            };
            if differs {
                if !first {
                    ej.push(',');
                }
                first = false;
                push_text(ej, t.json_name(col));
            }
        }
        ej.push_str("]}");
        Ok(())
    }
}

/// The JSON string of the last segment name an event named: a thread's events name a few segments, each many
/// times in a row.
#[derive(Default)]
pub struct SegmentJson {
    name: Vec<u8>,
    json: String,
}

/// Segment name `seg` as a JSON string (Doubt: not UTF-8).
fn segment_json(out: &mut String, seg: &[u8], last: &mut SegmentJson) -> D<()> {
    if last.json.is_empty() || !super::key::eq(&last.name, seg) {
        last.json.clear();
        json_str(&mut last.json, std::str::from_utf8(seg).map_err(|_| Doubt)?);
        last.name.clear();
        last.name.extend_from_slice(seg);
    }
    push_text(out, &last.json);
    Ok(())
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

/// The key columns of `to_json_key(table, key)`, as `"name":value` pairs joined by commas (a key JSON's content,
/// and the first columns of a JSON row): the partition key's components, then the clustering columns (null for
/// the static-only row).
fn key_columns_json(out: &mut String, t: &Table, pk: &[u8], key: RowKey) -> D<()> {
    let mut parts = partition_key_parts(t, pk);
    for (i, col) in t.pk.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let c = t.c(*col);
        push_text(out, &c.json_key);
        // a key with fewer components than key columns: Python's event() fails on the missing one
        types::json_value(out, c.ty.as_ref().ok_or(Doubt)?, parts.next().ok_or(Doubt)?)?;
    }
    if t.ck.is_empty() {
        return Ok(());
    }
    let vals = match key {
        Some(k) if !k.is_empty() => decode_clustering(k.0),
        _ => Vec::new(),
    };
    for (i, col) in t.ck.iter().enumerate() {
        out.push(',');
        let c = t.c(*col);
        push_text(out, &c.json_key);
        types::json_opt(out, c.ty.as_ref().ok_or(Doubt)?, vals.get(i).copied().flatten())?;
    }
    Ok(())
}

/// The JSON of a non-key column from an image value (`typed_row` then `to_json`); `items`: the image's.
pub fn ival_json(out: &mut String, ty: &Ty, v: &IV, items: &[Item]) -> D<()> {
    match v {
        IV::Bytes(b) => types::json_value(out, ty, b),
        IV::Counter(total) => {
            push_i128(out, *total);
            Ok(())
        }
        IV::Items(s, e) => complex_json(out, ty, &items[*s as usize..*e as usize]),
    }
}

/// A complex column's value from its live items (`decode_cells` of the items in path order, then `to_json`).
fn complex_json(out: &mut String, ty: &Ty, items: &[Item]) -> D<()> {
    match ty {
        Ty::List(e, _) => types::json_list(out, items.iter().map(|(_, v)| (&**e, Some(*v)))),
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
                let p = p.ok_or(Doubt)?;
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

/// The 32 hex digits of an event id.
fn hex_id(digest: &[u8; 16]) -> [u8; 32] {
    let mut out = [0u8; 32];
    hex_into(&mut out, digest);
    out
}

// ---- event ids: SHA-256 of a canonical encoding of the change and the row's state (`state.events._event_id`) -------
//
// An id is the first 16 bytes (32 hex digits) of SHA-256 over `id_input_prefix`, then `event_id_input`; the
// `Emitter` hashes the first once (`id_hasher`) and each event's input from there.

/// What the encoding starts with: its name and version.
const ID_TAG: &[u8] = b"cassandra-cdc event id 2\n";

/// The id input's writer: every field length-prefixed or of fixed width, integers big-endian. A cursor into the
/// buffer's spare room rather than `Vec` pushes: each group of fields (a cell, a deletion, a length and its bytes)
/// makes room for its longest encoding once, then its fields are stored without a check or a length update each
/// (an event writes about sixty of them). The buffer's length is set when the writer is dropped.
struct IdInput<'o> {
    buf: &'o mut Vec<u8>,
    /// where the next byte goes: `buf`'s start + what has been written
    at: *mut u8,
    /// the end of `buf`'s capacity
    end: *mut u8,
}

impl<'o> IdInput<'o> {
    /// A writer appending to `buf`.
    fn new(buf: &'o mut Vec<u8>) -> IdInput<'o> {
        let (len, cap) = (buf.len(), buf.capacity());
        let p = buf.as_mut_ptr();
        // SAFETY: len <= cap: both within (or one past) the allocation
        let (at, end) = unsafe { (p.add(len), p.add(cap)) };
        IdInput { buf, at, end }
    }

    fn written(&self) -> usize {
        self.at as usize - self.buf.as_ptr() as usize
    }

    /// Room for `n` more bytes.
    #[inline(always)]
    fn room(&mut self, n: usize) {
        if (self.end as usize - self.at as usize) < n {
            self.grow(n);
        }
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self, n: usize) {
        let len = self.written();
        // SAFETY: the first `len` bytes are written
        unsafe { self.buf.set_len(len) };
        self.buf.reserve(n);
        let p = self.buf.as_mut_ptr();
        // SAFETY: len <= capacity
        unsafe {
            self.at = p.add(len);
            self.end = p.add(self.buf.capacity());
        }
    }

    /// # Safety
    /// `room` made space for these N bytes.
    #[inline(always)]
    unsafe fn put<const N: usize>(&mut self, b: [u8; N]) {
        self.at.cast::<[u8; N]>().write_unaligned(b);
        self.at = self.at.add(N);
    }

    /// # Safety
    /// `room` made space for u32 + `b`.
    #[inline(always)]
    unsafe fn put_bytes(&mut self, b: &[u8]) {
        self.put((b.len() as u32).to_be_bytes());
        crate::columns::copy_short(self.at, b);
        self.at = self.at.add(b.len());
    }

    #[inline]
    fn u8(&mut self, x: u8) {
        self.room(1);
        // SAFETY: `room` made space for what this writes
        unsafe { self.put([x]) }
    }

    #[inline]
    fn u32(&mut self, n: usize) {
        self.room(4);
        // SAFETY: `room` made space for what this writes
        unsafe { self.put((n as u32).to_be_bytes()) }
    }

    #[inline]
    fn i64(&mut self, x: i64) {
        self.room(8);
        // SAFETY: `room` made space for what this writes
        unsafe { self.put(x.to_be_bytes()) }
    }

    #[inline]
    fn bytes(&mut self, b: &[u8]) {
        self.room(4 + b.len());
        // SAFETY: `room` made space for what this writes
        unsafe { self.put_bytes(b) }
    }

    /// opt(x): 0 for None, else 1 then `x` as `write` encodes it.
    #[inline]
    fn opt<T>(&mut self, x: Option<T>, write: impl FnOnce(&mut Self, T)) {
        match x {
            None => self.u8(0),
            Some(v) => {
                self.u8(1);
                write(self, v);
            }
        }
    }

    /// # Safety
    /// `room` made space for 17 bytes.
    #[inline(always)]
    unsafe fn put_del(&mut self, d: &Option<Del>) {
        match d {
            None => self.put([0]),
            Some((ts, ldt)) => {
                self.put([1]);
                self.put(ts.to_be_bytes());
                self.put(ldt.to_be_bytes());
            }
        }
    }

    fn del(&mut self, d: &Option<Del>) {
        self.room(17);
        // SAFETY: `room` made space for what this writes
        unsafe { self.put_del(d) }
    }

    /// str(name) then the cell; `name`: a path's bytes for a complex column's cell.
    #[inline]
    fn named_cell(&mut self, name: &[u8], c: &Cell) {
        // str(name); cell: i64 ts, i32 ttl, i64 ldt, u8 tombstone, bytes(value)
        self.room(4 + name.len() + 25 + c.value.len());
        // SAFETY: `room` made space for what this writes
        unsafe {
            self.put_bytes(name);
            self.put(c.ts.to_be_bytes());
            self.put(c.ttl.to_be_bytes());
            self.put(c.ldt.to_be_bytes());
            self.put([c.tomb as u8]);
            self.put_bytes(&c.value);
        }
    }

    fn row(&mut self, t: &Table, row: &RowState) {
        // opt(liveness: i64, i32, i64), opt(del) twice, u32(number of cells)
        self.room(21 + 17 + 17 + 4);
        // SAFETY: `room` made space for what this writes
        unsafe {
            match row.liveness {
                None => self.put([0]),
                Some((ts, ttl, ldt)) => {
                    self.put([1]);
                    self.put(ts.to_be_bytes());
                    self.put(ttl.to_be_bytes());
                    self.put(ldt.to_be_bytes());
                }
            }
            self.put_del(&row.deletion);
            self.put_del(&row.shadowable);
            self.put((row.cells.len() as u32).to_be_bytes());
        }
        for (col, c) in t.in_name_order(&row.cells) {
            self.named_cell(t.name_of(*col).as_bytes(), c);
        }
        self.u32(row.complex.len());
        for (col, e) in t.in_name_order(&row.complex) {
            self.bytes(t.name_of(*col).as_bytes());
            self.del(&e.del);
            self.u32(e.cells.len());
            for (p, c) in &e.cells {
                self.named_cell(p, c);
            }
        }
    }

    fn image(&mut self, t: &Table, img: &[(ColId, IV)], items: &[Item]) {
        self.u32(img.len());
        for (col, v) in t.in_name_order(img) {
            let name = t.name_of(*col).as_bytes();
            match v {
                IV::Bytes(b) => {
                    self.room(4 + name.len() + 1 + 4 + b.len());
                    // SAFETY: `room` made space for what this writes
                    unsafe {
                        self.put_bytes(name);
                        self.put([0]);
                        self.put_bytes(b);
                    }
                }
                IV::Counter(n) => {
                    self.room(4 + name.len() + 1 + 16);
                    // SAFETY: `room` made space for what this writes
                    unsafe {
                        self.put_bytes(name);
                        self.put([1]);
                        self.put(n.to_be_bytes());
                    }
                }
                IV::Items(s, e) => {
                    self.bytes(name);
                    self.u8(2);
                    let items = &items[*s as usize..*e as usize];
                    self.u32(items.len());
                    for (p, x) in items {
                        self.opt(*p, |w, p| w.bytes(p));
                        self.bytes(x);
                    }
                }
            }
        }
    }
}

impl Drop for IdInput<'_> {
    fn drop(&mut self) {
        let len = self.written();
        // SAFETY: every byte up to `at` is written, within the capacity
        unsafe { self.buf.set_len(len) };
    }
}

/// What every event id of table `t` hashes first: the encoding's tag and the table id.
fn id_input_prefix(t: &Table, s: &mut Vec<u8>) {
    s.extend_from_slice(ID_TAG);
    IdInput::new(s).bytes(t.id_str.as_bytes());
}

/// `events._event_id`'s input after `id_input_prefix`, written into `s`: the change (row, op, write time,
/// expiry), the row's resulting state, and what it shows after the change (`a_img`; None for a delete). The
/// names it hashes are the data's only if `t.names_exact`: `process_run` hands every partition back to the Python
/// engine otherwise, before any event.
#[allow(clippy::too_many_arguments)]
pub fn event_id_input(t: &Table, pk: &[u8], key: RowKey, op: u8, ts_us: i64, expired: bool, part: &PartitionState,
                      a_img: Option<Img>, s: &mut Vec<u8>) -> D<()> {
    debug_assert!(t.names_exact, "a table whose names are not the data's reached the event ids");
    s.clear();
    let mut w = IdInput::new(s);
    w.bytes(pk);
    w.opt(key, |w, k| w.bytes(&k));
    w.u8(op);
    w.i64(ts_us);
    w.u8(expired as u8);
    w.row(t, &part.static_row);
    w.del(&part.deletion);
    match key {
        Some(k) => {
            w.opt(part.rows.get(&k), |w, row| w.row(t, row));
            w.i64(row_shadow_ts(t, part, &k)?);
        }
        None => {
            // the static-only row exists or not depending on the partition's clustering rows
            w.u32(part.rows.len());
            for (k, r) in part.rows.iter() {
                w.bytes(&k);
                w.row(t, r);
            }
        }
    }
    w.opt(a_img, |w, img| {
        w.image(t, img.stat, img.items);
        w.opt(img.row, |w, r| w.image(t, r, img.items));
    });
    Ok(())
}

