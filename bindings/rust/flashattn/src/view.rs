//! Typed views: a `flashattn_tensor_t` over a borrowed slice (host memory, for CPU contexts) or a
//! borrowed buffer, checked to lie inside what it borrows.

use std::marker::PhantomData;
use std::os::raw::c_void;

use flashattn_sys as sys;

use crate::{Buffer, DType, Error, Result, Status};

/// An element type the library computes with.
///
/// # Safety
/// `DTYPE` must describe the type's size and bit layout, and every bit pattern must be a valid
/// value (the library writes outputs of this type).
pub unsafe trait Element: Copy + Default + 'static {
    const DTYPE: DType;
}

// SAFETY: an IEEE binary32.
unsafe impl Element for f32 {
    const DTYPE: DType = DType::F32;
}

/// An IEEE binary16 value, as its bits.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct F16(pub u16);

/// A bfloat16 value (the upper half of an f32), as its bits.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BF16(pub u16);

// SAFETY: a 32-bit two's complement integer (offsets, cache lengths, block tables).
unsafe impl Element for i32 {
    const DTYPE: DType = DType::I32;
}

// SAFETY: 16 bits, any pattern valid.
unsafe impl Element for F16 {
    const DTYPE: DType = DType::F16;
}

// SAFETY: 16 bits, any pattern valid.
unsafe impl Element for BF16 {
    const DTYPE: DType = DType::BF16;
}

impl F16 {
    /// The nearest binary16 (ties to even; overflow to infinity).
    pub fn from_f32(f: f32) -> F16 {
        let b = f.to_bits();
        let sign = ((b >> 16) & 0x8000) as u16;
        let exp = ((b >> 23) & 0xff) as i32;
        let mut mant = b & 0x7f_ffff;
        if exp == 0xff {
            return F16(sign | if mant != 0 { 0x7e00 } else { 0x7c00 });
        }
        let e = exp - 127 + 15;
        if e >= 0x1f {
            return F16(sign | 0x7c00);
        }
        if e <= 0 {
            if e < -10 {
                return F16(sign);
            }
            mant |= 0x80_0000;
            let shift = (14 - e) as u32;
            let mut r = mant >> shift;
            let (rem, half) = (mant & ((1 << shift) - 1), 1u32 << (shift - 1));
            if rem > half || (rem == half && r & 1 == 1) {
                r += 1;
            }
            return F16(sign | r as u16);
        }
        let mut r = ((e as u32) << 10) | (mant >> 13);
        let rem = mant & 0x1fff;
        if rem > 0x1000 || (rem == 0x1000 && r & 1 == 1) {
            r += 1; // may carry into the exponent: rounds to infinity at the top
        }
        F16(sign | r as u16)
    }

    pub fn to_f32(self) -> f32 {
        let h = self.0 as u32;
        let sign = (h & 0x8000) << 16;
        let exp = (h >> 10) & 0x1f;
        let mant = h & 0x3ff;
        match exp {
            0x1f => f32::from_bits(sign | 0x7f80_0000 | (mant << 13)),
            0 => {
                let f = mant as f32 / (1u32 << 24) as f32; // subnormal: exact
                if sign != 0 {
                    -f
                } else {
                    f
                }
            }
            _ => f32::from_bits(sign | ((exp + 112) << 23) | (mant << 13)),
        }
    }
}

impl BF16 {
    /// The nearest bfloat16 (ties to even); NaN stays NaN.
    pub fn from_f32(f: f32) -> BF16 {
        let b = f.to_bits();
        if b & 0x7fff_ffff > 0x7f80_0000 {
            return BF16(((b >> 16) as u16) | 0x40);
        }
        BF16((b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16)
    }

    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
}

/// A read-only view (an input of a call).
pub struct View<'a> {
    raw: sys::flashattn_tensor_t,
    _borrow: PhantomData<&'a ()>,
}

/// A view the library writes (an output of a call).
pub struct ViewMut<'a> {
    raw: sys::flashattn_tensor_t,
    _borrow: PhantomData<&'a mut ()>,
}

