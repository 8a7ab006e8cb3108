//! Every case of the bad-input catalogue (tests/catalogue/bad_inputs.tsv, format in
//! tests/catalogue/FORMAT.md) through the raw bindings: the call returns the expected status with
//! a last-error message holding the expected fragment, no buffer changes (outputs are poisoned
//! beforehand) and workspace_size leaves its output alone. FLASHATTN_CATALOGUE names another file.
use std::collections::HashMap;
use std::ffi::CStr;
use std::path::PathBuf;
use std::ptr;

use flashattn_sys::*;

const B: usize = 2;
const NQ: usize = 64;
const NK: usize = 48;
const HQ: usize = 4;
const HKV: usize = 2;
const D: usize = 32;
const POISON: u8 = 0xA5;
const OPTIONS_BLOCK: usize = 4096;
const SIZE_SENTINEL: usize = 0xDEAD_BEEF_CAFE_F00D;
const NAMES: [&str; 22] = [
    "q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv", "alibi_slopes", "sinks", "dsinks", "cu_seqlens_q", "cu_seqlens_k",
    "cache_seqlens", "block_table", "k_new", "v_new", "rotary_cos", "rotary_sin", "parts_out", "parts_lse",
];
/// The variant tensors (the next five names) and then the KV cache's (six) exist for the _ex ops
/// only, created in this order, the merge's parts (the last two) for the merge only (FORMAT.md).
const PLAIN_TENSORS: usize = 9;
const EX_TENSORS: usize = 20;
/// The KV cache form (FORMAT.md): four query tokens, 40 and 44 tokens held, four rows appended,
/// six pages of 16 rows (three per sequence), rotary tables of 48 positions over all 32 features.
const CACHE_QUERIES: usize = 4;
const CACHE_NEW: usize = 4;
const PAGES: usize = 6;
const PAGE_ROWS: usize = 16;
const PAGES_PER_SEQ: usize = 3;
const POSITIONS: usize = 48;
const CACHE_SEQLENS: [i32; B] = [40, 44];
const BLOCK_TABLE: [i32; B * PAGES_PER_SEQ] = [0, 1, 2, 3, 4, 5];
const OPS: [&str; 12] = [
    "forward", "backward", "supported", "workspace_size", "forward_ex", "backward_ex", "supported_ex", "workspace_size_ex", "merge",
    "cp_forward", "cp_backward", "cp_workspace_size",
];

/// The _ex ops and the cp ops take the args struct, and its tensors' buffers.
fn takes_args(op: &str) -> bool {
    op.ends_with("_ex") || op.starts_with("cp_")
}
/// The merge's parts: three of out's and lse's shapes, one after another.
const PARTS: usize = 3;

fn merge_bytes(name: &str) -> Option<usize> {
    match name {
        "parts_out" => Some(PARTS * B * NQ * HQ * D * 4),
        "parts_lse" => Some(PARTS * B * HQ * NQ * 4),
        _ => None,
    }
}

/// The int32 tensors' contents: the offsets of the variable-length form, the cache's lengths
/// and block table.
fn int_values(name: &str) -> Option<Vec<i32>> {
    match name {
        "cu_seqlens_q" => Some(vec![0, NQ as i32, 2 * NQ as i32]),
        "cu_seqlens_k" => Some(vec![0, NK as i32, 2 * NK as i32]),
        "cache_seqlens" => Some(CACHE_SEQLENS.to_vec()),
        "block_table" => Some(BLOCK_TABLE.to_vec()),
        _ => None,
    }
}

/// A KV cache tensor's view (dtype, shape; contiguous strides): None for the other names.
fn cache_view(name: &str) -> Option<(flashattn_dtype_t, Vec<usize>)> {
    let (int32, float32) = (flashattn_dtype_FLASHATTN_DTYPE_INT32, flashattn_dtype_FLASHATTN_DTYPE_FLOAT32);
    match name {
        "cache_seqlens" => Some((int32, vec![B])),
        "block_table" => Some((int32, vec![B, PAGES_PER_SEQ])),
        "k_new" | "v_new" => Some((float32, vec![B, CACHE_NEW, HKV, D])),
        "rotary_cos" | "rotary_sin" => Some((float32, vec![POSITIONS, D / 2])),
        _ => None,
    }
}

