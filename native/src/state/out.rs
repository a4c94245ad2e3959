//! The engine's Arrow outputs, built as plain buffers that Python wraps without a copy (`state.native`):
//! the state rows of changed partitions (`sinks.delta.change_rows`: the typed CQL columns as
//! `sinks.delta.arrow_type`/`to_arrow_value` make them, then the `_cdc_*` metadata) and the events.

use crate::columns::Bits;

use super::engine::{self, Cell, IVal, Image, Images, Item, PartitionState, RowState};
use super::key;
use super::table::{ColId, Role, Table};
use super::text;
use super::types::{self, Doubt, Ty, D};

/// One Arrow array under construction; `Python` builds it with `pa.Array.from_buffers`. A fixed-width column's
/// values `v` may be fewer than its entries: the nulls after its last value are written only when a value follows
/// them, so a column of nulls only (a batch without deletions or TTLs has several) writes nothing (`filled`).
pub enum Out {
    /// binary or string (i32 offsets)
    Var { offsets: Vec<i32>, data: Vec<u8>, valid: Bits },
    I8 { v: Vec<i8>, valid: Bits },
    I16 { v: Vec<i16>, valid: Bits },
    I32 { v: Vec<i32>, valid: Bits },
    I64 { v: Vec<i64>, valid: Bits },
    F32 { v: Vec<u32>, valid: Bits },
    F64 { v: Vec<u64>, valid: Bits },
    Bool { v: Bits, valid: Bits },
    /// list (and map: its child is the struct of key and value)
    List { offsets: Vec<i32>, valid: Bits, child: Box<Out> },
    Struct { valid: Bits, children: Vec<Out> },
}

impl Out {
    pub fn var() -> Out {
        Out::Var { offsets: vec![0], data: Vec::new(), valid: Bits::default() }
    }

    /// A binary/string column with room for `items` values of `bytes` in all: reserved address space is not
    /// memory until written, and growing by doubling would copy the data and touch fresh pages again.
    pub fn var_with_capacity(items: usize, bytes: usize) -> Out {
        let mut offsets = Vec::with_capacity(items + 1);
        offsets.push(0);
        Out::Var { offsets, data: Vec::with_capacity(bytes), valid: Bits::default() }
    }

    pub fn list(child: Out) -> Out {
        Out::List { offsets: vec![0], valid: Bits::default(), child: Box::new(child) }
    }

