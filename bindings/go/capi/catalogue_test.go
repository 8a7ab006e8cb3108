package capi

// Every case of the bad-input catalogue (tests/catalogue/bad_inputs.tsv, format in
// tests/catalogue/FORMAT.md) through this low layer: the call returns an *Error with the expected
// status and a message holding the expected fragment, no buffer changes (outputs are poisoned
// beforehand; k and v, which a call with k_new writes, are compared as well) and workspace_size
// leaves its output alone. FLASHATTN_CATALOGUE names another file.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

type catalogueCase struct {
	line                                int
	id, op, mutations, status, fragment string
}

var catalogueOutputs = map[string][]string{
	"forward": {"out", "lse"}, "backward": {"dq", "dk", "dv"}, "supported": {}, "workspace_size": {},
	"forward_ex": {"out", "lse"}, "backward_ex": {"dq", "dk", "dv", "dsinks"}, "supported_ex": {},
	"workspace_size_ex": {}, "merge": {"out", "lse"}, "cp_forward": {"out", "lse"},
	"cp_backward": {"dq", "dk", "dv", "dsinks"}, "cp_workspace_size": {},
}

// The merge's parts (FORMAT.md): three parts of out's and lse's shapes, part 0's views over
// buffers that hold the three.
const mergeParts = 3

var (
	mergeNames = []string{"parts_out", "parts_lse"}
	mergeBytes = map[string]int64{"parts_out": mergeParts * cB * cNQ * cHQ * cD * 4,
		"parts_lse": mergeParts * cB * cHQ * cNQ * 4}
)

// The variant tensors of the _ex ops, in the order of the ArgTensor fields after dv: their
// buffers' sizes, and the offsets' contents.
var (
	variantNames = []string{"alibi_slopes", "sinks", "dsinks", "cu_seqlens_q", "cu_seqlens_k"}
	variantBytes = map[string]int64{"alibi_slopes": cB * cHQ * 4, "sinks": cHQ * 4, "dsinks": cHQ * 4,
		"cu_seqlens_q": (cB + 1) * 4, "cu_seqlens_k": (cB + 1) * 4}
	variantOffsets = map[string][]int32{"cu_seqlens_q": {0, cNQ, 2 * cNQ}, "cu_seqlens_k": {0, cNK, 2 * cNK}}
)

// The KV cache form (FORMAT.md): four query tokens, 40 and 44 tokens held, four rows appended,
// six pages of 16 rows (three per sequence), rotary tables of 48 positions over all 32 features.
const (
	cCacheQueries, cNew, cPageRows, cPages, cPagesPerSeq, cPositions = 4, 4, 16, 6, 3, 48
)

// The cache tensors of the _ex ops, in the order of the ArgTensor fields after cu_seqlens_k:
// their shapes (each buffer holds exactly its view) and the INT32 tensors' contents.
var (
	cacheNames  = []string{"cache_seqlens", "block_table", "k_new", "v_new", "rotary_cos", "rotary_sin"}
	cacheShapes = map[string][]int64{"cache_seqlens": {cB}, "block_table": {cB, cPagesPerSeq},
		"k_new": {cB, cNew, cHKV, cD}, "v_new": {cB, cNew, cHKV, cD},
		"rotary_cos": {cPositions, cD / 2}, "rotary_sin": {cPositions, cD / 2}}
	cacheInts = map[string][]int32{"cache_seqlens": {40, 44}, "block_table": {0, 1, 2, 3, 4, 5}}
)

const (
	cB, cNQ, cNK, cHQ, cHKV, cD = 2, 64, 48, 4, 2, 32
	poison                      = 0xA5
	optionsBlock                = 4096
	sizeSentinel                = uint64(0xDEADBEEFCAFEF00D)
)

var catalogueNames = []string{"q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv"}