/// Sets a view's shape and its contiguous (row-major) strides; the dimensions past it are 0.
fn set_contiguous(t: &mut flashattn_tensor_t, shape: &[usize]) {
    t.rank = shape.len() as i32;
    (t.shape, t.strides) = ([0; 4], [0; 4]);
    let mut stride = 1;
    for (i, &n) in shape.iter().enumerate().rev() {
        (t.shape[i], t.strides[i]) = (n as i64, stride as i64);
        stride *= n;
    }
}

/// The buffer size of a variant tensor (alibi_slopes: room for [batch, heads_q]).
fn variant_bytes(name: &str) -> Option<usize> {
    match name {
        "alibi_slopes" => Some(B * HQ * 4),
        "sinks" | "dsinks" => Some(HQ * 4),
        "cu_seqlens_q" | "cu_seqlens_k" => Some((B + 1) * 4),
        _ => None,
    }
}

fn shape(name: &str) -> Vec<usize> {
    match name {
        "k" | "v" | "dk" | "dv" => vec![B, NK, HKV, D],
        "lse" | "parts_lse" => vec![B, HQ, NQ],
        _ => vec![B, NQ, HQ, D],
    }
}

fn outputs(op: &str) -> &'static [&'static str] {
    match op {
        "forward" | "forward_ex" | "merge" | "cp_forward" => &["out", "lse"],
        "backward" => &["dq", "dk", "dv"],
        "backward_ex" | "cp_backward" => &["dq", "dk", "dv", "dsinks"],
        _ => &[],
    }
}

struct Case {
    line: usize,
    id: String,
    op: String,
    mutations: String,
    status: String,
    fragment: String,
}

fn load() -> Vec<Case> {
    let path = std::env::var_os("FLASHATTN_CATALOGUE")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../tests/catalogue/bad_inputs.tsv"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("the catalogue {}: {e}", path.display()));
    let mut cases = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split('\t').collect();
        assert_eq!(f.len(), 5, "{}:{}: 5 tab-separated fields expected", path.display(), n + 1);
        assert!(OPS.contains(&f[1]), "{}:{}: unknown op {}", path.display(), n + 1, f[1]);
        cases.push(Case { line: n + 1, id: f[0].into(), op: f[1].into(), mutations: f[2].into(), status: f[3].into(), fragment: f[4].into() });
    }
    assert!(!cases.is_empty(), "{}: no cases", path.display());
    cases
}

fn check(status: flashattn_status_t, what: &str) {
    if status != flashattn_status_FLASHATTN_SUCCESS {
        // SAFETY: never NULL.
        panic!("{what}: {}", unsafe { CStr::from_ptr(flashattn_last_error()) }.to_string_lossy());
    }
}

/// The baseline call of the format, built through the raw bindings.
struct Call {
    op: String,
    ctx: flashattn_context_t,
    call_ctx: flashattn_context_t,
    buffers: HashMap<&'static str, flashattn_buffer_t>,
    contents: HashMap<&'static str, Vec<u8>>,
    views: HashMap<&'static str, Box<flashattn_tensor_t>>,
    passed: HashMap<&'static str, bool>,
    ends: HashMap<&'static str, usize>, // each tensor's buffer: its base address plus its size
    block: Vec<u64>, // zero-filled storage the options sit at the start of
    options_sizeof: usize,
    pass_options: bool,
    workspace: Vec<u8>,
    workspace_ptr: *mut std::os::raw::c_void,
    workspace_size: usize,
    backward: i32,
    names: Vec<&'static str>,
    args: flashattn_args_t,
    merge: flashattn_merge_args_t,
    pass_args: bool,
    cp: flashattn_cp_args_t,
    pass_cp: bool,
    comm_stand_in: Box<u64>, // what cp.nccl_comm=set points at: no communicator
}

