//! CQL types as the state engine needs them: the JSON form of a serialized value (`CqlType.decode` then
//! `to_json`), the order of clustering values (`state.reconcile.compare_values`), the order of collection
//! elements (`CqlType.sort_key`), and the typed Arrow value of a state row (`sinks.delta.to_arrow_value`, in
//! `arrow_out`).
//!
//! Every function here either gives exactly what the Python code gives, or `Err(Doubt)`: then the caller hands
//! the whole chunk back to the Python engine, which gives the answer (or raises the typed error). Doubts are
//! values Python would reject (damaged bytes) and the few corners whose Python output is not worth
//! reproducing (listed where they are decided).

use std::cmp::Ordering;

use super::text;

/// The Python engine must decide (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Doubt;

pub type D<T> = Result<T, Doubt>;

#[derive(Debug, Clone, PartialEq)]
pub enum Ty {
    Ascii,
    Text,
    Blob,
    Bool,
    /// tinyint (1), smallint (2), int (4), bigint (8)
    Int(u8),
    Counter,
    Varint,
    Decimal,
    Float,
    Double,
    Uuid,
    TimeUuid,
    Inet,
    Date,
    Time,
    Timestamp,
    Duration,
    Empty,
    Custom(Option<u32>),
    List(Box<Ty>, bool),
    Set(Box<Ty>, bool),
    Map(Box<Ty>, Box<Ty>, bool),
    Tuple(Vec<Ty>),
    Udt(Vec<String>, Vec<Ty>, bool),
    Vector(Box<Ty>, u32),
}

impl Ty {
    /// From `state.native.type_desc(t)`: (kind, fixed_length, multicell, subtypes, field_names, dimension).
    pub fn from_desc(kind: &str, fixed: Option<u32>, multicell: bool, subs: Vec<Ty>, fields: Vec<String>,
                     dimension: u32) -> Option<Ty> {
        let one = |subs: &Vec<Ty>| subs.first().cloned().map(Box::new);
        Some(match kind {
            "ascii" => Ty::Ascii,
            "text" | "varchar" => Ty::Text,
            "blob" => Ty::Blob,
            "boolean" => Ty::Bool,
            "tinyint" => Ty::Int(1),
            "smallint" => Ty::Int(2),
            "int" => Ty::Int(4),
            "bigint" => Ty::Int(8),
            "counter" => Ty::Counter,
            "varint" => Ty::Varint,
            "decimal" => Ty::Decimal,
            "float" => Ty::Float,
            "double" => Ty::Double,
            "uuid" => Ty::Uuid,
            "timeuuid" => Ty::TimeUuid,
            "inet" => Ty::Inet,
            "date" => Ty::Date,
            "time" => Ty::Time,
            "timestamp" => Ty::Timestamp,
            "duration" => Ty::Duration,
            "empty" => Ty::Empty,
            "custom" => Ty::Custom(fixed),
            "list" => Ty::List(one(&subs)?, multicell),
            "set" => Ty::Set(one(&subs)?, multicell),
            "map" if subs.len() == 2 => Ty::Map(Box::new(subs[0].clone()), Box::new(subs[1].clone()), multicell),
            "tuple" => Ty::Tuple(subs),
            "udt" if fields.len() == subs.len() => Ty::Udt(fields, subs, multicell),
            "vector" => Ty::Vector(one(&subs)?, dimension),
            _ => return None, // composite and anything new: the Python engine
        })
    }

    /// Zero bytes are a value of the type (ascii, text, blob, custom), not the CQL empty value.
    pub fn empty_is_value(&self) -> bool {
        matches!(self, Ty::Ascii | Ty::Text | Ty::Blob | Ty::Custom(_))
    }

    pub fn fixed_length(&self) -> Option<usize> {
        match self {
            Ty::Bool => Some(1),
            Ty::Int(4) | Ty::Float => Some(4),
            Ty::Int(8) | Ty::Double | Ty::Timestamp => Some(8),
            Ty::Uuid | Ty::TimeUuid => Some(16),
            Ty::Empty => Some(0),
            Ty::Custom(f) => f.map(|x| x as usize),
            Ty::Vector(e, n) => e.fixed_length().map(|f| f * *n as usize),
            _ => None,
        }
    }

    pub fn is_multicell(&self) -> bool {
        matches!(self, Ty::List(_, true) | Ty::Set(_, true) | Ty::Map(_, _, true) | Ty::Udt(_, _, true))
    }

    /// Whether decoded values could be equal for different bytes (so a Python dict of them could merge keys).
    fn values_alias(&self) -> bool {
        match self {
            Ty::Float | Ty::Double | Ty::Decimal | Ty::Varint | Ty::Counter => true,
            Ty::List(e, _) | Ty::Set(e, _) | Ty::Vector(e, _) => e.values_alias(),
            Ty::Map(k, v, _) => k.values_alias() || v.values_alias(),
            Ty::Tuple(f) | Ty::Udt(_, f, _) => f.iter().any(|t| t.values_alias()),
            _ => false,
        }
    }
}

// ---- reading serialized collections -------------------------------------------------------------------------

fn be_i32(b: &[u8], p: usize) -> D<i32> {
    b.get(p..p + 4).map(|x| i32::from_be_bytes(x.try_into().unwrap())).ok_or(Doubt)
}