func catalogueShape(name string) []int64 {
	switch name {
	case "k", "v", "dk", "dv":
		return []int64{cB, cNK, cHKV, cD}
	case "lse", "parts_lse":
		return []int64{cB, cHQ, cNQ}
	}
	return []int64{cB, cNQ, cHQ, cD}
}

func loadCatalogue(t *testing.T) []catalogueCase {
	path := os.Getenv("FLASHATTN_CATALOGUE")
	if path == "" {
		path = filepath.Join("..", "..", "..", "tests", "catalogue", "bad_inputs.tsv")
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("the catalogue: %v", err)
	}
	defer f.Close()
	var cases []catalogueCase
	scanner := bufio.NewScanner(f)
	for n := 1; scanner.Scan(); n++ {
		line := strings.TrimRight(scanner.Text(), "\r")
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Split(line, "\t")
		if len(fields) != 5 {
			t.Fatalf("%s:%d: 5 tab-separated fields expected, got %d", path, n, len(fields))
		}
		c := catalogueCase{n, fields[0], fields[1], fields[2], fields[3], fields[4]}
		if _, ok := catalogueOutputs[c.op]; !ok {
			t.Fatalf("%s:%d: unknown op %q", path, n, c.op)
		}
		cases = append(cases, c)
	}
	if err := scanner.Err(); err != nil {
		t.Fatal(err)
	}
	if len(cases) == 0 {
		t.Fatalf("%s: no cases", path)
	}
	return cases
}

// call is the baseline call of the format, built through this layer.
type call struct {
	op            string
	ctx, callCtx  Context
	buffers       map[string]Buffer
	contents      map[string][]byte
	views         map[string]*Tensor
	passed        map[string]*Tensor
	ends          map[string]uintptr // each tensor's buffer: its base address plus its size
	block         []uint64           // the zero-filled storage the options sit at the start of
	options       *Options
	optionsSizeof uint64
	passOptions   bool
	workspaceBufs []Buffer
	workspace     uintptr
	workspaceSize int64
	backwardFlag  int
	names         []string // every tensor with a buffer, in ArgTensor order
	args          *ArgsBlock
	merge         *MergeBlock
	passArgs      bool
	cp            *CpArgs // an allocation of its own: cgo refuses memory that holds Go pointers
	passCp        bool
	commStandIn   [8]byte // what cp.nccl_comm=set points at: no communicator
}

// takesArgs: the _ex ops and the cp ops take the args struct (and its tensors' buffers).
func takesArgs(op string) bool { return strings.HasSuffix(op, "_ex") || strings.HasPrefix(op, "cp_") }