impl Call {
    fn new(op: &str) -> Call {
        let mut ctx = ptr::null_mut();
        // SAFETY (all calls below): valid out pointers, live handles, buffers of the sizes given.
        check(unsafe { flashattn_context_create(&mut ctx, flashattn_backend_FLASHATTN_BACKEND_CPU, 0) }, "context");
        let mut c = Call {
            op: op.into(), ctx, call_ctx: ctx, buffers: HashMap::new(), contents: HashMap::new(), views: HashMap::new(),
            passed: HashMap::new(), ends: HashMap::new(), block: vec![0; OPTIONS_BLOCK / 8], options_sizeof: 0, pass_options: true,
            workspace: Vec::new(), workspace_ptr: ptr::null_mut(), workspace_size: 0, backward: 0,
            names: match op {
                _ if takes_args(op) => NAMES[..EX_TENSORS].to_vec(),
                "merge" => NAMES[..PLAIN_TENSORS].iter().chain(&NAMES[EX_TENSORS..]).copied().collect(),
                _ => NAMES[..PLAIN_TENSORS].to_vec(),
            },
            // SAFETY: plain C structs; flashattn_args_init and flashattn_merge_args_init fill them below.
            args: unsafe { std::mem::zeroed() }, merge: unsafe { std::mem::zeroed() }, pass_args: true,
            cp: unsafe { std::mem::zeroed() }, pass_cp: true, comm_stand_in: Box::new(0),
        };
        check(unsafe { flashattn_cp_args_init(&mut c.cp) }, "cp_args_init");
        check(unsafe { flashattn_args_init(&mut c.args) }, "args_init");
        check(unsafe { flashattn_merge_args_init(&mut c.merge) }, "merge_args_init");
        (c.merge.num_parts, c.merge.parts_out_stride, c.merge.parts_lse_stride) = (PARTS as i64, (B * NQ * HQ * D) as i64, (B * HQ * NQ) as i64);
        for name in c.names.clone() {
            let s = shape(name);
            let cache = cache_view(name);
            let s = cache.as_ref().map_or(s, |(_, shape)| shape.clone());
            let bytes = merge_bytes(name).or(variant_bytes(name)).unwrap_or_else(|| 4 * s.iter().product::<usize>());
            let mut buf = ptr::null_mut();
            check(unsafe { flashattn_buffer_create(&mut buf, ctx, bytes) }, "buffer");
            c.buffers.insert(name, buf);
            let data: Vec<u8> = if outputs(op).contains(&name) {
                vec![POISON; bytes]
            } else if let Some(o) = int_values(name) {
                o.iter().flat_map(|x| x.to_ne_bytes()).collect()
            } else {
                // The rows to append differ from what k and v hold (FORMAT.md), so a refused
                // call's append would show.
                let value: f32 = if name == "k_new" || name == "v_new" { 0.25 } else { 0.5 };
                std::iter::repeat(value.to_ne_bytes()).take(bytes / 4).flatten().collect()
            };
            check(unsafe { flashattn_buffer_write(buf, 0, data.as_ptr().cast(), bytes) }, "write");
            c.contents.insert(name, data);
            let mut address = ptr::null_mut();
            check(unsafe { flashattn_buffer_data(&mut address, buf) }, "data");
            c.ends.insert(name, address as usize + bytes);
            let mut view = Box::new(unsafe { std::mem::zeroed::<flashattn_tensor_t>() });
            if let Some((dtype, shape)) = &cache {
                view.data = address;
                view.dtype = *dtype;
                set_contiguous(&mut view, shape);
            } else if variant_bytes(name).is_some() {
                view.data = address;
                view.rank = 1;
                view.strides[0] = 1;
                (view.dtype, view.shape[0]) = match int_values(name) {
                    Some(_) => (flashattn_dtype_FLASHATTN_DTYPE_INT32, B as i64 + 1),
                    None => (flashattn_dtype_FLASHATTN_DTYPE_FLOAT32, HQ as i64),
                };
            } else if name == "lse" || name == "parts_lse" {
                check(unsafe { flashattn_tensor_lse(&mut *view, address, s[0] as i64, s[1] as i64, s[2] as i64) }, "tensor_lse");
            } else {
                let [a, b2, c2, d2] = [s[0], s[1], s[2], s[3]].map(|n| n as i64);
                check(unsafe { flashattn_tensor_4d(&mut *view, address, flashattn_dtype_FLASHATTN_DTYPE_FLOAT32, a, b2, c2, d2) }, "tensor_4d");
            }
            c.views.insert(name, view);
            // The variant and KV cache tensors are given by a mutation.
            c.passed.insert(name, variant_bytes(name).is_none() && cache.is_none());
        }
        check(unsafe { flashattn_options_init(c.options()) }, "options_init");
        c.options_sizeof = unsafe { (*c.options()).size };
        if op.starts_with("cp_") {
            c.make_self_attention().expect("the cp ops' baseline");
        }
        c
    }

