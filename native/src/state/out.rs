//! The engine's Arrow outputs, built as plain buffers that Python wraps without a copy (`state.native`): `Out`,
//! an array of any of the Arrow types the outputs use; the typed CQL values as `sinks.delta.arrow_type` and
//! `to_arrow_value` make them (`arrow_value`); and the events' columns (`Events`). The state rows are
//! `state_rows`.

use crate::columns::Bits;

use super::events::SegmentJson;
use super::images::{in_path_order, Item};
use super::text;
use super::types::{self, Doubt, Ty, D};

/// A column's validity, written only once it is needed: as long as a column's entries are all valid or all null
/// (most columns of a batch: keys and metadata are always set, deletions and TTLs of a plain batch never), it is
/// their count; the bitmap is made when the first entry of the other kind comes.
pub struct Validity {
    len: usize,
    nulls: usize,
    /// the entry that keeps the column uniform, as `push` takes it (`ALL_VALID`, `ALL_NULL`), or `EITHER` (no
    /// entries yet) or `MIXED` (neither: the bitmap is kept): one compare an entry on the way all but a few take
    uniform: u8,
    /// the bitmap, once entries are mixed
    bits: Option<Bits>,
}

// `push` compares `uniform` with its entry as a byte: these two are the entries' values
const ALL_NULL: u8 = false as u8;
const ALL_VALID: u8 = true as u8;
const EITHER: u8 = 2;
const MIXED: u8 = 3;

impl Default for Validity {
    fn default() -> Validity {
        Validity { len: 0, nulls: 0, uniform: EITHER, bits: None }
    }
}

impl Validity {
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `len` valid entries.
    pub fn valid(len: usize) -> Validity {
        Validity { len, nulls: 0, uniform: if len == 0 { EITHER } else { ALL_VALID }, bits: None }
    }

    #[inline(always)]
    pub fn push(&mut self, valid: bool) {
        if self.uniform == valid as u8 {
            self.nulls += !valid as usize;
            self.len += 1;
        } else {
            self.push_other(valid);
        }
    }

    /// `push` of an entry that is not the kind the entries so far all are: the first entry, or the first of the
    /// other kind (the bitmap is made), or any once they are mixed.
    #[inline(never)]
    fn push_other(&mut self, valid: bool) {
        match self.uniform {
            EITHER => self.uniform = if valid { ALL_VALID } else { ALL_NULL },
            MIXED => {}
            _ => {
                // the bitmap of the entries so far (all valid, or all null)
                let mut bits = Bits::zeros(self.len);
                if self.nulls == 0 {
                    bits.bytes.fill(0xff);
                    if !self.len.is_multiple_of(8) {
                        // zeros after them in the last byte: `Bits::push` only sets bits
                        *bits.bytes.last_mut().unwrap() = (1u8 << (self.len % 8)) - 1;
                    }
                }
                self.bits = Some(bits);
                self.uniform = MIXED;
            }
        }
        if let Some(bits) = self.bits.as_mut() {
            bits.push(valid);
        }
        self.nulls += !valid as usize;
        self.len += 1;
    }

    /// Drop the entries after the first `n`.
    pub fn truncate(&mut self, n: usize) {
        if n >= self.len {
            return;
        }
        match &mut self.bits {
            Some(bits) => {
                bits.truncate(n);
                self.nulls = bits.count_zeros();
            }
            None => self.nulls = self.nulls.min(n),
        }
        self.len = n;
        if n == 0 && self.bits.is_none() {
            self.uniform = EITHER;
        }
    }

    /// Room for `n` more entries (in the bitmap, if there is one).
    pub fn reserve(&mut self, n: usize) {
        if let Some(bits) = &mut self.bits {
            bits.reserve(n);
        }
    }