/// One i32-length-prefixed value at `pos` (None for length -1) and the position after it.
fn read_one(b: &[u8], pos: usize) -> D<(Option<&[u8]>, usize)> {
    let ln = be_i32(b, pos)?;
    let pos = pos + 4;
    if ln < 0 {
        return if ln == -1 { Ok((None, pos)) } else { Err(Doubt) };
    }
    let end = pos.checked_add(ln as usize).ok_or(Doubt)?;
    Ok((Some(b.get(pos..end).ok_or(Doubt)?), end))
}

/// `count` i32-length-prefixed elements from `pos` (None for length -1), as `read_length_prefixed`; the next
/// position.
fn read_elements(b: &[u8], mut pos: usize, count: usize) -> D<(Vec<Option<&[u8]>>, usize)> {
    let mut out = Vec::with_capacity(count.min(1024));
    for _ in 0..count {
        let (v, next) = read_one(b, pos)?;
        out.push(v);
        pos = next;
    }
    Ok((out, pos))
}

/// Elements of a frozen list or set (`_Collection._decode`).
pub fn collection_elements(b: &[u8]) -> D<Vec<Option<&[u8]>>> {
    let count = be_i32(b, 0)?;
    if count < 0 {
        return Err(Doubt);
    }
    let (els, pos) = read_elements(b, 4, count as usize)?;
    if pos != b.len() {
        return Err(Doubt);
    }
    Ok(els)
}

/// Key/value pairs of a frozen map (`MapType._from_serialized`).
pub fn map_pairs(b: &[u8]) -> D<Vec<(Option<&[u8]>, Option<&[u8]>)>> {
    let count = be_i32(b, 0)?;
    if count < 0 || count as usize > (b.len() - 4) / 8 + 1 {
        return Err(Doubt);
    }
    let (els, pos) = read_elements(b, 4, 2 * count as usize)?;
    if pos != b.len() {
        return Err(Doubt);
    }
    Ok(els.chunks(2).map(|p| (p[0], p[1])).collect())
}

/// Fields of a tuple or UDT value (`TupleType._split`): at most `n`, missing trailing fields absent.
pub fn split_fields(b: &[u8], n: usize) -> D<Vec<Option<&[u8]>>> {
    let mut out = Vec::with_capacity(n.min(64));
    let mut pos = 0;
    while out.len() < n && pos < b.len() {
        let (v, next) = read_one(b, pos)?;
        out.push(v);
        pos = next;
    }
    if pos != b.len() {
        return Err(Doubt);
    }
    Ok(out)
}

fn read_uvint(b: &[u8], pos: usize) -> D<(u64, usize)> {
    let b0 = *b.get(pos).ok_or(Doubt)?;
    if b0 < 0x80 {
        return Ok((b0 as u64, pos + 1));
    }
    let extra = b0.leading_ones() as usize;
    let end = pos + 1 + extra;
    let rest = b.get(pos + 1..end).ok_or(Doubt)?;
    let mut v = if extra >= 8 { 0 } else { (b0 as u64) & (0xFF >> extra) };
    for &x in rest {
        v = (v << 8) | x as u64;
    }
    Ok((v, end))
}

/// Elements of a vector value (`VectorType._split`).
pub fn vector_elements<'a>(elem: &Ty, dim: u32, b: &'a [u8]) -> D<Vec<&'a [u8]>> {
    let n = dim as usize;
    if let Some(size) = elem.fixed_length() {
        if b.len() != size * n {
            return Err(Doubt);
        }
        return Ok((0..n).map(|i| &b[i * size..(i + 1) * size]).collect());
    }
    let mut out = Vec::with_capacity(n);
    let mut pos = 0;
    for _ in 0..n {
        let (ln, p) = read_uvint(b, pos)?;
        let end = p.checked_add(usize::try_from(ln).map_err(|_| Doubt)?).ok_or(Doubt)?;
        out.push(b.get(p..end).ok_or(Doubt)?);
        pos = end;
    }
    if pos != b.len() {
        return Err(Doubt);
    }
    Ok(out)
}

/// The shards' counts of a counter context (`decode_counter_context`): their sum, as Python's int.
pub fn counter_total(b: &[u8]) -> D<i128> {
    if b.len() < 2 {
        return Err(Doubt);
    }
    let header = (i16::from_be_bytes([b[0], b[1]]) as i32).unsigned_abs() as usize;
    let body = 2 + 2 * header;
    if body > b.len() || (b.len() - body) % 32 != 0 {
        return Err(Doubt);
    }
    let n = (b.len() - body) / 32;
    for i in 0..header {
        let e = i16::from_be_bytes([b[2 + 2 * i], b[3 + 2 * i]]) as i32;
        let index = if e >= 0 { e } else { e + 32768 } as usize;
        if index >= n {
            return Err(Doubt);
        }
    }
    Ok((0..n).map(|i| i64::from_be_bytes(b[body + 32 * i + 24..body + 32 * i + 32].try_into().unwrap()) as i128)
        .sum())
}

// ---- date and time text --------------------------------------------------------------------------------------

fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn push_year(out: &mut String, y: i64) {
    use std::fmt::Write;
    if (0..=9999).contains(&y) {
        let _ = write!(out, "{y:04}");
    } else {
        let _ = write!(out, "{y:+05}");
    }
}

pub fn format_days(out: &mut String, days: i64) {
    use std::fmt::Write;
    let (y, m, d) = civil_from_days(days);
    push_year(out, y);
    let _ = write!(out, "-{m:02}-{d:02}");
}