    /// The cp ops' baseline (FORMAT.md): q, out, dout and dq hold as many tokens as k, over the
    /// start of their buffers.
    fn make_self_attention(&mut self) -> Result<(), String> {
        for name in ["q", "out", "dout", "dq"] {
            set_contiguous(self.view(name)?, &[B, NK, HQ, D]);
        }
        set_contiguous(self.view("lse")?, &[B, HQ, NK]);
        Ok(())
    }

    fn options(&mut self) -> *mut flashattn_options_t {
        self.block.as_mut_ptr().cast()
    }

    /// The variable-length form of the baseline (FORMAT.md).
    fn make_varlen(&mut self) -> Result<(), String> {
        for name in ["q", "out", "dout", "dq", "k", "v", "dk", "dv"] {
            let (rows, heads) = if ["k", "v", "dk", "dv"].contains(&name) { (B * NK, HKV) } else { (B * NQ, HQ) };
            let t = self.view(name)?;
            t.rank = 3;
            t.shape = [rows as i64, heads as i64, D as i64, 0];
            t.strides = [(heads * D) as i64, D as i64, 1, 0];
        }
        let lse = self.view("lse")?;
        lse.rank = 2;
        lse.shape = [HQ as i64, (B * NQ) as i64, 0, 0];
        lse.strides = [(B * NQ) as i64, 1, 0, 0];
        for name in ["cu_seqlens_q", "cu_seqlens_k"] {
            if self.views.contains_key(name) {
                self.passed.insert(name, true);
            }
        }
        self.args.max_seqlen_q = NQ as i64;
        self.args.max_seqlen_k = NK as i64;
        Ok(())
    }

    /// The KV cache form of the baseline (FORMAT.md): four query tokens against the contiguous
    /// cache that k and v are, cache_seqlens given.
    fn make_cache(&mut self) -> Result<(), String> {
        if !self.views.contains_key("cache_seqlens") {
            return Err("cache=1 needs an _ex op".into());
        }
        for name in ["q", "out"] {
            set_contiguous(self.view(name)?, &[B, CACHE_QUERIES, HQ, D]);
        }
        set_contiguous(self.view("lse")?, &[B, HQ, CACHE_QUERIES]);
        self.passed.insert("cache_seqlens", true);
        Ok(())
    }

    /// The paged form of the cache: k and v as six pages of 16 rows over the same buffers,
    /// block_table given.
    fn make_paged(&mut self) -> Result<(), String> {
        if !self.passed.get("cache_seqlens").copied().unwrap_or(false) {
            return Err("paged=1 comes after cache=1".into());
        }
        for name in ["k", "v"] {
            set_contiguous(self.view(name)?, &[PAGES, PAGE_ROWS, HKV, D]);
        }
        self.passed.insert("block_table", true);
        Ok(())
    }

    fn view(&mut self, name: &str) -> Result<&mut flashattn_tensor_t, String> {
        self.views.get_mut(name).map(|b| &mut **b).ok_or_else(|| format!("unknown tensor {name:?}"))
    }

