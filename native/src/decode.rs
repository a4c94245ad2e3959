//! One serialized mutation (messaging versions 10-13) straight to cell-log records.
//!
//! The layout and the record rules are those of the pure-Python reference (`cdc_lib.commitlog.mutation
//! .decode_mutation` followed by `cdc_lib.celllog.records.update_records`), which stays the single truth: this decoder either produces
//! exactly the records the reference would, or gives up on the entry (`Fail::Bad`), and the caller re-decodes it
//! with the reference, which produces the typed error or the records. It never has to be right about errors,
//! only about successes, so whenever it is in doubt it gives up.


use crate::columns::*;
use crate::fxhash::FxMap;
use crate::murmur3::token;

pub const MODE_USER: u8 = 0; // decode natively
pub const MODE_SKIP: u8 = 1; // system keyspace as the first table: count and skip
pub const MODE_PYTHON: u8 = 2; // hand the entry to Python (system_schema when the schema follows the log)
pub const MODE_UNKNOWN: u8 = 3; // not in the schema: the reference reports it
pub const MODE_SYSTEM_UNKNOWN: u8 = 4; // a system table id the schema does not describe: skipped when first

const TIMESTAMP_EPOCH: i64 = 1442880000000000;
const DELETION_TIME_EPOCH: i64 = 1442880000;
const NO_TIMESTAMP: i64 = i64::MIN;
const NO_DELETION_TIME: i64 = (1 << 31) - 1;
const NO_DELETION_TIME_UINT: i64 = (1 << 32) - 1;

pub enum Fail {
    /// Not decodable here: let the reference decide.
    Bad,
    /// A partition update of a table this decoder was not told about (Python registers it, then retries).
    NeedTable([u8; 16]),
}

type R<T> = Result<T, Fail>;

pub type Tables = FxMap<[u8; 16], Table>;

pub struct ColInfo {
    pub name: Vec<u8>,
    pub complex: bool,
    pub fixed: Option<u32>,
}

pub struct Table {
    pub mode: u8,
    pub id_str: Vec<u8>,
    pub keyspace: Vec<u8>,
    pub name: Vec<u8>,
    pub clustering: Vec<Option<u32>>,
    pub cols: Vec<ColInfo>,
    pub by_name: FxMap<Vec<u8>, usize>,
    // the last column headers seen (raw bytes, parsed): headers repeat from one mutation to the next
    last_static: Option<(Vec<u8>, Vec<usize>)>,
    last_regular: Option<(Vec<u8>, Vec<usize>)>,
}

impl Table {
    pub fn new(mode: u8, id_str: Vec<u8>, keyspace: Vec<u8>, name: Vec<u8>, clustering: Vec<Option<u32>>,
               cols: Vec<ColInfo>) -> Table {
        let mut by_name = FxMap::default();
        for (i, c) in cols.iter().enumerate() {
            by_name.entry(c.name.clone()).or_insert(i);
        }
        Table { mode, id_str, keyspace, name, clustering, cols, by_name, last_static: None, last_regular: None }
    }
}

// ---- the byte cursor --------------------------------------------------------------------------------------

pub struct Rd<'a> {
    pub b: &'a [u8],
    pub p: usize,
}

