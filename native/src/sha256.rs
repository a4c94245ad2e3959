//! SHA-256 of short messages that share a prefix, one or two at a time: the event ids (`state::events`), and the
//! mutation ids (`decode::mutation_id`).
//!
//! An event id hashes about 200 bytes, four blocks, each waiting on the one before. With the processor's SHA
//! instructions one block is a chain of dependent rounds, so a lone hash leaves the SHA unit idle most of the time;
//! two independent messages hashed together, their rounds interleaved, take about 0.75 times as long as one after
//! the other (docs/benchmarks.md). Where the processor has no SHA
//! instructions (or is not x86-64), the `sha2` crate's compression function does the blocks, one message after the
//! other: the digests are the same either way, which the tests check against `sha2` for every input of up to 200
//! bytes after prefixes of 0 to 128 bytes.

/// SHA-256's initial hash value (FIPS 180-4, 5.3.3).
const H0: [u32; 8] = [
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
];

/// The hash state after a common prefix: its whole blocks compressed, the bytes after them kept to go before each
/// message's.
#[derive(Clone)]
pub struct Prefixed {
    h: [u32; 8],
    /// the prefix's bytes after its last whole block
    tail: Vec<u8>,
    /// how many bytes the whole blocks held
    compressed: u64,
}

impl Prefixed {
    pub fn new(prefix: &[u8]) -> Prefixed {
        let whole = prefix.len() / 64 * 64;
        let mut h = H0;
        for block in prefix[..whole].chunks_exact(64) {
            compress_one(&mut h, block.try_into().expect("a 64-byte chunk"));
        }
        Prefixed { h, tail: prefix[whole..].to_vec(), compressed: whole as u64 }
    }

    /// The padded message `tail ‖ input` (FIPS 180-4, 5.1.1) as it goes on from `h`.
    fn message<'m>(&'m self, input: &'m [u8]) -> Padded<'m> {
        let len = self.tail.len() + input.len();
        let bits = (self.compressed + len as u64) * 8;
        // the message, a 0x80 byte and the 8-byte length, rounded up to whole blocks
        Padded { tail: &self.tail, input, blocks: (len + 9).div_ceil(64), bits }
    }

    /// The first 16 bytes of SHA-256(prefix ‖ `input`).
    pub fn digest16(&self, input: &[u8]) -> [u8; 16] {
        let m = self.message(input);
        #[cfg(target_arch = "x86_64")]
        if shani::available() {
            // the state kept in registers from the first block to the last (a mutation id hashes a whole
            // commit-log entry: two blocks or many more), not loaded and stored around each
            // SAFETY: the processor has the SHA, SSSE3 and SSE4.1 instructions (`available`)
            return first16(&unsafe { shani::digest(&self.h, &m) });
        }
        let mut block = [0u8; 64];
        let mut h = self.h;
        for i in 0..m.blocks {
            m.block(i, &mut block);
            compress_one(&mut h, &block);
        }
        first16(&h)
    }

    /// `digest16` of two inputs, their blocks hashed together where the processor allows it.
    pub fn digest16_pair(&self, a: &[u8], b: &[u8]) -> ([u8; 16], [u8; 16]) {
        #[cfg(target_arch = "x86_64")]
        if shani::available() {
            let (ma, mb) = (self.message(a), self.message(b));
            let (mut ba, mut bb) = ([0u8; 64], [0u8; 64]);
            let both = ma.blocks.min(mb.blocks);
            // SAFETY: the processor has the SHA, SSSE3 and SSE4.1 instructions (`available`)
            unsafe {
                let (mut sa, mut sb) = (shani::State::load(&self.h), shani::State::load(&self.h));
                for i in 0..both {
                    ma.block(i, &mut ba);
                    mb.block(i, &mut bb);
                    shani::compress_two(&mut sa, &ba, &mut sb, &bb);
                }
                for i in both..ma.blocks {
                    ma.block(i, &mut ba);
                    shani::compress(&mut sa, &ba);
                }
                for i in both..mb.blocks {
                    mb.block(i, &mut bb);
                    shani::compress(&mut sb, &bb);
                }
                return (first16(&sa.store()), first16(&sb.store()));
            }
        }
        (self.digest16(a), self.digest16(b))
    }
}

