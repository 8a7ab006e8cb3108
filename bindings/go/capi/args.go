package capi

// #include <stdlib.h>
import "C"

import "unsafe"

// Args is flashattn_args_t; fill it with Flashattn_args_init. Its pointer fields are C
// addresses (0 is NULL): memory handed to C may hold no Go pointer, so an Args passed to the
// _ex functions, and the Options and Tensors it points to, live in C memory (ArgsBlock).
type Args struct {
	Size                   uint64
	Options                uintptr
	Q, K, V, Out, Lse      uintptr
	Dout, Dq, Dk, Dv       uintptr
	AlibiSlopes, Sinks     uintptr
	Dsinks                 uintptr
	CuSeqlensQ, CuSeqlensK uintptr
	MaxSeqlenQ, MaxSeqlenK int64
	// Added with the KV cache (forward only).
	CacheSeqlens, BlockTable uintptr
	KNew, VNew               uintptr
	RotaryCos, RotarySin     uintptr
	RotaryInterleaved        int64
}

// Flashattn_args_init fills a with the defaults, Size included: C's flashattn_args_init(&a)
// macro, flashattn_args_init_sized with the size of Args (the header's flashattn_args_t, as
// capi_test.go checks).
func Flashattn_args_init(a *Args) error {
	return Flashattn_args_init_sized(a, int64(unsafe.Sizeof(Args{})))
}

// ArgTensor names a tensor field of Args.
type ArgTensor int

const (
	ArgQ ArgTensor = iota
	ArgK
	ArgV
	ArgOut
	ArgLse
	ArgDout
	ArgDq
	ArgDk
	ArgDv
	ArgAlibiSlopes
	ArgSinks
	ArgDsinks
	ArgCuSeqlensQ
	ArgCuSeqlensK
	ArgCacheSeqlens
	ArgBlockTable
	ArgKNew
	ArgVNew
	ArgRotaryCos
	ArgRotarySin
	NumArgTensors
)

func (a *Args) field(f ArgTensor) *uintptr {
	return [...]*uintptr{&a.Q, &a.K, &a.V, &a.Out, &a.Lse, &a.Dout, &a.Dq, &a.Dk, &a.Dv,
		&a.AlibiSlopes, &a.Sinks, &a.Dsinks, &a.CuSeqlensQ, &a.CuSeqlensK, &a.CacheSeqlens,
		&a.BlockTable, &a.KNew, &a.VNew, &a.RotaryCos, &a.RotarySin}[f]
}

// OptionsStorage is the number of zero-filled bytes an ArgsBlock's options start: the largest
// size a caller's struct may claim, so that an Options whose Size claims more than this
// library's struct reads defined memory.
const OptionsStorage = 4096

type argsBlockLayout struct {
	args    Args
	tensors [NumArgTensors]Tensor
	options [OptionsStorage / 8]uint64
}

// ArgsBlock is one allocation of C memory holding an Args, a Tensor for each of its tensor
// fields and the Options it points to. Free releases it.
type ArgsBlock struct {
	mem *argsBlockLayout
}

// NewArgsBlock allocates a block: its Args from Flashattn_args_init, pointing at its Options
// from Flashattn_options_init, every tensor field NULL.
func NewArgsBlock() (*ArgsBlock, error) {
	mem := C.calloc(1, C.size_t(unsafe.Sizeof(argsBlockLayout{})))
	if mem == nil {
		return nil, &Error{Status: Status(FLASHATTN_ERROR_OUT_OF_MEMORY), Message: "cannot allocate an ArgsBlock"}
	}
	b := &ArgsBlock{mem: (*argsBlockLayout)(mem)}
	if err := Flashattn_args_init(&b.mem.args); err != nil {
		b.Free()
		return nil, err
	}
	if err := Flashattn_options_init(b.Options()); err != nil {
		b.Free()
		return nil, err
	}
	b.mem.args.Options = uintptr(unsafe.Pointer(b.Options()))
	return b, nil
}

// Args is the block's flashattn_args_t, to pass to the _ex functions.
func (b *ArgsBlock) Args() *Args { return &b.mem.args }

// Options is the block's options struct, the one Args points to (unless Args().Options is
// changed).
func (b *ArgsBlock) Options() *Options { return (*Options)(unsafe.Pointer(&b.mem.options[0])) }

// OptionsBytes are the OptionsStorage bytes the options start.
func (b *ArgsBlock) OptionsBytes() []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(&b.mem.options[0])), OptionsStorage)
}

