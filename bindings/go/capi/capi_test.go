package capi

import (
	"errors"
	"runtime"
	"testing"
	"unsafe"
)

// The Go structs must be the C structs byte for byte.
func TestStructLayout(t *testing.T) {
	var tensor Tensor
	var options Options
	var args Args
	var merge MergeArgs
	var cp CpArgs
	checks := []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof(flashattn_tensor_t)", unsafe.Sizeof(tensor), uintptr(SizeofTensor)},
		{"offsetof(flashattn_tensor_t, dtype)", unsafe.Offsetof(tensor.Dtype), uintptr(OffsetofTensorDtype)},
		{"offsetof(flashattn_tensor_t, rank)", unsafe.Offsetof(tensor.Rank), uintptr(OffsetofTensorRank)},
		{"offsetof(flashattn_tensor_t, shape)", unsafe.Offsetof(tensor.Shape), uintptr(OffsetofTensorShape)},
		{"offsetof(flashattn_tensor_t, strides)", unsafe.Offsetof(tensor.Strides), uintptr(OffsetofTensorStrides)},
		{"sizeof(flashattn_options_t)", unsafe.Sizeof(options), uintptr(SizeofOptions)},
		{"offsetof(flashattn_options_t, softmax_scale)", unsafe.Offsetof(options.SoftmaxScale), uintptr(OffsetofOptionsSoftmaxScale)},
		{"offsetof(flashattn_options_t, causal)", unsafe.Offsetof(options.Causal), uintptr(OffsetofOptionsCausal)},
		{"offsetof(flashattn_options_t, algorithm)", unsafe.Offsetof(options.Algorithm), uintptr(OffsetofOptionsAlgorithm)},
		{"offsetof(flashattn_options_t, deterministic)", unsafe.Offsetof(options.Deterministic), uintptr(OffsetofOptionsDeterministic)},
		{"offsetof(flashattn_options_t, window)", unsafe.Offsetof(options.Window), uintptr(OffsetofOptionsWindow)},
		{"offsetof(flashattn_options_t, window_left)", unsafe.Offsetof(options.WindowLeft), uintptr(OffsetofOptionsWindowLeft)},
		{"offsetof(flashattn_options_t, window_right)", unsafe.Offsetof(options.WindowRight), uintptr(OffsetofOptionsWindowRight)},
		{"offsetof(flashattn_options_t, softcap)", unsafe.Offsetof(options.Softcap), uintptr(OffsetofOptionsSoftcap)},
		{"offsetof(flashattn_options_t, num_splits)", unsafe.Offsetof(options.NumSplits), uintptr(OffsetofOptionsNumSplits)},
		{"sizeof(flashattn_args_t)", unsafe.Sizeof(args), uintptr(SizeofArgs)},
		{"offsetof(flashattn_args_t, options)", unsafe.Offsetof(args.Options), uintptr(OffsetofArgsOptions)},
		{"offsetof(flashattn_args_t, q)", unsafe.Offsetof(args.Q), uintptr(OffsetofArgsQ)},
		{"offsetof(flashattn_args_t, dv)", unsafe.Offsetof(args.Dv), uintptr(OffsetofArgsDv)},
		{"offsetof(flashattn_args_t, alibi_slopes)", unsafe.Offsetof(args.AlibiSlopes), uintptr(OffsetofArgsAlibiSlopes)},
		{"offsetof(flashattn_args_t, sinks)", unsafe.Offsetof(args.Sinks), uintptr(OffsetofArgsSinks)},
		{"offsetof(flashattn_args_t, dsinks)", unsafe.Offsetof(args.Dsinks), uintptr(OffsetofArgsDsinks)},
		{"offsetof(flashattn_args_t, cu_seqlens_q)", unsafe.Offsetof(args.CuSeqlensQ), uintptr(OffsetofArgsCuSeqlensQ)},
		{"offsetof(flashattn_args_t, cu_seqlens_k)", unsafe.Offsetof(args.CuSeqlensK), uintptr(OffsetofArgsCuSeqlensK)},
		{"offsetof(flashattn_args_t, max_seqlen_q)", unsafe.Offsetof(args.MaxSeqlenQ), uintptr(OffsetofArgsMaxSeqlenQ)},
		{"offsetof(flashattn_args_t, max_seqlen_k)", unsafe.Offsetof(args.MaxSeqlenK), uintptr(OffsetofArgsMaxSeqlenK)},
		{"offsetof(flashattn_args_t, cache_seqlens)", unsafe.Offsetof(args.CacheSeqlens), uintptr(OffsetofArgsCacheSeqlens)},
		{"offsetof(flashattn_args_t, block_table)", unsafe.Offsetof(args.BlockTable), uintptr(OffsetofArgsBlockTable)},
		{"offsetof(flashattn_args_t, k_new)", unsafe.Offsetof(args.KNew), uintptr(OffsetofArgsKNew)},
		{"offsetof(flashattn_args_t, v_new)", unsafe.Offsetof(args.VNew), uintptr(OffsetofArgsVNew)},
		{"offsetof(flashattn_args_t, rotary_cos)", unsafe.Offsetof(args.RotaryCos), uintptr(OffsetofArgsRotaryCos)},
		{"offsetof(flashattn_args_t, rotary_sin)", unsafe.Offsetof(args.RotarySin), uintptr(OffsetofArgsRotarySin)},
		{"offsetof(flashattn_args_t, rotary_interleaved)", unsafe.Offsetof(args.RotaryInterleaved), uintptr(OffsetofArgsRotaryInterleaved)},
		{"sizeof(flashattn_merge_args_t)", unsafe.Sizeof(merge), uintptr(SizeofMergeArgs)},
		{"offsetof(flashattn_merge_args_t, num_parts)", unsafe.Offsetof(merge.NumParts), uintptr(OffsetofMergeArgsNumParts)},
		{"offsetof(flashattn_merge_args_t, parts_out)", unsafe.Offsetof(merge.PartsOut), uintptr(OffsetofMergeArgsPartsOut)},
		{"offsetof(flashattn_merge_args_t, parts_out_stride)", unsafe.Offsetof(merge.PartsOutStride), uintptr(OffsetofMergeArgsPartsOutStride)},
		{"offsetof(flashattn_merge_args_t, parts_lse)", unsafe.Offsetof(merge.PartsLse), uintptr(OffsetofMergeArgsPartsLse)},
		{"offsetof(flashattn_merge_args_t, parts_lse_stride)", unsafe.Offsetof(merge.PartsLseStride), uintptr(OffsetofMergeArgsPartsLseStride)},
		{"offsetof(flashattn_merge_args_t, out)", unsafe.Offsetof(merge.Out), uintptr(OffsetofMergeArgsOut)},
		{"offsetof(flashattn_merge_args_t, lse)", unsafe.Offsetof(merge.Lse), uintptr(OffsetofMergeArgsLse)},
		{"sizeof(flashattn_cp_args_t)", unsafe.Sizeof(cp), uintptr(SizeofCpArgs)},
		{"offsetof(flashattn_cp_args_t, ranks)", unsafe.Offsetof(cp.Ranks), uintptr(OffsetofCpArgsRanks)},
		{"offsetof(flashattn_cp_args_t, rank)", unsafe.Offsetof(cp.Rank), uintptr(OffsetofCpArgsRank)},
		{"offsetof(flashattn_cp_args_t, layout)", unsafe.Offsetof(cp.Layout), uintptr(OffsetofCpArgsLayout)},
		{"offsetof(flashattn_cp_args_t, nccl_comm)", unsafe.Offsetof(cp.NcclComm), uintptr(OffsetofCpArgsNcclComm)},
		{"offsetof(flashattn_cp_args_t, exchange)", unsafe.Offsetof(cp.Exchange), uintptr(OffsetofCpArgsExchange)},
		{"offsetof(flashattn_cp_args_t, exchange_user)", unsafe.Offsetof(cp.ExchangeUser), uintptr(OffsetofCpArgsExchangeUser)},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: Go says %d, C says %d", c.what, c.got, c.want)
		}
	}
}