/// The raw view of `shape`/`strides` (contiguous when `strides` is None) at `data`, after
/// checking that it ends within `available` bytes.
fn layout(name: &str, data: *mut c_void, dtype: DType, shape: &[usize], strides: Option<&[usize]>, available: usize) -> Result<sys::flashattn_tensor_t> {
    let rank = shape.len();
    let max_rank = sys::FLASHATTN_MAX_RANK as usize;
    if rank > max_rank {
        return Err(Error::new(Status::INVALID_SHAPE, format!("{name}: rank is {rank}, at most {max_rank} is possible")));
    }
    if let Some(s) = strides {
        if s.len() != rank {
            return Err(Error::new(Status::INVALID_SHAPE, format!("{name}: {} strides for {rank} dimensions", s.len())));
        }
    }
    let too_big = || Error::new(Status::INVALID_SHAPE, format!("{name}: shape {shape:?} is too large"));
    let mut raw = sys::flashattn_tensor_t { data, dtype: dtype.raw(), rank: rank as i32, shape: [0; 4], strides: [0; 4] };
    let mut contiguous = 1usize;
    let mut last = 0usize; // largest element offset
    for i in (0..rank).rev() {
        let stride = strides.map_or(contiguous, |s| s[i]);
        raw.shape[i] = i64::try_from(shape[i]).map_err(|_| too_big())?;
        raw.strides[i] = i64::try_from(stride).map_err(|_| too_big())?;
        contiguous = contiguous.checked_mul(shape[i]).ok_or_else(too_big)?;
        if shape[i] > 0 {
            last = (shape[i] - 1).checked_mul(stride).and_then(|x| x.checked_add(last)).ok_or_else(too_big)?;
        }
    }
    // An empty view covers no memory; the library rejects its sizes with its own message.
    if shape.iter().all(|&s| s > 0) {
        let bytes = last.checked_add(1).and_then(|n| n.checked_mul(dtype.size())).ok_or_else(too_big)?;
        if bytes > available {
            return Err(Error::new(Status::INVALID_MEMORY, format!("{name}: the view spans {bytes} bytes, only {available} are there")));
        }
    }
    Ok(raw)
}

fn buffer_layout(name: &str, buf: &Buffer, offset: usize, dtype: DType, shape: &[usize], strides: Option<&[usize]>) -> Result<sys::flashattn_tensor_t> {
    if offset >= buf.size() {
        return Err(Error::new(Status::INVALID_MEMORY, format!("{name}: offset {offset} is outside the {}-byte buffer", buf.size())));
    }
    // SAFETY: offset < size keeps the address inside the buffer's allocation.
    let data = unsafe { buf.as_ptr().cast::<u8>().add(offset) }.cast();
    layout(name, data, dtype, shape, strides, buf.size() - offset)
}