/// The first 16 bytes of SHA-256(`data`).
pub fn digest16(data: &[u8]) -> [u8; 16] {
    const NO_PREFIX: Prefixed = Prefixed { h: H0, tail: Vec::new(), compressed: 0 };
    NO_PREFIX.digest16(data)
}

/// A message after a prefix's whole blocks, padded: read a block at a time, never copied whole.
struct Padded<'m> {
    tail: &'m [u8],
    input: &'m [u8],
    blocks: usize,
    /// the whole message's length in bits, prefix included
    bits: u64,
}

impl Padded<'_> {
    /// Block `i`: the bytes of `tail ‖ input` it covers, then the padding's.
    #[inline]
    fn block(&self, i: usize, out: &mut [u8; 64]) {
        let (start, end) = (64 * i, 64 * i + 64);
        let t = self.tail.len();
        let len = t + self.input.len();
        let mut at = 0;
        // the prefix's tail (only in the first block: it is shorter than a block)
        if start < t {
            let n = t - start;
            out[..n].copy_from_slice(&self.tail[start..]);
            at = n;
        }
        // the input
        let from = (start + at).max(t) - t;
        let to = end.min(len).max(t) - t;
        if to > from {
            out[at..at + to - from].copy_from_slice(&self.input[from..to]);
            at += to - from;
        }
        // the padding: 0x80 right after the message, zeros, and the length in the last block's last 8 bytes
        out[at..].fill(0);
        if len >= start && len < end {
            out[len - start] = 0x80;
        }
        if i + 1 == self.blocks {
            out[56..].copy_from_slice(&self.bits.to_be_bytes());
        }
    }
}

fn first16(h: &[u32; 8]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(h) {
        o.copy_from_slice(&w.to_be_bytes());
    }
    out
}

/// One block into `h`, with the SHA instructions where there are.
#[inline]
fn compress_one(h: &mut [u32; 8], block: &[u8; 64]) {
    #[cfg(target_arch = "x86_64")]
    if shani::available() {
        // SAFETY: the processor has the SHA, SSSE3 and SSE4.1 instructions (`available`)
        unsafe {
            let mut s = shani::State::load(h);
            shani::compress(&mut s, block);
            *h = s.store();
        }
        return;
    }
    sha2::compress256(h, &[(*block).into()]);
}

/// The SHA-256 rounds with x86's SHA extensions (`sha256rnds2`, `sha256msg1`, `sha256msg2`), written from the
/// instructions' definitions in Intel's Software Developer's Manual and FIPS 180-4.
#[cfg(target_arch = "x86_64")]
mod shani {
    use std::arch::x86_64::*;

