//! Arrow column buffers of the cell log (CELL_LOG_SCHEMA), built row by row.
//!
//! Every column has exactly `rows` values; a failed entry is undone with `truncate(rows_before)`. Binary/string
//! columns are (validity bits, i32 offsets, data); booleans are bit-packed; integers little-endian.

#[derive(Default)]
pub struct Bits {
    pub bytes: Vec<u8>,
    pub len: usize,
}

impl Bits {
    #[inline]
    pub fn push(&mut self, v: bool) {
        if self.len % 8 == 0 {
            self.bytes.push(0);
        }
        if v {
            self.bytes[self.len / 8] |= 1 << (self.len % 8);
        }
        self.len += 1;
    }
    pub fn truncate(&mut self, n: usize) {
        if n >= self.len {
            return;
        }
        self.len = n;
        self.bytes.truncate(n.div_ceil(8));
        if n % 8 != 0 {
            let last = self.bytes.len() - 1;
            self.bytes[last] &= (1u8 << (n % 8)) - 1;
        }
    }
    /// Room for `n` more bits.
    pub fn reserve(&mut self, n: usize) {
        self.bytes.reserve((self.len + n).div_ceil(8).saturating_sub(self.bytes.len()));
    }
    pub fn zeros(n: usize) -> Bits {
        Bits { bytes: vec![0; n.div_ceil(8)], len: n }
    }
    #[inline]
    pub fn set(&mut self, i: usize) {
        self.bytes[i / 8] |= 1 << (i % 8);
    }
    pub fn count_zeros(&self) -> usize {
        let ones: usize = self.bytes.iter().map(|b| b.count_ones() as usize).sum();
        self.len - ones
    }
}

/// A binary/string column (nullable or not).
pub struct Var {
    pub offsets: Vec<i32>,
    pub data: Vec<u8>,
    pub valid: Bits,
    pub nulls: usize,
    pub nullable: bool,
    pub overflow: bool,
}

/// Append `src` to `dst`; short copies inline (two overlapping loads/stores) instead of a `memcpy` call: the
/// cell log is millions of copies of a few bytes each.
#[inline(always)]
pub fn append(dst: &mut Vec<u8>, src: &[u8]) {
    let n = src.len();
    dst.reserve(n);
    // SAFETY: `reserve` made room for n more bytes at dst[len..len + n]
    unsafe {
        copy_short(dst.as_mut_ptr().add(dst.len()), src);
        dst.set_len(dst.len() + n);
    }
}

/// `src` copied to `d`, short copies inline (`append`).
///
/// # Safety
/// `d` is valid for writing `src.len()` bytes, and does not overlap `src`.
#[inline(always)]
pub unsafe fn copy_short(d: *mut u8, src: &[u8]) {
    let n = src.len();
    let s = src.as_ptr();
    use std::ptr::{read_unaligned as rd, write_unaligned as wr};
    if n <= 16 {
        if n >= 8 {
            wr(d as *mut u64, rd(s as *const u64));
            wr(d.add(n - 8) as *mut u64, rd(s.add(n - 8) as *const u64));
        } else if n >= 4 {
            wr(d as *mut u32, rd(s as *const u32));
            wr(d.add(n - 4) as *mut u32, rd(s.add(n - 4) as *const u32));
        } else if n > 0 {
            *d = *s;
            *d.add(n / 2) = *s.add(n / 2);
            *d.add(n - 1) = *s.add(n - 1);
        }
    } else if n <= 32 {
        wr(d as *mut u128, rd(s as *const u128));
        wr(d.add(n - 16) as *mut u128, rd(s.add(n - 16) as *const u128));
    } else {
        std::ptr::copy_nonoverlapping(s, d, n);
    }
}

