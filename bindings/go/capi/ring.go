package capi

// #include <stddef.h>
// int flashattn_go_exchange(void *user, const void *send, void *recv, size_t bytes);
import "C"

import (
	"runtime/cgo"
	"unsafe"
)

// ExchangeFunc is a Go exchange for CpArgs: it sends send to rank + 1 and fills recv (of the
// same length, host memory of the library's workspace, valid only during the call) from
// rank - 1, returning nil once both are done.
type ExchangeFunc func(send, recv []byte) error

// ExchangeCall is one use of an ExchangeFunc as CpArgs' exchange: NewExchangeCall sets
// cp.Exchange and cp.ExchangeUser; Close releases the handle after the call and gives the first
// error the function returned (or the panic it raised, as an error).
type ExchangeCall struct {
	handle cgo.Handle
	state  *exchangeState
}

type exchangeState struct {
	fn  ExchangeFunc
	err error
}

// NewExchangeCall points cp's exchange at fn for the calls until Close.
func NewExchangeCall(cp *CpArgs, fn ExchangeFunc) *ExchangeCall {
	s := &exchangeState{fn: fn}
	h := cgo.NewHandle(s)
	cp.Exchange = uintptr(unsafe.Pointer(C.flashattn_go_exchange))
	cp.ExchangeUser = uintptr(h)
	return &ExchangeCall{handle: h, state: s}
}

// Close releases the handle; the error is the exchange's first failure, if any.
func (e *ExchangeCall) Close() error {
	e.handle.Delete()
	return e.state.err
}

//export flashattnGoExchange
func flashattnGoExchange(user unsafe.Pointer, send, recv unsafe.Pointer, bytes C.size_t) (status C.int) {
	s := cgo.Handle(uintptr(user)).Value().(*exchangeState)
	defer func() {
		if p := recover(); p != nil {
			if s.err == nil {
				s.err = &Error{Status: Status(FLASHATTN_ERROR_DEVICE), Message: "the exchange panicked: " + panicText(p)}
			}
			status = 1
		}
	}()
	n := int(bytes)
	if err := s.fn(unsafe.Slice((*byte)(send), n), unsafe.Slice((*byte)(recv), n)); err != nil {
		if s.err == nil {
			s.err = err
		}
		return 1
	}
	return 0
}

func panicText(p any) string {
	if e, ok := p.(error); ok {
		return e.Error()
	}
	if s, ok := p.(string); ok {
		return s
	}
	return "a value of another type"
}
