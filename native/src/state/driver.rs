//! One table's batch, as `state.batch.process_table` and `sinks.delta.change_rows` do it, over Arrow input:
//! the table's cell-log records and the stored records of its partitions in, the MERGE source rows of the
//! changed partitions and the events out. A partition the engine is not sure of (`Doubt`) appends nothing and
//! is named in `doubted`: the Python engine processes it, and the caller puts its events at its place.

use std::collections::BTreeMap;

use super::arrow_in::Col;
use super::engine::{self, Cell, Complex, EventCtx, Emitter, Event, Kind, PartitionState, Rec, RowState};
use super::out::{Out, StateRows};
use super::table::Table;
use crate::fxhash::FxMap;
use super::types::D;


/// The events of the partitions the engine processed, in publish order (`partition` indexes `Batch::keys`).
pub struct Events {
    pub partition: Vec<i32>,
    pub event_id: Out,
    pub op: Out,
    pub key_json: Out,
    pub event_json: Out,
    pub ts_us: Vec<i64>,
}

impl Events {
    /// Room for about `n` events (one per change is the common case).
    fn with_capacity(n: usize) -> Events {
        Events { partition: Vec::with_capacity(n), event_id: Out::var_with_capacity(n, 32 * n),
                 op: Out::var_with_capacity(n, n), key_json: Out::var_with_capacity(n, 64 * n),
                 event_json: Out::var_with_capacity(n, 1024 * n), ts_us: Vec::with_capacity(n) }
    }

    fn push(&mut self, partition: usize, e: &Event) {
        self.partition.push(partition as i32);
        self.event_id.bytes(e.event_id.as_bytes());
        self.op.bytes(&[e.op]);
        self.key_json.bytes(e.key_json.as_bytes());
        self.event_json.bytes(e.event_json.as_bytes());
        self.ts_us.push(e.ts_us);
    }
}

pub struct Output {
    /// every partition of the batch, in publish order: (partition key, token)
    pub keys: Vec<(Vec<u8>, i64)>,
    /// the threads' outputs, in publish order
    pub runs: Vec<Run>,
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

/// The identity of a cell-log record (`batch.IDENTITY_COLUMNS` within one table): copies of one record from
/// several replicas share it.
#[derive(Hash, PartialEq, Eq)]
struct Identity<'a> {
    pk: &'a [u8],
    clustering: &'a [u8],
    clustering_end: Option<&'a [u8]>,
    start_incl: Option<bool>,
    end_incl: Option<bool>,
    is_static: bool,
    kind: &'a [u8],
    column: Option<&'a [u8]>,
    path: Option<&'a [u8]>,
    value: Option<&'a [u8]>,
    ts: i64,
    ttl: i32,
    ldt: i64,
    mid: Option<&'a [u8]>,
}

/// A record of the cell log, hashed and compared by its identity: a map entry is a reference and an index, not
/// the identity's fields (two million records make a map of hundreds of megabytes otherwise).
struct ByIdentity<'l, 'a> {
    log: &'l CellLog<'a>,
    i: usize,
}

impl std::hash::Hash for ByIdentity<'_, '_> {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.log.identity(self.i).hash(h)
    }
}

impl PartialEq for ByIdentity<'_, '_> {
    fn eq(&self, o: &Self) -> bool {
        self.log.identity(self.i) == o.log.identity(o.i)
    }
}

impl Eq for ByIdentity<'_, '_> {}

struct CellLog<'a> {
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
}

impl<'a> CellLog<'a> {
    fn new(c: &'a Col) -> Result<CellLog<'a>, String> {
        let f = |name: &str, format: &str| -> Result<&'a Col, String> {
            let col = c.child(name)?;
            col.expect(format)?;
            Ok(col)
        };
        Ok(CellLog {
            segment: f("segment", "u")?, segment_id: f("segment_id", "l")?, position: f("position", "l")?,
            entry_index: f("entry_index", "i")?, seq: f("seq", "i")?, pk: f("partition_key", "z")?,
            token: f("token", "l")?, clustering: f("clustering", "z")?, clustering_end: f("clustering_end", "z")?,
            start_incl: f("start_inclusive", "b")?, end_incl: f("end_inclusive", "b")?,
            is_static: f("is_static", "b")?, kind: f("kind", "u")?, column: f("column", "u")?, path: f("path", "z")?,
            value: f("value", "z")?, ts: f("timestamp", "l")?, ttl: f("ttl", "i")?,
            ldt: f("local_deletion_time", "l")?, mid: f("mutation_id", "z")?,
        })
    }