impl Var {
    pub fn new(nullable: bool) -> Var {
        Var { offsets: vec![0], data: Vec::new(), valid: Bits::default(), nulls: 0, nullable, overflow: false }
    }
    pub fn with_capacity(rows: usize, bytes: usize) -> Var {
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0);
        Var { offsets, data: Vec::with_capacity(bytes), valid: Bits::default(), nulls: 0, nullable: false,
              overflow: false }
    }
    /// `v`, `k` times (non-nullable column).
    #[inline]
    pub fn repeat(&mut self, v: &[u8], k: usize) {
        let mut off = *self.offsets.last().unwrap();
        for _ in 0..k {
            append(&mut self.data, v);
            off += v.len() as i32;
            self.offsets.push(off);
        }
    }
    /// An empty column with room for about what `like` held.
    pub fn new_like(like: &Var) -> Var {
        let rows = like.offsets.len();
        let mut offsets = Vec::with_capacity(rows + rows / 8 + 16);
        offsets.push(0);
        let data = Vec::with_capacity(like.data.len() + like.data.len() / 8 + 64);
        let valid = Bits { bytes: Vec::with_capacity(if like.nullable { rows / 8 + 64 } else { 0 }), len: 0 };
        Var { offsets, data, valid, nulls: 0, nullable: like.nullable, overflow: false }
    }
    #[inline]
    fn end(&mut self) {
        let n = self.data.len();
        if n > i32::MAX as usize {
            self.overflow = true;
        }
        self.offsets.push(n as i32);
    }
    #[inline]
    pub fn push(&mut self, v: &[u8]) {
        append(&mut self.data, v);
        self.end();
        if self.nullable {
            self.valid.push(true);
        }
    }
    #[inline]
    pub fn push_opt(&mut self, v: Option<&[u8]>) {
        match v {
            Some(v) => self.push(v),
            None => {
                self.offsets.push(*self.offsets.last().unwrap());
                self.valid.push(false);
                self.nulls += 1;
            }
        }
    }
    /// Keep the first `rows` values.
    pub fn truncate(&mut self, rows: usize) {
        if rows + 1 >= self.offsets.len() {
            return;
        }
        self.offsets.truncate(rows + 1);
        self.data.truncate(self.offsets[rows] as usize);
        if self.nullable {
            self.valid.truncate(rows);
            self.nulls = self.valid.count_zeros();
        }
    }
}

#[derive(Default)]
pub struct OptBool {
    pub values: Bits,
    pub valid: Bits,
    pub nulls: usize,
}

impl OptBool {
    pub fn zeros(n: usize) -> OptBool {
        OptBool { values: Bits::zeros(n), valid: Bits::zeros(n), nulls: n }
    }
    #[inline]
    pub fn set(&mut self, i: usize, v: bool) {
        if v {
            self.values.set(i);
        }
        self.valid.set(i);
        self.nulls -= 1;
    }
    #[inline]
    pub fn push(&mut self, v: Option<bool>) {
        self.values.push(v.unwrap_or(false));
        self.valid.push(v.is_some());
        if v.is_none() {
            self.nulls += 1;
        }
    }
    pub fn truncate(&mut self, rows: usize) {
        self.values.truncate(rows);
        self.valid.truncate(rows);
        self.nulls = self.valid.count_zeros();
    }
}

/// What every record of one partition update shares.
pub struct Upd<'a> {
    pub segment: &'a [u8],
    pub segment_id: i64,
    pub position: i64,
    pub entry_index: i32,
    pub table_id: &'a [u8],
    pub keyspace: &'a [u8],
    pub table: &'a [u8],
    pub key: &'a [u8],
    pub token: i64,
    /// The mutation's id (`commitlog.model.mutation_id`); None for records that come from no commit-log entry.
    pub mutation_id: Option<[u8; 16]>,
}

pub const KIND_CELL: u8 = 0;
pub const KIND_TOMB: u8 = 1;
pub const KIND_LIVE: u8 = 2;
pub const KIND_RDEL: u8 = 3;
pub const KIND_RDELS: u8 = 4;
pub const KIND_CDEL: u8 = 5;
pub const KIND_PDEL: u8 = 6;
pub const KIND_RT: u8 = 7;
pub const KIND_NAMES: [&[u8]; 8] = [b"cell", b"cell_tombstone", b"row_liveness", b"row_deletion",
                                    b"row_deletion_shadowable", b"complex_deletion", b"partition_deletion",
                                    b"range_tombstone"];