    /// The null count, and the bitmap Arrow needs when there is a null (all zeros for a column of nulls only).
    pub fn finish(self) -> (usize, Option<Bits>) {
        match (self.nulls, self.bits) {
            (0, _) => (0, None),
            (nulls, Some(bits)) => (nulls, Some(bits)),
            (nulls, None) => (nulls, Some(Bits::zeros(self.len))),
        }
    }
}

/// One Arrow array under construction; `Python` builds it with `pa.Array.from_buffers`. A fixed-width column's
/// values `v` may be fewer than its entries: the nulls after its last value are written only when a value follows
/// them, so a column of nulls only (a batch without deletions or TTLs has several) writes nothing (`filled`).
pub enum Out {
    /// binary or string (i32 offsets)
    Var { offsets: Vec<i32>, data: Vec<u8>, valid: Validity },
    I8 { v: Vec<i8>, valid: Validity },
    I16 { v: Vec<i16>, valid: Validity },
    I32 { v: Vec<i32>, valid: Validity },
    I64 { v: Vec<i64>, valid: Validity },
    F32 { v: Vec<u32>, valid: Validity },
    F64 { v: Vec<u64>, valid: Validity },
    Bool { v: Bits, valid: Validity },
    /// list (and map: its child is the struct of key and value)
    List { offsets: Vec<i32>, valid: Validity, child: Box<Out> },
    Struct { valid: Validity, children: Vec<Out> },
}

impl Out {
    pub fn var() -> Out {
        Out::Var { offsets: vec![0], data: Vec::new(), valid: Validity::default() }
    }

    /// A binary/string column with room for `items` values of `bytes` in all: reserved address space is not
    /// memory until written, and growing by doubling would copy the data and touch fresh pages again.
    pub fn var_with_capacity(items: usize, bytes: usize) -> Out {
        let mut offsets = Vec::with_capacity(items + 1);
        offsets.push(0);
        Out::Var { offsets, data: Vec::with_capacity(bytes), valid: Validity::default() }
    }

    pub fn list(child: Out) -> Out {
        Out::List { offsets: vec![0], valid: Validity::default(), child: Box::new(child) }
    }

    pub fn len(&self) -> usize {
        match self {
            Out::Var { valid, .. } | Out::I8 { valid, .. } | Out::I16 { valid, .. } | Out::I32 { valid, .. }
            | Out::I64 { valid, .. } | Out::F32 { valid, .. } | Out::F64 { valid, .. } | Out::Bool { valid, .. }
            | Out::List { valid, .. } | Out::Struct { valid, .. } => valid.len(),
        }
    }

    /// Append a null.
    pub fn null(&mut self) {
        match self {
            Out::Var { offsets, valid, .. } => {
                offsets.push(*offsets.last().unwrap());
                valid.push(false);
            }
            // fixed-width: the value is written only if one follows (`fixed`)
            Out::I8 { valid, .. } | Out::I16 { valid, .. } | Out::I32 { valid, .. } | Out::I64 { valid, .. }
            | Out::F32 { valid, .. } | Out::F64 { valid, .. } => valid.push(false),
            Out::Bool { v, valid } => {
                v.push(false);
                valid.push(false);
            }
            Out::List { offsets, valid, .. } => {
                offsets.push(*offsets.last().unwrap());
                valid.push(false);
            }
            Out::Struct { valid, children } => {
                valid.push(false);
                for c in children.iter_mut() {
                    c.null();
                }
            }
        }
    }

    /// How many bytes a binary/string column holds.
    pub fn data_len(&self) -> usize {
        match self {
            Out::Var { data, .. } => data.len(),
            _ => unreachable!("data_len() on a non-binary column"),
        }
    }

    /// Write `b` over a binary/string column's bytes from `at` on (bytes of the same kind: ASCII over ASCII).
    pub fn overwrite(&mut self, at: usize, b: &[u8]) {
        match self {
            Out::Var { data, .. } => data[at..at + b.len()].copy_from_slice(b),
            _ => unreachable!("overwrite() on a non-binary column"),
        }
    }

