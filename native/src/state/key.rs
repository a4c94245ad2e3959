//! Byte strings compared without `memcmp` when they are short or empty: clustering keys as map keys, partition
//! keys, cell values, mutation ids and segment names, compared a dozen times per change.
//!
//! An empty `Vec` or `b""` points at a dangling address (0x1), and glibc's AVX-512 `memcmp` reads its operands
//! with masked loads, whose fault on that unmapped page is suppressed by a microcode assist: about 80 ns a
//! compare on an AMD EPYC, against 2 ns for an allocated one. A table without clustering columns keys its one
//! row by b"", and those compares (the map lookups of every partition) were a fifth of the engine's time. A
//! short one is a library call for a few bytes: two loads of each side compare it here.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::ops::Deref;

/// `a == b`.
#[inline]
pub fn eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n == 0 {
        return true;
    }
    let (p, q) = (a.as_ptr(), b.as_ptr());
    // SAFETY: every read is within a[..n] and b[..n] (unaligned reads of 8 or 4 bytes: at 0, 8, n - 16 and n - 8
    // for n of 17 to 32; at 0 and n - 8 or n - 4 below that)
    unsafe {
        if (17..=32).contains(&n) {
            // segment names ("CommitLog-7-1763000000001.log"), mutation ids: inline, without a call to memcmp
            let at = |x: *const u8, i: usize| x.add(i).cast::<u64>().read_unaligned();
            at(p, 0) == at(q, 0) && at(p, 8) == at(q, 8) && at(p, n - 16) == at(q, n - 16)
                && at(p, n - 8) == at(q, n - 8)
        } else if (8..=16).contains(&n) {
            p.cast::<u64>().read_unaligned() == q.cast::<u64>().read_unaligned()
                && p.add(n - 8).cast::<u64>().read_unaligned() == q.add(n - 8).cast::<u64>().read_unaligned()
        } else if (4..8).contains(&n) {
            p.cast::<u32>().read_unaligned() == q.cast::<u32>().read_unaligned()
                && p.add(n - 4).cast::<u32>().read_unaligned() == q.add(n - 4).cast::<u32>().read_unaligned()
        } else if n < 4 {
            // the first, middle and last bytes are every byte of 1 to 3
            *p == *q && *p.add(n / 2) == *q.add(n / 2) && *p.add(n - 1) == *q.add(n - 1)
        } else {
            a == b
        }
    }
}

/// `a == b` of optional byte strings.
#[inline]
pub fn opt_eq(a: Option<&[u8]>, b: Option<&[u8]>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

/// `a.cmp(b)`.
#[inline]
pub fn cmp(a: &[u8], b: &[u8]) -> Ordering {
    if a.is_empty() || b.is_empty() {
        a.len().cmp(&b.len())
    } else {
        a.cmp(b)
    }
}

/// An owned clustering key (the bytes of `Vec<u8>`, ordered as they are).
#[derive(Clone, Default, Debug)]
pub struct Key(pub Vec<u8>);

/// A borrowed clustering key: what a map of `Key`s is searched by.
#[repr(transparent)]
#[derive(Debug)]
pub struct KeyRef([u8]);

impl KeyRef {
    #[inline]
    pub fn new(b: &[u8]) -> &KeyRef {
        // SAFETY: KeyRef is a transparent wrapper of [u8]
        unsafe { &*(b as *const [u8] as *const KeyRef) }
    }
}

impl From<&[u8]> for Key {
    fn from(b: &[u8]) -> Key {
        Key(b.to_vec())
    }
}

impl Deref for Key {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl Deref for KeyRef {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl Borrow<KeyRef> for Key {
    #[inline]
    fn borrow(&self) -> &KeyRef {
        KeyRef::new(&self.0)
    }
}

impl PartialEq for Key {
    #[inline]
    fn eq(&self, o: &Key) -> bool {
        eq(&self.0, &o.0)
    }
}

impl Eq for Key {}

impl PartialOrd for Key {
    #[inline]
    fn partial_cmp(&self, o: &Key) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for Key {
    #[inline]
    fn cmp(&self, o: &Key) -> Ordering {
        cmp(&self.0, &o.0)
    }
}

impl PartialEq for KeyRef {
    #[inline]
    fn eq(&self, o: &KeyRef) -> bool {
        eq(&self.0, &o.0)
    }
}

impl Eq for KeyRef {}

impl PartialOrd for KeyRef {
    #[inline]
    fn partial_cmp(&self, o: &KeyRef) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for KeyRef {
    #[inline]
    fn cmp(&self, o: &KeyRef) -> Ordering {
        cmp(&self.0, &o.0)
    }
}

/// A clustering key borrowed from the batch's Arrow input (a stored row's or a record's clustering bytes, alive for
/// the whole batch): rows are keyed by it without a copy of their key.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ck<'a>(pub &'a [u8]);

impl<'a> Deref for Ck<'a> {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        self.0
    }
}

impl PartialEq for Ck<'_> {
    #[inline]
    fn eq(&self, o: &Self) -> bool {
        eq(self.0, o.0)
    }
}

impl Eq for Ck<'_> {}

impl PartialOrd for Ck<'_> {
    #[inline]
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for Ck<'_> {
    #[inline]
    fn cmp(&self, o: &Self) -> Ordering {
        cmp(self.0, o.0)
    }
}

impl Borrow<KeyRef> for Ck<'_> {
    #[inline]
    fn borrow(&self) -> &KeyRef {
        KeyRef::new(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_long_strings_compare_as_slices_do() {
        let data: Vec<u8> = (0..64u8).collect();
        for n in 0..40 {
            let a = &data[..n];
            let mut b = a.to_vec();
            assert!(eq(a, &b), "{n}");
            for i in 0..n {
                b[i] ^= 1;
                assert!(!eq(a, &b), "{n} {i}");
                b[i] ^= 1;
            }
            assert!(!eq(a, &data[..n + 1]));
            assert_eq!(cmp(a, &b), a.cmp(&b[..]));
        }
        assert!(opt_eq(None, None) && !opt_eq(Some(b""), None) && opt_eq(Some(b"ab"), Some(b"ab")));
    }
}