impl<'a> Rd<'a> {
    #[inline]
    fn u8(&mut self) -> R<u8> {
        let v = *self.b.get(self.p).ok_or(Fail::Bad)?;
        self.p += 1;
        Ok(v)
    }
    #[inline]
    fn u16(&mut self) -> R<usize> {
        if self.p + 2 > self.b.len() {
            return Err(Fail::Bad);
        }
        let v = ((self.b[self.p] as usize) << 8) | self.b[self.p + 1] as usize;
        self.p += 2;
        Ok(v)
    }
    /// Cassandra's unsigned vint (NOT LEB128): leading 1-bits of the first byte = extra bytes, big-endian.
    #[inline]
    pub fn uvint(&mut self) -> R<u64> {
        let b0 = *self.b.get(self.p).ok_or(Fail::Bad)?;
        if b0 < 0x80 {
            self.p += 1;
            return Ok(b0 as u64);
        }
        let extra = b0.leading_ones() as usize;
        let end = self.p + 1 + extra;
        if end > self.b.len() {
            return Err(Fail::Bad);
        }
        let mut v = (b0 as u64) & (0xFFu64 >> extra);
        for &x in &self.b[self.p + 1..end] {
            v = (v << 8) | x as u64;
        }
        self.p = end;
        Ok(v)
    }
    /// A Java int written through the unsigned-vint writer: its low 32 bits, signed (reference `uvint32`).
    #[inline]
    fn uvint32(&mut self) -> R<i32> {
        Ok(self.uvint()? as u32 as i32)
    }
    #[inline]
    fn take(&mut self, n: usize) -> R<&'a [u8]> {
        let end = self.p.checked_add(n).ok_or(Fail::Bad)?;
        if end > self.b.len() {
            return Err(Fail::Bad);
        }
        let s = &self.b[self.p..end];
        self.p = end;
        Ok(s)
    }
    #[inline]
    fn vbytes(&mut self) -> R<&'a [u8]> {
        let n = self.uvint32()?;
        if n < 0 {
            return Err(Fail::Bad);
        }
        self.take(n as usize)
    }
}

// ---- delta-encoded times ----------------------------------------------------------------------------------

struct Times {
    ts0: i64,
    ldt0: i64,
    ttl0: i32,
    unsigned_ldt: bool,
}

impl Times {
    #[inline]
    fn ts(&self, r: &mut Rd) -> R<i64> {
        Ok((r.uvint()? as i64).wrapping_add(self.ts0))
    }
    #[inline]
    fn ldt(&self, r: &mut Rd) -> R<i64> {
        let v = r.uvint32()? as i64 + self.ldt0;
        Ok(if self.unsigned_ldt { v & 0xFFFF_FFFF } else { v as i32 as i64 })
    }
    #[inline]
    fn ttl(&self, r: &mut Rd) -> R<i32> {
        Ok(r.uvint32()?.wrapping_add(self.ttl0))
    }
    #[inline]
    fn deletion(&self, r: &mut Rd) -> R<(i64, i64)> {
        let ts = self.ts(r)?;
        Ok((ts, self.ldt(r)?))
    }
}

// ---- scratch space reused across entries ------------------------------------------------------------------

#[derive(Clone, Copy)]
struct PendingCell {
    col: usize,
    path: (usize, usize),
    has_path: bool,
    value: (usize, usize),
    ts: i64,
    ttl: i32,
    ldt: i64,
    tomb: bool,
}

#[derive(Clone, Copy)]
struct Marker {
    kind: u8,
    cl: (usize, usize), // range in Scratch::marker_cl
    d1: (i64, i64),
    d2: (i64, i64),
}

#[derive(Default)]
pub struct Scratch {
    static_cols: Vec<usize>,
    regular_cols: Vec<usize>,
    row_cols: Vec<usize>,
    present: Vec<bool>,
    cl: Vec<u8>,
    marker_cl: Vec<u8>,
    markers: Vec<Marker>,
    pending: Vec<PendingCell>,
}

/// Where the records of one entry go, and what they share.
pub struct EntryCtx<'a> {
    pub segment: &'a [u8],
    pub segment_id: i64,
    pub position: i64,
    pub entry_index: i64,
    pub mv: u32,
}

// ---- pieces -----------------------------------------------------------------------------------------------

