package fuse

import (
	"testing"
	"unsafe"
)

// TestIoUringEarlyInterrupt (patch 4 of PATCHES.md): an INTERRUPT that
// arrives before its request reached a handler cancels the request when
// it does, since for requests that came through io_uring the kernel
// cannot send it again; the kept interrupts are bounded.
func TestIoUringEarlyInterrupt(t *testing.T) {
	newReq := func(unique uint64) *request {
		r := &request{cancel: make(chan struct{}), inputBuf: make([]byte, unsafe.Sizeof(InHeader{}))}
		r.inHeader().Unique = unique
		return r
	}
	cancelled := func(r *request) bool {
		select {
		case <-r.cancel:
			return true
		default:
			return false
		}
	}
	for _, uring := range []bool{false, true} {
		ms := &protocolServer{rememberEarlyInterrupts: uring}
		if st := ms.interruptRequest(42); st != EAGAIN {
			t.Fatalf("interrupt of an unknown request: %v, want EAGAIN (so that the kernel of /dev/fuse sends it again)", st)
		}
		other, early := newReq(40), newReq(42)
		ms.addInflight(other)
		ms.addInflight(early)
		if cancelled(other) {
			t.Error("a request that no interrupt named was cancelled")
		}
		if cancelled(early) != uring || early.interrupted != uring {
			t.Errorf("io_uring %v: request named by an earlier interrupt cancelled %v, want %v", uring, cancelled(early), uring)
		}
		ms.dropInflight(early)
		ms.dropInflight(other)
		// An interrupt of a request in flight cancels it at once.
		late := newReq(44)
		ms.addInflight(late)
		if st := ms.interruptRequest(44); st != OK || !cancelled(late) {
			t.Errorf("interrupt of a request in flight: %v, cancelled %v", st, cancelled(late))
		}
		ms.dropInflight(late)
	}
	ms := &protocolServer{rememberEarlyInterrupts: true}
	for u := uint64(1); u < 10*maxEarlyInterrupts; u++ {
		ms.interruptRequest(2 * u)
	}
	if len(ms.earlyInterrupts) > maxEarlyInterrupts {
		t.Errorf("%d early interrupts kept, want at most %d", len(ms.earlyInterrupts), maxEarlyInterrupts)
	}
}