impl<'a> View<'a> {
    /// A contiguous view of host memory (usable by a CPU context).
    pub fn new<T: Element>(data: &'a [T], shape: &[usize]) -> Result<View<'a>> {
        Self::strided(data, shape, None)
    }

    /// A view of host memory with the given strides (in elements; None: contiguous).
    pub fn strided<T: Element>(data: &'a [T], shape: &[usize], strides: Option<&[usize]>) -> Result<View<'a>> {
        let raw = layout("view", data.as_ptr() as *mut c_void, T::DTYPE, shape, strides, std::mem::size_of_val(data))?;
        Ok(View { raw, _borrow: PhantomData })
    }

    /// A view of a buffer from byte `offset` (strides in elements; None: contiguous).
    pub fn of_buffer(buf: &'a Buffer, offset: usize, dtype: DType, shape: &[usize], strides: Option<&[usize]>) -> Result<View<'a>> {
        Ok(View { raw: buffer_layout("view", buf, offset, dtype, shape, strides)?, _borrow: PhantomData })
    }

    /// A view of memory this crate cannot check (e.g. a device array of another library).
    ///
    /// # Safety
    /// `raw` must describe memory that stays valid and unwritten by others for `'a` and for the
    /// work enqueued with it.
    pub unsafe fn from_raw(raw: sys::flashattn_tensor_t) -> View<'a> {
        View { raw, _borrow: PhantomData }
    }

    pub fn as_raw(&self) -> *const sys::flashattn_tensor_t {
        &self.raw
    }
}

impl<'a> ViewMut<'a> {
    /// A contiguous view of host memory (usable by a CPU context).
    pub fn new<T: Element>(data: &'a mut [T], shape: &[usize]) -> Result<ViewMut<'a>> {
        Self::strided(data, shape, None)
    }

    /// A view of host memory with the given strides (in elements; None: contiguous).
    pub fn strided<T: Element>(data: &'a mut [T], shape: &[usize], strides: Option<&[usize]>) -> Result<ViewMut<'a>> {
        let bytes = std::mem::size_of_val(data);
        let raw = layout("view", data.as_mut_ptr().cast(), T::DTYPE, shape, strides, bytes)?;
        Ok(ViewMut { raw, _borrow: PhantomData })
    }

    /// A view of a buffer from byte `offset` (strides in elements; None: contiguous).
    pub fn of_buffer(buf: &'a mut Buffer, offset: usize, dtype: DType, shape: &[usize], strides: Option<&[usize]>) -> Result<ViewMut<'a>> {
        Ok(ViewMut { raw: buffer_layout("view", buf, offset, dtype, shape, strides)?, _borrow: PhantomData })
    }

    /// # Safety
    /// As [`View::from_raw`], and nothing else may read or write the memory meanwhile.
    pub unsafe fn from_raw(raw: sys::flashattn_tensor_t) -> ViewMut<'a> {
        ViewMut { raw, _borrow: PhantomData }
    }

    /// The same memory as a read-only view, for as long as this one is borrowed (e.g. to ask
    /// [`Context::supported_kvcache`](crate::Context::supported_kvcache) about a cache that a
    /// call will write): while it lives, this view cannot be handed to a call as an output.
    pub fn as_view(&self) -> View<'_> {
        View { raw: self.raw, _borrow: PhantomData }
    }

    pub fn as_raw(&mut self) -> *const sys::flashattn_tensor_t {
        &self.raw
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trips_every_value() {
        for h in 0..=u16::MAX {
            let f = F16(h).to_f32();
            let back = F16::from_f32(f).0;
            if f.is_nan() {
                assert!(back & 0x7c00 == 0x7c00 && back & 0x3ff != 0, "NaN {h:#06x} -> {back:#06x}");
            } else {
                assert_eq!(back, h, "{h:#06x} -> {f} -> {back:#06x}");
            }
        }
    }

    #[test]
    fn bf16_round_trips_every_value() {
        for h in 0..=u16::MAX {
            let f = BF16(h).to_f32();
            if !f.is_nan() {
                assert_eq!(BF16::from_f32(f).0, h);
            }
        }
    }

    #[test]
    fn rounding_is_to_nearest_even() {
        let cases: [(f32, u16, u16); 10] = [
            (1.0, 0x3c00, 0x3f80),
            (65504.0, 0x7bff, 0x4780),
            (65520.0, 0x7c00, 0x4780),
            (1.0 + 1.0 / 2048.0, 0x3c00, 0x3f80),
            (1.0 + 3.0 / 2048.0, 0x3c02, 0x3f80),
            (5.960464477539063e-08, 0x0001, 0x3380),
            (2.9e-08, 0x0000, 0x32f9),
            (f32::NEG_INFINITY, 0xfc00, 0xff80),
            (1.0 + 1.0 / 256.0, 0x3c04, 0x3f80),
            (1.0 + 3.0 / 256.0, 0x3c0c, 0x3f82),
        ];
        for (f, h, b) in cases {
            assert_eq!(F16::from_f32(f).0, h, "f16 of {f}");
            assert_eq!(BF16::from_f32(f).0, b, "bf16 of {f}");
        }
    }

    #[test]
    fn views_must_fit_what_they_borrow() {
        let data = [0f32; 64];
        assert!(View::new(&data, &[1, 4, 2, 8]).is_ok());
        let e = View::new(&data, &[1, 5, 2, 8]).err().unwrap();
        assert_eq!(e.status(), Status::INVALID_MEMORY);
        assert_eq!(e.message(), "view: the view spans 320 bytes, only 256 are there");
        let e = View::strided(&data, &[1, 4, 2, 8], Some(&[64, 20, 8, 1])).err().unwrap();
        assert_eq!(e.message(), "view: the view spans 304 bytes, only 256 are there");
        assert!(View::strided(&data, &[2, 4, 2, 8], Some(&[0, 16, 8, 1])).is_ok()); // broadcast batch
        let e = View::new(&data, &[1, 1, 1, 1, 1]).err().unwrap();
        assert_eq!((e.status(), e.message()), (Status::INVALID_SHAPE, "view: rank is 5, at most 4 is possible"));
        assert!(View::new(&data, &[usize::MAX, 2, 1, 1]).is_err());
    }
}