func newCall(op string) (*call, error) {
	c := &call{op: op, buffers: map[string]Buffer{}, contents: map[string][]byte{},
		views: map[string]*Tensor{}, passed: map[string]*Tensor{}, ends: map[string]uintptr{},
		passOptions: true, passArgs: true, passCp: true}
	// Output parameters are locals: cgo refuses a pointer into memory that holds Go pointers.
	var ctx Context
	if err := Flashattn_context_create(&ctx, Backend(FLASHATTN_BACKEND_CPU), 0); err != nil {
		return nil, err
	}
	c.ctx, c.callCtx = ctx, ctx
	isOutput := map[string]bool{}
	for _, n := range catalogueOutputs[op] {
		isOutput[n] = true
	}
	// The variant tensors' buffers exist for the _ex ops only (FORMAT.md).
	c.names = append([]string{}, catalogueNames...)
	if takesArgs(op) { // the cache tensors' after the variant tensors'
		c.names = append(c.names, variantNames...)
		c.names = append(c.names, cacheNames...)
	}
	if op == "merge" { // and the merge's parts for the merge only, after the nine
		c.names = append(c.names, mergeNames...)
	}
	for _, name := range c.names {
		shape := catalogueShape(name)
		if s, ok := cacheShapes[name]; ok {
			shape = s
		}
		nbytes := int64(4)
		for _, s := range shape {
			nbytes *= s
		}
		if n, ok := variantBytes[name]; ok {
			nbytes = n
		}
		if n, ok := mergeBytes[name]; ok {
			nbytes = n
		}
		var buf Buffer
		if err := Flashattn_buffer_create(&buf, c.ctx, nbytes); err != nil {
			return c, err
		}
		c.buffers[name] = buf
		data := make([]byte, nbytes)
		for i := range data {
			data[i] = poison
		}
		ints, isInts := variantOffsets[name]
		if !isInts {
			ints, isInts = cacheInts[name]
		}
		if isInts {
			for i, o := range ints {
				binary.LittleEndian.PutUint32(data[4*i:], uint32(o))
			}
		} else if !isOutput[name] {
			// The rows to append differ from what k and v hold (FORMAT.md), so a refused
			// call's append shows.
			value := float32(0.5)
			if name == "k_new" || name == "v_new" {
				value = 0.25
			}
			for i := 0; i < len(data); i += 4 {
				binary.LittleEndian.PutUint32(data[i:], math.Float32bits(value))
			}
		}
		if err := Flashattn_buffer_write(buf, 0, data); err != nil {
			return c, err
		}
		c.contents[name] = data
		var address uintptr
		if err := Flashattn_buffer_data(&address, buf); err != nil {
			return c, err
		}
		c.ends[name] = address + uintptr(nbytes)
		view := &Tensor{}
		var err error
		if _, ok := cacheShapes[name]; ok {
			dtype := DType(FLASHATTN_DTYPE_FLOAT32)
			if _, ok := cacheInts[name]; ok {
				dtype = DType(FLASHATTN_DTYPE_INT32)
			}
			c.views[name] = contiguousView(address, dtype, shape) // given by a mutation
			continue
		} else if _, ok := variantBytes[name]; ok {
			view.Data, view.Dtype, view.Rank = address, DType(FLASHATTN_DTYPE_FLOAT32), 1
			view.Shape[0], view.Strides[0] = cHQ, 1
			if _, ok := variantOffsets[name]; ok {
				view.Dtype, view.Shape[0] = DType(FLASHATTN_DTYPE_INT32), cB+1
			}
			c.views[name] = view // given by a mutation
			continue
		} else if name == "lse" || name == "parts_lse" {
			err = Flashattn_tensor_lse(view, address, shape[0], shape[1], shape[2])
		} else {
			err = Flashattn_tensor_4d(view, address, DType(FLASHATTN_DTYPE_FLOAT32), shape[0], shape[1], shape[2], shape[3])
		}
		if err != nil {
			return c, err
		}
		c.views[name], c.passed[name] = view, view
	}
	args, err := NewArgsBlock()
	if err != nil {
		return c, err
	}
	c.args = args
	merge, err := NewMergeBlock()
	if err != nil {
		return c, err
	}
	c.merge = merge
	m := merge.Args()
	m.NumParts, m.PartsOutStride, m.PartsLseStride = mergeParts, cB*cNQ*cHQ*cD, cB*cHQ*cNQ
	c.block = make([]uint64, optionsBlock/8)
	c.options = (*Options)(unsafe.Pointer(&c.block[0]))
	if err := Flashattn_options_init(c.options); err != nil {
		return c, err
	}
	c.optionsSizeof = c.options.Size
	c.cp = new(CpArgs)
	if err := Flashattn_cp_args_init(c.cp); err != nil {
		return c, err
	}
	if strings.HasPrefix(op, "cp_") {
		c.makeSelfAttention()
	}
	return c, nil
}

// contiguousView is a row-major view of shape at address.
func contiguousView(address uintptr, dtype DType, shape []int64) *Tensor {
	t := &Tensor{Data: address, Dtype: dtype, Rank: int32(len(shape))}
	stride := int64(1)
	for i := len(shape) - 1; i >= 0; i-- {
		t.Shape[i], t.Strides[i] = shape[i], stride
		stride *= shape[i]
	}
	return t
}