    fn identity(&self, i: usize) -> Identity<'a> {
        Identity {
            pk: self.pk.bytes(i), clustering: self.clustering.bytes(i), clustering_end: self.clustering_end.opt_bytes(i),
            start_incl: self.start_incl.opt_bool(i), end_incl: self.end_incl.opt_bool(i),
            is_static: self.is_static.bool(i), kind: self.kind.bytes(i), column: self.column.opt_bytes(i),
            path: self.path.opt_bytes(i), value: self.value.opt_bytes(i), ts: self.ts.i64(i), ttl: self.ttl.i32(i),
            ldt: self.ldt.i64(i), mid: self.mid.opt_bytes(i),
        }
    }

    /// Make every column name the records hold known to `t` (before the engine's threads share it).
    fn intern(&self, t: &mut Table) {
        for i in 0..self.column.len {
            if let Some(c) = self.column.opt_bytes(i) {
                t.col(c);
            }
        }
    }

    /// `dedupe_records`' order among copies: the smallest wins.
    fn source_key(&self, i: usize) -> (i64, i64, &'a [u8], i32, i32) {
        (self.segment_id.i64(i), self.position.i64(i), self.segment.bytes(i), self.entry_index.i32(i), self.seq.i32(i))
    }

    /// The record as the engine applies it (its column name known to `t`: `intern`); None for a kind it does not
    /// know (the Python engine says what is wrong with it).
    fn rec(&self, t: &Table, i: usize) -> Option<Rec<'a>> {
        Some(Rec {
            segment: self.segment.bytes(i),
            segment_id: self.segment_id.i64(i),
            position: self.position.i64(i),
            kind: Kind::parse(self.kind.bytes(i))?,
            clustering: self.clustering.bytes(i),
            clustering_end: self.clustering_end.opt_bytes(i).unwrap_or(b""),
            start_incl: self.start_incl.opt_bool(i).unwrap_or(false),
            end_incl: self.end_incl.opt_bool(i).unwrap_or(false),
            is_static: self.is_static.bool(i),
            column: match self.column.opt_bytes(i) {
                Some(c) => Some(t.lookup(c)?),
                None => None,
            },
            path: self.path.opt_bytes(i),
            value: self.value.opt_bytes(i),
            ts: self.ts.i64(i),
            ttl: self.ttl.i32(i),
            ldt: self.ldt.i64(i),
            mid: self.mid.opt_bytes(i),
        })
    }
}

/// The stored records (`reconcile.STATE_SCHEMA`) of the batch's partitions, read one partition at a time
/// (`partition_from_records`) so that only one partition's state is in memory at once.
struct Stored<'a> {
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
    /// partition key -> its records
    by_key: FxMap<&'a [u8], Vec<usize>>,
}

impl<'a> Stored<'a> {
    /// Index the records by partition; every column name they hold becomes known to `t`.
    fn new(t: &mut Table, c: &'a Col) -> Result<Stored<'a>, String> {
        let f = |name: &str, format: &str| -> Result<&'a Col, String> {
            let col = c.child(name)?;
            col.expect(format)?;
            Ok(col)
        };
        let s = Stored {
            pk: f("partition_key", "z")?, kind: f("row_kind", "u")?, ck: f("clustering", "z")?,
            lts: f("liveness_ts", "l")?, lttl: f("liveness_ttl", "i")?, lldt: f("liveness_ldt", "l")?,
            dts: f("deletion_ts", "l")?, dldt: f("deletion_ldt", "l")?, sts: f("shadowable_ts", "l")?,
            sldt: f("shadowable_ldt", "l")?, cells: f("cells", "+l")?, cdels: f("complex_deletions", "+l")?,
            rts: f("range_tombstones", "+l")?, by_key: FxMap::default(),
        };
        let names = [s.cells.children[0].child("column")?, s.cdels.children[0].child("column")?];
        for col in names {
            col.expect("u")?;
            for j in 0..col.len {
                t.col(col.bytes(j));
            }
        }
        let mut by_key: FxMap<&'a [u8], Vec<usize>> = FxMap::default();
        for i in 0..c.len {
            by_key.entry(s.pk.bytes(i)).or_default().push(i);
        }
        Ok(Stored { by_key, ..s })
    }

