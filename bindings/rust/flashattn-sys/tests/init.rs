//! The crate's counterparts of the header's init macros pass the size of the struct as bindgen
//! declares it, and the _sized functions refuse a size below the first options struct's.
use std::mem::{size_of, MaybeUninit};

use flashattn_sys::*;

#[test]
fn inits_pass_the_struct_size() {
    // SAFETY: a plain C struct, for which all zeros is a value.
    let mut o: flashattn_options_t = unsafe { MaybeUninit::zeroed().assume_init() };
    o.window = 7;
    assert_eq!(unsafe { flashattn_options_init(&mut o) }, flashattn_status_FLASHATTN_SUCCESS);
    assert_eq!(o.size, size_of::<flashattn_options_t>());
    assert_eq!(o.window, 0);

    let mut a = MaybeUninit::<flashattn_args_t>::zeroed();
    // SAFETY: the struct has room for size_of::<flashattn_args_t>() bytes.
    assert_eq!(unsafe { flashattn_args_init(a.as_mut_ptr()) }, flashattn_status_FLASHATTN_SUCCESS);
    assert_eq!(unsafe { a.assume_init() }.size, size_of::<flashattn_args_t>());

    let mut m = MaybeUninit::<flashattn_merge_args_t>::zeroed();
    // SAFETY: the struct has room for size_of::<flashattn_merge_args_t>() bytes.
    assert_eq!(unsafe { flashattn_merge_args_init(m.as_mut_ptr()) }, flashattn_status_FLASHATTN_SUCCESS);
    let m = unsafe { m.assume_init() };
    assert_eq!((m.size, m.num_parts), (size_of::<flashattn_merge_args_t>(), 0));
    assert!(m.parts_out.is_null() && m.lse.is_null());

    let mut cp = MaybeUninit::<flashattn_cp_args_t>::zeroed();
    // SAFETY: the struct has room for size_of::<flashattn_cp_args_t>() bytes.
    assert_eq!(unsafe { flashattn_cp_args_init(cp.as_mut_ptr()) }, flashattn_status_FLASHATTN_SUCCESS);
    let cp = unsafe { cp.assume_init() };
    assert_eq!((cp.size, cp.ranks, cp.rank, cp.layout), (size_of::<flashattn_cp_args_t>(), 1, 0, 0));
    assert!(cp.nccl_comm.is_null() && cp.exchange.is_none());

    o.softcap = 2.0;
    let status = unsafe { flashattn_options_init_sized(&mut o, 8) };
    assert_eq!(status, flashattn_status_FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_eq!(o.softcap, 2.0, "a refused size writes nothing");
}