    pub fn bytes(&mut self, b: &[u8]) {
        if let Out::Var { offsets, data, valid } = self {
            crate::columns::append(data, b);
            offsets.push(data.len() as i32);
            valid.push(true);
        } else {
            unreachable!("bytes() on a non-binary column")
        }
    }

    /// Append a string value that `f` writes straight into the column's data (no string of its own, no copy);
    /// nothing is appended when `f` doubts. For string columns only: their data is UTF-8 throughout.
    pub fn push_str_with(&mut self, f: impl FnOnce(&mut String) -> D<()>) -> D<()> {
        if let Out::Var { offsets, data, valid } = self {
            let start = data.len();
            // SAFETY: a string column's data holds only what `&str`s and Strings appended (UTF-8), and `f` can
            // append only through the String
            let mut text = unsafe { String::from_utf8_unchecked(std::mem::take(data)) };
            let done = f(&mut text);
            *data = text.into_bytes();
            match done {
                Ok(()) => {
                    offsets.push(data.len() as i32);
                    valid.push(true);
                }
                Err(_) => data.truncate(start),
            }
            done
        } else {
            unreachable!("push_str_with() on a non-binary column")
        }
    }

    pub fn opt_bytes(&mut self, b: Option<&[u8]>) {
        match b {
            Some(b) => self.bytes(b),
            None => self.null(),
        }
    }

    pub fn i64(&mut self, x: i64) {
        if let Out::I64 { v, valid } = self {
            fixed(v, valid, x);
        } else {
            unreachable!("i64() on another column")
        }
    }

    pub fn opt_i64(&mut self, x: Option<i64>) {
        match x {
            Some(x) => self.i64(x),
            None => self.null(),
        }
    }

    pub fn i32(&mut self, x: i32) {
        if let Out::I32 { v, valid } = self {
            fixed(v, valid, x);
        } else {
            unreachable!("i32() on another column")
        }
    }

    pub fn opt_i32(&mut self, x: Option<i32>) {
        match x {
            Some(x) => self.i32(x),
            None => self.null(),
        }
    }

    pub fn bool(&mut self, x: bool) {
        if let Out::Bool { v, valid } = self {
            v.push(x);
            valid.push(true);
        } else {
            unreachable!("bool() on another column")
        }
    }

    /// Close a list entry holding the child values appended since the last one.
    pub fn end_list(&mut self) {
        if let Out::List { offsets, valid, child } = self {
            offsets.push(child.len() as i32);
            valid.push(true);
        } else {
            unreachable!("end_list() on another column")
        }
    }

    pub fn end_struct(&mut self) {
        if let Out::Struct { valid, .. } = self {
            valid.push(true);
        } else {
            unreachable!("end_struct() on another column")
        }
    }

    pub fn child(&mut self, i: usize) -> &mut Out {
        match self {
            Out::List { child, .. } => child,
            Out::Struct { children, .. } => &mut children[i],
            _ => unreachable!("child() of a flat column"),
        }
    }

    /// Drop everything appended after the first `n` entries (what a doubted partition appended).
    pub fn truncate(&mut self, n: usize) {
        match self {
            Out::Var { offsets, data, valid } => {
                if n < valid.len() {
                    offsets.truncate(n + 1);
                    data.truncate(offsets[n] as usize);
                    valid.truncate(n);
                }
            }
            Out::I8 { v, valid } => {
                v.truncate(n);
                valid.truncate(n);
            }
            Out::I16 { v, valid } => {
                v.truncate(n);
                valid.truncate(n);
            }
            Out::I32 { v, valid } => {
                v.truncate(n);
                valid.truncate(n);
            }
            Out::I64 { v, valid } => {
                v.truncate(n);
                valid.truncate(n);
            }
            Out::F32 { v, valid } => {
                v.truncate(n);
                valid.truncate(n);
            }
            Out::F64 { v, valid } => {
                v.truncate(n);
                valid.truncate(n);
            }
            Out::Bool { v, valid } => {
                v.truncate(n);
                valid.truncate(n);
            }
            Out::List { offsets, valid, child } => {
                if n < valid.len() {
                    offsets.truncate(n + 1);
                    child.truncate(offsets[n] as usize);
                    valid.truncate(n);
                }
            }
            Out::Struct { valid, children } => {
                for c in children.iter_mut() {
                    c.truncate(n);
                }
                valid.truncate(n);
            }
        }
    }