/// Python's `f"{n:02d}"` of an int that may be negative (floor division leaves negative hours for negative
/// nanoseconds): the sign counts in the width.
fn push_02(out: &mut String, n: i128) {
    use std::fmt::Write;
    let _ = write!(out, "{n:02}");
}

pub fn format_nanos_of_day(out: &mut String, n: i64) {
    use std::fmt::Write;
    let n = n as i128;
    let h = n.div_euclid(3_600_000_000_000);
    let rem = n.rem_euclid(3_600_000_000_000);
    push_02(out, h);
    let _ = write!(out, ":{:02}:{:02}.{:09}", rem / 60_000_000_000, rem % 60_000_000_000 / 1_000_000_000,
                   rem % 1_000_000_000);
}

pub fn format_millis(out: &mut String, ms: i64) {
    use std::fmt::Write;
    let days = ms.div_euclid(86_400_000);
    let rem = ms.rem_euclid(86_400_000);
    format_days(out, days);
    let _ = write!(out, "T{:02}:{:02}:{:02}.{:03}Z", rem / 3_600_000, rem % 3_600_000 / 60_000, rem % 60_000 / 1000,
                   rem % 1000);
}

/// Duration (months, days, nanoseconds) from its three zig-zag vints (`DurationType._decode`).
pub fn duration_parts(b: &[u8]) -> D<(i64, i64, i64)> {
    let zz = |u: u64| ((u >> 1) as i64) ^ -((u & 1) as i64);
    let (m, p) = read_uvint(b, 0)?;
    let (d, p) = read_uvint(b, p)?;
    let (n, p) = read_uvint(b, p)?;
    if p != b.len() {
        return Err(Doubt);
    }
    let (m, d, n) = (zz(m), zz(d), zz(n));
    if i32::try_from(m).is_err() || i32::try_from(d).is_err() {
        return Err(Doubt);
    }
    Ok((m, d, n))
}

/// `str(Duration(months, days, nanoseconds))`.
pub fn format_duration(out: &mut String, months: i64, days: i64, nanos: i64) {
    use std::fmt::Write;
    let start = out.len();
    let unit = |out: &mut String, dividend: i128, divisor: i128, name: &str| -> i128 {
        if dividend == 0 || dividend < divisor {
            return dividend;
        }
        let _ = write!(out, "{}{}", dividend / divisor, name);
        dividend % divisor
    };
    if months < 0 || days < 0 || nanos < 0 {
        out.push('-');
    }
    let rem = unit(out, (months as i128).abs(), 12, "y");
    unit(out, rem, 1, "mo");
    unit(out, (days as i128).abs(), 1, "d");
    if nanos != 0 {
        let mut rem = unit(out, (nanos as i128).abs(), 3_600_000_000_000, "h");
        rem = unit(out, rem, 60_000_000_000, "m");
        rem = unit(out, rem, 1_000_000_000, "s");
        rem = unit(out, rem, 1_000_000, "ms");
        rem = unit(out, rem, 1000, "us");
        unit(out, rem, 1, "ns");
    }
    let text = &out[start..];
    if text.is_empty() || text == "-" {
        out.truncate(start);
        out.push_str("0s");
    }
}

pub fn format_uuid(out: &mut String, b: &[u8]) {
    use std::fmt::Write;
    for (i, x) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        let _ = write!(out, "{x:02x}");
    }
}

/// `str(ipaddress.ip_address(b))`; IPv4-mapped IPv6 addresses are a doubt (Python 3.13 prints them dotted,
/// earlier versions do not).
pub fn format_inet(out: &mut String, b: &[u8]) -> D<()> {
    use std::fmt::Write;
    if b.len() == 4 {
        let _ = write!(out, "{}.{}.{}.{}", b[0], b[1], b[2], b[3]);
        return Ok(());
    }
    if b.len() != 16 {
        return Err(Doubt);
    }
    if b[..10].iter().all(|&x| x == 0) && b[10] == 0xff && b[11] == 0xff {
        return Err(Doubt);
    }
    let h: Vec<u16> = (0..8).map(|i| u16::from_be_bytes([b[2 * i], b[2 * i + 1]])).collect();
    // the longest run of two or more zero groups (the first of equal runs) becomes "::"
    let (mut best, mut best_len, mut i) = (usize::MAX, 0usize, 0usize);
    while i < 8 {
        if h[i] == 0 {
            let s = i;
            while i < 8 && h[i] == 0 {
                i += 1;
            }
            if i - s > best_len {
                best = s;
                best_len = i - s;
            }
        } else {
            i += 1;
        }
    }
    if best_len < 2 {
        best = usize::MAX;
    }
    let mut i = 0;
    while i < 8 {
        if i == best {
            out.push_str("::");
            i += best_len;
            continue;
        }
        if i > 0 && i != best + best_len {
            out.push(':');
        }
        let _ = write!(out, "{:x}", h[i]);
        i += 1;
    }
    Ok(())
}

// ---- JSON ----------------------------------------------------------------------------------------------------

/// `json.dumps(t.to_json(t.decode(b)))` with the outbox's separators (`(",", ":")`, `ensure_ascii=False`).
/// Inlined where it is called: an event's values are mostly text and integers, written here; the other types in
/// `json_value_other`.
#[inline(always)]
pub fn json_value(out: &mut String, t: &Ty, b: &[u8]) -> D<()> {
    if b.is_empty() && !t.empty_is_value() {
        out.push_str(EMPTY_JSON_COMPACT);
        return Ok(());
    }
    match t {
        Ty::Text => text::json_text(out, b).map_err(|_| Doubt)?,
        Ty::Int(size) => {
            if b.len() != *size as usize {
                return Err(Doubt);
            }
            text::push_i64(out, be_int(b));
        }
        _ => return json_value_other(out, t, b),
    }
    Ok(())
}

