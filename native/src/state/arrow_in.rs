//! Reading Arrow record batches handed over through the Arrow C data interface (`__arrow_c_array__`
//! capsules), without a copy and without an Arrow library: the few layouts the engine reads (binary, string,
//! int32, int64, bool, list and struct) are simple enough to read from the C structs directly. The Python
//! side casts its tables to the exact schemas first (`state.native`), and the formats are checked here.

use std::ffi::{c_char, c_void, CStr};

#[repr(C)]
pub struct FFIArrowSchema {
    format: *const c_char,
    name: *const c_char,
    metadata: *const c_char,
    flags: i64,
    n_children: i64,
    children: *mut *mut FFIArrowSchema,
    dictionary: *mut FFIArrowSchema,
    release: Option<unsafe extern "C" fn(*mut FFIArrowSchema)>,
    private_data: *mut c_void,
}

#[repr(C)]
pub struct FFIArrowArray {
    length: i64,
    null_count: i64,
    offset: i64,
    n_buffers: i64,
    n_children: i64,
    buffers: *mut *const c_void,
    children: *mut *mut FFIArrowArray,
    dictionary: *mut FFIArrowArray,
    release: Option<unsafe extern "C" fn(*mut FFIArrowArray)>,
    private_data: *mut c_void,
}

/// A read-only view of one Arrow array (and its children) exported through the C data interface. Valid while
/// the capsules it was read from are alive (the caller holds them for the whole call).
#[derive(Clone)]
pub struct Col {
    pub format: String,
    pub name: String,
    pub len: usize,
    offset: usize,
    validity: *const u8,
    b1: *const u8,
    b2: *const u8,
    /// bytes per value in `b1` (0: a bitmap; 4 for offsets), for `prefetch`
    width: u8,
    /// whether `b2` holds the values `b1`'s offsets point into (binary and string)
    var: bool,
    pub children: Vec<Col>,
}

/// Ask the CPU to bring the cache line holding `p` in (a hint: never faults, a no-op elsewhere than x86-64).
#[inline(always)]
pub fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint that does not access memory architecturally, whatever the address
    unsafe {
        std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T0)
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

unsafe impl Send for Col {}
// SAFETY: a read-only view; the engine's threads only read the buffers, which live for the whole call
unsafe impl Sync for Col {}

impl Col {
    /// # Safety
    /// `schema` and `array` must point to valid, unreleased C data interface structs describing the same array.
    pub unsafe fn from_ffi(schema: *const FFIArrowSchema, array: *const FFIArrowArray) -> Result<Col, String> {
        let s = &*schema;
        let a = &*array;
        let format = CStr::from_ptr(s.format).to_string_lossy().into_owned();
        let name = if s.name.is_null() { String::new() } else { CStr::from_ptr(s.name).to_string_lossy().into_owned() };
        if s.n_children != a.n_children {
            return Err(format!("column {name}: schema and array disagree on children"));
        }
        let buf = |i: i64| -> *const u8 {
            if i < a.n_buffers {
                *a.buffers.add(i as usize) as *const u8
            } else {
                std::ptr::null()
            }
        };
        let mut children = Vec::with_capacity(a.n_children as usize);
        for i in 0..a.n_children as usize {
            children.push(Col::from_ffi(*s.children.add(i), *a.children.add(i))?);
        }
        if format == "+s" {
            // a struct's offset applies to its fields
            for c in children.iter_mut() {
                c.offset += a.offset as usize;
            }
        }
        let validity = if a.null_count == 0 { std::ptr::null() } else { buf(0) };
        let (width, var) = match format.as_str() {
            "l" => (8, false),
            "i" => (4, false),
            "u" | "z" => (4, true),
            "+l" => (4, false),
            _ => (0, false),
        };
        // an exporter may hand over no data buffer when every value is empty: the values then point at a real
        // empty one (a slice must not be built from a null pointer, nor compared at a dangling one: `key`)
        static NO_DATA: [u8; 1] = [0];
        let b2 = if var && buf(2).is_null() { NO_DATA.as_ptr() } else { buf(2) };
        Ok(Col { format, name, len: a.length as usize, offset: a.offset as usize, validity, b1: buf(1), b2, width,
                 var, children })
    }

    pub fn expect(&self, format: &str) -> Result<(), String> {
        if self.format == format {
            Ok(())
        } else {
            Err(format!("column {}: Arrow format {:?}, expected {:?}", self.name, self.format, format))
        }
    }