func TestFailingStatusIsAnErrorWithTheMessage(t *testing.T) {
	var buf Buffer
	err := Flashattn_buffer_create(&buf, 0, 16)
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("want an *Error, got %v", err)
	}
	if e.Status != Status(FLASHATTN_ERROR_INVALID_ARGUMENT) || e.Message != "flashattn_buffer_create: ctx is NULL" {
		t.Errorf("got %d %q", e.Status, e.Message)
	}
	if e.Error() != "FLASHATTN_ERROR_INVALID_ARGUMENT: flashattn_buffer_create: ctx is NULL" {
		t.Errorf("Error() = %q", e.Error())
	}
	if !errors.Is(err, &Error{Status: Status(FLASHATTN_ERROR_INVALID_ARGUMENT)}) {
		t.Error("errors.Is does not match the status")
	}
	if buf != 0 {
		t.Error("a failing call wrote its output")
	}
	// The thread-local message may be read again only on the same thread; the error kept it.
	if Flashattn_version_number()/10000 != uint(FLASHATTN_VERSION_MAJOR) {
		t.Error("header and library disagree on the major version")
	}
}

func TestBuffersRoundTrip(t *testing.T) {
	// The last-error check at the end reads this thread's message: stay on one thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var ctx Context
	if err := Flashattn_context_create(&ctx, Backend(FLASHATTN_BACKEND_CPU), 0); err != nil {
		t.Fatal(err)
	}
	defer Flashattn_context_destroy(ctx)
	var buf Buffer
	if err := Flashattn_buffer_create(&buf, ctx, 64); err != nil {
		t.Fatal(err)
	}
	defer Flashattn_buffer_destroy(buf)
	src := []byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
	if err := Flashattn_buffer_write(buf, 0, src); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, 16)
	if err := Flashattn_buffer_read(buf, 48, dst); err != nil || string(dst) != "0123456789abcdef" {
		t.Fatalf("read %q, %v", dst, err)
	}
	err := Flashattn_buffer_read(buf, 56, dst)
	if e, ok := err.(*Error); !ok || e.Message != "flashattn_buffer_read: offset 56 + bytes 16 exceeds the buffer's 64 bytes" {
		t.Errorf("got %v", err)
	}
	var size uint64
	var data uintptr
	if Flashattn_buffer_size(&size, buf) != nil || size != 64 || Flashattn_buffer_data(&data, buf) != nil || data%256 != 0 {
		t.Errorf("size %d, data %#x", size, data)
	}
	var view Tensor
	if err := Flashattn_tensor_4d(&view, data, DType(FLASHATTN_DTYPE_FLOAT16), 1, 2, 2, 8); err != nil {
		t.Fatal(err)
	}
	if view.Data != data || view.Rank != 4 || view.Shape != [4]int64{1, 2, 2, 8} || view.Strides != [4]int64{32, 16, 8, 1} {
		t.Errorf("tensor_4d gave %+v", view)
	}
	msg := make([]byte, 8)
	if n := Flashattn_last_error_r(msg); n != 0 || msg[0] != 0 {
		t.Errorf("last_error_r after a success: %d %q", n, msg)
	}
}