    /// FIPS 180-4, 4.2.2
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
    ];

    /// Whether this processor has the instructions (std caches the answer).
    #[inline]
    pub fn available() -> bool {
        is_x86_feature_detected!("sha") && is_x86_feature_detected!("sse4.1") && is_x86_feature_detected!("ssse3")
    }

    /// The eight working words as `sha256rnds2` takes them: A, B, E, F in one register, C, D, G, H in the other
    /// (highest lane first).
    #[derive(Clone, Copy)]
    pub struct State {
        abef: __m128i,
        cdgh: __m128i,
    }

    impl State {
        #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
        pub unsafe fn load(h: &[u32; 8]) -> State {
            // lanes low to high: A B C D and E F G H
            let abcd = _mm_loadu_si128(h.as_ptr() as *const __m128i);
            let efgh = _mm_loadu_si128(h.as_ptr().add(4) as *const __m128i);
            let badc = _mm_shuffle_epi32(abcd, 0b10_11_00_01);
            let hgfe = _mm_shuffle_epi32(efgh, 0b00_01_10_11);
            // F E B A and H G D C
            State { abef: _mm_alignr_epi8(badc, hgfe, 8), cdgh: _mm_blend_epi16(hgfe, badc, 0xF0) }
        }

        #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
        pub unsafe fn store(self) -> [u32; 8] {
            let abef = _mm_shuffle_epi32(self.abef, 0b00_01_10_11); // A B E F
            let cdgh = _mm_shuffle_epi32(self.cdgh, 0b10_11_00_01); // G H C D
            let mut h = [0u32; 8];
            _mm_storeu_si128(h.as_mut_ptr() as *mut __m128i, _mm_blend_epi16(abef, cdgh, 0xF0));
            _mm_storeu_si128(h.as_mut_ptr().add(4) as *mut __m128i, _mm_alignr_epi8(cdgh, abef, 8));
            h
        }
    }

    /// A block's sixteen words, big-endian, four to a register.
    #[inline(always)]
    unsafe fn words(block: &[u8; 64]) -> [__m128i; 4] {
        let swap = _mm_set_epi64x(0x0c0d0e0f_08090a0b, 0x04050607_00010203);
        let p = block.as_ptr() as *const __m128i;
        [_mm_shuffle_epi8(_mm_loadu_si128(p), swap), _mm_shuffle_epi8(_mm_loadu_si128(p.add(1)), swap),
         _mm_shuffle_epi8(_mm_loadu_si128(p.add(2)), swap), _mm_shuffle_epi8(_mm_loadu_si128(p.add(3)), swap)]
    }

    /// Words 4g..4g+4 of the message schedule into `w[g % 4]`, from the sixteen before them (W[t-16] + σ0(W[t-15])
    /// by msg1, + W[t-7] by the byte shift, + σ1(W[t-2]) by msg2).
    #[inline(always)]
    unsafe fn schedule(w: &mut [__m128i; 4], g: usize) {
        let (a, b, c, d) = (w[g & 3], w[(g + 1) & 3], w[(g + 2) & 3], w[(g + 3) & 3]);
        let x = _mm_add_epi32(_mm_sha256msg1_epu32(a, b), _mm_alignr_epi8(d, c, 4));
        w[g & 3] = _mm_sha256msg2_epu32(x, d);
    }

    /// Rounds 4g..4g+4 with the schedule's words `w`.
    #[inline(always)]
    unsafe fn rounds(s: &mut State, w: __m128i, g: usize) {
        let wk = _mm_add_epi32(w, _mm_loadu_si128(K.as_ptr().add(4 * g) as *const __m128i));
        // two rounds each: the second pair's words are the upper half; the registers swap roles in between
        s.cdgh = _mm_sha256rnds2_epu32(s.cdgh, s.abef, wk);
        s.abef = _mm_sha256rnds2_epu32(s.abef, s.cdgh, _mm_shuffle_epi32(wk, 0b00_00_11_10));
    }

    /// Rounds 4g..4g+4 of the block whose schedule `w` holds (the schedule made first from round 16 on).
    macro_rules! step {
        ($g:literal, $($s:expr, $w:expr),+) => {
            $( if $g >= 4 { schedule(&mut $w, $g); } rounds(&mut $s, $w[$g & 3], $g); )+
        };
    }

    /// One block into `s`.
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    pub unsafe fn compress(s: &mut State, block: &[u8; 64]) {
        let start = *s;
        let mut w = words(block);
        step!(0, *s, w); step!(1, *s, w); step!(2, *s, w); step!(3, *s, w);
        step!(4, *s, w); step!(5, *s, w); step!(6, *s, w); step!(7, *s, w);
        step!(8, *s, w); step!(9, *s, w); step!(10, *s, w); step!(11, *s, w);
        step!(12, *s, w); step!(13, *s, w); step!(14, *s, w); step!(15, *s, w);
        s.abef = _mm_add_epi32(s.abef, start.abef);
        s.cdgh = _mm_add_epi32(s.cdgh, start.cdgh);
    }

    /// Every block of `m` from the hash value `h`: the hash value after them.
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    pub unsafe fn digest(h: &[u32; 8], m: &super::Padded) -> [u32; 8] {
        let mut s = State::load(h);
        let mut block = [0u8; 64];
        for i in 0..m.blocks {
            m.block(i, &mut block);
            compress(&mut s, &block);
        }
        s.store()
    }

    /// A block of each of two messages, their rounds interleaved: neither waits on the other's.
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    pub unsafe fn compress_two(s: &mut State, a: &[u8; 64], t: &mut State, b: &[u8; 64]) {
        let (s0, t0) = (*s, *t);
        let (mut w, mut x) = (words(a), words(b));
        step!(0, *s, w, *t, x); step!(1, *s, w, *t, x); step!(2, *s, w, *t, x); step!(3, *s, w, *t, x);
        step!(4, *s, w, *t, x); step!(5, *s, w, *t, x); step!(6, *s, w, *t, x); step!(7, *s, w, *t, x);
        step!(8, *s, w, *t, x); step!(9, *s, w, *t, x); step!(10, *s, w, *t, x); step!(11, *s, w, *t, x);
        step!(12, *s, w, *t, x); step!(13, *s, w, *t, x); step!(14, *s, w, *t, x); step!(15, *s, w, *t, x);
        s.abef = _mm_add_epi32(s.abef, s0.abef);
        s.cdgh = _mm_add_epi32(s.cdgh, s0.cdgh);
        t.abef = _mm_add_epi32(t.abef, t0.abef);
        t.cdgh = _mm_add_epi32(t.cdgh, t0.cdgh);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    fn want(prefix: &[u8], input: &[u8]) -> [u8; 16] {
        Sha256::new_with_prefix(prefix).chain_update(input).finalize()[..16].try_into().unwrap()
    }

    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    #[test]
    fn digests_equal_sha2s_at_every_length() {
        for n in 0..300 {
            let input = bytes(n, 11);
            assert_eq!(digest16(&input), want(b"", &input), "input {n}");
        }
        for plen in [0, 1, 5, 55, 56, 63, 64, 65, 100, 128] {
            let prefix = bytes(plen, 7);
            let p = Prefixed::new(&prefix);
            for n in 0..200 {
                let input = bytes(n, 3);
                assert_eq!(p.digest16(&input), want(&prefix, &input), "prefix {plen}, input {n}");
            }
        }
    }

    #[test]
    fn pairs_equal_single_digests() {
        // same and different block counts, in both orders
        let prefix = bytes(65, 1);
        let p = Prefixed::new(&prefix);
        for (na, nb) in [(0, 0), (10, 200), (200, 10), (183, 183), (54, 55), (119, 120), (300, 1)] {
            let (a, b) = (bytes(na, 2), bytes(nb, 9));
            assert_eq!(p.digest16_pair(&a, &b), (want(&prefix, &a), want(&prefix, &b)), "{na} and {nb}");
        }
    }

    #[test]
    fn padding_is_sha2s_without_the_sha_instructions() {
        // the blocks `Padded` makes, through the portable block function: the path of processors without them
        for (plen, n) in [(0, 0), (65, 183), (1, 54), (1, 55), (64, 64), (3, 130)] {
            let (prefix, input) = (bytes(plen, 4), bytes(n, 5));
            let p = Prefixed::new(&prefix);
            let m = p.message(&input);
            let mut h = p.h;
            let mut block = [0u8; 64];
            for i in 0..m.blocks {
                m.block(i, &mut block);
                sha2::compress256(&mut h, &[block.into()]);
            }
            assert_eq!(first16(&h), want(&prefix, &input), "prefix {plen}, input {n}");
        }
    }

    #[test]
    fn known_answer() {
        // FIPS 180-4's "abc" example
        let d = digest16(b"abc");
        assert_eq!(d, Prefixed::new(b"").digest16(b"abc"));
        assert_eq!(d, [0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea, 0x41, 0x41, 0x40, 0xde, 0x5d, 0xae, 0x22, 0x23]);
    }
}