    /// The stored state of one partition (None: not stored).
    fn partition(&self, t: &Table, pk: &[u8]) -> Result<Option<PartitionState>, String> {
        let Some(rows) = self.by_key.get(pk) else { return Ok(None) };
        let ce = &self.cells.children[0];
        let (c_col, c_path, c_value, c_ts, c_ttl, c_ldt, c_tomb) = (ce.child("column")?, ce.child("path")?,
            ce.child("value")?, ce.child("ts")?, ce.child("ttl")?, ce.child("ldt")?, ce.child("tombstone")?);
        let de = &self.cdels.children[0];
        let (d_col, d_ts, d_ldt) = (de.child("column")?, de.child("ts")?, de.child("ldt")?);
        let re = &self.rts.children[0];
        let (r_s, r_si, r_e, r_ei, r_ts, r_ldt) = (re.child("start")?, re.child("start_inclusive")?,
            re.child("end")?, re.child("end_inclusive")?, re.child("ts")?, re.child("ldt")?);
        let id = |name: &[u8]| t.lookup(name).ok_or("a column name missed by the index");
        let mut part = PartitionState::default();
        for &i in rows {
            let k = self.kind.bytes(i);
            if k == b"partition" {
                if let Some(ts) = self.dts.opt_i64(i) {
                    part.deletion = Some((ts, self.dldt.opt_i64(i).ok_or("partition deletion without ldt")?));
                }
                for j in if self.rts.valid(i) { self.rts.list_range(i) } else { 0..0 } {
                    part.rts.insert((r_s.bytes(j).to_vec(), r_si.bool(j), r_e.bytes(j).to_vec(), r_ei.bool(j)),
                                    (r_ts.i64(j), r_ldt.i64(j)));
                }
                continue;
            }
            let mut row = RowState::default();
            if let Some(ts) = self.lts.opt_i64(i) {
                row.liveness = Some((ts, self.lttl.opt_i32(i).unwrap_or(0),
                                     self.lldt.opt_i64(i).ok_or("liveness without ldt")?));
            }
            if let Some(ts) = self.dts.opt_i64(i) {
                row.deletion = Some((ts, self.dldt.opt_i64(i).ok_or("deletion without ldt")?));
            }
            if let Some(ts) = self.sts.opt_i64(i) {
                row.shadowable = Some((ts, self.sldt.opt_i64(i).ok_or("shadowable deletion without ldt")?));
            }
            for j in if self.cdels.valid(i) { self.cdels.list_range(i) } else { 0..0 } {
                let (e, _) = row.complex_mut(id(d_col.bytes(j))?);
                *e = Complex { del: Some((d_ts.i64(j), d_ldt.i64(j))), cells: BTreeMap::new() };
            }
            for j in if self.cells.valid(i) { self.cells.list_range(i) } else { 0..0 } {
                let col = id(c_col.bytes(j))?;
                let cell = Cell { ts: c_ts.i64(j), ttl: c_ttl.i32(j), ldt: c_ldt.i64(j), tomb: c_tomb.bool(j),
                                  value: c_value.bytes(j).to_vec() };
                match c_path.opt_bytes(j) {
                    None => row.set_cell(col, cell),
                    Some(p) => {
                        row.complex_mut(col).0.cells.insert(p.to_vec(), cell);
                    }
                }
            }
            match k {
                b"static" => part.static_row = row,
                b"row" => {
                    part.rows.insert(self.ck.bytes(i).to_vec(), row);
                }
                other => return Err(format!("unknown state row_kind {:?}", String::from_utf8_lossy(other))),
            }
        }
        Ok(Some(part))
    }
}

/// Every builder's length, to undo what a doubted partition appended.
fn lengths(s: &mut StateRows) -> (usize, Vec<usize>) {
    (s.n, s.columns_mut().iter().map(|o| o.len()).collect())
}

fn truncate(s: &mut StateRows, to: &(usize, Vec<usize>)) {
    s.n = to.0;
    for (o, n) in s.columns_mut().into_iter().zip(&to.1) {
        o.truncate(*n);
    }
}

/// `process_partition` for one partition: the events, the new state, whether it must be written back.
fn process_partition(em: &Emitter, pk: &[u8], recs: &[Rec], prior: Option<&PartitionState>, s: &Settings,
                     events: &mut Vec<Event>) -> D<(PartitionState, bool)> {
    let mut state = prior.cloned().unwrap_or_default();
    let mut swept = false;
    if let (Some(prev), Some(_)) = (s.prev_now, prior) {
        if s.now > prev {
            engine::sweep_partition(em, pk, &state, prev, s.now, events)?;
            swept = true;
        }
    }
    if !recs.is_empty() {
        engine::apply_partition(em, pk, &mut state, recs, s.now, events)?;
    }
    let changed = swept || match prior {
        None => !state.is_empty(),
        Some(p) => &state != p,
    };
    Ok((state, changed))
}