// The inits pass the size of the Go structs (the header's), and the _sized functions refuse a
// size below the first options struct's, writing nothing.
func TestInitsPassTheStructSize(t *testing.T) {
	o := Options{Window: 7}
	if err := Flashattn_options_init(&o); err != nil {
		t.Fatal(err)
	}
	if o.Size != uint64(SizeofOptions) || o.Window != 0 {
		t.Errorf("options after init: %+v", o)
	}
	var a Args
	if err := Flashattn_args_init(&a); err != nil {
		t.Fatal(err)
	}
	if a.Size != uint64(SizeofArgs) {
		t.Errorf("args after init: %+v", a)
	}
	o.Softcap = 2
	err := Flashattn_options_init_sized(&o, 8)
	var e *Error
	if !errors.As(err, &e) || e.Status != Status(FLASHATTN_ERROR_INVALID_ARGUMENT) || o.Softcap != 2 {
		t.Errorf("options_init_sized(8): %v, options %+v", err, o)
	}
}

func TestArgsBlockHoldsInitializedArgs(t *testing.T) {
	b, err := NewArgsBlock()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	a := b.Args()
	if a.Size != uint64(SizeofArgs) || a.Options != uintptr(unsafe.Pointer(b.Options())) || a.Q != 0 || a.MaxSeqlenQ != 0 ||
		a.CacheSeqlens != 0 || a.RotarySin != 0 || a.RotaryInterleaved != 0 {
		t.Errorf("args after init: %+v", *a)
	}
	if o := b.Options(); o.Size != uint64(SizeofOptions) || o.Window != 0 || o.Softcap != 0 {
		t.Errorf("options after init: %+v", *o)
	}
	tensor := Tensor{Data: 256, Dtype: DType(FLASHATTN_DTYPE_INT32), Rank: 1}
	b.SetTensor(ArgCuSeqlensK, &tensor)
	if a.CuSeqlensK == 0 || a.CuSeqlensQ != 0 {
		t.Error("SetTensor did not set exactly its field")
	}
	b.SetTensor(ArgCuSeqlensK, nil)
	if a.CuSeqlensK != 0 {
		t.Error("SetTensor(nil) left the field set")
	}
	// The last tensor field, the one next to the int64 that ends the struct.
	b.SetTensor(ArgRotarySin, &tensor)
	if a.RotarySin == 0 || a.RotaryCos != 0 || a.RotaryInterleaved != 0 {
		t.Error("SetTensor(ArgRotarySin) did not set exactly its field")
	}
	b.SetTensor(ArgRotarySin, nil)
	var ctx Context
	if err := Flashattn_context_create(&ctx, Backend(FLASHATTN_BACKEND_CPU), 0); err != nil {
		t.Fatal(err)
	}
	defer Flashattn_context_destroy(ctx)
	err = Flashattn_forward_ex(ctx, a, 0, 0)
	var e *Error
	if !errors.As(err, &e) || e.Status != Status(FLASHATTN_ERROR_INVALID_ARGUMENT) || e.Message != "flashattn_forward_ex: q is NULL" {
		t.Errorf("forward_ex without q: %v", err)
	}
	runtime.KeepAlive(b)
}

func TestMergeBlockHoldsInitializedArgs(t *testing.T) {
	b, err := NewMergeBlock()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	m := b.Args()
	if m.Size != uint64(SizeofMergeArgs) || m.NumParts != 0 || m.PartsOut != 0 || m.Lse != 0 {
		t.Errorf("merge args after init: %+v", *m)
	}
	tensor := Tensor{Data: 256, Dtype: DType(FLASHATTN_DTYPE_FLOAT32), Rank: 3}
	b.SetTensor(MergeLse, &tensor)
	if m.Lse == 0 || m.Out != 0 {
		t.Error("SetTensor did not set exactly its field")
	}
	b.SetTensor(MergeLse, nil)
	if m.Lse != 0 {
		t.Error("SetTensor(nil) left the field set")
	}
	var small MergeArgs
	var e *Error
	if err := Flashattn_merge_args_init_sized(&small, 8); !errors.As(err, &e) ||
		e.Status != Status(FLASHATTN_ERROR_INVALID_ARGUMENT) || small.Size != 0 {
		t.Errorf("merge_args_init_sized(8): %v, %+v", err, small)
	}
}