func parseInt32(what, value string) (int32, error) {
	v, err := strconv.ParseInt(value, 10, 64)
	if err != nil {
		return 0, err
	}
	if v < math.MinInt32 || v > math.MaxInt32 {
		return 0, fmt.Errorf("%s=%d does not fit the 32-bit field", what, v)
	}
	return int32(v), nil
}

func (c *call) mutate(m string) error {
	key, value, ok := strings.Cut(m, "=")
	if !ok {
		return fmt.Errorf("mutation %q has no '='", m)
	}
	switch {
	case key == "ctx" && value == "null":
		c.callCtx = 0
	case key == "ctx" && value == "destroyed":
		var stale Context
		if err := Flashattn_context_create(&stale, Backend(FLASHATTN_BACKEND_CPU), 0); err != nil {
			return err
		}
		if err := Flashattn_context_destroy(stale); err != nil {
			return err
		}
		c.callCtx = stale
	case key == "options" && value == "null":
		c.passOptions = false
	case key == "cp" && value == "null":
		c.passCp = false
	case key == "cp.nccl_comm" && value == "set":
		c.cp.NcclComm = uintptr(unsafe.Pointer(&c.commStandIn[0]))
	case key == "cp.size" || key == "cp.ranks" || key == "cp.rank" || key == "cp.layout":
		v, err := strconv.ParseInt(value, 10, 64)
		if err != nil {
			return err
		}
		switch key {
		case "cp.size":
			c.cp.Size = uint64(v)
		case "cp.ranks":
			c.cp.Ranks = v
		case "cp.rank":
			c.cp.Rank = v
		default:
			c.cp.Layout = v
		}
	case strings.HasPrefix(key, "options."):
		return c.mutateOptions(strings.TrimPrefix(key, "options."), value)
	case key == "workspace":
		n, err := strconv.ParseInt(value, 10, 64)
		if err != nil {
			return err
		}
		var buf Buffer
		alloc := n
		if alloc < 1 {
			alloc = 1
		}
		if err := Flashattn_buffer_create(&buf, c.ctx, alloc); err != nil {
			return err
		}
		c.workspaceBufs = append(c.workspaceBufs, buf)
		var address uintptr
		if err := Flashattn_buffer_data(&address, buf); err != nil {
			return err
		}
		c.workspace, c.workspaceSize = address, n
	case key == "workspace_size":
		n, err := strconv.ParseInt(value, 10, 64)
		if err != nil {
			return err
		}
		c.workspaceSize = n
	case key == "backward":
		n, err := strconv.Atoi(value)
		if err != nil {
			return err
		}
		c.backwardFlag = n
	case key == "args" && value == "null":
		c.passArgs = false
	case key == "args.num_parts" || key == "args.parts_out_stride" || key == "args.parts_lse_stride":
		if c.op != "merge" {
			return fmt.Errorf("%s belongs to the merge op", key)
		}
		v, err := strconv.ParseInt(value, 10, 64)
		if err != nil {
			return err
		}
		m := c.merge.Args()
		switch key {
		case "args.num_parts":
			m.NumParts = v
		case "args.parts_out_stride":
			m.PartsOutStride = v
		default:
			m.PartsLseStride = v
		}
	case key == "args.size" || key == "args.max_seqlen_q" || key == "args.max_seqlen_k":
		v, err := strconv.ParseInt(value, 10, 64)
		if err != nil {
			return err
		}
		a := c.args.Args()
		switch key {
		case "args.size":
			if c.op == "merge" {
				c.merge.Args().Size = uint64(v)
				return nil
			}
			a.Size = uint64(v)
		case "args.max_seqlen_q":
			a.MaxSeqlenQ = v
		default:
			a.MaxSeqlenK = v
		}
	case key == "varlen" && value == "1":
		c.makeVarlen()
	case (key == "cache" || key == "paged") && value == "1":
		if c.views["cache_seqlens"] == nil {
			return fmt.Errorf("%s=1 needs an _ex op", key)
		}
		if key == "cache" {
			c.makeCache()
		} else {
			c.makePaged()
		}
	case key == "args.rotary_interleaved":
		v, err := strconv.ParseInt(value, 10, 64)
		if err != nil {
			return err
		}
		c.args.Args().RotaryInterleaved = v
	case c.views[key] != nil && value == "null":
		c.passed[key] = nil
	case c.views[key] != nil && value == "given":
		c.passed[key] = c.views[key]
	default:
		return c.mutateView(key, value)
	}
	return nil
}