fn read_columns(r: &mut Rd, table: &mut Table, is_static: bool, out: &mut Vec<usize>) -> R<()> {
    let start = r.p;
    let last = if is_static { &table.last_static } else { &table.last_regular };
    if let Some((raw, cols)) = last {
        if r.b[start..].starts_with(raw) {
            out.clear();
            out.extend_from_slice(cols);
            r.p = start + raw.len();
            return Ok(());
        }
    }
    let n = r.uvint32()?;
    if n < 0 || n as usize > r.b.len() {
        return Err(Fail::Bad);
    }
    out.clear();
    for _ in 0..n {
        let raw = r.vbytes()?;
        let ci = *table.by_name.get(raw).ok_or(Fail::Bad)?;
        if out.contains(&ci) {
            return Err(Fail::Bad); // a name listed twice: leave such oddities to the reference
        }
        out.push(ci);
    }
    let parsed = (r.b[start..r.p].to_vec(), out.clone());
    if is_static {
        table.last_static = Some(parsed);
    } else {
        table.last_regular = Some(parsed);
    }
    Ok(())
}

/// Clustering values, appended to `out` encoded as `celllog.encode_clustering` encodes them.
fn clustering(r: &mut Rd, fixed: &[Option<u32>], size: usize, out: &mut Vec<u8>) -> R<()> {
    let mut header = 0u64;
    for i in 0..size {
        if i % 32 == 0 {
            header = r.uvint()?;
        }
        let j = (i % 32) * 2;
        if header & (2u64 << j) != 0 {
            out.extend_from_slice(b"\xff\xff\x00");
        } else if header & (1u64 << j) != 0 {
            out.extend_from_slice(b"\x00\x00\x00");
        } else {
            let v = match fixed.get(i).copied().flatten() {
                Some(f) => r.take(f as usize)?,
                None => r.vbytes()?,
            };
            if v.len() > 0xFFFF {
                return Err(Fail::Bad); // encode_clustering cannot encode it: the reference raises
            }
            out.extend_from_slice(&(v.len() as u16).to_be_bytes());
            out.extend_from_slice(v);
            out.push(0);
        }
    }
    Ok(())
}

/// The columns a row has, from its header (reference `_read_subset`).
fn subset(r: &mut Rd, header: &[usize], present: &mut Vec<bool>, out: &mut Vec<usize>) -> R<()> {
    let v = r.uvint()?;
    let n = header.len();
    out.clear();
    if v == 0 {
        out.extend_from_slice(header);
        return Ok(());
    }
    if n < 64 {
        if v >> n != 0 {
            return Err(Fail::Bad);
        }
        for (i, &c) in header.iter().enumerate() {
            if (v >> i) & 1 == 0 {
                out.push(c);
            }
        }
        return Ok(());
    }
    // large subset: ascending indexes of the present columns (when fewer than half) or of the missing ones
    let missing = v;
    if missing > n as u64 {
        return Err(Fail::Bad);
    }
    let count = n - missing as usize;
    let listed_present = count < n / 2;
    present.clear();
    present.resize(n, !listed_present);
    let mut next = 0u64; // the smallest index the next one may be
    for _ in 0..(if listed_present { count } else { missing as usize }) {
        let i = r.uvint()?;
        if i < next || i >= n as u64 {
            return Err(Fail::Bad);
        }
        present[i as usize] = listed_present;
        next = i + 1;
    }
    for (i, &c) in header.iter().enumerate() {
        if present[i] {
            out.push(c);
        }
    }
    Ok(())
}

struct UpdState<'u> {
    upd: Upd<'u>,
    first_row: usize,
}

impl<'u> UpdState<'u> {
    #[inline]
    fn seq(&self, cols: &Columns) -> i32 {
        (cols.rows - self.first_row) as i32
    }
}