    /// Room for `factor` times what the column holds now, more (children and data bytes alike): a run's columns
    /// sized from its first partitions, instead of growing by doubling, which copies every buffer and touches
    /// fresh pages again at each step.
    pub fn reserve_scaled(&mut self, factor: f64) {
        let more = |n: usize| (n as f64 * factor) as usize;
        fn values<T>(v: &mut Vec<T>, valid: &mut Validity, more: impl Fn(usize) -> usize) {
            v.reserve(more(v.len()));
            valid.reserve(more(valid.len()));
        }
        match self {
            Out::Var { offsets, data, valid } => {
                offsets.reserve(more(valid.len()));
                data.reserve(more(data.len()));
                valid.reserve(more(valid.len()));
            }
            Out::I8 { v, valid } => values(v, valid, more),
            Out::I16 { v, valid } => values(v, valid, more),
            Out::I32 { v, valid } => values(v, valid, more),
            Out::I64 { v, valid } => values(v, valid, more),
            Out::F32 { v, valid } => values(v, valid, more),
            Out::F64 { v, valid } => values(v, valid, more),
            Out::Bool { v, valid } => {
                v.reserve(more(v.len));
                valid.reserve(more(valid.len()));
            }
            Out::List { offsets, valid, child } => {
                offsets.reserve(more(valid.len()));
                valid.reserve(more(valid.len()));
                child.reserve_scaled(factor);
            }
            Out::Struct { valid, children } => {
                valid.reserve(more(valid.len()));
                for c in children.iter_mut() {
                    c.reserve_scaled(factor);
                }
            }
        }
    }

    /// Whether a 32-bit offset overflowed (the caller then hands the table to the Python engine).
    pub fn overflowed(&self) -> bool {
        match self {
            Out::Var { data, .. } => data.len() > i32::MAX as usize,
            Out::List { child, .. } => child.len() > i32::MAX as usize || child.overflowed(),
            Out::Struct { children, .. } => children.iter().any(|c| c.overflowed()),
            _ => false,
        }
    }
}

/// Append value `x` to a fixed-width column, first writing the nulls `Out::null` left unwritten.
#[inline]
fn fixed<T: Copy + Default>(v: &mut Vec<T>, valid: &mut Validity, x: T) {
    if v.len() < valid.len() {
        v.resize(valid.len(), T::default());
    }
    v.push(x);
    valid.push(true);
}

/// A fixed-width column's `len` values, the nulls left unwritten at its end as zeros: for a column of nulls only,
/// zeroed memory from the allocator, which leaves it untouched (the system's pages are zero already).
pub fn filled<T: Copy + Default>(mut v: Vec<T>, len: usize) -> Vec<T> {
    if v.is_empty() {
        return vec![T::default(); len];
    }
    v.resize(len, T::default());
    v
}

// ---- events ----------------------------------------------------------------------------------------------------

/// The events of the partitions a thread processed, in publish order (`partition` indexes the batch's keys),
/// written straight into their Arrow columns.
pub struct Events {
    /// each event's partition: its index among the batch's partitions (publish order), its token and key, and the
    /// event's number among the partition's events
    pub partition: Vec<i32>,
    pub token: Vec<i64>,
    pub partition_key: Out,
    pub idx: Vec<i64>,
    pub event_id: Out,
    pub op: Out,
    pub key_json: Out,
    pub event_json: Out,
    pub ts_us: Vec<i64>,
    /// the partition the events being written belong to: its index, its token, where its events start
    current: (i32, i64, usize),
    /// what an event id hashes (`events::event_id_input`), written here first (one buffer for all the events)
    pub scratch: Vec<u8>,
    /// an event's key columns as JSON (`events::key_columns_json`), written once for its key and both rows
    pub key_text: String,
    /// the segment name the last event named, as JSON
    pub segments: SegmentJson,
    /// the event whose id waits to be hashed with the next event's (`events::Emitter::event`), and its input
    pub pending_id: Option<PendingId>,
    pub pending_input: Vec<u8>,
}