func (c *call) mutateOptions(field, value string) error {
	o := c.options
	switch field {
	case "size":
		v, err := strconv.ParseInt(value, 10, 64)
		if err != nil {
			return err
		}
		o.Size = uint64(v) // two's complement: -1 is SIZE_MAX
	case "softmax_scale", "softcap":
		f, err := parseFloat32(value)
		if err != nil {
			return err
		}
		if field == "softcap" {
			o.Softcap = f
		} else {
			o.SoftmaxScale = f
		}
	case "num_splits":
		v, err := strconv.ParseInt(value, 10, 64)
		if err != nil {
			return fmt.Errorf("options.num_splits: %v", err)
		}
		o.NumSplits = v
	case "causal", "algorithm", "deterministic", "window", "window_left", "window_right":
		v, err := parseInt32("options."+field, value)
		if err != nil {
			return err
		}
		switch field {
		case "causal":
			o.Causal = v
		case "algorithm":
			o.Algorithm = Algorithm(v)
		case "window":
			o.Window = v
		case "window_left":
			o.WindowLeft = v
		case "window_right":
			o.WindowRight = v
		default:
			o.Deterministic = v
		}
	case "tail":
		v, err := strconv.ParseUint(value, 10, 8)
		if err != nil {
			return err
		}
		raw := unsafe.Slice((*byte)(unsafe.Pointer(&c.block[0])), optionsBlock)
		end := o.Size
		if end > optionsBlock {
			end = optionsBlock
		}
		for i := c.optionsSizeof; i < end; i++ {
			raw[i] = byte(v)
		}
	default:
		return fmt.Errorf("unknown options field %q", field)
	}
	return nil
}

func parseFloat32(value string) (float32, error) {
	switch value {
	case "nan":
		return float32(math.NaN()), nil
	case "inf":
		return float32(math.Inf(1)), nil
	case "-inf":
		return float32(math.Inf(-1)), nil
	}
	v, err := strconv.ParseFloat(value, 32)
	return float32(v), err
}

// makeVarlen turns the baseline into its variable-length form (FORMAT.md).
func (c *call) makeVarlen() {
	for _, name := range []string{"q", "out", "dout", "dq", "k", "v", "dk", "dv"} {
		rows, heads := int64(cB*cNQ), int64(cHQ)
		if name == "k" || name == "v" || name == "dk" || name == "dv" {
			rows, heads = cB*cNK, cHKV
		}
		t := c.views[name]
		t.Rank = 3
		t.Shape = [FLASHATTN_MAX_RANK]int64{rows, heads, cD, 0}
		t.Strides = [FLASHATTN_MAX_RANK]int64{heads * cD, cD, 1, 0}
	}
	lse := c.views["lse"]
	lse.Rank = 2
	lse.Shape = [FLASHATTN_MAX_RANK]int64{cHQ, cB * cNQ, 0, 0}
	lse.Strides = [FLASHATTN_MAX_RANK]int64{cB * cNQ, 1, 0, 0}
	for name := range variantOffsets {
		c.passed[name] = c.views[name]
	}
	c.args.Args().MaxSeqlenQ, c.args.Args().MaxSeqlenK = cNQ, cNK
}

// makeSelfAttention is the cp ops' baseline (FORMAT.md): q, out, dout and dq hold as many
// tokens as k, over the start of their buffers.
func (c *call) makeSelfAttention() {
	for _, name := range []string{"q", "out", "dout", "dq"} {
		t := c.views[name]
		t.Shape[1], t.Strides[0] = cNK, cNK*cHQ*cD
	}
	lse := c.views["lse"]
	lse.Shape[2], lse.Strides[0], lse.Strides[1] = cNK, cHQ*cNK, cNK
}