/// `json_value` of a value of any type but text and the integers, not empty where that shows as `EMPTY`.
#[inline(never)]
fn json_value_other(out: &mut String, t: &Ty, b: &[u8]) -> D<()> {
    match t {
        Ty::Text | Ty::Int(_) => unreachable!("json_value writes these"),
        Ty::Ascii => {
            if !b.is_ascii() {
                return Err(Doubt);
            }
            text::json_str(out, std::str::from_utf8(b).unwrap());
        }
        Ty::Blob => hex(out, b),
        Ty::Custom(fixed) => {
            if matches!(fixed, Some(f) if *f as usize != b.len()) {
                return Err(Doubt);
            }
            hex(out, b)
        }
        Ty::Bool => {
            if b.len() != 1 {
                return Err(Doubt);
            }
            out.push_str(if b[0] != 0 { "true" } else { "false" });
        }
        Ty::Counter => push_int(out, counter_total(b)?),
        Ty::Varint => match text::bigint_i128(b) {
            Some(v) if v.unsigned_abs() < 1u128 << 53 => push_int(out, v),
            _ => {
                out.push('"');
                out.push_str(&text::bigint_str(b));
                out.push('"');
            }
        },
        Ty::Decimal => {
            if b.len() < 5 {
                return Err(Doubt);
            }
            out.push('"');
            text::decimal_str(out, &b[4..], i32::from_be_bytes(b[..4].try_into().unwrap()));
            out.push('"');
        }
        Ty::Float => {
            let v = f32::from_bits(u32::from_be_bytes(b.try_into().map_err(|_| Doubt)?));
            if v.is_nan() {
                out.push_str("\"NaN\"");
            } else if v.is_infinite() {
                out.push_str(if v > 0.0 { "\"Infinity\"" } else { "\"-Infinity\"" });
            } else {
                text::float32_json(out, v);
            }
        }
        Ty::Double => {
            let v = f64::from_bits(u64::from_be_bytes(b.try_into().map_err(|_| Doubt)?));
            if v.is_nan() {
                out.push_str("\"NaN\"");
            } else if v.is_infinite() {
                out.push_str(if v > 0.0 { "\"Infinity\"" } else { "\"-Infinity\"" });
            } else {
                text::py_float_repr(out, v);
            }
        }
        Ty::Uuid | Ty::TimeUuid => {
            if b.len() != 16 {
                return Err(Doubt);
            }
            out.push('"');
            format_uuid(out, b);
            out.push('"');
        }
        Ty::Inet => {
            out.push('"');
            format_inet(out, b)?;
            out.push('"');
        }
        Ty::Date => {
            let u = u32::from_be_bytes(b.try_into().map_err(|_| Doubt)?);
            out.push('"');
            format_days(out, u as i64 - (1i64 << 31));
            out.push('"');
        }
        Ty::Time => {
            let n = i64::from_be_bytes(b.try_into().map_err(|_| Doubt)?);
            out.push('"');
            format_nanos_of_day(out, n);
            out.push('"');
        }
        Ty::Timestamp => {
            let ms = i64::from_be_bytes(b.try_into().map_err(|_| Doubt)?);
            out.push('"');
            format_millis(out, ms);
            out.push('"');
        }
        Ty::Duration => {
            let (m, d, n) = duration_parts(b)?;
            out.push('"');
            format_duration(out, m, d, n);
            out.push('"');
        }
        Ty::Empty => return Err(Doubt), // its only value is zero bytes (handled above)
        Ty::List(e, _) | Ty::Set(e, _) => {
            let els = collection_elements(b)?;
            json_list(out, els.iter().map(|x| (&**e, *x)))?;
        }
        Ty::Map(k, v, _) => {
            let pairs = map_pairs(b)?;
            json_map(out, k, v, &pairs)?;
        }
        Ty::Tuple(fields) => {
            let vals = split_fields(b, fields.len())?;
            json_list(out, fields.iter().enumerate().map(|(i, t)| (t, vals.get(i).copied().flatten())))?;
        }
        Ty::Udt(names, fields, _) => {
            let vals = split_fields(b, fields.len())?;
            json_udt(out, names, fields, |i| vals.get(i).copied().flatten())?;
        }
        Ty::Vector(e, dim) => {
            let els = vector_elements(e, *dim, b)?;
            json_list(out, els.iter().map(|x| (&**e, Some(*x))))?;
        }
    }
    Ok(())
}

// `json.dumps({"$empty": True}, separators=(",", ":"))`: the CQL empty value of a type
const EMPTY_JSON_COMPACT: &str = "{\"$empty\":true}";

fn hex(out: &mut String, b: &[u8]) {
    out.push_str("\"0x");
    crate::state::text::push_hex(out, b);
    out.push('"');
}

/// A big-endian two's complement integer of 1 to 8 bytes.
#[inline]
pub fn be_int(b: &[u8]) -> i64 {
    match b.len() {
        1 => b[0] as i8 as i64,
        2 => i16::from_be_bytes([b[0], b[1]]) as i64,
        4 => i32::from_be_bytes(b.try_into().unwrap()) as i64,
        8 => i64::from_be_bytes(b.try_into().unwrap()),
        _ => b.iter().fold(if b.first().is_some_and(|x| x & 0x80 != 0) { -1 } else { 0 }, |v, &x| (v << 8) | x as i64),
    }
}

