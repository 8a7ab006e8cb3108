package capi

// Every case of the bad-input catalogue (tests/catalogue/bad_inputs.tsv, format in
// tests/catalogue/FORMAT.md) through this low layer: the call returns an *Error with the expected
// status and a message holding the expected fragment, no buffer changes (outputs are poisoned
// beforehand) and workspace_size leaves its output alone. FLASHATTN_CATALOGUE names another file.

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
}

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
	case "lse":
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
	block         []uint64 // the zero-filled storage the options sit at the start of
	options       *Options
	optionsSizeof uint64
	passOptions   bool
	workspaceBufs []Buffer
	workspace     uintptr
	workspaceSize int64
	backwardFlag  int
}

func newCall(op string) (*call, error) {
	c := &call{op: op, buffers: map[string]Buffer{}, contents: map[string][]byte{},
		views: map[string]*Tensor{}, passed: map[string]*Tensor{}, ends: map[string]uintptr{},
		passOptions: true}
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
	for _, name := range catalogueNames {
		shape := catalogueShape(name)
		nbytes := int64(4)
		for _, s := range shape {
			nbytes *= s
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
		if !isOutput[name] {
			for i := 0; i < len(data); i += 4 {
				binary.LittleEndian.PutUint32(data[i:], math.Float32bits(0.5))
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
		if name == "lse" {
			err = Flashattn_tensor_lse(view, address, shape[0], shape[1], shape[2])
		} else {
			err = Flashattn_tensor_4d(view, address, DType(FLASHATTN_DTYPE_FLOAT32), shape[0], shape[1], shape[2], shape[3])
		}
		if err != nil {
			return c, err
		}
		c.views[name], c.passed[name] = view, view
	}
	c.block = make([]uint64, optionsBlock/8)
	c.options = (*Options)(unsafe.Pointer(&c.block[0]))
	if err := Flashattn_options_init(c.options); err != nil {
		return c, err
	}
	c.optionsSizeof = c.options.Size
	return c, nil
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
	case c.views[key] != nil && value == "null":
		c.passed[key] = nil
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
	case "softmax_scale":
		switch value {
		case "nan":
			o.SoftmaxScale = float32(math.NaN())
		case "inf":
			o.SoftmaxScale = float32(math.Inf(1))
		case "-inf":
			o.SoftmaxScale = float32(math.Inf(-1))
		default:
			v, err := strconv.ParseFloat(value, 32)
			if err != nil {
				return err
			}
			o.SoftmaxScale = float32(v)
		}
	case "causal", "algorithm", "deterministic":
		v, err := parseInt32("options."+field, value)
		if err != nil {
			return err
		}
		switch field {
		case "causal":
			o.Causal = v
		case "algorithm":
			o.Algorithm = Algorithm(v)
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

func (c *call) run() (error, bool) {
	p := c.passed
	var opts *Options
	if c.passOptions {
		opts = c.options
	}
	switch c.op {
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
	for _, name := range catalogueNames {
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
	Flashattn_context_destroy(c.ctx)
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