/// Where an event's id goes once it is hashed: the event's number, and the offsets of its 32 digits (zeros until
/// then) in the `event_id` and `event_json` columns' data.
pub struct PendingId {
    pub event: usize,
    pub id_at: usize,
    pub json_at: usize,
}

impl Events {
    /// Room for about `n` events (one per change is the common case).
    pub fn with_capacity(n: usize) -> Events {
        Events { partition: Vec::with_capacity(n), token: Vec::with_capacity(n),
                 partition_key: Out::var_with_capacity(n, 16 * n), idx: Vec::with_capacity(n),
                 event_id: Out::var_with_capacity(n, 32 * n), op: Out::var_with_capacity(n, n),
                 key_json: Out::var_with_capacity(n, 64 * n), event_json: Out::var_with_capacity(n, 1024 * n),
                 ts_us: Vec::with_capacity(n), current: (0, 0, 0), scratch: Vec::with_capacity(1024),
                 key_text: String::with_capacity(64), segments: SegmentJson::default(), pending_id: None,
                 pending_input: Vec::with_capacity(1024) }
    }

    /// Write the waiting event's id (`pending_id`), which then waits no more.
    pub fn fill_pending_id(&mut self, hex: &[u8; 32]) {
        if let Some(p) = self.pending_id.take() {
            self.event_id.overwrite(p.id_at, hex);
            self.event_json.overwrite(p.json_at, hex);
        }
    }

    pub fn len(&self) -> usize {
        self.partition.len()
    }

    /// The events written next are partition `index`'s (of token `token`).
    pub fn start_partition(&mut self, index: i32, token: i64) {
        self.current = (index, token, self.len());
    }

    /// An event's partition columns, its op and its write time (its text columns are written by the caller).
    pub fn push_partition_columns(&mut self, pk: &[u8], op: u8, ts_us: i64) {
        let (index, token, first) = self.current;
        self.idx.push((self.len() - first) as i64);
        self.partition.push(index);
        self.token.push(token);
        self.partition_key.bytes(pk);
        self.op.bytes(&[op]);
        self.ts_us.push(ts_us);
    }

    /// Drop the events after the first `n` (what a doubted partition wrote).
    pub fn truncate(&mut self, n: usize) {
        if self.pending_id.as_ref().is_some_and(|p| p.event >= n) {
            self.pending_id = None;
        }
        self.partition.truncate(n);
        self.token.truncate(n);
        self.idx.truncate(n);
        self.ts_us.truncate(n);
        for o in [&mut self.partition_key, &mut self.event_id, &mut self.op, &mut self.key_json,
                  &mut self.event_json] {
            o.truncate(n);
        }
    }
}

// ---- typed columns: sinks.delta.arrow_type / to_arrow_value --------------------------------------------------

/// Whether Arrow's type for `t` is nested (a map with such a key is a list of key/value structs).
fn arrow_nested(t: &Ty) -> bool {
    matches!(t, Ty::Duration | Ty::List(..) | Ty::Set(..) | Ty::Vector(..) | Ty::Map(..) | Ty::Tuple(_) | Ty::Udt(..))
}