// makeCache turns the baseline into its KV cache form (FORMAT.md): four query tokens over the
// start of q's and out's buffers against the contiguous cache that k and v are.
func (c *call) makeCache() {
	for _, name := range []string{"q", "out"} {
		t := c.views[name]
		t.Shape[1], t.Strides[0] = cCacheQueries, cCacheQueries*cHQ*cD
	}
	lse := c.views["lse"]
	lse.Shape[2], lse.Strides[0], lse.Strides[1] = cCacheQueries, cHQ*cCacheQueries, cCacheQueries
	c.passed["cache_seqlens"] = c.views["cache_seqlens"]
}

// makePaged turns the cache form paged: k and v as six pages of 16 rows over the same buffers.
func (c *call) makePaged() {
	for _, name := range []string{"k", "v"} {
		t := c.views[name]
		t.Shape[0], t.Shape[1], t.Strides[0] = cPages, cPageRows, cPageRows*cHKV*cD
	}
	c.passed["block_table"] = c.views["block_table"]
}

func (c *call) mutateView(key, value string) error {
	name, field, _ := strings.Cut(key, ".")
	t := c.views[name]
	if t == nil {
		return fmt.Errorf("unknown tensor %q", name)
	}
	switch {
	case field == "dtype" || field == "rank":
		v, err := parseInt32(key, value)
		if err != nil {
			return err
		}
		if field == "dtype" {
			t.Dtype = DType(v)
		} else {
			t.Rank = v
		}
	case (strings.HasPrefix(field, "shape[") || strings.HasPrefix(field, "strides[")) && strings.HasSuffix(field, "]"):
		attr, index, _ := strings.Cut(strings.TrimSuffix(field, "]"), "[")
		i, err := strconv.Atoi(index)
		if err != nil || i < 0 || i >= FLASHATTN_MAX_RANK {
			return fmt.Errorf("bad index in %q", key)
		}
		v, err := strconv.ParseInt(value, 10, 64)
		if err != nil {
			return err
		}
		if attr == "shape" {
			t.Shape[i] = v
		} else {
			t.Strides[i] = v
		}
	case strings.HasPrefix(field, "values[") && strings.HasSuffix(field, "]"):
		i, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(field, "values["), "]"))
		if err != nil || i < 0 || 4*(i+1) > len(c.contents[name]) {
			return fmt.Errorf("bad index in %q", key)
		}
		v, err := parseInt32(key, value)
		if err != nil {
			return err
		}
		binary.LittleEndian.PutUint32(c.contents[name][4*i:], uint32(v))
		return Flashattn_buffer_write(c.buffers[name], int64(4*i), c.contents[name][4*i:4*i+4])
	case field == "data":
		switch {
		case value == "null":
			t.Data = 0
		case value == "misalign":
			t.Data++
		case strings.HasPrefix(value, "alias:"):
			u := c.views[strings.TrimPrefix(value, "alias:")]
			if u == nil {
				return fmt.Errorf("unknown alias in %q", value)
			}
			t.Data = u.Data
		case strings.HasPrefix(value, "end+"):
			past, err := strconv.Atoi(strings.TrimPrefix(value, "end+"))
			if err != nil || past < 0 || past > 255 {
				return fmt.Errorf("end+ takes 0..255 in %q", value)
			}
			t.Data = c.ends[name] + uintptr(past)
		default:
			return fmt.Errorf("unknown data mutation %q", value)
		}
	default:
		return fmt.Errorf("unknown mutation %q", key)
	}
	return nil
}