#[allow(clippy::too_many_arguments)]
fn read_row(r: &mut Rd, flags: u8, expect_static: bool, table: &Table, header: &[usize], t: &Times, no_ldt: i64,
            cols: &mut Columns, us: &UpdState, sc: &mut Scratch) -> R<()> {
    let ext = if flags & 0x80 != 0 { r.u8()? } else { 0 };
    let is_static = ext & 0x01 != 0;
    if is_static != expect_static {
        return Err(Fail::Bad);
    }
    sc.cl.clear();
    if !is_static {
        let mut cl = std::mem::take(&mut sc.cl);
        let res = clustering(r, &table.clustering, table.clustering.len(), &mut cl);
        sc.cl = cl;
        res?;
    }
    // liveness: (timestamp, ttl, local expiration time)
    let mut lv: Option<(i64, i32, i64)> = None;
    if flags & 0x04 != 0 {
        let ts = t.ts(r)?;
        if flags & 0x08 != 0 {
            let ttl = t.ttl(r)?;
            let ldt = t.ldt(r)?;
            lv = Some((ts, ttl, ldt));
        } else {
            lv = Some((ts, 0, no_ldt));
        }
    }
    let deletion = if flags & 0x10 != 0 { Some(t.deletion(r)?) } else { None };
    if flags & 0x20 != 0 {
        sc.row_cols.clear();
        sc.row_cols.extend_from_slice(header);
    } else {
        let mut rc = std::mem::take(&mut sc.row_cols);
        let res = subset(r, header, &mut sc.present, &mut rc);
        sc.row_cols = rc;
        res?;
    }
    let cl: &[u8] = &sc.cl;
    if let Some((ts, ttl, ldt)) = lv {
        if ts != NO_TIMESTAMP {
            let seq = us.seq(cols);
            cols.push(seq, cl, is_static, KIND_LIVE, None, None, None, ts, ttl,
                      if ttl != 0 { ldt } else { NO_DELETION_TIME });
        }
    }
    if let Some((ts, ldt)) = deletion {
        if ts != NO_TIMESTAMP {
            let seq = us.seq(cols);
            let kind = if ext & 0x02 != 0 { KIND_RDELS } else { KIND_RDEL };
            cols.push(seq, cl, is_static, kind, None, None, None, ts, 0, ldt);
        }
    }
    let has_cdel = flags & 0x40 != 0;
    sc.pending.clear();
    for &ci in sc.row_cols.iter() {
        let col = &table.cols[ci];
        let ncells = if col.complex {
            if has_cdel {
                let (dts, dldt) = t.deletion(r)?;
                if dts != NO_TIMESTAMP {
                    let seq = us.seq(cols);
                    cols.push(seq, cl, is_static, KIND_CDEL, Some(&col.name), None, None, dts, 0, dldt);
                }
            }
            let n = r.uvint32()?;
            if n < 0 || n as usize > r.b.len() - r.p {
                return Err(Fail::Bad);
            }
            n as usize
        } else {
            1
        };
        for _ in 0..ncells {
            let cf = r.u8()?;
            let ts = if cf & 0x08 != 0 {
                lv.ok_or(Fail::Bad)?.0
            } else {
                t.ts(r)?
            };
            let deleted = cf & 0x01 != 0;
            let expiring = cf & 0x02 != 0;
            let mut ttl = 0i32;
            let mut ldt = no_ldt;
            if cf & 0x10 != 0 {
                let l = lv.ok_or(Fail::Bad)?;
                ttl = l.1;
                ldt = l.2;
            } else if deleted || expiring {
                ldt = t.ldt(r)?;
                if expiring {
                    ttl = t.ttl(r)?;
                }
            }
            let path = if col.complex { Some(r.vbytes()?) } else { None };
            let value: &[u8] = if cf & 0x04 != 0 {
                b""
            } else if let (Some(f), false) = (col.fixed, col.complex) {
                r.take(f as usize)?
            } else {
                r.vbytes()?
            };
            let (rec_ttl, rec_ldt) = if deleted { (0, ldt) } else { (ttl, if ttl != 0 { ldt } else { NO_DELETION_TIME }) };
            if has_cdel {
                // complex deletions of the row come before its cells: hold the cells back
                let base = r.b.as_ptr() as usize;
                let pr = path.map(|p| (p.as_ptr() as usize - base, p.len())).unwrap_or((0, 0));
                let vr = (value.as_ptr() as usize).wrapping_sub(base);
                sc.pending.push(PendingCell {
                    col: ci,
                    path: pr,
                    has_path: path.is_some(),
                    value: (if value.is_empty() { 0 } else { vr }, value.len()),
                    ts,
                    ttl: rec_ttl,
                    ldt: rec_ldt,
                    tomb: deleted,
                });
            } else {
                let seq = us.seq(cols);
                cols.push(seq, cl, is_static, if deleted { KIND_TOMB } else { KIND_CELL }, Some(&col.name), path,
                          Some(value), ts, rec_ttl, rec_ldt);
            }
        }
    }
    if has_cdel {
        for pc in sc.pending.iter() {
            let col = &table.cols[pc.col];
            let path = if pc.has_path { Some(&r.b[pc.path.0..pc.path.0 + pc.path.1]) } else { None };
            let value = &r.b[pc.value.0..pc.value.0 + pc.value.1];
            let seq = us.seq(cols);
            cols.push(seq, cl, is_static, if pc.tomb { KIND_TOMB } else { KIND_CELL }, Some(&col.name), path,
                      Some(value), pc.ts, pc.ttl, pc.ldt);
        }
    }
    Ok(())
}