/// One table's batch. `cell_log`: the table's records (`CELL_LOG_SCHEMA`); `stored`: the stored records of every
/// partition the batch touches (`STATE_SCHEMA`); `expiring`: partitions to sweep that have no records.
pub fn process_table(t: &mut Table, cell_log: &Col, stored: &Col, expiring: &[Vec<u8>], s: &Settings)
                     -> Result<Output, String> {
    let log = CellLog::new(cell_log)?;
    // replica copies: one record per identity, the smallest source; kept in first-seen order
    let mut first: FxMap<ByIdentity, usize> = FxMap::with_capacity_and_hasher(cell_log.len, Default::default());
    let mut kept: Vec<usize> = Vec::with_capacity(cell_log.len);
    for i in 0..cell_log.len {
        match first.entry(ByIdentity { log: &log, i }) {
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(kept.len());
                kept.push(i);
            }
            std::collections::hash_map::Entry::Occupied(o) => {
                let slot = *o.get();
                if log.source_key(i) < log.source_key(kept[slot]) {
                    kept[slot] = i;
                }
            }
        }
    }
    drop(first);
    // partitions: their records (indexes, in first-seen order), built into `Rec`s by the thread that runs them
    log.intern(t);
    let mut by_key: FxMap<&[u8], (i64, Vec<usize>)> = FxMap::default();
    for &i in &kept {
        by_key.entry(log.pk.bytes(i)).or_insert_with(|| (log.token.i64(i), Vec::new())).1.push(i);
    }
    for pk in expiring {
        by_key.entry(pk.as_slice()).or_insert_with(|| (crate::murmur3::token(pk), Vec::new()));
    }
    let mut order: Vec<(&[u8], i64)> = by_key.iter().map(|(k, v)| (*k, v.0)).collect();
    order.sort_by(|a, b| (a.1, a.0).cmp(&(b.1, b.0)));
    let stored = Stored::new(t, stored)?;
    let t: &Table = t;
    let ctx = EventCtx { cluster: s.cluster, node: "", ts_ms: s.now * 1000 };
    let em = Emitter { t, ctx: &ctx };
    // partitions are independent: contiguous runs of them on `threads` threads, outputs joined in order
    let threads = s.threads.clamp(1, order.len().max(1));
    let per = order.len().div_ceil(threads).max(1);
    let runs: Vec<Result<Run, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = order.chunks(per).enumerate()
            .map(|(i, part)| {
                let (em, stored, by_key, log) = (&em, &stored, &by_key, &log);
                scope.spawn(move || process_run(em, stored, log, by_key, part, i * per, s))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a state engine thread panicked")).collect()
    });
    let mut runs = runs.into_iter().collect::<Result<Vec<Run>, String>>()?;
    if runs.iter_mut().any(|r| r.overflowed()) {
        return Err("a batch too large for 32-bit Arrow offsets".into());
    }
    Ok(Output { keys: order.iter().map(|(k, tok)| (k.to_vec(), *tok)).collect(), runs })
}

/// What one thread made of a contiguous run of partitions: its outputs are one chunk of the batch's (Python
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
        self.state.columns_mut().iter().any(|o| o.overflowed())
            || [&self.events.event_json, &self.events.key_json].iter().any(|o| o.overflowed())
    }
}

/// The partitions `order` (publish order; the first is partition number `first` of the batch).
fn process_run(em: &Emitter, stored: &Stored, log: &CellLog, by_key: &FxMap<&[u8], (i64, Vec<usize>)>,
               order: &[(&[u8], i64)], first: usize, s: &Settings) -> Result<Run, String> {
    let t = em.t;
    let mut out = Run { doubted: Vec::new(), events: Events::with_capacity(order.len()), state: StateRows::new(t),
                        changed: 0 };
    let mut events: Vec<Event> = Vec::new();
    let mut recs: Vec<Rec> = Vec::new();
    for (i, &(pk, token)) in order.iter().enumerate() {
        let idx = first + i;
        recs.clear();
        let mut unknown = false;
        for &j in &by_key[pk].1 {
            match log.rec(t, j) {
                Some(r) => recs.push(r),
                None => unknown = true,
            }
        }
        if unknown || !t.repr_ok {
            out.doubted.push(idx);
            continue;
        }
        let prior_state = stored.partition(t, pk)?;
        let prior = prior_state.as_ref();
        events.clear();
        let mark = lengths(&mut out.state);
        let done = process_partition(em, pk, &recs, prior, s, &mut events).and_then(|(state, changed)| {
            if changed {
                out.state.change_rows(t, pk, token, prior, &state, s.now, s.batch_seq)?;
            }
            Ok(changed)
        });
        match done {
            Ok(changed) => {
                out.changed += changed as usize;
                for e in &events {
                    out.events.push(idx, e);
                }
            }
            Err(_) => {
                truncate(&mut out.state, &mark);
                out.doubted.push(idx);
            }
        }
    }
    Ok(out)
}