// exArgs copies the call's options and views into its ArgsBlock, as the _ex ops take them.
func (c *call) exArgs() *Args {
	if !c.passArgs {
		return nil
	}
	copy(c.args.OptionsBytes(), unsafe.Slice((*byte)(unsafe.Pointer(&c.block[0])), optionsBlock))
	a := c.args.Args()
	a.Options = 0
	if c.passOptions {
		a.Options = uintptr(unsafe.Pointer(c.args.Options()))
	}
	fields := append(append(append([]string{}, catalogueNames...), variantNames...), cacheNames...)
	for i, name := range fields {
		c.args.SetTensor(ArgTensor(i), c.passed[name])
	}
	return a
}

// cpArgs is the call's cp struct, or nil after cp=null.
func (c *call) cpArgs() *CpArgs {
	if !c.passCp {
		return nil
	}
	return c.cp
}

// mergeArgs points the call's MergeBlock at its views, as the merge op takes them.
func (c *call) mergeArgs() *MergeArgs {
	if !c.passArgs {
		return nil
	}
	for i, name := range []string{"parts_out", "parts_lse", "out", "lse"} {
		c.merge.SetTensor(MergeTensor(i), c.passed[name])
	}
	return c.merge.Args()
}

func (c *call) run() (error, bool) {
	p := c.passed
	var opts *Options
	if c.passOptions {
		opts = c.options
	}
	switch c.op {
	case "merge":
		return Flashattn_merge(c.callCtx, c.mergeArgs()), true
	case "cp_forward":
		return Flashattn_cp_forward(c.callCtx, c.cpArgs(), c.exArgs(), c.workspace, c.workspaceSize), true
	case "cp_backward":
		return Flashattn_cp_backward(c.callCtx, c.cpArgs(), c.exArgs(), c.workspace, c.workspaceSize), true
	case "cp_workspace_size":
		size := sizeSentinel
		err := Flashattn_cp_workspace_size(&size, c.callCtx, c.cpArgs(), c.exArgs(), c.backwardFlag)
		return err, size == sizeSentinel
	case "forward_ex":
		return Flashattn_forward_ex(c.callCtx, c.exArgs(), c.workspace, c.workspaceSize), true
	case "backward_ex":
		return Flashattn_backward_ex(c.callCtx, c.exArgs(), c.workspace, c.workspaceSize), true
	case "supported_ex":
		return Flashattn_supported_ex(c.callCtx, c.exArgs(), c.backwardFlag), true
	case "workspace_size_ex":
		size := sizeSentinel
		err := Flashattn_workspace_size_ex(&size, c.callCtx, c.exArgs(), c.backwardFlag)
		return err, size == sizeSentinel
	case "forward":
		return Flashattn_forward(c.callCtx, p["q"], p["k"], p["v"], p["out"], p["lse"], opts, c.workspace, c.workspaceSize), true
	case "backward":
		return Flashattn_backward(c.callCtx, p["q"], p["k"], p["v"], p["out"], p["dout"], p["lse"], p["dq"], p["dk"], p["dv"], opts, c.workspace, c.workspaceSize), true
	case "supported":
		return Flashattn_supported(c.callCtx, p["q"], p["k"], p["v"], opts, c.backwardFlag), true
	}
	size := sizeSentinel
	err := Flashattn_workspace_size(&size, c.callCtx, p["q"], p["k"], p["v"], opts, c.backwardFlag)
	return err, size == sizeSentinel
}

func (c *call) changedBuffers() ([]string, error) {
	var changed []string
	for _, name := range c.names {
		now := make([]byte, len(c.contents[name]))
		if err := Flashattn_buffer_read(c.buffers[name], 0, now); err != nil {
			return nil, err
		}
		if !bytes.Equal(now, c.contents[name]) {
			changed = append(changed, name)
		}
	}
	return changed, nil
}

func (c *call) close() {
	for _, b := range c.buffers {
		Flashattn_buffer_destroy(b)
	}
	for _, b := range c.workspaceBufs {
		Flashattn_buffer_destroy(b)
	}
	if c.args != nil {
		c.args.Free()
	}
	if c.merge != nil {
		c.merge.Free()
	}
	Flashattn_context_destroy(c.ctx)
}