// SetTensor copies *t into the block and points field f at the copy; nil makes the field NULL.
func (b *ArgsBlock) SetTensor(f ArgTensor, t *Tensor) {
	if t == nil {
		*b.mem.args.field(f) = 0
		return
	}
	b.mem.tensors[f] = *t
	*b.mem.args.field(f) = uintptr(unsafe.Pointer(&b.mem.tensors[f]))
}

// Free releases the block; freeing twice is a no-op.
func (b *ArgsBlock) Free() {
	if b.mem != nil {
		C.free(unsafe.Pointer(b.mem))
		b.mem = nil
	}
}

// MergeArgs is flashattn_merge_args_t; fill it with Flashattn_merge_args_init. Like Args it
// holds C addresses (0 is NULL) and lives in C memory when passed (MergeBlock).
type MergeArgs struct {
	Size           uint64
	NumParts       int64
	PartsOut       uintptr
	PartsOutStride int64
	PartsLse       uintptr
	PartsLseStride int64
	Out, Lse       uintptr
}

// Flashattn_merge_args_init fills m with the defaults, Size included: C's
// flashattn_merge_args_init(&m) macro, flashattn_merge_args_init_sized with the size of
// MergeArgs.
func Flashattn_merge_args_init(m *MergeArgs) error {
	return Flashattn_merge_args_init_sized(m, int64(unsafe.Sizeof(MergeArgs{})))
}

// CpArgs is flashattn_cp_args_t; fill it with Flashattn_cp_args_init. It holds no Go pointer
// (NcclComm is a C address, an ncclComm_t), so it may live in Go memory. Exchange, a C function
// pointer, stays 0: no Go function can be one.
type CpArgs struct {
	Size         uint64
	Ranks        int64
	Rank         int64
	Layout       int64
	NcclComm     uintptr
	Exchange     uintptr
	ExchangeUser uintptr
}

// Flashattn_cp_args_init fills cp with the defaults, Size included: C's
// flashattn_cp_args_init(&cp) macro, flashattn_cp_args_init_sized with the size of CpArgs.
func Flashattn_cp_args_init(cp *CpArgs) error {
	return Flashattn_cp_args_init_sized(cp, int64(unsafe.Sizeof(CpArgs{})))
}

// MergeTensor names a tensor field of MergeArgs.
type MergeTensor int

const (
	MergePartsOut MergeTensor = iota
	MergePartsLse
	MergeOut
	MergeLse
	NumMergeTensors
)

func (m *MergeArgs) field(f MergeTensor) *uintptr {
	return [...]*uintptr{&m.PartsOut, &m.PartsLse, &m.Out, &m.Lse}[f]
}

type mergeBlockLayout struct {
	args    MergeArgs
	tensors [NumMergeTensors]Tensor
}

// MergeBlock is one allocation of C memory holding a MergeArgs and a Tensor for each of its
// tensor fields. Free releases it.
type MergeBlock struct {
	mem *mergeBlockLayout
}

// NewMergeBlock allocates a block, its MergeArgs from Flashattn_merge_args_init, every tensor
// field NULL.
func NewMergeBlock() (*MergeBlock, error) {
	mem := C.calloc(1, C.size_t(unsafe.Sizeof(mergeBlockLayout{})))
	if mem == nil {
		return nil, &Error{Status: Status(FLASHATTN_ERROR_OUT_OF_MEMORY), Message: "cannot allocate a MergeBlock"}
	}
	b := &MergeBlock{mem: (*mergeBlockLayout)(mem)}
	if err := Flashattn_merge_args_init(&b.mem.args); err != nil {
		b.Free()
		return nil, err
	}
	return b, nil
}

// Args is the block's flashattn_merge_args_t, to pass to Flashattn_merge.
func (b *MergeBlock) Args() *MergeArgs { return &b.mem.args }

// SetTensor copies *t into the block and points field f at the copy; nil makes the field NULL.
func (b *MergeBlock) SetTensor(f MergeTensor, t *Tensor) {
	if t == nil {
		*b.mem.args.field(f) = 0
		return
	}
	b.mem.tensors[f] = *t
	*b.mem.args.field(f) = uintptr(unsafe.Pointer(&b.mem.tensors[f]))
}

// Free releases the block; freeing twice is a no-op.
func (b *MergeBlock) Free() {
	if b.mem != nil {
		C.free(unsafe.Pointer(b.mem))
		b.mem = nil
	}
}