/// An empty builder for `arrow_type(t)`.
pub fn builder(t: &Ty) -> Out {
    let v = Validity::default;
    match t {
        Ty::Ascii | Ty::Text | Ty::Varint | Ty::Decimal | Ty::Uuid | Ty::TimeUuid | Ty::Inet | Ty::Blob | Ty::Custom(_)
        | Ty::Empty => Out::var(),
        Ty::Bool => Out::Bool { v: Bits::default(), valid: v() },
        Ty::Int(1) => Out::I8 { v: Vec::new(), valid: v() },
        Ty::Int(2) => Out::I16 { v: Vec::new(), valid: v() },
        Ty::Int(4) | Ty::Date => Out::I32 { v: Vec::new(), valid: v() },
        Ty::Int(_) | Ty::Counter | Ty::Time | Ty::Timestamp => Out::I64 { v: Vec::new(), valid: v() },
        Ty::Float => Out::F32 { v: Vec::new(), valid: v() },
        Ty::Double => Out::F64 { v: Vec::new(), valid: v() },
        Ty::Duration => Out::Struct {
            valid: v(),
            children: vec![Out::I32 { v: Vec::new(), valid: v() }, Out::I32 { v: Vec::new(), valid: v() },
                           Out::I64 { v: Vec::new(), valid: v() }],
        },
        Ty::List(e, _) | Ty::Set(e, _) | Ty::Vector(e, _) => Out::list(builder(e)),
        Ty::Map(k, val, _) => Out::list(Out::Struct { valid: v(), children: vec![builder(k), builder(val)] }),
        Ty::Tuple(f) | Ty::Udt(_, f, _) => Out::Struct { valid: v(), children: f.iter().map(builder).collect() },
    }
}

/// Append `to_arrow_value(t, t.decode(b))` (None: null). Inlined where it is called: a state row's typed columns
/// are mostly text and integers, written here; the other types in `arrow_value_other`.
#[inline(always)]
pub fn arrow_value(o: &mut Out, t: &Ty, b: Option<&[u8]>) -> D<()> {
    let b = match b {
        None => {
            o.null();
            return Ok(());
        }
        Some(b) => b,
    };
    if b.is_empty() && !t.empty_is_value() {
        o.null(); // EMPTY shows as null in the typed columns
        return Ok(());
    }
    match t {
        Ty::Ascii | Ty::Text => {
            let ok = b.is_ascii() || (matches!(t, Ty::Text) && std::str::from_utf8(b).is_ok());
            if !ok {
                return Err(Doubt);
            }
            o.bytes(b)
        }
        Ty::Int(size) => {
            if b.len() != *size as usize {
                return Err(Doubt);
            }
            let x = types::be_int(b);
            match o {
                Out::I8 { v, valid } => fixed(v, valid, x as i8),
                Out::I16 { v, valid } => fixed(v, valid, x as i16),
                Out::I32 { v, valid } => fixed(v, valid, x as i32),
                _ => o.i64(x),
            }
        }
        _ => return arrow_value_other(o, t, b),
    }
    Ok(())
}