    fn mutate(&mut self, m: &str) -> Result<(), String> {
        let (key, value) = m.split_once('=').ok_or_else(|| format!("mutation {m:?} has no '='"))?;
        let int = |v: &str| v.parse::<i64>().map_err(|e| format!("{m}: {e}"));
        let int32 = |v: &str| int(v).and_then(|x| i32::try_from(x).map_err(|_| format!("{m}: does not fit the 32-bit field")));
        match (key, value) {
            ("ctx", "null") => self.call_ctx = ptr::null_mut(),
            ("ctx", "destroyed") => {
                let mut stale = ptr::null_mut();
                // SAFETY: a valid out pointer; the handle is destroyed and never used but as an argument.
                check(unsafe { flashattn_context_create(&mut stale, flashattn_backend_FLASHATTN_BACKEND_CPU, 0) }, "context");
                check(unsafe { flashattn_context_destroy(stale) }, "context_destroy");
                self.call_ctx = stale;
            }
            ("options", "null") => self.pass_options = false,
            ("workspace", n) => {
                let n = int(n)? as usize;
                self.workspace = vec![0; n.max(1)];
                self.workspace_ptr = self.workspace.as_mut_ptr().cast();
                self.workspace_size = n;
            }
            ("workspace_size", n) => self.workspace_size = int(n)? as usize,
            ("backward", n) => self.backward = int32(n)?,
            (name, "null" | "given") if self.views.contains_key(name) => {
                self.passed.insert(NAMES.iter().find(|&&n| n == name).unwrap(), value == "given");
            }
            ("args", "null") => self.pass_args = false,
            ("cp", "null") => self.pass_cp = false,
            ("cp.size", n) => self.cp.size = int(n)? as usize,
            ("cp.ranks", n) => self.cp.ranks = int(n)?,
            ("cp.rank", n) => self.cp.rank = int(n)?,
            ("cp.layout", n) => self.cp.layout = int(n)?,
            ("cp.nccl_comm", "set") => self.cp.nccl_comm = (&mut *self.comm_stand_in as *mut u64).cast(),
            ("args.size", n) if self.op == "merge" => self.merge.size = int(n)? as usize,
            ("args.size", n) => self.args.size = int(n)? as usize,
            ("args.num_parts" | "args.parts_out_stride" | "args.parts_lse_stride", _) if self.op != "merge" => {
                return Err(format!("{key} belongs to the merge op"));
            }
            ("args.num_parts", n) => self.merge.num_parts = int(n)?,
            ("args.parts_out_stride", n) => self.merge.parts_out_stride = int(n)?,
            ("args.parts_lse_stride", n) => self.merge.parts_lse_stride = int(n)?,
            ("args.max_seqlen_q", n) => self.args.max_seqlen_q = int(n)?,
            ("args.max_seqlen_k", n) => self.args.max_seqlen_k = int(n)?,
            ("varlen", "1") => self.make_varlen()?,
            ("cache", "1") => self.make_cache()?,
            ("paged", "1") => self.make_paged()?,
            ("args.rotary_interleaved", n) => self.args.rotary_interleaved = int(n)?,
            _ if key.starts_with("options.") => {
                let o = self.options();
                // SAFETY: o points at the start of the block, which holds a whole options struct.
                let o = unsafe { &mut *o };
                match &key["options.".len()..] {
                    "size" => o.size = int(value)? as usize, // two's complement: -1 is SIZE_MAX
                    "softmax_scale" => {
                        o.softmax_scale = match value {
                            "nan" => f32::NAN,
                            "inf" => f32::INFINITY,
                            "-inf" => f32::NEG_INFINITY,
                            v => v.parse().map_err(|e| format!("{m}: {e}"))?,
                        }
                    }
                    "causal" => o.causal = int32(value)?,
                    "algorithm" => o.algorithm = int32(value)? as u32,
                    "deterministic" => o.deterministic = int32(value)?,
                    "window" => o.window = int32(value)?,
                    "window_left" => o.window_left = int32(value)?,
                    "window_right" => o.window_right = int32(value)?,
                    "num_splits" => {
                        o.num_splits = value.parse::<i64>().map_err(|e| format!("options.num_splits: {e}"))?
                    }
                    "softcap" => {
                        o.softcap = match value {
                            "nan" => f32::NAN,
                            "inf" => f32::INFINITY,
                            "-inf" => f32::NEG_INFINITY,
                            v => v.parse().map_err(|e| format!("{m}: {e}"))?,
                        }
                    }
                    "tail" => {
                        let byte: u8 = value.parse().map_err(|e| format!("{m}: {e}"))?;
                        let end = o.size.min(OPTIONS_BLOCK);
                        let start = self.options_sizeof;
                        // SAFETY: the block is OPTIONS_BLOCK bytes.
                        let raw = unsafe { std::slice::from_raw_parts_mut(self.block.as_mut_ptr().cast::<u8>(), OPTIONS_BLOCK) };
                        for b in raw.iter_mut().take(end).skip(start) {
                            *b = byte;
                        }
                    }
                    f => return Err(format!("unknown options field {f:?}")),
                }
            }
            _ => {
                let (name, field) = key.split_once('.').ok_or_else(|| format!("unknown mutation {m:?}"))?;
                if field == "data" {
                    let alias = match value.strip_prefix("alias:") {
                        Some(u) => Some(self.view(u)?.data),
                        None => None,
                    };
                    let past_end = match value.strip_prefix("end+") {
                        Some(n) => match n.parse::<usize>() {
                            Ok(past) if past <= 255 => {
                                let end = *self.ends.get(name).ok_or_else(|| format!("unknown tensor {name:?}"))?;
                                Some((end + past) as *mut std::os::raw::c_void)
                            }
                            _ => return Err(format!("end+ takes 0..255 in {m:?}")),
                        },
                        None => None,
                    };
                    let t = self.view(name)?;
                    t.data = match (value, alias, past_end) {
                        ("null", _, _) => ptr::null_mut(),
                        ("misalign", _, _) => t.data.cast::<u8>().wrapping_add(1).cast(),
                        (_, Some(a), _) => a,
                        (_, _, Some(p)) => p,
                        _ => return Err(format!("unknown data mutation {value:?}")),
                    };
                    return Ok(());
                }
                if let Some(index) = field.strip_prefix("values[").and_then(|f| f.strip_suffix(']')) {
                    let i: usize = index.parse().map_err(|e| format!("{m}: {e}"))?;
                    let bytes = int32(value)?.to_ne_bytes();
                    let contents = self.contents.get_mut(name).ok_or_else(|| format!("unknown tensor {name:?}"))?;
                    contents.get_mut(4 * i..4 * i + 4).ok_or_else(|| format!("{m}: index out of range"))?.copy_from_slice(&bytes);
                    // SAFETY: the range lies inside the buffer (checked against its contents above).
                    check(unsafe { flashattn_buffer_write(self.buffers[name], 4 * i, bytes.as_ptr().cast(), 4) }, "write");
                    return Ok(());
                }
                let t = self.view(name)?;
                match field {
                    "dtype" => t.dtype = int32(value)? as u32,
                    "rank" => t.rank = int32(value)?,
                    _ => {
                        let (attr, index) = field.strip_suffix(']').and_then(|f| f.split_once('[')).ok_or_else(|| format!("unknown mutation {m:?}"))?;
                        let i: usize = index.parse().map_err(|e| format!("{m}: {e}"))?;
                        let slot = match attr {
                            "shape" => t.shape.get_mut(i),
                            "strides" => t.strides.get_mut(i),
                            _ => None,
                        };
                        *slot.ok_or_else(|| format!("unknown mutation {m:?}"))? = int(value)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn arg(&self, name: &str) -> *const flashattn_tensor_t {
        if self.passed.get(name).copied().unwrap_or(false) {
            &*self.views[name]
        } else {
            ptr::null()
        }
    }

    /// The status, and whether workspace_size left its output alone.
    fn run(&mut self) -> (flashattn_status_t, bool) {
        let opts: *const flashattn_options_t = if self.pass_options { self.options() } else { ptr::null() };
        let (q, k, v) = (self.arg("q"), self.arg("k"), self.arg("v"));
        let fields = [q, k, v, self.arg("out"), self.arg("lse"), self.arg("dout"), self.arg("dq"), self.arg("dk"), self.arg("dv"),
            self.arg("alibi_slopes"), self.arg("sinks"), self.arg("dsinks"), self.arg("cu_seqlens_q"), self.arg("cu_seqlens_k")];
        let cache = ["cache_seqlens", "block_table", "k_new", "v_new", "rotary_cos", "rotary_sin"].map(|n| self.arg(n));
        let a = &mut self.args;
        a.options = opts;
        [a.q, a.k, a.v, a.out, a.lse, a.dout, a.dq, a.dk, a.dv, a.alibi_slopes, a.sinks, a.dsinks, a.cu_seqlens_q, a.cu_seqlens_k] = fields;
        [a.cache_seqlens, a.block_table, a.k_new, a.v_new, a.rotary_cos, a.rotary_sin] = cache;
        let args: *const flashattn_args_t = if self.pass_args { &self.args } else { ptr::null() };
        let m = [self.arg("parts_out"), self.arg("parts_lse"), self.arg("out"), self.arg("lse")];
        [self.merge.parts_out, self.merge.parts_lse, self.merge.out, self.merge.lse] = m;
        let merge: *const flashattn_merge_args_t = if self.pass_args { &self.merge } else { ptr::null() };
        let cp: *const flashattn_cp_args_t = if self.pass_cp { &self.cp } else { ptr::null() };
        // SAFETY: every pointer is NULL or points at a live view, options block or buffer; the
        // catalogue's cases are exactly what the library must reject without touching memory.
        unsafe {
            match self.op.as_str() {
                "merge" => (flashattn_merge(self.call_ctx, merge), true),
                "cp_forward" => (flashattn_cp_forward(self.call_ctx, cp, args, self.workspace_ptr, self.workspace_size), true),
                "cp_backward" => (flashattn_cp_backward(self.call_ctx, cp, args, self.workspace_ptr, self.workspace_size), true),
                "cp_workspace_size" => {
                    let mut size = SIZE_SENTINEL;
                    let status = flashattn_cp_workspace_size(&mut size, self.call_ctx, cp, args, self.backward);
                    (status, size == SIZE_SENTINEL)
                }
                "forward_ex" => (flashattn_forward_ex(self.call_ctx, args, self.workspace_ptr, self.workspace_size), true),
                "backward_ex" => (flashattn_backward_ex(self.call_ctx, args, self.workspace_ptr, self.workspace_size), true),
                "supported_ex" => (flashattn_supported_ex(self.call_ctx, args, self.backward), true),
                "workspace_size_ex" => {
                    let mut size = SIZE_SENTINEL;
                    let status = flashattn_workspace_size_ex(&mut size, self.call_ctx, args, self.backward);
                    (status, size == SIZE_SENTINEL)
                }
                "forward" => (flashattn_forward(self.call_ctx, q, k, v, self.arg("out"), self.arg("lse"), opts, self.workspace_ptr, self.workspace_size), true),
                "backward" => (
                    flashattn_backward(
                        self.call_ctx, q, k, v, self.arg("out"), self.arg("dout"), self.arg("lse"),
                        self.arg("dq"), self.arg("dk"), self.arg("dv"), opts, self.workspace_ptr, self.workspace_size,
                    ),
                    true,
                ),
                "supported" => (flashattn_supported(self.call_ctx, q, k, v, opts, self.backward), true),
                _ => {
                    let mut size = SIZE_SENTINEL;
                    let status = flashattn_workspace_size(&mut size, self.call_ctx, q, k, v, opts, self.backward);
                    (status, size == SIZE_SENTINEL)
                }
            }
        }
    }

    fn changed_buffers(&self) -> Vec<&'static str> {
        self.names
            .iter()
            .filter(|&&name| {
                let mut now = vec![0u8; self.contents[name].len()];
                check(unsafe { flashattn_buffer_read(self.buffers[name], 0, now.as_mut_ptr().cast(), now.len()) }, "read");
                now != self.contents[name]
            })
            .copied()
            .collect()
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        for &buf in self.buffers.values() {
            unsafe { flashattn_buffer_destroy(buf) };
        }
        unsafe { flashattn_context_destroy(self.ctx) };
    }
}

/// The unmutated baselines succeed (else a case could pass for a reason other than its
/// mutation), the _ex ops also with every variant tensor given, in the variable-length form and
/// in the KV cache forms (forward only: a backward of those is a catalogue line).
#[test]
fn baselines_succeed() {
    let variants = ["-", "alibi_slopes=given;sinks=given;dsinks=given", "varlen=1",
        "varlen=1;sinks=given;dsinks=given;alibi_slopes=given;alibi_slopes.rank=2;alibi_slopes.shape[0]=2;alibi_slopes.shape[1]=4;alibi_slopes.strides[0]=4",
        "cache=1", "cache=1;paged=1", "cache=1;k_new=given;v_new=given", "cache=1;rotary_cos=given;rotary_sin=given",
        "cache=1;paged=1;k_new=given;v_new=given;rotary_cos=given;rotary_sin=given;args.rotary_interleaved=1;sinks=given;alibi_slopes=given"];
    let merge_variants = ["-", "lse=null", "out.data=alias:parts_out;lse.data=alias:parts_lse", "args.parts_out_stride=0;args.parts_lse_stride=0"];
    for op in OPS {
        let cp_variants = ["-", "cp.layout=1", "sinks=given;dsinks=given"];
        let lines: &[&str] = if op == "merge" {
            &merge_variants
        } else if op.starts_with("cp_") {
            &cp_variants
        } else {
            &variants
        };
        for mutations in lines.iter().filter(|m| **m == "-" || takes_args(op) || op == "merge") {
            for backward in [0, 1] {
                if mutations.contains("cache=1") && (backward == 1 || op == "backward_ex") {
                    continue;
                }
                let mut call = Call::new(op);
                if *mutations != "-" {
                    for m in mutations.split(';') {
                        call.mutate(m).unwrap();
                    }
                }
                call.backward = backward;
                let (status, _) = call.run();
                let message = unsafe { CStr::from_ptr(flashattn_last_error()) }.to_string_lossy().into_owned();
                assert_eq!(status, flashattn_status_FLASHATTN_SUCCESS, "{op} {mutations} backward={backward}: {message}");
            }
        }
    }
}

#[test]
fn catalogue() {
    let statuses: HashMap<String, flashattn_status_t> = (0..1000)
        .map(|code| (unsafe { CStr::from_ptr(flashattn_status_string(code)) }.to_string_lossy().into_owned(), code))
        .filter(|(name, _)| name != "FLASHATTN_UNKNOWN_STATUS")
        .collect();
    let cases = load();
    let mut failures = Vec::new();
    for case in &cases {
        let want = *statuses.get(&case.status).unwrap_or_else(|| panic!("line {}: unknown status {}", case.line, case.status));
        let mut call = Call::new(&case.op);
        if case.mutations != "-" {
            for m in case.mutations.split(';') {
                call.mutate(m).unwrap_or_else(|e| panic!("line {}: {e}", case.line));
            }
        }
        let (status, kept) = call.run();
        // Read right after the call, on this thread.
        let message = unsafe { CStr::from_ptr(flashattn_last_error()) }.to_string_lossy().into_owned();
        let mut problems = Vec::new();
        if status != want || !message.contains(&case.fragment) {
            problems.push(format!("want {} with {:?}, got {} {:?}", case.status, case.fragment, status, message));
        }
        if !kept {
            problems.push("wrote workspace_size's out".into());
        }
        let changed = call.changed_buffers();
        if !changed.is_empty() {
            problems.push(format!("wrote {changed:?}"));
        }
        if !problems.is_empty() {
            failures.push(format!("line {} ({}): {}", case.line, case.id, problems.join("; ")));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
    eprintln!("{} catalogue cases passed", cases.len());
}