/// The records of one partition update are contiguous: what they share is stored once per update ("run")
/// and repeated into the Arrow columns when the batch is taken.
#[derive(Clone, Copy)]
struct Run {
    start_row: usize,
    segment_id: i64,
    position: i64,
    entry_index: i32,
    token: i64,
    mutation_id: Option<[u8; 16]>,
    arena: usize,              // segment, table id, keyspace, table, key: consecutive in `arena`
    lens: [u32; 5],
}

/// A range tombstone's own columns (null on every other record).
#[derive(Clone, Copy)]
struct Rt {
    row: usize,
    start_incl: bool,
    end_incl: bool,
    end: (usize, usize), // clustering_end in `rt_data`
}

/// A position to roll back to (`Columns::truncate`).
#[derive(Clone, Copy)]
pub struct Mark {
    rows: usize,
    runs: usize,
    arena: usize,
    rt: usize,
    rt_data: usize,
}

/// The records of a batch, column by column; `finish` makes the 23 columns of CELL_LOG_SCHEMA.
pub struct Columns {
    pub rows: usize,
    runs: Vec<Run>,
    arena: Vec<u8>,
    seq: Vec<i32>,
    clustering: Var,
    is_static: Bits,
    kind: Vec<u8>,
    column: Var,
    path: Var,
    value: Var,
    timestamp: Vec<i64>,
    ttl: Vec<i32>,
    ldt: Vec<i64>,
    rt: Vec<Rt>,
    rt_data: Vec<u8>,
    overflow: bool,
}

impl Default for Columns {
    fn default() -> Self {
        Columns::new()
    }
}

/// The 23 finished columns, in CELL_LOG_SCHEMA order.
pub struct Finished {
    pub rows: usize,
    pub segment: Var,
    pub segment_id: Vec<i64>,
    pub position: Vec<i64>,
    pub entry_index: Vec<i32>,
    pub seq: Vec<i32>,
    pub table_id: Var,
    pub keyspace: Var,
    pub table: Var,
    pub partition_key: Var,
    pub token: Vec<i64>,
    pub clustering: Var,
    pub clustering_end: Var,
    pub start_inclusive: OptBool,
    pub end_inclusive: OptBool,
    pub is_static: Bits,
    pub kind: Var,
    pub column: Var,
    pub path: Var,
    pub value: Var,
    pub timestamp: Vec<i64>,
    pub ttl: Vec<i32>,
    pub ldt: Vec<i64>,
    pub mutation_id: Var,
}

impl Columns {
    pub fn new() -> Columns {
        Columns {
            rows: 0,
            runs: Vec::new(),
            arena: Vec::new(),
            seq: Vec::new(),
            clustering: Var::new(false),
            is_static: Bits::default(),
            kind: Vec::new(),
            column: Var::new(true),
            path: Var::new(true),
            value: Var::new(true),
            timestamp: Vec::new(),
            ttl: Vec::new(),
            ldt: Vec::new(),
            rt: Vec::new(),
            rt_data: Vec::new(),
            overflow: false,
        }
    }

    /// Empty columns with room for about as many records (and bytes) as `like` held: no reallocation while
    /// the next batch fills up.
    pub fn new_like(like: &Columns) -> Columns {
        let r = like.rows + like.rows / 8 + 16;
        Columns {
            rows: 0,
            runs: Vec::with_capacity(like.runs.len() + like.runs.len() / 8 + 16),
            arena: Vec::with_capacity(like.arena.len() + like.arena.len() / 8 + 64),
            seq: Vec::with_capacity(r),
            clustering: Var::new_like(&like.clustering),
            is_static: Bits { bytes: Vec::with_capacity(r / 8 + 8), len: 0 },
            kind: Vec::with_capacity(r),
            column: Var::new_like(&like.column),
            path: Var::new_like(&like.path),
            value: Var::new_like(&like.value),
            timestamp: Vec::with_capacity(r),
            ttl: Vec::with_capacity(r),
            ldt: Vec::with_capacity(r),
            rt: Vec::new(),
            rt_data: Vec::new(),
            overflow: false,
        }
    }

    pub fn mark(&self) -> Mark {
        Mark { rows: self.rows, runs: self.runs.len(), arena: self.arena.len(), rt: self.rt.len(),
               rt_data: self.rt_data.len() }
    }

