//! Text forms that must match Python's byte for byte: `json.dumps(..., ensure_ascii=False)` strings and floats,
//! `str(decimal.Decimal)`, and integers in decimal.

use std::fmt::Write;

/// Append `s`: a short string copied in place (`columns::append`) instead of by a `memcpy` call, as most of
/// what the outputs hold is: names, keys, values, numbers.
#[inline(always)]
pub fn push_text(out: &mut String, s: &str) {
    // SAFETY: a str's bytes are UTF-8
    crate::columns::append(unsafe { out.as_mut_vec() }, s.as_bytes());
}

/// A JSON string as `json.dumps(s, ensure_ascii=False)` writes it.
pub fn json_str(out: &mut String, s: &str) {
    if !json_plain(s.as_bytes(), out) {
        json_escaped(out, s);
    }
}

/// A text value's bytes as a JSON string (`json_str`); Doubt when they are not UTF-8.
pub fn json_text(out: &mut String, b: &[u8]) -> Result<(), std::str::Utf8Error> {
    if !json_plain(b, out) {
        json_escaped(out, std::str::from_utf8(b)?);
    }
    Ok(())
}

/// Write `b` as a JSON string if it is printable ASCII without a quote or backslash (the common case, which needs
/// neither a UTF-8 check nor escapes); false, writing nothing, otherwise.
#[inline]
fn json_plain(b: &[u8], out: &mut String) -> bool {
    if !b.iter().all(|&c| (0x20..0x7f).contains(&c) && c != b'"' && c != b'\\') {
        return false;
    }
    // SAFETY: printable ASCII
    let v = unsafe { out.as_mut_vec() };
    v.reserve(b.len() + 2);
    v.push(b'"');
    crate::columns::append(v, b);
    v.push(b'"');
    true
}