fn push_int(out: &mut String, v: i128) {
    crate::state::text::push_i128(out, v);
}

/// A JSON value or null.
pub fn json_opt(out: &mut String, t: &Ty, b: Option<&[u8]>) -> D<()> {
    match b {
        None => {
            out.push_str("null");
            Ok(())
        }
        Some(b) => json_value(out, t, b),
    }
}

pub fn json_list<'a>(out: &mut String, items: impl Iterator<Item = (&'a Ty, Option<&'a [u8]>)>) -> D<()> {
    out.push('[');
    for (i, (t, b)) in items.enumerate() {
        if i > 0 {
            out.push(',');
        }
        json_opt(out, t, b)?;
    }
    out.push(']');
    Ok(())
}

/// Whether two distinct serialized keys decode to equal Python values (a dict of them would merge them).
fn keys_alias(k: &Ty, a: Option<&[u8]>, b: Option<&[u8]>) -> bool {
    let (a, b) = match (a, b) {
        (Some(a), Some(b)) => (a, b),
        (None, None) => return true,
        _ => return false,
    };
    if a == b {
        return true;
    }
    if a.is_empty() || b.is_empty() {
        return false;
    }
    match k {
        Ty::Float | Ty::Double => {
            let zero = |x: &[u8]| x[0] & 0x7f == 0 && x[1..].iter().all(|c| *c == 0);
            a.len() == b.len() && zero(a) && zero(b) // +0.0 == -0.0; NaN is never equal
        }
        Ty::Varint => cmp_signed_be(a, b) == Ordering::Equal,
        Ty::Decimal => a.len() >= 5 && b.len() >= 5 && compare_decimals_exact(a, b) == Ordering::Equal,
        t => t.values_alias(), // nested: not worth deciding here
    }
}

/// A map value (`MapType._json`): an object when the keys are ascii/text, else an array of [key, value].
pub fn json_map(out: &mut String, k: &Ty, v: &Ty, pairs: &[(Option<&[u8]>, Option<&[u8]>)]) -> D<()> {
    // Python builds a dict of the decoded keys first (of hashable ones; others are kept as pairs): keys that
    // decode equal would merge
    for i in 0..pairs.len() {
        for j in i + 1..pairs.len() {
            if keys_alias(k, pairs[i].0, pairs[j].0) {
                return Err(Doubt);
            }
        }
    }
    if matches!(k, Ty::Ascii | Ty::Text) {
        out.push('{');
        for (i, (kb, vb)) in pairs.iter().enumerate() {
            let kb = kb.ok_or(Doubt)?; // a null key would print as "null"
            if i > 0 {
                out.push(',');
            }
            json_value(out, k, kb)?;
            out.push(':');
            json_opt(out, v, *vb)?;
        }
        out.push('}');
    } else {
        out.push('[');
        for (i, (kb, vb)) in pairs.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push('[');
            json_opt(out, k, *kb)?;
            out.push(',');
            json_opt(out, v, *vb)?;
            out.push(']');
        }
        out.push(']');
    }
    Ok(())
}

pub fn json_udt<'a>(out: &mut String, names: &[String], fields: &[Ty], value: impl Fn(usize) -> Option<&'a [u8]>)
                    -> D<()> {
    out.push('{');
    for (i, (n, t)) in names.iter().zip(fields).enumerate() {
        if i > 0 {
            out.push(',');
        }
        text::json_str(out, n);
        out.push(':');
        json_opt(out, t, value(i))?;
    }
    out.push('}');
    Ok(())
}

// ---- clustering order: state.reconcile.compare_values -------------------------------------------------------

fn cmp_signed_be(a: &[u8], b: &[u8]) -> Ordering {
    match (text::bigint_i128(a), text::bigint_i128(b)) {
        (Some(x), Some(y)) => x.cmp(&y),
        _ => {
            let (na, ma) = text::bigint_magnitude(a);
            let (nb, mb) = text::bigint_magnitude(b);
            let mag = |x: &Vec<u64>, y: &Vec<u64>| x.len().cmp(&y.len()).then_with(|| x.iter().rev().cmp(y.iter().rev()));
            match (na, nb) {
                (false, true) => Ordering::Greater,
                (true, false) => Ordering::Less,
                (false, false) => mag(&ma, &mb),
                (true, true) => mag(&mb, &ma),
            }
        }
    }
}

fn float_rank(neg_sign: bool, is_nan: bool, is_zero: bool, v: f64) -> (u8, f64) {
    // reconcile._float_key: NaN (2, 0); -0.0 (0, 0); +0.0 (1, 0); negatives (0, v); positives (1, v)
    if is_nan {
        (2, 0.0)
    } else if is_zero {
        (if neg_sign { 0 } else { 1 }, 0.0)
    } else if v < 0.0 {
        (0, v)
    } else {
        (1, v)
    }
}

fn timeuuid_key(b: &[u8]) -> u64 {
    let mut msb = 0u64;
    for &x in &b[..b.len().min(8)] {
        msb = (msb << 8) | x as u64;
    }
    ((msb & 0x0FFF) << 48) | (((msb >> 16) & 0xFFFF) << 32) | (msb >> 32)
}