    /// Undo everything after `m`.
    pub fn truncate(&mut self, m: Mark) {
        let rows = m.rows;
        self.runs.truncate(m.runs);
        self.arena.truncate(m.arena);
        self.rt.truncate(m.rt);
        self.rt_data.truncate(m.rt_data);
        if rows >= self.rows {
            return;
        }
        self.seq.truncate(rows);
        self.clustering.truncate(rows);
        self.is_static.truncate(rows);
        self.kind.truncate(rows);
        self.column.truncate(rows);
        self.path.truncate(rows);
        self.value.truncate(rows);
        self.timestamp.truncate(rows);
        self.ttl.truncate(rows);
        self.ldt.truncate(rows);
        self.rows = rows;
    }

    /// The records that follow belong to partition update `u`.
    pub fn begin_update(&mut self, u: &Upd) {
        let arena = self.arena.len();
        for part in [u.segment, u.table_id, u.keyspace, u.table, u.key] {
            append(&mut self.arena, part);
        }
        self.runs.push(Run {
            start_row: self.rows,
            segment_id: u.segment_id,
            position: u.position,
            entry_index: u.entry_index,
            token: u.token,
            mutation_id: u.mutation_id,
            arena,
            lens: [u.segment.len() as u32, u.table_id.len() as u32, u.keyspace.len() as u32, u.table.len() as u32,
                   u.key.len() as u32],
        });
    }