fn json_escaped(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `repr(float)` of a finite double: the shortest digits that read back to it (as Python's and Rust's shortest
/// formatting both give), laid out as Python lays them out.
pub fn py_float_repr(out: &mut String, v: f64) {
    let s = format!("{v:e}"); // e.g. "1.2345e-5", "-0e0", "1e16"
    let (mant, exp) = s.split_once('e').expect("LowerExp has an exponent");
    let exp: i32 = exp.parse().expect("exponent");
    let (neg, mant) = match mant.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mant),
    };
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    let decpt = exp + 1; // the value is 0.DIGITS x 10^decpt
    if neg {
        out.push('-');
    }
    if decpt > -4 && decpt <= 16 {
        let n = digits.len() as i32;
        if decpt <= 0 {
            out.push_str("0.");
            for _ in 0..(-decpt) {
                out.push('0');
            }
            out.push_str(&digits);
        } else if decpt >= n {
            out.push_str(&digits);
            for _ in 0..(decpt - n) {
                out.push('0');
            }
            out.push_str(".0");
        } else {
            out.push_str(&digits[..decpt as usize]);
            out.push('.');
            out.push_str(&digits[decpt as usize..]);
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let e = decpt - 1;
        let _ = write!(out, "e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs());
    }
}

/// `cql.types._float32_json` of a finite float32 value: the shortest `%.{p}g` decimal (p = 1..9) that reads
/// back to the same float32, as the double Python makes of it.
pub fn float32_json(out: &mut String, v: f32) {
    let target = v.to_bits();
    let wide = v as f64;
    for p in 1..10usize {
        let text = format!("{:.*e}", p - 1, wide); // correctly rounded, as Python's format(v, ".{p}g")
        let s: f64 = text.parse().expect("formatted float parses");
        let back = s as f32;
        if back.is_infinite() && !s.is_infinite() {
            continue; // struct.pack('>f') overflows: not this float
        }
        if back.to_bits() == target {
            py_float_repr(out, s);
            return;
        }
    }
    py_float_repr(out, wide);
}

/// The magnitude of a big-endian two's complement integer, as little-endian u64 limbs, and its sign.
pub fn bigint_magnitude(b: &[u8]) -> (bool, Vec<u64>) {
    let neg = !b.is_empty() && b[0] & 0x80 != 0;
    // two's complement -> magnitude: invert and add one when negative
    let mut bytes: Vec<u8> = if neg { b.iter().map(|x| !x).collect() } else { b.to_vec() };
    if neg {
        for x in bytes.iter_mut().rev() {
            let (s, carry) = x.overflowing_add(1);
            *x = s;
            if !carry {
                break;
            }
        }
    }
    let mut limbs = Vec::with_capacity(bytes.len() / 8 + 1);
    let mut i = bytes.len();
    while i > 0 {
        let lo = i.saturating_sub(8);
        let mut w = 0u64;
        for &x in &bytes[lo..i] {
            w = (w << 8) | x as u64;
        }
        limbs.push(w);
        i = lo;
    }
    while limbs.last() == Some(&0) {
        limbs.pop();
    }
    (neg && !limbs.is_empty(), limbs)
}

/// Decimal digits of a magnitude (little-endian u64 limbs); "0" for zero.
pub fn magnitude_digits(limbs: &[u64]) -> String {
    if limbs.is_empty() {
        return "0".to_string();
    }
    let mut l = limbs.to_vec();
    let mut chunks: Vec<u64> = Vec::new(); // base 10^19, least significant first
    const BASE: u128 = 10_000_000_000_000_000_000;
    while !l.is_empty() {
        let mut rem: u128 = 0;
        for w in l.iter_mut().rev() {
            let cur = (rem << 64) | *w as u128;
            *w = (cur / BASE) as u64;
            rem = cur % BASE;
        }
        chunks.push(rem as u64);
        while l.last() == Some(&0) {
            l.pop();
        }
    }
    let mut s = chunks.last().unwrap().to_string();
    for c in chunks.iter().rev().skip(1) {
        let _ = write!(s, "{c:019}");
    }
    s
}

/// `str(int.from_bytes(b, "big", signed=True))`.
pub fn bigint_str(b: &[u8]) -> String {
    let (neg, limbs) = bigint_magnitude(b);
    let d = magnitude_digits(&limbs);
    if neg {
        format!("-{d}")
    } else {
        d
    }
}

/// The value of a big-endian two's complement integer when it fits in an i128.
pub fn bigint_i128(b: &[u8]) -> Option<i128> {
    if b.len() > 16 {
        let (neg, limbs) = bigint_magnitude(b);
        if limbs.len() > 2 || (limbs.len() == 2 && limbs[1] >> 63 != 0) {
            return None;
        }
        let m = limbs.first().copied().unwrap_or(0) as i128 | ((limbs.get(1).copied().unwrap_or(0) as i128) << 64);
        return Some(if neg { -m } else { m });
    }
    let mut v: i128 = if !b.is_empty() && b[0] & 0x80 != 0 { -1 } else { 0 };
    for &x in b {
        v = (v << 8) | x as i128;
    }
    Some(v)
}

/// `str(decimal.Decimal((sign, digits, -scale)))` for the decimal `unscaled x 10^-scale`.
pub fn decimal_str(out: &mut String, unscaled: &[u8], scale: i32) {
    let (neg, limbs) = bigint_magnitude(unscaled);
    let int = magnitude_digits(&limbs);
    let exp = -(scale as i64);
    let leftdigits = exp + int.len() as i64;
    let dotplace = if exp <= 0 && leftdigits > -6 { leftdigits } else { 1 };
    if neg {
        out.push('-');
    }
    if dotplace <= 0 {
        out.push_str("0.");
        for _ in 0..(-dotplace) {
            out.push('0');
        }
        out.push_str(&int);
    } else if dotplace >= int.len() as i64 {
        out.push_str(&int);
        for _ in 0..(dotplace - int.len() as i64) {
            out.push('0');
        }
    } else {
        out.push_str(&int[..dotplace as usize]);
        out.push('.');
        out.push_str(&int[dotplace as usize..]);
    }
    if leftdigits != dotplace {
        let _ = write!(out, "E{:+}", leftdigits - dotplace);
    }
}

// ---- integers and hex, without core::fmt (the hot paths write several per event) ---------------------------

/// The decimal digits of `v` (as `str(v)`).
pub fn push_i64(out: &mut String, v: i64) {
    if v < 0 {
        out.push('-');
    }
    push_u64(out, v.unsigned_abs(), 1);
}

pub fn push_i128(out: &mut String, v: i128) {
    if v < 0 {
        out.push('-');
    }
    push_u128(out, v.unsigned_abs());
}

fn push_u128(out: &mut String, n: u128) {
    const E19: u128 = 10_000_000_000_000_000_000;
    match u64::try_from(n) {
        Ok(small) => push_u64(out, small, 1),
        Err(_) => {
            // u64 arithmetic for each 19 digits: u128 division is a library call
            push_u128(out, n / E19);
            push_u64(out, (n % E19) as u64, 19);
        }
    }
}

const PAIRS: &[u8; 200] = b"00010203040506070809101112131415161718192021222324252627282930313233343536373839404142434445464748495051525354555657585960616263646566676869707172737475767778798081828384858687888990919293949596979899";

/// The 8 decimal digits of `n` (< 10^8, zero-padded) at `p`: four pairs, in 32-bit arithmetic.
///
/// # Safety
/// `p` is valid for writing 8 bytes.
#[inline(always)]
unsafe fn put8(p: *mut u8, n: u32) {
    let (hi, lo) = (n / 10_000, n % 10_000);
    for (k, q) in [(0, hi / 100), (2, hi % 100), (4, lo / 100), (6, lo % 100)] {
        std::ptr::copy_nonoverlapping(PAIRS.as_ptr().add(q as usize * 2), p.add(k), 2);
    }
}

/// `n` in decimal, zero-padded to at least `width` digits, written straight into the string's buffer: an event
/// writes a dozen integers of 10 to 16 digits (timestamps, positions), eight digits at a time in 32-bit
/// arithmetic rather than two at a time in 64-bit.
fn push_u64(out: &mut String, mut n: u64, width: usize) {
    let digits = (n.checked_ilog10().unwrap_or(0) as usize + 1).max(width);
    // SAFETY: only ASCII digits are written, into capacity reserved here (the chunks of eight are written within
    // the digits' room: the first from position digits - 8 on only when there are at least eight), and the length
    // is set after them
    unsafe {
        let v = out.as_mut_vec();
        v.reserve(digits);
        let start = v.len();
        let p = v.as_mut_ptr().add(start);
        let mut i = digits;
        while i >= 8 && (n >= 10_000_000 || i > 8) {
            i -= 8;
            put8(p.add(i), (n % 100_000_000) as u32);
            n /= 100_000_000;
        }
        // the rest: fewer than eight digits (or eight, of a number below 10^7 padded to eight)
        while n >= 100 {
            let d = (n % 100) as usize * 2;
            n /= 100;
            i -= 2;
            std::ptr::copy_nonoverlapping(PAIRS.as_ptr().add(d), p.add(i), 2);
        }
        if n >= 10 {
            i -= 2;
            std::ptr::copy_nonoverlapping(PAIRS.as_ptr().add(n as usize * 2), p.add(i), 2);
        } else if i > 0 {
            i -= 1;
            *p.add(i) = b'0' + n as u8;
        }
        while i > 0 {
            i -= 1;
            *p.add(i) = b'0';
        }
        v.set_len(start + digits);
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Two lowercase hex digits per byte.
pub fn push_hex(out: &mut String, b: &[u8]) {
    let mut buf = [0u8; 64];
    for chunk in b.chunks(32) {
        for (i, &x) in chunk.iter().enumerate() {
            buf[2 * i] = HEX[(x >> 4) as usize];
            buf[2 * i + 1] = HEX[(x & 15) as usize];
        }
        // SAFETY: hex digits are ASCII
        out.push_str(unsafe { std::str::from_utf8_unchecked(&buf[..2 * chunk.len()]) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repr(v: f64) -> String {
        let mut s = String::new();
        py_float_repr(&mut s, v);
        s
    }

    #[test]
    fn float_repr_like_python() {
        assert_eq!(repr(1e16), "1e+16");
        assert_eq!(repr(1e15), "1000000000000000.0");
        assert_eq!(repr(0.0001), "0.0001");
        assert_eq!(repr(0.00001), "1e-05");
        assert_eq!(repr(-0.0), "-0.0");
        assert_eq!(repr(1.5), "1.5");
        assert_eq!(repr(123456789.125), "123456789.125");
        assert_eq!(repr(1e100), "1e+100");
        assert_eq!(repr(3.4028234663852886e38), "3.4028234663852886e+38");
    }

    #[test]
    fn decimal_like_python() {
        let d = |u: i64, s: i32| {
            let mut o = String::new();
            decimal_str(&mut o, &u.to_be_bytes(), s);
            o
        };
        assert_eq!(d(150, 2), "1.50");
        assert_eq!(d(0, 0), "0");
        assert_eq!(d(-5, 0), "-5");
        assert_eq!(d(5, -3), "5E+3");
        assert_eq!(d(123, 10), "1.23E-8");
        assert_eq!(d(0, 3), "0.000");
        assert_eq!(d(1, 6), "0.000001");
        assert_eq!(d(1, 7), "1E-7");
    }

    #[test]
    fn integers_in_decimal() {
        let d = |v: i64| {
            let mut s = String::from("x");
            push_i64(&mut s, v);
            s
        };
        for v in [0, 7, 10, 99, 100, 12345, 1234567, 12345678, 99_999_999, 100_000_000, 10_000_000_000_000_000,
                  -1, -10, i64::MAX, i64::MIN, 1_763_000_001_000_000] {
            assert_eq!(d(v), format!("x{v}"));
        }
        for v in [-(1i128 << 100), (1i128 << 64) + 5, 10i128.pow(19), 10i128.pow(19) * 3 + 7] {
            let mut s = String::new();
            push_i128(&mut s, v);
            assert_eq!(s, v.to_string());
        }
    }

    #[test]
    fn bigints() {
        assert_eq!(bigint_str(&[0xff]), "-1");
        assert_eq!(bigint_str(&[0x00, 0x80]), "128");
        assert_eq!(bigint_str(&[0x80]), "-128");
        let big = [0x7fu8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(bigint_str(&big), "39614081257132168796771975167");
    }
}