/// `arrow_value` of a value of any type but text and the integers, not empty where that shows as null.
#[inline(never)]
fn arrow_value_other(o: &mut Out, t: &Ty, b: &[u8]) -> D<()> {
    match t {
        Ty::Ascii | Ty::Text | Ty::Int(_) => unreachable!("arrow_value writes these"),
        Ty::Blob => o.bytes(b),
        Ty::Custom(f) => {
            if matches!(f, Some(f) if *f as usize != b.len()) {
                return Err(Doubt);
            }
            o.bytes(b)
        }
        Ty::Empty => return Err(Doubt),
        Ty::Varint => o.bytes(text::bigint_str(b).as_bytes()),
        Ty::Decimal => {
            if b.len() < 5 {
                return Err(Doubt);
            }
            let mut s = String::new();
            text::decimal_str(&mut s, &b[4..], i32::from_be_bytes(b[..4].try_into().unwrap()));
            o.bytes(s.as_bytes())
        }
        Ty::Uuid | Ty::TimeUuid => {
            if b.len() != 16 {
                return Err(Doubt);
            }
            let mut s = String::new();
            types::format_uuid(&mut s, b);
            o.bytes(s.as_bytes())
        }
        Ty::Inet => {
            let mut s = String::new();
            types::format_inet(&mut s, b)?;
            o.bytes(s.as_bytes())
        }
        Ty::Bool => {
            if b.len() != 1 {
                return Err(Doubt);
            }
            if let Out::Bool { v, valid } = o {
                v.push(b[0] != 0);
                valid.push(true);
            }
        }
        Ty::Counter => {
            let total = types::counter_total(b)?;
            o.i64(i64::try_from(total).map_err(|_| Doubt)?);
        }
        Ty::Float => {
            let bits = u32::from_be_bytes(b.try_into().map_err(|_| Doubt)?);
            // the float Python decodes goes through a double; C's double -> float conversion keeps a NaN's
            // payload and quiets it
            let bits = if f32::from_bits(bits).is_nan() { bits | 0x0040_0000 } else { bits };
            if let Out::F32 { v, valid } = o {
                fixed(v, valid, bits);
            }
        }
        Ty::Double => {
            let bits = u64::from_be_bytes(b.try_into().map_err(|_| Doubt)?);
            if let Out::F64 { v, valid } = o {
                fixed(v, valid, bits);
            }
        }
        Ty::Date => {
            let u = u32::from_be_bytes(b.try_into().map_err(|_| Doubt)?);
            o.i32((u as i64 - (1i64 << 31)) as i32);
        }
        Ty::Time => o.i64(i64::from_be_bytes(b.try_into().map_err(|_| Doubt)?)),
        Ty::Timestamp => {
            let ms = i64::from_be_bytes(b.try_into().map_err(|_| Doubt)?);
            o.opt_i64(ms.checked_mul(1000)); // beyond +-292,000 years: null
        }
        Ty::Duration => {
            let (m, d, n) = types::duration_parts(b)?;
            o.child(0).i32(m as i32);
            o.child(1).i32(d as i32);
            o.child(2).i64(n);
            o.end_struct();
        }
        Ty::List(e, _) | Ty::Set(e, _) => {
            let els = types::collection_elements(b)?;
            for x in els {
                arrow_value(o.child(0), e, x)?;
            }
            o.end_list();
        }
        Ty::Vector(e, dim) => {
            let els = types::vector_elements(e, *dim, b)?;
            for x in els {
                arrow_value(o.child(0), e, Some(x))?;
            }
            o.end_list();
        }
        Ty::Map(k, v, _) => {
            let pairs = types::map_pairs(b)?;
            map_value(o, k, v, &pairs)?;
        }
        Ty::Tuple(f) => {
            let vals = types::split_fields(b, f.len())?;
            for (i, ft) in f.iter().enumerate() {
                arrow_value(o.child(i), ft, vals.get(i).copied().flatten())?;
            }
            o.end_struct();
        }
        Ty::Udt(_, f, _) => {
            let vals = types::split_fields(b, f.len())?;
            for (i, ft) in f.iter().enumerate() {
                arrow_value(o.child(i), ft, vals.get(i).copied().flatten())?;
            }
            o.end_struct();
        }
    }
    Ok(())
}

/// A map value: pairs (an Arrow map, null as a whole when a key shows as null), or key/value structs when the
/// key's Arrow type is nested (Python then fails on maps with unhashable keys: a doubt).
fn map_value(o: &mut Out, k: &Ty, v: &Ty, pairs: &[(Option<&[u8]>, Option<&[u8]>)]) -> D<()> {
    // the same dict of decoded keys as for JSON: keys that decode equal merge there
    let mut probe = String::new();
    types::json_map(&mut probe, k, v, pairs)?;
    if arrow_nested(k) {
        if matches!(k, Ty::List(..) | Ty::Map(..) | Ty::Vector(..)) || !hashable(k) {
            return Err(Doubt);
        }
    } else if pairs.iter().any(|(kb, _)| kb.is_none_or(|kb| kb.is_empty() && !k.empty_is_value())) {
        o.null(); // an empty-value or null key cannot be an Arrow map key; exact in _cdc_cells
        return Ok(());
    }
    for (kb, vb) in pairs {
        let entry = o.child(0);
        arrow_value(entry.child(0), k, *kb)?;
        arrow_value(entry.child(1), v, *vb)?;
        entry.end_struct();
    }
    o.end_list();
    Ok(())
}

