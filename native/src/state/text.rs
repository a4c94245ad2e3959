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
    if !all_plain(b) {
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

/// Whether every byte of `b` is printable ASCII (0x20 to 0x7e) other than `"` and `\`: eight bytes at a time (a
/// value's text is most of what an event's JSON checks), each word tested at once for the bytes that are not.
#[inline]
fn all_plain(b: &[u8]) -> bool {
    let n = b.len();
    let p = b.as_ptr();
    // SAFETY: every read is within b[..n]: words of 8 at 8-byte steps and the last 8 (for n >= 8), the first and
    // last 4 (4 <= n < 8), or the first, middle and last byte (1 <= n < 4); a byte read twice is tested twice
    unsafe {
        match n {
            0 => true,
            1..=3 => {
                let x = *p as u64 | (*p.add(n / 2) as u64) << 8 | (*p.add(n - 1) as u64) << 16;
                plain_word(x | SPACES << 24)
            }
            4..=7 => plain_word(p.cast::<u32>().read_unaligned() as u64
                | (p.add(n - 4).cast::<u32>().read_unaligned() as u64) << 32),
            _ => {
                let mut flags = 0;
                let mut i = 0;
                while i + 8 <= n {
                    flags |= not_plain(p.add(i).cast::<u64>().read_unaligned());
                    i += 8;
                }
                flags |= not_plain(p.add(n - 8).cast::<u64>().read_unaligned());
                flags == 0
            }
        }
    }
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;
/// Eight spaces (plain): what fills a word of fewer bytes.
const SPACES: u64 = ONES * 0x20;

#[inline(always)]
fn plain_word(x: u64) -> bool {
    not_plain(x) == 0
}

/// Not zero when a byte of `x` is not plain (`all_plain`): at or above 0x80, below 0x20 (with every byte below
/// 0x80, `(x - 0x20..) & !x` has a top bit set exactly when one is), or equal to `"`, `\` or 0x7f (a zero byte of
/// `x ^ c..`). Which bytes it flags is not exact; whether any is.
#[inline(always)]
fn not_plain(x: u64) -> u64 {
    let zero_in = |y: u64| y.wrapping_sub(ONES) & !y;
    let below_space = x.wrapping_sub(SPACES) & !x;
    (x | below_space | zero_in(x ^ (ONES * b'"' as u64)) | zero_in(x ^ (ONES * b'\\' as u64))
        | zero_in(x ^ (ONES * 0x7f))) & HIGHS
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
    // Rust's shortest digits, written on the stack: e.g. "1.2345e-5", "-0e0", "1e16" (at most 17 digits, a sign,
    // a point and a 4-character exponent)
    let mut text = StackText::<32>::default();
    let _ = write!(text, "{v:e}");
    let s = text.as_bytes();
    let e = s.iter().position(|&c| c == b'e').expect("LowerExp has an exponent");
    let exp: i32 = std::str::from_utf8(&s[e + 1..]).ok().and_then(|x| x.parse().ok()).expect("exponent");
    let neg = s[0] == b'-';
    let mut digits = [0u8; 24];
    let mut n = 0;
    for &c in &s[neg as usize..e] {
        if c != b'.' {
            digits[n] = c;
            n += 1;
        }
    }
    if n >= 16 {
        // two shortest candidates can be equally near only with 16 or 17 digits (their distance, one unit in
        // the last digit, must fit within the double's spacing); Python then takes the even one, Rust not always
        let d = digits[..n].iter().fold(0u64, |d, &c| d * 10 + (c - b'0') as u64);
        if let Some(even) = tie_even(v.abs(), d, exp + 1 - n as i32) {
            py_decimal_layout(out, neg, even, exp + 1 - n as i32);
            return;
        }
    }
    py_float_layout(out, neg, &digits[..n], exp + 1);
}

/// When `a` (finite, positive) lies exactly halfway between `d x 10^k` and a neighbour `(d +- 1) x 10^k`, and `d`
/// is odd: the neighbour, the even one, which Python's `repr` gives for such a tie. None otherwise.
fn tie_even(a: f64, d: u64, k: i32) -> Option<u64> {
    if d % 2 == 0 {
        return None;
    }
    let bits = a.to_bits();
    let (m, e) = match (bits >> 52) as i32 {
        0 => (bits, -1074),
        x => (bits & ((1 << 52) - 1) | 1 << 52, x - 1075),
    };
    if m == 0 {
        return None;
    }
    let (odd, e2) = ((m >> m.trailing_zeros()) as u128, e + m.trailing_zeros() as i32); // a = odd x 2^e2
    // a tie: 2a = o x 10^k for o = 2d - 1 or 2d + 1, an odd number; the powers of two must match and the odd
    // parts too
    let o = if k >= 0 {
        if k != e2 + 1 || k > 22 || odd % 5u128.pow(k as u32) != 0 {
            return None;
        }
        odd / 5u128.pow(k as u32)
    } else {
        if e2 + 1 - k != 0 || -k > 27 {
            return None;
        }
        odd * 5u128.pow(-k as u32)
    };
    let d = d as u128;
    if o == 2 * d - 1 {
        Some((d - 1) as u64)
    } else if o == 2 * d + 1 {
        Some((d + 1) as u64)
    } else {
        None
    }
}

/// `py_float_layout` of the decimal `d x 10^k` (d > 0), from the digits of `d` without its trailing zeros.
fn py_decimal_layout(out: &mut String, neg: bool, d: u64, k: i32) {
    let mut digits = [0u8; 20];
    let mut n = 0;
    let mut t = d;
    while t > 0 {
        digits[n] = b'0' + (t % 10) as u8;
        t /= 10;
        n += 1;
    }
    digits[..n].reverse();
    let decpt = n as i32 + k;
    while n > 1 && digits[n - 1] == b'0' {
        n -= 1;
    }
    py_float_layout(out, neg, &digits[..n], decpt);
}

/// Python's layout of a float whose value is `0.DIGITS x 10^decpt` (`digits` its shortest significant digits,
/// ASCII, no trailing zero unless the value is zero): positional from 1e-4 up to 1e16, exponent form outside.
fn py_float_layout(out: &mut String, neg: bool, digits: &[u8], decpt: i32) {
    // SAFETY: everything pushed below is ASCII
    let o = unsafe { out.as_mut_vec() };
    o.reserve(digits.len() + 26);
    if neg {
        o.push(b'-');
    }
    let n = digits.len() as i32;
    if decpt > -4 && decpt <= 16 {
        if decpt <= 0 {
            o.extend_from_slice(b"0.");
            o.resize(o.len() + (-decpt) as usize, b'0');
            o.extend_from_slice(digits);
        } else if decpt >= n {
            o.extend_from_slice(digits);
            o.resize(o.len() + (decpt - n) as usize, b'0');
            o.extend_from_slice(b".0");
        } else {
            o.extend_from_slice(&digits[..decpt as usize]);
            o.push(b'.');
            o.extend_from_slice(&digits[decpt as usize..]);
        }
    } else {
        o.push(digits[0]);
        if digits.len() > 1 {
            o.push(b'.');
            o.extend_from_slice(&digits[1..]);
        }
        let e = decpt - 1;
        o.push(b'e');
        o.push(if e < 0 { b'-' } else { b'+' });
        if e.abs() < 10 {
            o.push(b'0');
        }
        let mut t = StackText::<8>::default();
        let _ = write!(t, "{}", e.abs());
        o.extend_from_slice(t.as_bytes());
    }
}

/// `cql.types._float32_json` of a finite float32 value: the shortest `%.{p}g` decimal (p = 1..9) that reads
/// back to the same float32, as the double Python makes of it.
///
/// Most values take `float32_json_fast`, which does Python's arithmetic in integers and exact double operations;
/// the values it cannot settle exactly take `float32_json_exact`, which formats and parses each candidate as
/// Python does (1.3-3 µs a value against 0.14-0.21 µs: as much as the rest of a small table's event).
pub fn float32_json(out: &mut String, v: f32) {
    if !float32_json_fast(out, v) {
        float32_json_exact(out, v);
    }
}

/// `float32_json` by formatting and parsing each candidate `%.{p}g` decimal, as Python does.
fn float32_json_exact(out: &mut String, v: f32) {
    for p in 1..10 {
        if let Some(s) = python_candidate(v, p) {
            py_float_repr(out, s);
            return;
        }
    }
    py_float_repr(out, v as f64);
}

/// Python's candidate for `p` digits, `float(format(v, ".{p}g"))`, if it reads back to `v` as a float32.
fn python_candidate(v: f32, p: usize) -> Option<f64> {
    let text = format!("{:.*e}", p - 1, v as f64); // correctly rounded, as Python's format(v, ".{p}g")
    let s: f64 = text.parse().expect("formatted float parses");
    let back = s as f32;
    if back.is_infinite() && !s.is_infinite() {
        return None; // struct.pack('>f') overflows: not this float
    }
    (back.to_bits() == v.to_bits()).then_some(s)
}

/// 10^0 ..= 10^22: the powers of ten a double holds exactly.
const EXACT_POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19,
    1e20, 1e21, 1e22,
];

/// `float32_json` with little formatting or parsing, for magnitudes in [1e-7, 1e22): false, writing nothing, for
/// any other value (and should the decimal exponent come out wrong).
///
/// Python's candidate for p digits is the double nearest `D x 10^s`, `D` the exact value rounded to p significant
/// digits. Here `s` stays within +-22, so `10^s` is an exact double and `D` (at most 9 digits) too: the one
/// division or product that scales the value is correctly rounded, and so is the one that makes the candidate, as
/// Python's parse of `"De+s"` is. Only the rounding to `D` can go wrong, when the scaled value lies within its own
/// error of a half: that candidate is formatted and parsed as Python does. The candidate's `repr` is `D`'s digits
/// with no formatting: a double that two decimals of at most 9 digits both read to would put them 2^-52 apart.
fn float32_json_fast(out: &mut String, v: f32) -> bool {
    let a = (v as f64).abs();
    if !(1e-7..1e22).contains(&a) {
        return false;
    }
    let target = v.to_bits();
    // the decimal exponent: 10^e10 <= a < 10^(e10 + 1), log10's estimate corrected on the scaled value itself
    let mut e10 = a.log10().floor() as i32;
    for _ in 0..2 {
        if !(-22..=22).contains(&e10) {
            return false;
        }
        let q = scale(a, e10);
        if q >= 10.0 {
            e10 += 1;
        } else if q < 1.0 {
            e10 -= 1;
        } else {
            break;
        }
    }
    for p in 1..10i32 {
        let mut s = e10 - p + 1;
        if !(-22..=21).contains(&s) {
            return false;
        }
        let q = scale(a, s);
        let floor = q.floor();
        let frac = q - floor;
        // q is within 2^-53 x 10^9 (about 1.1e-7) of the exact quotient: which way a fraction that close to a half
        // rounds is not known here (nor which way an exact half goes, Python rounding it to even), so this
        // candidate is made as Python makes it
        if (frac - 0.5).abs() < 1e-6 {
            if let Some(y) = python_candidate(v, p as usize) {
                py_float_repr(out, y);
                return true;
            }
            continue;
        }
        let mut d = floor as u64 + (frac > 0.5) as u64;
        let top = EXACT_POW10[p as usize] as u64;
        if d == top {
            // rounded up to the next power of ten: the same value as p digits one place up
            d /= 10;
            s += 1;
        } else if d > top || d < top / 10 {
            return false; // e10 is not the value's decimal exponent after all
        }
        let y = if s >= 0 { d as f64 * EXACT_POW10[s as usize] } else { d as f64 / EXACT_POW10[-s as usize] };
        let y = if v.is_sign_negative() { -y } else { y };
        if (y as f32).to_bits() == target {
            py_decimal_layout(out, v.is_sign_negative(), d, s);
            return true;
        }
    }
    false
}

/// `a / 10^s`, correctly rounded (|s| <= 22: one operation on exact operands).
#[inline]
fn scale(a: f64, s: i32) -> f64 {
    if s >= 0 {
        a / EXACT_POW10[s as usize]
    } else {
        a * EXACT_POW10[-s as usize]
    }
}

/// A small text buffer on the stack for `write!`, instead of a `String` per value.
struct StackText<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> Default for StackText<N> {
    fn default() -> Self {
        StackText { buf: [0; N], len: 0 }
    }
}

impl<const N: usize> StackText<N> {
    fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl<const N: usize> Write for StackText<N> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        if end > N {
            return Err(std::fmt::Error);
        }
        self.buf[self.len..end].copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
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

/// 10^0 to 10^19.
const POW10: [u64; 20] = {
    let mut p = [1u64; 20];
    let mut i = 1;
    while i < 20 {
        p[i] = p[i - 1] * 10;
        i += 1;
    }
    p
};

/// How many decimal digits `n` has (none for 0): from its bit length (log10(2) is about 1233 / 4096, which gives
/// the count or one less for every u64) and one compare, where `u64::ilog10` takes a chain of them.
#[inline(always)]
fn decimal_digits(n: u64) -> usize {
    let bits = 64 - (n | 1).leading_zeros();
    let guess = ((bits * 1233) >> 12) as usize;
    guess + (n >= POW10[guess]) as usize
}

/// `n` in decimal, zero-padded to at least `width` digits, written straight into the string's buffer: an event
/// writes a dozen integers of 10 to 16 digits (timestamps, positions), eight digits at a time in 32-bit
/// arithmetic rather than two at a time in 64-bit.
fn push_u64(out: &mut String, mut n: u64, width: usize) {
    let digits = decimal_digits(n).max(width);
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

/// Each byte's two lowercase hex digits.
const HEX_PAIRS: [[u8; 2]; 256] = {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut t = [[0; 2]; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = [HEX[i >> 4], HEX[i & 15]];
        i += 1;
    }
    t
};

/// The two lowercase hex digits of each byte of `b` into `dst` (twice as long), a byte's pair at a time.
#[inline]
pub fn hex_into(dst: &mut [u8], b: &[u8]) {
    debug_assert_eq!(dst.len(), 2 * b.len());
    for (pair, x) in dst.chunks_exact_mut(2).zip(b) {
        pair.copy_from_slice(&HEX_PAIRS[*x as usize]);
    }
}

/// Two lowercase hex digits per byte.
pub fn push_hex(out: &mut String, b: &[u8]) {
    let mut buf = [0u8; 64];
    for chunk in b.chunks(32) {
        let digits = &mut buf[..2 * chunk.len()];
        hex_into(digits, chunk);
        // SAFETY: hex digits are ASCII
        out.push_str(unsafe { std::str::from_utf8_unchecked(digits) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_digits_are_counted_at_every_power_of_two_and_ten() {
        let mut edges = vec![0, 1, u64::MAX, u64::MAX - 1];
        for k in 0..64 {
            edges.extend([(1u64 << k) - 1, 1 << k, (1u64 << k).saturating_add(1)]);
        }
        for p in POW10 {
            edges.extend([p - 1, p, p + 1]);
        }
        for n in edges {
            let digits = if n == 0 { 0 } else { n.to_string().len() };
            assert_eq!(decimal_digits(n), digits, "{n}");
            let mut s = String::new();
            push_u64(&mut s, n, 1);
            assert_eq!(s, n.to_string());
            s.clear();
            push_u64(&mut s, n, 12);
            assert_eq!(s, format!("{n:012}"));
        }
    }

    #[test]
    fn plain_bytes_are_told_word_by_word_as_byte_by_byte() {
        let plain = |b: &[u8]| b.iter().all(|&c| (0x20..0x7f).contains(&c) && c != b'"' && c != b'\\');
        // every byte value at every place of texts of 0 to 19 bytes, the others plain (letters, or bytes next to
        // the edges of the plain range)
        for background in [b'a', b' ', b'~', b'!', b'#', b'[', b']'] {
            for n in 0..20 {
                assert!(all_plain(&vec![background; n]));
                for at in 0..n {
                    for x in 0..=255u8 {
                        let mut b = vec![background; n];
                        b[at] = x;
                        assert_eq!(all_plain(&b), plain(&b), "{b:?}");
                    }
                }
            }
        }
        // two bytes that are not plain in one word, and a borrow from one byte into the next
        for (x, y) in [(0x00, 0x80), (0x1f, 0x7f), (b'"', b'\\'), (0x20, 0x00), (0xff, 0x01)] {
            for n in 2..20 {
                for at in 0..n - 1 {
                    let mut b = vec![b'a'; n];
                    (b[at], b[at + 1]) = (x, y);
                    assert_eq!(all_plain(&b), plain(&b), "{b:?}");
                }
            }
        }
    }

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

    fn f32_json(v: f32) -> (String, bool) {
        let mut fast = String::new();
        let took = float32_json_fast(&mut fast, v);
        let mut exact = String::new();
        float32_json_exact(&mut exact, v);
        if took {
            assert_eq!(fast, exact, "float32 {v:e} (bits {:#010x})", v.to_bits());
        }
        (exact, took)
    }

    #[test]
    fn float_repr_takes_the_even_one_of_two_equally_near_shortest_candidates() {
        // Python's repr of doubles that lie halfway between two 16- or 17-digit decimals
        assert_eq!(repr(1059438285926254.25), "1059438285926254.2");
        assert_eq!(repr(-108868734838530.125), "-108868734838530.12");
        assert_eq!(repr(26363981746409.3125), "26363981746409.312");
        assert_eq!(repr(1059438285926254.75), "1059438285926254.8");
        // no tie: the nearer candidate, however its last digit
        assert_eq!(repr(0.30000000000000004), "0.30000000000000004");
        assert_eq!(repr(1059438285926254.5), "1059438285926254.5");
    }

    #[test]
    fn float32_json_like_python() {
        // cql.types._float32_json's answers, as Python gives them
        for (v, want) in [(0.1f32, "0.1"), (1.5, "1.5"), (-2.75, "-2.75"), (100.0, "100.0"), (1e7, "10000000.0"),
                          (3.4028235e38, "3.4028235e+38"), (1e-45, "1e-45"), (0.0, "0.0"), (-0.0, "-0.0"),
                          (16777216.0, "16777216.0"), (1.0e-5, "1e-05"), (123456.79, "123456.79"),
                          (9.999999e21, "9.999999e+21"), (0.3, "0.3"), (1e16, "1e+16")] {
            assert_eq!(f32_json(v).0, want, "{v:e}");
        }
        // values of everyday magnitude take the fast path (the exact one is there for the rest)
        for v in [0.1f32, 1.5, 19.99, 1e-7, 123456.79, 9.999999e21] {
            assert!(f32_json(v).1, "{v:e} took the exact path");
        }
    }

    #[test]
    fn float32_json_fast_path_equals_the_exact_one() {
        // every magnitude (a stride through all bit patterns), amounts in cents and thousandths, integers, the
        // neighbours of each power of ten and of the values halfway between two short decimals
        let mut values: Vec<f32> = (0..(1u64 << 32)).step_by(7919).map(|b| f32::from_bits(b as u32)).collect();
        values.extend((0..200_000).map(|k| k as f32 / 100.0));
        values.extend((0..50_000).map(|k| k as f32 / 1000.0 - 25.0));
        values.extend((0..50_000).map(|k| k as f32));
        for e in -8..23 {
            for digits in [1.0f64, 1.5, 2.5, 9.5, 12.5, 99.5, 1234.5, 9_999_999.5] {
                let x = (digits * 10f64.powi(e)) as f32;
                for step in -3i32..=3 {
                    values.push(f32::from_bits((x.to_bits() as i32 + step) as u32));
                }
            }
        }
        let mut fast = 0;
        for &v in values.iter().filter(|v| v.is_finite()) {
            fast += f32_json(v).1 as usize;
        }
        assert!(fast > values.len() / 2, "{fast} of {} took the fast path", values.len());
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