fn read_marker(r: &mut Rd, table: &Table, t: &Times, sc: &mut Scratch) -> R<()> {
    let kind = r.u8()?;
    if !matches!(kind, 0 | 1 | 2 | 5 | 6 | 7) {
        return Err(Fail::Bad);
    }
    let size = r.u16()?;
    if size > table.clustering.len() {
        return Err(Fail::Bad);
    }
    let start = sc.marker_cl.len();
    clustering(r, &table.clustering, size, &mut sc.marker_cl)?;
    let cl = (start, sc.marker_cl.len());
    let d1 = t.deletion(r)?;
    let d2 = if kind == 2 || kind == 5 { t.deletion(r)? } else { (0, 0) };
    sc.markers.push(Marker { kind, cl, d1, d2 });
    Ok(())
}

/// Pair the markers of one update into range tombstones (reference `celllog.range_tombstones`).
fn range_tombstones(cols: &mut Columns, us: &UpdState, sc: &Scratch) -> R<()> {
    // open range: (clustering range, inclusive, deletion)
    let mut open: Option<((usize, usize), bool, (i64, i64))> = None;
    for m in sc.markers.iter() {
        match m.kind {
            1 | 7 => {
                if open.is_some() {
                    return Err(Fail::Bad);
                }
                open = Some((m.cl, m.kind == 1, m.d1));
            }
            2 | 5 => {
                let (ocl, oincl, od) = open.ok_or(Fail::Bad)?;
                if od != m.d1 {
                    return Err(Fail::Bad); // a close must carry the deletion of the range it closes
                }
                let end_incl = m.kind == 5;
                let seq = us.seq(cols);
                cols.push_range(seq, &sc.marker_cl[ocl.0..ocl.1], &sc.marker_cl[m.cl.0..m.cl.1], oincl,
                                end_incl, m.d1.0, m.d1.1);
                open = Some((m.cl, !end_incl, m.d2));
            }
            _ => {
                let (ocl, oincl, od) = open.ok_or(Fail::Bad)?;
                if od != m.d1 {
                    return Err(Fail::Bad);
                }
                let seq = us.seq(cols);
                cols.push_range(seq, &sc.marker_cl[ocl.0..ocl.1], &sc.marker_cl[m.cl.0..m.cl.1], oincl,
                                m.kind == 6, od.0, od.1);
                open = None;
            }
        }
    }
    if open.is_some() {
        return Err(Fail::Bad);
    }
    Ok(())
}

/// `commitlog.model.mutation_id` of an entry's bytes: the first 16 bytes of their SHA-256 (with the processor's
/// SHA instructions where it has them: `sha256`).
pub fn mutation_id(data: &[u8]) -> [u8; 16] {
    crate::sha256::digest16(data)
}

