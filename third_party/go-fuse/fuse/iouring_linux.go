// Copyright 2026 the Go-FUSE Authors. All rights reserved.
// Use of this source code is governed by a BSD-style
// license that can be found in the LICENSE file.

package fuse

import (
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// This file is the little of io_uring(7) that FUSE over io_uring needs:
// a ring with 128-byte submission entries (the FUSE commands live in the
// 80 bytes the kernel leaves for a driver's command), one submission at a
// time and a few completions. It is written against raw system calls of
// golang.org/x/sys/unix, which this module already depends on, rather
// than a Go io_uring library: the transport needs io_uring_setup, three
// mmaps and io_uring_enter, and a library would add a dependency (and a
// second view of the rings to keep in step with the kernel) for what is
// here about 200 lines. The layouts are those of include/uapi/linux/io_uring.h.

const (
	ioringSetupCQSize    = 1 << 3
	ioringSetupSubmitAll = 1 << 7
	ioringSetupSQE128    = 1 << 10

	ioringFeatSingleMmap = 1 << 0

	ioringEnterGetEvents = 1 << 0

	ioringOffSQRing = 0
	ioringOffCQRing = 0x8000000
	ioringOffSQEs   = 0x10000000

	ioringOpURingCmd = 46

	// sqe128Size is the size of one submission entry with
	// IORING_SETUP_SQE128; the command area starts at sqeCmdOff.
	sqe128Size = 128
	sqeCmdOff  = 48
	cqeSize    = 16
)

type ioSQRingOffsets struct {
	Head, Tail, RingMask, RingEntries, Flags, Dropped, Array, Resv1 uint32
	UserAddr                                                        uint64
}

type ioCQRingOffsets struct {
	Head, Tail, RingMask, RingEntries, Overflow, CQEs, Flags, Resv1 uint32
	UserAddr                                                        uint64
}

type ioURingParams struct {
	SQEntries, CQEntries, Flags, SQThreadCPU, SQThreadIdle, Features, WQFd uint32
	Resv                                                                   [3]uint32
	SQOff                                                                  ioSQRingOffsets
	CQOff                                                                  ioCQRingOffsets
}

// ioURing is one io_uring instance, used by one goroutine at a time.
type ioURing struct {
	fd int

	ringMem []byte // SQ and CQ rings (one mapping with IORING_FEAT_SINGLE_MMAP)
	cqMem   []byte // the CQ ring when it is mapped apart
	sqeMem  []byte

	sqHead, sqTail, sqMask *uint32
	sqArray                unsafe.Pointer
	sqEntries              uint32
	sqPending              uint32 // entries written since the last submission

	cqHead, cqTail, cqMask *uint32
	cqes                   unsafe.Pointer
}

// newIOURing sets up a ring of sqEntries submission and cqEntries
// completion entries, each submission entry 128 bytes.
func newIOURing(sqEntries, cqEntries uint32) (*ioURing, error) {
	p := ioURingParams{
		Flags:     ioringSetupSQE128 | ioringSetupCQSize | ioringSetupSubmitAll,
		CQEntries: cqEntries,
	}
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(sqEntries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	r := &ioURing{fd: int(fd), sqEntries: p.SQEntries}
	if err := r.mmap(&p); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *ioURing) mmap(p *ioURingParams) error {
	sqSize := int(p.SQOff.Array) + int(p.SQEntries)*4
	cqSize := int(p.CQOff.CQEs) + int(p.CQEntries)*cqeSize
	single := p.Features&ioringFeatSingleMmap != 0
	if single {
		sqSize = max(sqSize, cqSize)
	}
	var err error
	r.ringMem, err = unix.Mmap(r.fd, ioringOffSQRing, sqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("io_uring mmap sq ring: %w", err)
	}
	cq := r.ringMem
	if !single {
		r.cqMem, err = unix.Mmap(r.fd, ioringOffCQRing, cqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
		if err != nil {
			return fmt.Errorf("io_uring mmap cq ring: %w", err)
		}
		cq = r.cqMem
	}
	r.sqeMem, err = unix.Mmap(r.fd, ioringOffSQEs, int(p.SQEntries)*sqe128Size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("io_uring mmap sqes: %w", err)
	}
	sq := unsafe.Pointer(&r.ringMem[0])
	r.sqHead = (*uint32)(unsafe.Add(sq, p.SQOff.Head))
	r.sqTail = (*uint32)(unsafe.Add(sq, p.SQOff.Tail))
	r.sqMask = (*uint32)(unsafe.Add(sq, p.SQOff.RingMask))
	r.sqArray = unsafe.Add(sq, p.SQOff.Array)
	cqp := unsafe.Pointer(&cq[0])
	r.cqHead = (*uint32)(unsafe.Add(cqp, p.CQOff.Head))
	r.cqTail = (*uint32)(unsafe.Add(cqp, p.CQOff.Tail))
	r.cqMask = (*uint32)(unsafe.Add(cqp, p.CQOff.RingMask))
	r.cqes = unsafe.Add(cqp, p.CQOff.CQEs)
	return nil
}

func (r *ioURing) close() {
	for _, m := range [][]byte{r.sqeMem, r.cqMem, r.ringMem} {
		if m != nil {
			unix.Munmap(m)
		}
	}
	r.sqeMem, r.cqMem, r.ringMem = nil, nil, nil
	if r.fd >= 0 {
		syscall.Close(r.fd)
		r.fd = -1
	}
}

var errSQFull = errors.New("io_uring submission queue full")

// getSQE returns the next free submission entry, zeroed, to be filled in
// and then counted by a submit.
func (r *ioURing) getSQE() ([]byte, error) {
	head := atomic.LoadUint32(r.sqHead)
	tail := *r.sqTail + r.sqPending
	if tail-head >= r.sqEntries {
		return nil, errSQFull
	}
	idx := tail & *r.sqMask
	sqe := r.sqeMem[int(idx)*sqe128Size : int(idx+1)*sqe128Size]
	clear(sqe)
	*(*uint32)(unsafe.Add(r.sqArray, 4*idx)) = idx
	r.sqPending++
	return sqe, nil
}

// enter publishes the entries written since the last call and submits
// them, then, when wait, waits until a completion is there. The error is
// the kernel's (EINTR, EAGAIN, EBUSY, ...); entries it took are not
// submitted again.
func (r *ioURing) enter(wait bool) error {
	if r.sqPending > 0 {
		atomic.StoreUint32(r.sqTail, *r.sqTail+r.sqPending)
		r.sqPending = 0
	}
	for {
		toSubmit := *r.sqTail - atomic.LoadUint32(r.sqHead)
		var minComplete, flags uintptr
		if wait {
			minComplete, flags = 1, ioringEnterGetEvents
		}
		n, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(toSubmit), minComplete, flags, 0, 0)
		if errno != 0 {
			return errno
		}
		if uint32(n) >= toSubmit || !wait {
			return nil
		}
		// Only a part was taken: submit the rest before waiting.
	}
}

// cqe is one completion: what the SQE's user_data said, and its result.
type cqe struct {
	userData uint64
	res      int32
	flags    uint32
}

// peek returns the oldest completion without consuming it.
func (r *ioURing) peek() (cqe, bool) {
	head := *r.cqHead
	if head == atomic.LoadUint32(r.cqTail) {
		return cqe{}, false
	}
	c := *(*cqe)(unsafe.Add(r.cqes, uintptr(head&*r.cqMask)*cqeSize))
	return c, true
}

// advance consumes the completion peek returned.
func (r *ioURing) advance() {
	atomic.StoreUint32(r.cqHead, *r.cqHead+1)
}