    pub fn child(&self, name: &str) -> Result<&Col, String> {
        self.children.iter().find(|c| c.name == name).ok_or_else(|| format!("no column {name}"))
    }

    /// The child `name`, checked to have the Arrow `format` a reader of it expects.
    pub fn field(&self, name: &str, format: &str) -> Result<&Col, String> {
        let col = self.child(name)?;
        col.expect(format)?;
        Ok(col)
    }

    /// Where the array's values are: its buffers' addresses, its offset and length. Two views with the same place
    /// read the same values while both are exported (Arrow buffers do not change once built).
    pub fn place(&self) -> [usize; 5] {
        [self.validity as usize, self.b1 as usize, self.b2 as usize, self.offset, self.len]
    }

    #[inline]
    pub fn valid(&self, i: usize) -> bool {
        if self.validity.is_null() {
            return true;
        }
        let j = i + self.offset;
        // SAFETY: the validity bitmap covers offset + len bits
        unsafe { *self.validity.add(j / 8) & (1 << (j % 8)) != 0 }
    }

    #[inline]
    pub fn i64(&self, i: usize) -> i64 {
        // SAFETY: an int64 array of offset + len values (format checked by the caller)
        unsafe { (self.b1 as *const i64).add(i + self.offset).read_unaligned() }
    }

    #[inline]
    pub fn i32(&self, i: usize) -> i32 {
        unsafe { (self.b1 as *const i32).add(i + self.offset).read_unaligned() }
    }

    #[inline]
    pub fn bool(&self, i: usize) -> bool {
        let j = i + self.offset;
        unsafe { *self.b1.add(j / 8) & (1 << (j % 8)) != 0 }
    }

    /// A binary/string value (i32 offsets).
    #[inline]
    pub fn bytes(&self, i: usize) -> &[u8] {
        unsafe {
            let offs = self.b1 as *const i32;
            let a = offs.add(i + self.offset).read_unaligned() as usize;
            let b = offs.add(i + self.offset + 1).read_unaligned() as usize;
            std::slice::from_raw_parts(self.b2.add(a), b - a)
        }
    }

    #[inline]
    pub fn opt_bytes(&self, i: usize) -> Option<&[u8]> {
        if self.valid(i) {
            Some(self.bytes(i))
        } else {
            None
        }
    }

    #[inline]
    pub fn opt_i64(&self, i: usize) -> Option<i64> {
        if self.valid(i) {
            Some(self.i64(i))
        } else {
            None
        }
    }

    #[inline]
    pub fn opt_i32(&self, i: usize) -> Option<i32> {
        if self.valid(i) {
            Some(self.i32(i))
        } else {
            None
        }
    }

    #[inline]
    pub fn opt_bool(&self, i: usize) -> Option<bool> {
        if self.valid(i) {
            Some(self.bool(i))
        } else {
            None
        }
    }

    /// Start loading what reading value `i` touches first: its validity bit, its value or its offsets. The
    /// engine reads the records of one partition after another in token order, scattered over the cell log and
    /// the stored state: without a hint, nearly every column read waits on memory.
    #[inline]
    pub fn prefetch(&self, i: usize) {
        let j = i + self.offset;
        if !self.validity.is_null() {
            prefetch_line(self.validity.wrapping_add(j / 8));
        }
        if !self.b1.is_null() {
            prefetch_line(match self.width {
                0 => self.b1.wrapping_add(j / 8),
                w => self.b1.wrapping_add(j * w as usize),
            });
        }
    }

    /// Start loading the bytes of binary value `i` (its offsets read: `prefetch` them first).
    #[inline]
    pub fn prefetch_data(&self, i: usize) {
        if self.var && i < self.len {
            // SAFETY: offsets of offset + len + 1 values
            let a = unsafe { (self.b1 as *const i32).add(i + self.offset).read_unaligned() } as usize;
            prefetch_line(self.b2.wrapping_add(a));
        }
    }

    /// The child index range of list entry `i` (i32 offsets).
    #[inline]
    pub fn list_range(&self, i: usize) -> std::ops::Range<usize> {
        unsafe {
            let offs = self.b1 as *const i32;
            offs.add(i + self.offset).read_unaligned() as usize..offs.add(i + self.offset + 1).read_unaligned() as usize
        }
    }
}