    pub fn len(&self) -> usize {
        match self {
            Out::Var { valid, .. } | Out::I8 { valid, .. } | Out::I16 { valid, .. } | Out::I32 { valid, .. }
            | Out::I64 { valid, .. } | Out::F32 { valid, .. } | Out::F64 { valid, .. } | Out::Bool { valid, .. }
            | Out::List { valid, .. } | Out::Struct { valid, .. } => valid.len,
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

    pub fn bytes(&mut self, b: &[u8]) {
        if let Out::Var { offsets, data, valid } = self {
            data.extend_from_slice(b);
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
                if n < valid.len {
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
                if n < valid.len {
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
        fn values<T>(v: &mut Vec<T>, valid: &mut Bits, more: impl Fn(usize) -> usize) {
            v.reserve(more(v.len()));
            valid.reserve(more(valid.len));
        }
        match self {
            Out::Var { offsets, data, valid } => {
                offsets.reserve(more(valid.len));
                data.reserve(more(data.len()));
                valid.reserve(more(valid.len));
            }
            Out::I8 { v, valid } => values(v, valid, more),
            Out::I16 { v, valid } => values(v, valid, more),
            Out::I32 { v, valid } => values(v, valid, more),
            Out::I64 { v, valid } => values(v, valid, more),
            Out::F32 { v, valid } => values(v, valid, more),
            Out::F64 { v, valid } => values(v, valid, more),
            Out::Bool { v, valid } => {
                v.reserve(more(v.len));
                valid.reserve(more(valid.len));
            }
            Out::List { offsets, valid, child } => {
                offsets.reserve(more(valid.len));
                valid.reserve(more(valid.len));
                child.reserve_scaled(factor);
            }
            Out::Struct { valid, children } => {
                valid.reserve(more(valid.len));
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
fn fixed<T: Copy + Default>(v: &mut Vec<T>, valid: &mut Bits, x: T) {
    if v.len() < valid.len {
        v.resize(valid.len, T::default());
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
    pub partition: Vec<i32>,
    pub event_id: Out,
    pub op: Out,
    pub key_json: Out,
    pub event_json: Out,
    pub ts_us: Vec<i64>,
    /// the partition the events being written belong to
    pub current: i32,
    /// the Python reprs an event id hashes, written here first (one buffer for all the events)
    pub scratch: String,
}

impl Events {
    /// Room for about `n` events (one per change is the common case).
    pub fn with_capacity(n: usize) -> Events {
        Events { partition: Vec::with_capacity(n), event_id: Out::var_with_capacity(n, 32 * n),
                 op: Out::var_with_capacity(n, n), key_json: Out::var_with_capacity(n, 64 * n),
                 event_json: Out::var_with_capacity(n, 1024 * n), ts_us: Vec::with_capacity(n), current: 0,
                 scratch: String::with_capacity(1024) }
    }

    pub fn len(&self) -> usize {
        self.partition.len()
    }

    /// Drop the events after the first `n` (what a doubted partition wrote).
    pub fn truncate(&mut self, n: usize) {
        self.partition.truncate(n);
        self.ts_us.truncate(n);
        for o in [&mut self.event_id, &mut self.op, &mut self.key_json, &mut self.event_json] {
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
    let v = || Bits::default();
    match t {
        Ty::Ascii | Ty::Text | Ty::Varint | Ty::Decimal | Ty::Uuid | Ty::TimeUuid | Ty::Inet | Ty::Blob | Ty::Custom(_)
        | Ty::Empty => Out::var(),
        Ty::Bool => Out::Bool { v: v(), valid: v() },
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

/// Append `to_arrow_value(t, t.decode(b))` (None: null).
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
            let ok = if let Ty::Ascii = t { b.is_ascii() } else { std::str::from_utf8(b).is_ok() };
            if !ok {
                return Err(Doubt);
            }
            o.bytes(b)
        }
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
        Ty::Int(size) => {
            if b.len() != *size as usize {
                return Err(Doubt);
            }
            let x = text::bigint_i128(b).unwrap();
            match o {
                Out::I8 { v, valid } => fixed(v, valid, x as i8),
                Out::I16 { v, valid } => fixed(v, valid, x as i16),
                Out::I32 { v, valid } => fixed(v, valid, x as i32),
                _ => o.i64(x as i64),
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
            for (p, _) in engine::in_path_order(e, items)? {
                arrow_value(o.child(0), e, Some(p))?;
            }
            o.end_list();
        }
        Ty::Map(k, v, _) => {
            let ordered = engine::in_path_order(k, items)?;
            let pairs: Vec<(Option<&[u8]>, Option<&[u8]>)> = ordered.iter().map(|(p, x)| (Some(*p), Some(*x))).collect();
            map_value(o, k, v, &pairs)?;
        }
        Ty::Udt(_, f, _) => {
            let mut vals: Vec<Option<&[u8]>> = vec![None; f.len()];
            for (p, v) in items {
                let p = p.as_ref().ok_or(Doubt)?;
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

// ---- state rows ------------------------------------------------------------------------------------------------

/// Builders of `merge_source_schema(table)`: the typed columns (`Table.value_cols`), then the metadata.
pub struct StateRows {
    pub n: usize,
    pub typed: Vec<Out>,
    pub partition_key: Out,
    pub row_kind: Out,
    pub clustering: Out,
    pub liveness_ts: Out,
    pub liveness_ttl: Out,
    pub liveness_ldt: Out,
    pub deletion_ts: Out,
    pub deletion_ldt: Out,
    pub shadowable_ts: Out,
    pub shadowable_ldt: Out,
    pub cells: Out,
    pub complex_deletions: Out,
    pub range_tombstones: Out,
    pub token: Out,
    pub live: Out,
    pub next_expiry: Out,
    pub updated_batch: Out,
    pub oldest_deletion: Out,
    pub delete: Out,
}

fn i64b() -> Out {
    Out::I64 { v: Vec::new(), valid: Bits::default() }
}

fn i32b() -> Out {
    Out::I32 { v: Vec::new(), valid: Bits::default() }
}

fn boolb() -> Out {
    Out::Bool { v: Bits::default(), valid: Bits::default() }
}

fn structb(children: Vec<Out>) -> Out {
    Out::Struct { valid: Bits::default(), children }
}

impl StateRows {
    pub fn new(t: &Table) -> StateRows {
        StateRows {
            n: 0,
            typed: t.value_cols.iter().map(|c| builder(t.c(*c).ty.as_ref().expect("typed column"))).collect(),
            partition_key: Out::var(),
            row_kind: Out::var(),
            clustering: Out::var(),
            liveness_ts: i64b(),
            liveness_ttl: i32b(),
            liveness_ldt: i64b(),
            deletion_ts: i64b(),
            deletion_ldt: i64b(),
            shadowable_ts: i64b(),
            shadowable_ldt: i64b(),
            // column, path, value, ts, ttl, ldt, tombstone
            cells: Out::list(structb(vec![Out::var(), Out::var(), Out::var(), i64b(), i32b(), i64b(), boolb()])),
            // column, ts, ldt
            complex_deletions: Out::list(structb(vec![Out::var(), i64b(), i64b()])),
            // start, start_inclusive, end, end_inclusive, ts, ldt
            range_tombstones: Out::list(structb(vec![Out::var(), boolb(), Out::var(), boolb(), i64b(), i64b()])),
            token: i64b(),
            live: boolb(),
            next_expiry: i64b(),
            updated_batch: i64b(),
            oldest_deletion: i64b(),
            delete: boolb(),
        }
    }

    /// Every builder, in `merge_source_schema` order.
    pub fn columns_mut(&mut self) -> Vec<&mut Out> {
        let mut v: Vec<&mut Out> = self.typed.iter_mut().collect();
        v.extend([&mut self.partition_key, &mut self.row_kind, &mut self.clustering, &mut self.liveness_ts,
                  &mut self.liveness_ttl, &mut self.liveness_ldt, &mut self.deletion_ts, &mut self.deletion_ldt,
                  &mut self.shadowable_ts, &mut self.shadowable_ldt, &mut self.cells, &mut self.complex_deletions,
                  &mut self.range_tombstones, &mut self.token, &mut self.live, &mut self.next_expiry,
                  &mut self.updated_batch, &mut self.oldest_deletion, &mut self.delete]);
        v
    }

    /// Drop the rows after the first `n` (what a doubted partition appended, rows it completed or not): every
    /// complete row has an entry in every column.
    pub fn truncate(&mut self, n: usize) {
        self.n = n;
        for o in self.columns_mut() {
            o.truncate(n);
        }
    }

    /// Every builder, in `merge_source_schema` order.
    pub fn columns(self) -> Vec<Out> {
        let mut v = self.typed;
        v.extend([self.partition_key, self.row_kind, self.clustering, self.liveness_ts, self.liveness_ttl,
                  self.liveness_ldt, self.deletion_ts, self.deletion_ldt, self.shadowable_ts, self.shadowable_ldt,
                  self.cells, self.complex_deletions, self.range_tombstones, self.token, self.live, self.next_expiry,
                  self.updated_batch, self.oldest_deletion, self.delete]);
        v
    }

    fn push_cell(&mut self, t: &Table, col: ColId, path: Option<&[u8]>, c: &Cell) {
        let e = self.cells.child(0);
        e.child(0).bytes(t.name_of(col).as_bytes());
        e.child(1).opt_bytes(path);
        e.child(2).bytes(&c.value);
        e.child(3).i64(c.ts);
        e.child(4).i32(c.ttl);
        e.child(5).i64(c.ldt);
        e.child(6).bool(c.tomb);
        e.end_struct();
    }

    /// The metadata of one stored record (`partition_to_records`): its kind, clustering, row state.
    fn meta(&mut self, t: &Table, pk: &[u8], kind: &str, ck: &[u8], row: Option<&RowState>,
            part_del: Option<&PartitionState>) {
        self.partition_key.bytes(pk);
        self.row_kind.bytes(kind.as_bytes());
        self.clustering.bytes(ck);
        match row {
            Some(r) => {
                self.liveness_ts.opt_i64(r.liveness.map(|l| l.0));
                self.liveness_ttl.opt_i32(r.liveness.map(|l| l.1));
                self.liveness_ldt.opt_i64(r.liveness.map(|l| l.2));
                self.deletion_ts.opt_i64(r.deletion.map(|d| d.0));
                self.deletion_ldt.opt_i64(r.deletion.map(|d| d.1));
                self.shadowable_ts.opt_i64(r.shadowable.map(|d| d.0));
                self.shadowable_ldt.opt_i64(r.shadowable.map(|d| d.1));
                // simple cells by column name, then each complex column (by name): its deletion, its cells by path
                for (col, c) in t.in_name_order(&r.cells) {
                    self.push_cell(t, *col, None, c);
                }
                for (col, e) in t.in_name_order(&r.complex) {
                    if let Some(d) = e.del {
                        let cd = self.complex_deletions.child(0);
                        cd.child(0).bytes(t.name_of(*col).as_bytes());
                        cd.child(1).i64(d.0);
                        cd.child(2).i64(d.1);
                        cd.end_struct();
                    }
                    for (p, c) in &e.cells {
                        self.push_cell(t, *col, Some(p), c);
                    }
                }
            }
            None => {
                for o in [&mut self.liveness_ts, &mut self.liveness_ldt, &mut self.shadowable_ts,
                          &mut self.shadowable_ldt] {
                    o.null();
                }
                self.liveness_ttl.null();
                let d = part_del.and_then(|p| p.deletion);
                self.deletion_ts.opt_i64(d.map(|d| d.0));
                self.deletion_ldt.opt_i64(d.map(|d| d.1));
            }
        }
        self.cells.end_list();
        self.complex_deletions.end_list();
        if let Some(p) = part_del {
            for ((s, si, e, ei), d) in &p.rts {
                let rt = self.range_tombstones.child(0);
                rt.child(0).bytes(s);
                rt.child(1).bool(*si);
                rt.child(2).bytes(e);
                rt.child(3).bool(*ei);
                rt.child(4).i64(d.0);
                rt.child(5).i64(d.1);
                rt.end_struct();
            }
        }
        self.range_tombstones.end_list();
    }

    /// The typed columns of one record: the partition key always; for a visible row every column of its CQL
    /// row; for a row that is not visible its clustering; null elsewhere.
    fn typed_row(&mut self, t: &Table, pk: &[u8], ck: &[u8], imgs: Option<&Images>, keyed: bool) -> D<()> {
        let cl = if ck.is_empty() { Vec::new() } else { engine::decode_clustering(ck) };
        for (i, col) in t.value_cols.iter().enumerate() {
            let c = t.c(*col);
            let ty = c.ty.as_ref().ok_or(Doubt)?;
            let o = &mut self.typed[i];
            match c.role {
                Role::PartitionKey => {
                    let j = t.pk.iter().position(|x| x == col).unwrap();
                    arrow_value(o, ty, Some(engine::partition_key_parts(t, pk).nth(j).ok_or(Doubt)?))?;
                }
                Role::Clustering => {
                    if imgs.is_some() || keyed {
                        let j = t.ck.iter().position(|x| x == col).unwrap();
                        arrow_value(o, ty, cl.get(j).copied().flatten())?;
                    } else {
                        o.null();
                    }
                }
                role => match imgs {
                    None => o.null(),
                    Some(im) => {
                        let src: Option<&Image> = if role == Role::Static { Some(&im.0) } else { im.1.as_ref() };
                        match src.and_then(|img| img.binary_search_by_key(col, |x| x.0).ok().map(|k| &img[k].1)) {
                            None => o.null(),
                            Some(IVal::Bytes(b)) => arrow_value(o, ty, Some(&b[..]))?,
                            Some(IVal::Counter(total)) => o.i64(i64::try_from(*total).map_err(|_| Doubt)?),
                            Some(IVal::Items(items)) => arrow_complex(o, ty, items)?,
                        }
                    }
                },
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn tail(&mut self, token: i64, live: bool, next_expiry: Option<i64>, batch_seq: i64, oldest: i64) {
        self.token.i64(token);
        self.live.bool(live);
        self.next_expiry.opt_i64(next_expiry);
        self.updated_batch.i64(batch_seq);
        self.oldest_deletion.i64(oldest);
        self.delete.bool(false);
        self.n += 1;
    }

    /// `change_rows(table, pk, prior, new, now, batch_seq, token)`.
    #[allow(clippy::too_many_arguments)]
    pub fn change_rows(&mut self, t: &Table, pk: &[u8], token: i64, prior: Option<&PartitionState>,
                       part: &PartitionState, now: i64, batch_seq: i64) -> D<()> {
        let images = engine::partition_images(t, part, now, None)?;
        let next = engine::next_expiry(part, now);
        let mut present: Vec<(&str, &[u8])> = Vec::new();
        if part.deletion.is_some() || !part.rts.is_empty() {
            self.typed_row(t, pk, b"", None, false)?;
            self.meta(t, pk, "partition", b"", None, Some(part));
            self.tail(token, false, next, batch_seq, oldest_deletion(t, None, Some(part)));
            present.push(("partition", b""));
        }
        if !part.static_row.is_empty() {
            let imgs = images.get(&None);
            self.typed_row(t, pk, b"", imgs, false)?;
            self.meta(t, pk, "static", b"", Some(&part.static_row), None);
            self.tail(token, imgs.is_some(), next, batch_seq, oldest_deletion(t, Some(&part.static_row), None));
            present.push(("static", b""));
        }
        // the rows' images in the same key order as the rows (after the static row's, keyed None)
        let mut row_images = images.iter().filter_map(|(k, im)| Some((k.as_ref()?, im))).peekable();
        for (ck, row) in &part.rows {
            while row_images.next_if(|(k, _)| *k < ck).is_some() {}
            let imgs = row_images.next_if(|(k, _)| *k == ck).map(|(_, im)| im);
            self.typed_row(t, pk, ck, imgs, true)?;
            self.meta(t, pk, "row", ck, Some(row), None);
            self.tail(token, imgs.is_some(), next, batch_seq, oldest_deletion(t, Some(row), None));
            present.push(("row", ck));
        }
        if let Some(prior) = prior {
            let mut gone: Vec<(&str, &[u8])> = Vec::new();
            if prior.deletion.is_some() || !prior.rts.is_empty() {
                gone.push(("partition", b""));
            }
            if !prior.static_row.is_empty() {
                gone.push(("static", b""));
            }
            for ck in prior.rows.keys() {
                gone.push(("row", ck));
            }
            for (kind, ck) in gone {
                if present.iter().any(|&(k, c)| k == kind && key::eq(c, ck)) {
                    continue;
                }
                for o in self.typed.iter_mut() {
                    o.null();
                }
                self.partition_key.bytes(pk);
                self.row_kind.bytes(kind.as_bytes());
                self.clustering.bytes(ck);
                for o in [&mut self.liveness_ts, &mut self.liveness_ttl, &mut self.liveness_ldt, &mut self.deletion_ts,
                          &mut self.deletion_ldt, &mut self.shadowable_ts, &mut self.shadowable_ldt, &mut self.cells,
                          &mut self.complex_deletions, &mut self.range_tombstones, &mut self.live,
                          &mut self.next_expiry, &mut self.updated_batch, &mut self.oldest_deletion] {
                    o.null();
                }
                self.token.i64(token);
                self.delete.bool(true);
                self.n += 1;
            }
        }
        Ok(())
    }
}

/// `state.purge.oldest_deletion_time` of one stored record (a row's, or the partition record's): the earliest
/// time from which `gc_grace_seconds` counts for anything in it, `DROPPED_DATA` (0) when it holds data of a
/// dropped column written at or before the drop.
fn oldest_deletion(t: &Table, row: Option<&RowState>, part: Option<&PartitionState>) -> i64 {
    const DROPPED_DATA: i64 = 0;
    let mut times: Vec<i64> = Vec::new();
    if let Some(r) = row {
        let hidden = |col: ColId, ts: i64| t.c(col).drop_time.is_some_and(|d| ts <= d);
        if r.cells.iter().any(|(c, cell)| hidden(*c, cell.ts))
            || r.complex.iter().any(|(c, e)| e.del.is_some_and(|d| hidden(*c, d.0))
                || e.cells.values().any(|cell| hidden(*c, cell.ts))) {
            return DROPPED_DATA;
        }
        times.extend(r.deletion.map(|d| d.1));
        times.extend(r.shadowable.map(|d| d.1));
        if let Some(l) = r.liveness {
            if l.1 != 0 {
                times.push(l.2);
            }
        }
        let mut cell_time = |c: &Cell| {
            if c.tomb {
                times.push(c.ldt);
            } else if c.ttl != 0 {
                times.push(c.ldt - c.ttl as i64);
            }
        };
        for (_, c) in &r.cells {
            cell_time(c);
        }
        for (_, e) in &r.complex {
            for c in e.cells.values() {
                cell_time(c);
            }
        }
        for (_, e) in &r.complex {
            times.extend(e.del.map(|d| d.1));
        }
    }
    if let Some(p) = part {
        times.extend(p.deletion.map(|d| d.1));
        times.extend(p.rts.values().map(|d| d.1));
    }
    times.into_iter().min().unwrap_or(engine::NO_DELETION_TIME)
}