    /// One record of the current update (range tombstones: `push_range`).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn push(&mut self, seq: i32, clustering: &[u8], is_static: bool, kind: u8, column: Option<&[u8]>,
                path: Option<&[u8]>, value: Option<&[u8]>, ts: i64, ttl: i32, ldt: i64) {
        self.seq.push(seq);
        self.clustering.push(clustering);
        self.is_static.push(is_static);
        self.kind.push(kind);
        self.column.push_opt(column);
        self.path.push_opt(path);
        self.value.push_opt(value);
        self.timestamp.push(ts);
        self.ttl.push(ttl);
        self.ldt.push(ldt);
        self.rows += 1;
    }

    #[allow(clippy::too_many_arguments)]
    pub fn push_range(&mut self, seq: i32, start: &[u8], end: &[u8], start_incl: bool, end_incl: bool, ts: i64,
                      ldt: i64) {
        let a = self.rt_data.len();
        self.rt_data.extend_from_slice(end);
        self.rt.push(Rt { row: self.rows, start_incl, end_incl, end: (a, end.len()) });
        self.push(seq, start, false, KIND_RT, None, None, None, ts, 0, ldt);
    }

    /// A record given whole (the reference's records): its own one-record run.
    #[allow(clippy::too_many_arguments)]
    pub fn push_record(&mut self, u: &Upd, seq: i32, clustering: &[u8], end: Option<&[u8]>,
                       start_incl: Option<bool>, end_incl: Option<bool>, is_static: bool, kind: u8,
                       column: Option<&[u8]>, path: Option<&[u8]>, value: Option<&[u8]>, ts: i64, ttl: i32,
                       ldt: i64) {
        self.begin_update(u);
        if end.is_some() || start_incl.is_some() || end_incl.is_some() {
            // the three are set together on range tombstones; anything else is kept as given
            let e = end.unwrap_or(b"");
            let a = self.rt_data.len();
            self.rt_data.extend_from_slice(e);
            self.rt.push(Rt { row: self.rows, start_incl: start_incl.unwrap_or(false),
                              end_incl: end_incl.unwrap_or(false), end: (a, e.len()) });
            if end.is_none() || start_incl.is_none() || end_incl.is_none() {
                self.overflow = true; // not representable here: refuse the batch rather than guess
            }
        }
        self.push(seq, clustering, is_static, kind, column, path, value, ts, ttl, ldt);
    }

    pub fn overflow(&self) -> bool {
        self.overflow || [&self.clustering, &self.column, &self.path, &self.value].iter().any(|v| v.overflow)
    }

    /// The finished Arrow columns (update-level values repeated over their records).
    pub fn finish(self) -> Result<Finished, ()> {
        let n = self.rows;
        let mut segment = Var::with_capacity(n, 0);
        let mut table_id = Var::with_capacity(n, 0);
        let mut keyspace = Var::with_capacity(n, 0);
        let mut table = Var::with_capacity(n, 0);
        let mut partition_key = Var::with_capacity(n, 0);
        let mut segment_id = Vec::with_capacity(n);
        let mut position = Vec::with_capacity(n);
        let mut entry_index = Vec::with_capacity(n);
        let mut token = Vec::with_capacity(n);
        let mut mutation_id = Var::with_capacity(n, 16 * n);
        mutation_id.nullable = true;
        // byte totals first, so every data buffer is allocated once
        let mut totals = [0usize; 5];
        for (i, r) in self.runs.iter().enumerate() {
            let end = self.runs.get(i + 1).map(|x| x.start_row).unwrap_or(n);
            let k = end - r.start_row;
            for j in 0..5 {
                totals[j] += k * r.lens[j] as usize;
            }
        }
        if totals.iter().any(|&t| t > i32::MAX as usize) {
            return Err(());
        }
        let outs: [&mut Var; 5] = [&mut segment, &mut table_id, &mut keyspace, &mut table, &mut partition_key];
        for (o, t) in outs.into_iter().zip(totals) {
            o.data.reserve_exact(t);
        }
        for (i, r) in self.runs.iter().enumerate() {
            let end = self.runs.get(i + 1).map(|x| x.start_row).unwrap_or(n);
            let k = end - r.start_row;
            if k == 0 {
                continue;
            }
            segment_id.extend(std::iter::repeat_n(r.segment_id, k));
            position.extend(std::iter::repeat_n(r.position, k));
            entry_index.extend(std::iter::repeat_n(r.entry_index, k));
            token.extend(std::iter::repeat_n(r.token, k));
            match &r.mutation_id {
                Some(id) => {
                    for _ in 0..k {
                        mutation_id.push(id);
                    }
                }
                None => {
                    for _ in 0..k {
                        mutation_id.push_opt(None);
                    }
                }
            }
            let mut a = r.arena;
            let outs: [&mut Var; 5] = [&mut segment, &mut table_id, &mut keyspace, &mut table, &mut partition_key];
            for (j, o) in outs.into_iter().enumerate() {
                let len = r.lens[j] as usize;
                o.repeat(&self.arena[a..a + len], k);
                a += len;
            }
        }
        // range tombstone columns: null except on range tombstones
        let mut clustering_end = Var::with_capacity(n, self.rt_data.len());
        clustering_end.nullable = true;
        let mut start_inclusive = OptBool::zeros(n);
        let mut end_inclusive = OptBool::zeros(n);
        clustering_end.valid = Bits::zeros(n);
        let mut last = 0usize;
        let mut off = 0i32;
        for rt in self.rt.iter() {
            clustering_end.offsets.extend(std::iter::repeat_n(off, rt.row - last));
            append(&mut clustering_end.data, &self.rt_data[rt.end.0..rt.end.0 + rt.end.1]);
            off += rt.end.1 as i32;
            clustering_end.offsets.push(off);
            clustering_end.valid.set(rt.row);
            start_inclusive.set(rt.row, rt.start_incl);
            end_inclusive.set(rt.row, rt.end_incl);
            last = rt.row + 1;
        }
        clustering_end.offsets.extend(std::iter::repeat_n(off, n - last));
        clustering_end.nulls = n - self.rt.len();
        let mut kind = Var::with_capacity(n, 0);
        for &k in self.kind.iter() {
            kind.push(KIND_NAMES[k as usize]);
        }
        Ok(Finished {
            rows: n,
            segment,
            segment_id,
            position,
            entry_index,
            seq: self.seq,
            table_id,
            keyspace,
            table,
            partition_key,
            token,
            clustering: self.clustering,
            clustering_end,
            start_inclusive,
            end_inclusive,
            is_static: self.is_static,
            kind,
            column: self.column,
            path: self.path,
            value: self.value,
            timestamp: self.timestamp,
            ttl: self.ttl,
            ldt: self.ldt,
            mutation_id,
        })
    }
}