// The unmutated baselines succeed (else a case could pass for a reason other than its
// mutation), the _ex ops also with every variant tensor given, in the variable-length form and
// in the KV cache's forms (contiguous, paged, rows appended with a rotary embedding).
func TestCatalogueBaselinesSucceed(t *testing.T) {
	variants := []string{"-", "alibi_slopes=given;sinks=given;dsinks=given", "varlen=1",
		"cache=1", "cache=1;paged=1",
		"cache=1;paged=1;k_new=given;v_new=given;rotary_cos=given;rotary_sin=given;" +
			"args.rotary_interleaved=1;sinks=given",
		"varlen=1;sinks=given;dsinks=given;alibi_slopes=given;alibi_slopes.rank=2;" +
			"alibi_slopes.shape[0]=2;alibi_slopes.shape[1]=4;alibi_slopes.strides[0]=4"}
	mergeVariants := []string{"-", "lse=null", "out.data=alias:parts_out;lse.data=alias:parts_lse",
		"args.parts_out_stride=0;args.parts_lse_stride=0"}
	cpVariants := []string{"-", "cp.layout=1", "sinks=given;dsinks=given"}
	for op := range catalogueOutputs {
		lines := variants
		if op == "merge" {
			lines = mergeVariants
		} else if strings.HasPrefix(op, "cp_") {
			lines = cpVariants
		}
		for _, mutations := range lines {
			if mutations != "-" && !takesArgs(op) && op != "merge" {
				continue
			}
			for _, backward := range []int{0, 1} {
				// The KV cache is forward only: its backward forms are catalogue lines.
				if strings.Contains(mutations, "cache=1") && (backward == 1 || op == "backward_ex") {
					continue
				}
				c, err := newCall(op)
				if err != nil {
					t.Fatal(err)
				}
				if mutations != "-" {
					for _, m := range strings.Split(mutations, ";") {
						if err := c.mutate(m); err != nil {
							t.Fatal(err)
						}
					}
				}
				c.backwardFlag = backward
				if err, _ := c.run(); err != nil {
					t.Errorf("%s %s backward=%d: %v", op, mutations, backward, err)
				}
				c.close()
			}
		}
	}
}

func TestCatalogue(t *testing.T) {
	statuses := map[string]Status{}
	for code := 0; code < 1000; code++ {
		if name := Flashattn_status_string(Status(code)); name != "FLASHATTN_UNKNOWN_STATUS" {
			statuses[name] = Status(code)
		}
	}
	for _, tc := range loadCatalogue(t) {
		tc := tc
		t.Run(tc.id, func(t *testing.T) {
			want, ok := statuses[tc.status]
			if !ok {
				t.Fatalf("line %d: unknown status %s", tc.line, tc.status)
			}
			c, err := newCall(tc.op)
			if c != nil {
				defer c.close()
			}
			if err != nil {
				t.Fatalf("line %d: the baseline: %v", tc.line, err)
			}
			if tc.mutations != "-" {
				for _, m := range strings.Split(tc.mutations, ";") {
					if err := c.mutate(m); err != nil {
						t.Fatalf("line %d: %v", tc.line, err)
					}
				}
			}
			err, outputKept := c.run()
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("line %d: want %s, the call returned %v", tc.line, tc.status, err)
			}
			if e.Status != want || !strings.Contains(e.Message, tc.fragment) {
				t.Errorf("line %d: want %s with %q, got %v", tc.line, tc.status, tc.fragment, e)
			}
			if !outputKept {
				t.Errorf("line %d: the rejected call wrote workspace_size's out", tc.line)
			}
			changed, err := c.changedBuffers()
			if err != nil {
				t.Fatal(err)
			}
			if len(changed) != 0 {
				t.Errorf("line %d: the rejected call wrote %v", tc.line, changed)
			}
		})
	}
}