fn hashable(t: &Ty) -> bool {
    match t {
        Ty::List(..) | Ty::Map(..) | Ty::Vector(..) => false,
        Ty::Set(e, _) => hashable(e),
        Ty::Tuple(f) | Ty::Udt(_, f, _) => f.iter().all(hashable),
        _ => true,
    }
}

/// Append a complex column's typed value from its live items (`decode_cells` in path order, then the
/// converter).
pub fn arrow_complex(o: &mut Out, t: &Ty, items: &[Item]) -> D<()> {
    match t {
        Ty::List(e, _) => {
            for (_, v) in items {
                arrow_value(o.child(0), e, Some(v))?;
            }
            o.end_list();
        }
        Ty::Set(e, _) => {
            for (p, _) in in_path_order(e, items)? {
                arrow_value(o.child(0), e, Some(p))?;
            }
            o.end_list();
        }
        Ty::Map(k, v, _) => {
            let ordered = in_path_order(k, items)?;
            let pairs: Vec<(Option<&[u8]>, Option<&[u8]>)> = ordered.iter().map(|(p, x)| (Some(*p), Some(*x))).collect();
            map_value(o, k, v, &pairs)?;
        }
        Ty::Udt(_, f, _) => {
            let mut vals: Vec<Option<&[u8]>> = vec![None; f.len()];
            for (p, v) in items {
                let p = p.ok_or(Doubt)?;
                if p.len() != 2 {
                    return Err(Doubt);
                }
                let i = i16::from_be_bytes([p[0], p[1]]);
                if i < 0 || i as usize >= f.len() {
                    return Err(Doubt);
                }
                vals[i as usize] = Some(v);
            }
            for (i, ft) in f.iter().enumerate() {
                arrow_value(o.child(i), ft, vals[i])?;
            }
            o.end_struct();
        }
        _ => return Err(Doubt),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Validity;

    /// The entries `finish` describes: (null count, each entry's validity).
    fn described(v: Validity) -> (usize, Vec<bool>) {
        let len = v.len();
        match v.finish() {
            (0, None) => (0, vec![true; len]),
            (nulls, Some(bits)) => (nulls, (0..len).map(|i| bits.bytes[i / 8] & (1 << (i % 8)) != 0).collect()),
            (nulls, None) => panic!("{nulls} nulls without a bitmap"),
        }
    }

    #[test]
    fn validity_describes_every_sequence_of_entries_as_pushed() {
        // every sequence of up to 10 entries, and each truncated at every length, against the entries themselves
        for n in 0..=10usize {
            for pattern in 0u32..1 << n {
                let entries: Vec<bool> = (0..n).map(|i| pattern & (1 << i) != 0).collect();
                let mut v = Validity::default();
                entries.iter().for_each(|&e| v.push(e));
                let nulls = entries.iter().filter(|&&e| !e).count();
                assert_eq!(described(v), (nulls, entries.clone()), "{entries:?}");
                for keep in 0..=n {
                    let mut v = Validity::default();
                    entries.iter().for_each(|&e| v.push(e));
                    v.truncate(keep);
                    // pushes after a truncation continue from what was kept
                    v.push(false);
                    v.push(true);
                    let mut want = entries[..keep].to_vec();
                    want.extend([false, true]);
                    let want_nulls = want.iter().filter(|&&e| !e).count();
                    assert_eq!(described(v), (want_nulls, want.clone()), "{entries:?} kept {keep}");
                }
            }
        }
        let mut v = Validity::valid(5);
        v.push(true);
        assert_eq!(described(v), (0, vec![true; 6]));
    }
}