fn cmp_signed_bytes(a: &[u8], b: &[u8]) -> Ordering {
    for (x, y) in a.iter().zip(b) {
        if x != y {
            return (*x as i8).cmp(&(*y as i8));
        }
    }
    a.len().cmp(&b.len())
}

/// `compare_values(t, a, b)`: Cassandra's comparator for clustering values (reversal applied by the caller).
pub fn compare_values(t: &Ty, a: &[u8], b: &[u8]) -> D<Ordering> {
    if a.is_empty() || b.is_empty() {
        return Ok((!a.is_empty()).cmp(&!b.is_empty()));
    }
    Ok(match t {
        Ty::Int(_) | Ty::Timestamp | Ty::Time | Ty::Counter | Ty::Varint => cmp_signed_be(a, b),
        Ty::Text | Ty::Ascii | Ty::Blob | Ty::Inet | Ty::Date | Ty::Duration | Ty::Empty | Ty::Custom(_) => a.cmp(b),
        Ty::Bool => (a[0] != 0).cmp(&(b[0] != 0)),
        Ty::Float | Ty::Double => {
            let key = |x: &[u8]| -> D<(u8, f64)> {
                Ok(if let Ty::Float = t {
                    let v = f32::from_bits(u32::from_be_bytes(x.try_into().map_err(|_| Doubt)?));
                    float_rank(v.is_sign_negative(), v.is_nan(), v == 0.0, v as f64)
                } else {
                    let v = f64::from_bits(u64::from_be_bytes(x.try_into().map_err(|_| Doubt)?));
                    float_rank(v.is_sign_negative(), v.is_nan(), v == 0.0, v)
                })
            };
            let (ka, kb) = (key(a)?, key(b)?);
            ka.0.cmp(&kb.0).then(ka.1.partial_cmp(&kb.1).unwrap_or(Ordering::Equal))
        }
        Ty::Decimal => compare_decimals(a, b)?,
        Ty::TimeUuid => timeuuid_key(a).cmp(&timeuuid_key(b)).then_with(|| cmp_signed_bytes(&a[8.min(a.len())..],
                                                                                               &b[8.min(b.len())..])),
        Ty::Uuid => {
            if a.len() < 16 || b.len() < 16 {
                return Ok((a.len() >= 16).cmp(&(b.len() >= 16)));
            }
            let (va, vb) = (a[6] >> 4, b[6] >> 4);
            if va != vb {
                va.cmp(&vb)
            } else if va == 1 && timeuuid_key(a) != timeuuid_key(b) {
                timeuuid_key(a).cmp(&timeuuid_key(b))
            } else {
                a.cmp(b)
            }
        }
        Ty::List(e, _) | Ty::Set(e, _) => {
            let (ea, eb) = (reconcile_elements(a, 1)?, reconcile_elements(b, 1)?);
            for (x, y) in ea.iter().zip(&eb) {
                let c = cmp_nullable(Some(e), *x, *y)?;
                if c != Ordering::Equal {
                    return Ok(c);
                }
            }
            ea.len().cmp(&eb.len())
        }
        Ty::Map(k, v, _) => {
            let (ea, eb) = (reconcile_pairs(a)?, reconcile_pairs(b)?);
            for ((xk, xv), (yk, yv)) in ea.iter().zip(&eb) {
                let c = cmp_nullable(Some(k), *xk, *yk)?;
                if c != Ordering::Equal {
                    return Ok(c);
                }
                let c = cmp_nullable(Some(v), *xv, *yv)?;
                if c != Ordering::Equal {
                    return Ok(c);
                }
            }
            ea.len().cmp(&eb.len())
        }
        Ty::Tuple(subs) | Ty::Udt(_, subs, _) => {
            let (fa, fb) = (reconcile_fields(a)?, reconcile_fields(b)?);
            for i in 0..fa.len().max(fb.len()) {
                let x = fa.get(i).copied().flatten();
                let y = fb.get(i).copied().flatten();
                let c = cmp_nullable(subs.get(i), x, y)?;
                if c != Ordering::Equal {
                    return Ok(c);
                }
            }
            Ordering::Equal
        }
        Ty::Vector(e, _) => {
            if let Some(size) = e.fixed_length().filter(|s| *s > 0) {
                let n = a.len().min(b.len());
                let mut i = 0;
                while i < n {
                    let c = compare_values(e, &a[i..(i + size).min(a.len())], &b[i..(i + size).min(b.len())])?;
                    if c != Ordering::Equal {
                        return Ok(c);
                    }
                    i += size;
                }
            }
            a.cmp(b)
        }
    })
}

fn cmp_nullable(t: Option<&Ty>, x: Option<&[u8]>, y: Option<&[u8]>) -> D<Ordering> {
    match (x, y) {
        (Some(x), Some(y)) => match t {
            None => Ok(x.cmp(y)),
            Some(t) => compare_values(t, x, y),
        },
        _ => Ok(x.is_some().cmp(&y.is_some())),
    }
}

// reconcile.py's readers for comparisons (`read_length_prefixed` through `_read_elements`, `_read_elements_map`,
// `_read_fields`): a count-prefixed value reads `count` elements (none when the count is negative) and ignores
// what follows; damaged framing is a `CqlValueError` there, a doubt here
fn reconcile_elements(b: &[u8], per_element: usize) -> D<Vec<Option<&[u8]>>> {
    let n = be_i32(b, 0)?;
    Ok(read_elements(b, 4, n.max(0) as usize * per_element)?.0)
}