/// Decode one mutation into `cols`; returns its number of partition updates. On `Err` the caller truncates
/// `cols` back to where it was.
pub fn decode_entry(buf: &[u8], ctx: &EntryCtx, tables: &mut Tables, cols: &mut Columns,
                    sc: &mut Scratch) -> R<usize> {
    let unsigned_ldt = ctx.mv >= 13;
    let no_ldt = if unsigned_ldt { NO_DELETION_TIME_UINT } else { NO_DELETION_TIME };
    let mut r = Rd { b: buf, p: 0 };
    // every record of the entry belongs to this mutation (`commitlog.model.mutation_id`)
    let mid = mutation_id(buf);
    let n = r.uvint32()?;
    if n <= 0 || n as usize > buf.len() {
        return Err(Fail::Bad);
    }
    let n = n as usize;
    for u_i in 0..n {
        let tid: [u8; 16] = r.take(16)?.try_into().unwrap();
        let table = match tables.get_mut(&tid) {
            None => return Err(Fail::NeedTable(tid)),
            Some(t) if t.mode == MODE_UNKNOWN || t.mode == MODE_SYSTEM_UNKNOWN => return Err(Fail::Bad),
            Some(t) => t,
        };
        let key = r.vbytes()?;
        let flags = r.u8()?;
        if flags & 0x01 != 0 {
            continue; // empty update: no records
        }
        if flags & 0x02 != 0 {
            return Err(Fail::Bad); // reversed: the reference rejects it
        }
        let ts0 = (r.uvint()? as i64).wrapping_add(TIMESTAMP_EPOCH);
        let ldt0 = (r.uvint32()? as i64 + DELETION_TIME_EPOCH) as i32 as i64;
        let ttl0 = r.uvint32()?;
        let t = Times { ts0, ldt0, ttl0, unsigned_ldt };
        let mut static_cols = std::mem::take(&mut sc.static_cols);
        let mut regular_cols = std::mem::take(&mut sc.regular_cols);
        static_cols.clear();
        let res = (|| -> R<()> {
            if flags & 0x08 != 0 {
                read_columns(&mut r, table, true, &mut static_cols)?;
            }
            read_columns(&mut r, table, false, &mut regular_cols)
        })();
        if let Err(e) = res {
            sc.static_cols = static_cols;
            sc.regular_cols = regular_cols;
            return Err(e);
        }
        let table: &Table = table;
        let us = UpdState {
            upd: Upd {
                segment: ctx.segment,
                segment_id: ctx.segment_id,
                position: ctx.position,
                entry_index: (ctx.entry_index + u_i as i64) as i32,
                table_id: &table.id_str,
                keyspace: &table.keyspace,
                table: &table.name,
                key,
                token: token(key),
                mutation_id: Some(mid),
            },
            first_row: cols.rows,
        };
        cols.begin_update(&us.upd);
        let res = (|| -> R<()> {
            if flags & 0x04 != 0 {
                let (ts, ldt) = t.deletion(&mut r)?;
                if ts != NO_TIMESTAMP {
                    cols.push(0, b"", false, KIND_PDEL, None, None, None, ts, 0, ldt);
                }
            }
            if flags & 0x08 != 0 {
                let f = r.u8()?;
                if f & 0x03 != 0 {
                    return Err(Fail::Bad);
                }
                read_row(&mut r, f, true, table, &static_cols, &t, no_ldt, cols, &us, sc)?;
            }
            if flags & 0x10 != 0 {
                r.uvint32()?; // row estimate
            }
            sc.markers.clear();
            sc.marker_cl.clear();
            loop {
                let f = r.u8()?;
                if f & 0x01 != 0 {
                    break;
                }
                if f & 0x02 != 0 {
                    read_marker(&mut r, table, &t, sc)?;
                } else {
                    read_row(&mut r, f, false, table, &regular_cols, &t, no_ldt, cols, &us, sc)?;
                }
            }
            if !sc.markers.is_empty() {
                range_tombstones(cols, &us, sc)?;
            }
            Ok(())
        })();
        sc.static_cols = static_cols;
        sc.regular_cols = regular_cols;
        res?;
    }
    if r.p != buf.len() {
        return Err(Fail::Bad);
    }
    Ok(n)
}