fn reconcile_pairs(b: &[u8]) -> D<Vec<(Option<&[u8]>, Option<&[u8]>)>> {
    Ok(reconcile_elements(b, 2)?.chunks(2).map(|p| (p[0], p[1])).collect())
}

/// Every field up to the end.
fn reconcile_fields(b: &[u8]) -> D<Vec<Option<&[u8]>>> {
    split_fields(b, usize::MAX)
}

/// `Decimal(unscaled).scaleb(-scale)` compared: exact, and a doubt when either unscaled value has more than the
/// 28 digits of Python's default context (scaleb rounds to them).
fn compare_decimals(a: &[u8], b: &[u8]) -> D<Ordering> {
    let parse = |x: &[u8]| -> D<(bool, String, i64)> {
        let scale = be_i32(x, 0)? as i64;
        let (neg, limbs) = text::bigint_magnitude(&x[4..]);
        let digits = text::magnitude_digits(&limbs);
        if digits.len() > 28 {
            return Err(Doubt);
        }
        Ok((neg, digits, -scale))
    };
    let (na, da, ea) = parse(a)?;
    let (nb, db, eb) = parse(b)?;
    // scaleb traps Overflow and rounds past the context's exponent limits (Emax 999999, Emin -999999)
    if [(da.len() as i64 + ea), (db.len() as i64 + eb)].iter().any(|adj| adj.abs() > 999_000) {
        return Err(Doubt);
    }
    let za = da == "0";
    let zb = db == "0";
    if za || zb {
        let sa = if za { 0 } else if na { -1 } else { 1 };
        let sb = if zb { 0 } else if nb { -1 } else { 1 };
        return Ok((sa as i32).cmp(&(sb as i32)));
    }
    if na != nb {
        return Ok(if na { Ordering::Less } else { Ordering::Greater });
    }
    // same sign: compare magnitudes digits x 10^exp
    let ma = da.len() as i64 + ea; // position of the leading digit
    let mb = db.len() as i64 + eb;
    let mag = if ma != mb {
        ma.cmp(&mb)
    } else {
        let (x, y) = (da.trim_end_matches('0'), db.trim_end_matches('0'));
        let n = x.len().max(y.len());
        let pad = |s: &str| format!("{s:0<n$}");
        pad(x).cmp(&pad(y))
    };
    Ok(if na { mag.reverse() } else { mag })
}

// ---- collection element order: CqlType.sort_key ------------------------------------------------------------

/// `t.sort_key(a)` compared with `t.sort_key(b)` as Python compares the tuples.
pub fn sort_key_cmp(t: &Ty, a: &[u8], b: &[u8]) -> D<Ordering> {
    // (0,) for empty, (1, key) when the type's _sort_key succeeds, else (2, data)
    let rank = |x: &[u8]| -> u8 {
        if x.is_empty() {
            0
        } else if sort_key_valid(t, x) {
            1
        } else {
            2
        }
    };
    let (ra, rb) = (rank(a), rank(b));
    if ra != rb || ra == 0 {
        return Ok(ra.cmp(&rb));
    }
    if ra == 2 {
        return Ok(a.cmp(b));
    }
    sort_key_inner(t, a, b)
}

/// Whether `t._sort_key(x)` succeeds (Python's errors make the key `(2, data)`).
fn sort_key_valid(t: &Ty, x: &[u8]) -> bool {
    match t {
        Ty::Int(size) => x.len() == *size as usize,
        Ty::Counter => counter_total(x).is_ok(),
        Ty::Decimal => x.len() >= 5,
        Ty::Float => x.len() == 4,
        Ty::Double | Ty::Time | Ty::Timestamp => x.len() == 8,
        Ty::List(..) | Ty::Set(..) => sort_key_elements(x).is_some(),
        Ty::Map(..) => sort_key_elements_map(x).is_some(),
        Ty::Tuple(f) | Ty::Udt(_, f, _) => split_fields(x, f.len()).is_ok(),
        Ty::Vector(e, d) => vector_elements(e, *d, x).is_ok(),
        _ => true,
    }
}

// ListType._sort_key reads the elements without checking the end
fn sort_key_elements(x: &[u8]) -> Option<Vec<Option<&[u8]>>> {
    let n = be_i32(x, 0).ok()?;
    let (els, _) = read_elements(x, 4, usize::try_from(n).unwrap_or(0)).ok()?;
    Some(els)
}

fn sort_key_elements_map(x: &[u8]) -> Option<Vec<Option<&[u8]>>> {
    let n = be_i32(x, 0).ok()?;
    let (els, _) = read_elements(x, 4, 2 * usize::try_from(n).unwrap_or(0)).ok()?;
    Some(els)
}

fn seq_cmp(items_a: &[(Option<&[u8]>, &Ty)], items_b: &[(Option<&[u8]>, &Ty)]) -> D<Ordering> {
    for ((x, tx), (y, _)) in items_a.iter().zip(items_b) {
        // None elements are (0,): below every present element's key
        let c = match (x, y) {
            (Some(x), Some(y)) => sort_key_cmp(tx, x, y)?,
            (None, None) => Ordering::Equal,
            (None, Some(y)) => {
                if y.is_empty() {
                    Ordering::Equal // (0,) == (0,)
                } else {
                    Ordering::Less
                }
            }
            (Some(x), None) => {
                if x.is_empty() {
                    Ordering::Equal
                } else {
                    Ordering::Greater
                }
            }
        };
        if c != Ordering::Equal {
            return Ok(c);
        }
    }
    Ok(items_a.len().cmp(&items_b.len()))
}

fn sort_key_inner(t: &Ty, a: &[u8], b: &[u8]) -> D<Ordering> {
    Ok(match t {
        Ty::Int(_) | Ty::Varint => cmp_signed_be(a, b),
        Ty::Counter => counter_total(a)?.cmp(&counter_total(b)?),
        Ty::Decimal => compare_decimals_exact(a, b),
        Ty::Float | Ty::Double => {
            let key = |x: &[u8]| -> (u8, f64, f64) {
                let v = if let Ty::Float = t {
                    f32::from_bits(u32::from_be_bytes(x.try_into().unwrap())) as f64
                } else {
                    f64::from_bits(u64::from_be_bytes(x.try_into().unwrap()))
                };
                if v.is_nan() {
                    (1, 0.0, 0.0)
                } else {
                    (0, v, if v.is_sign_negative() { -1.0 } else { 1.0 })
                }
            };
            let (x, y) = (key(a), key(b));
            x.0.cmp(&y.0)
                .then(x.1.partial_cmp(&y.1).unwrap_or(Ordering::Equal))
                .then(x.2.partial_cmp(&y.2).unwrap_or(Ordering::Equal))
        }
        Ty::Time | Ty::Timestamp => i64::from_be_bytes(a.try_into().unwrap()).cmp(&i64::from_be_bytes(b.try_into().unwrap())),
        Ty::Uuid | Ty::TimeUuid => {
            let key = |x: &[u8]| -> (u64, u64, Vec<u8>) {
                let mut msb = 0u64;
                for &c in &x[..x.len().min(8)] {
                    msb = (msb << 8) | c as u64;
                }
                let version = (msb >> 12) & 0xF;
                let ts = if version == 1 {
                    ((msb & 0x0FFF) << 48) | (((msb >> 16) & 0xFFFF) << 32) | (msb >> 32)
                } else {
                    msb
                };
                let rest: Vec<u8> = x[x.len().min(8)..].iter().map(|c| c ^ 0x80).collect();
                (version, ts, rest)
            };
            let (x, y) = (key(a), key(b));
            if let Ty::TimeUuid = t {
                x.1.cmp(&y.1).then_with(|| x.2.cmp(&y.2))
            } else {
                x.cmp(&y)
            }
        }
        Ty::List(e, _) | Ty::Set(e, _) => {
            let (ea, eb) = (sort_key_elements(a).ok_or(Doubt)?, sort_key_elements(b).ok_or(Doubt)?);
            let wa: Vec<_> = ea.into_iter().map(|x| (x, &**e)).collect();
            let wb: Vec<_> = eb.into_iter().map(|x| (x, &**e)).collect();
            seq_cmp(&wa, &wb)?
        }
        Ty::Map(k, v, _) => {
            let (ea, eb) = (sort_key_elements_map(a).ok_or(Doubt)?, sort_key_elements_map(b).ok_or(Doubt)?);
            let (kt, vt): (&Ty, &Ty) = (k, v);
            let tag = |i: usize| if i % 2 == 0 { kt } else { vt };
            let wa: Vec<_> = ea.into_iter().enumerate().map(|(i, x)| (x, tag(i))).collect();
            let wb: Vec<_> = eb.into_iter().enumerate().map(|(i, x)| (x, tag(i))).collect();
            seq_cmp(&wa, &wb)?
        }
        Ty::Tuple(f) | Ty::Udt(_, f, _) => {
            let (fa, fb) = (split_fields(a, f.len())?, split_fields(b, f.len())?);
            let wa: Vec<_> = fa.into_iter().zip(f).collect();
            let wb: Vec<_> = fb.into_iter().zip(f).collect();
            seq_cmp(&wa, &wb)?
        }
        Ty::Vector(e, d) => {
            let (ea, eb) = (vector_elements(e, *d, a)?, vector_elements(e, *d, b)?);
            let wa: Vec<_> = ea.into_iter().map(|x| (Some(x), &**e)).collect();
            let wb: Vec<_> = eb.into_iter().map(|x| (Some(x), &**e)).collect();
            seq_cmp(&wa, &wb)?
        }
        _ => a.cmp(b),
    })
}

/// Exact comparison of two CQL decimals (`decimal.Decimal` ordering).
fn compare_decimals_exact(a: &[u8], b: &[u8]) -> Ordering {
    let parse = |x: &[u8]| {
        let scale = i32::from_be_bytes(x[..4].try_into().unwrap()) as i64;
        let (neg, limbs) = text::bigint_magnitude(&x[4..]);
        (neg, text::magnitude_digits(&limbs), -scale)
    };
    let (na, da, ea) = parse(a);
    let (nb, db, eb) = parse(b);
    let sign = |n: bool, d: &str| if d == "0" { 0 } else if n { -1 } else { 1 };
    let (sa, sb) = (sign(na, &da), sign(nb, &db));
    if sa != sb || sa == 0 {
        return sa.cmp(&sb);
    }
    let (ma, mb) = (da.len() as i64 + ea, db.len() as i64 + eb);
    let mag = if ma != mb {
        ma.cmp(&mb)
    } else {
        let (x, y) = (da.trim_end_matches('0'), db.trim_end_matches('0'));
        let n = x.len().max(y.len());
        format!("{x:0<n$}").cmp(&format!("{y:0<n$}"))
    };
    if sa < 0 {
        mag.reverse()
    } else {
        mag
    }
}
