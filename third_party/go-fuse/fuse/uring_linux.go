// Copyright 2026 the Go-FUSE Authors. All rights reserved.
// Use of this source code is governed by a BSD-style
// license that can be found in the LICENSE file.

package fuse

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// FUSE over io_uring (Linux 6.14+, protocol 7.42; the kernel's
// fs/fuse/dev_uring.c and Documentation/filesystems/fuse/fuse-io-uring.rst).
//
// The kernel keeps one queue of requests per possible CPU and hands a
// request to the queue of the CPU its caller runs on. A server registers
// ring entries with a queue (FUSE_IO_URING_CMD_REGISTER, an io_uring
// command on /dev/fuse): each entry is a header buffer (struct
// fuse_uring_req_header) and a payload buffer of at least max_write.
// The kernel copies a request into an available entry and completes the
// command; the server answers in the same buffers and sends
// FUSE_IO_URING_CMD_COMMIT_AND_FETCH, which delivers the reply and makes
// the entry available again. Until every queue has an entry, requests
// still come through /dev/fuse; FORGET, INTERRUPT and notifications
// always do, so the /dev/fuse readers of the classic transport keep
// running beside the rings.
//
// How this server uses it: every ring entry belongs to a worker, a
// goroutine locked to its own OS thread with an io_uring instance of its
// own. A worker submits its entry's command and waits for the next
// request in one io_uring_enter, handles the request itself, and sends
// the reply and waits again in the next io_uring_enter: one system call
// per request, and the thread that the request wakes is the thread that
// answers it. The kernel hands a request to the entry made available
// last, so with one caller at a time one worker of a queue does all the
// work while the others sleep.
//
// A handler may block for as long as it likes (a read that waits for
// data): when a worker takes a request and leaves its queue with no
// entry available, it starts another worker for that queue, up to
// MountOptions.MaxRingWorkers in all, so that a blocked handler never
// stalls the requests behind it. Workers are never stopped: the kernel
// has no way to take an entry back, and an entry whose worker stopped
// could be handed a request that nobody would ever answer.
//
// A request that comes while its queue has no entry available waits in
// the kernel, and the kernel hands it out only to an entry that sends a
// COMMIT_AND_FETCH: a newly registered entry gets only requests that come
// after it. When every entry is held by a handler that waits (a burst
// of readers waiting for data), the requests queued behind them would
// wait with them. So a worker started because its queue ran dry kicks
// the queue once registered: from a thread moved to the queue's CPU, it
// writes a NOTIFY_RETRIEVE of no bytes of a regular file, which the
// kernel answers with a NOTIFY_REPLY request filed with that queue. The
// entry that gets it commits it at once, and that commit fetches the
// oldest request held back. If that one waits too, its worker starts
// another, which kicks again, until the queue is empty or MaxRingWorkers
// is reached. The kernel retrieves only from a regular file it has in
// its inode cache; the kick names the file of the READ or WRITE taken
// last, which a request that waits in a READ keeps open.
//
// Why a worker is locked to its thread from the submission of its
// entry's command until the request comes: the kernel copies a request
// into an entry in the context of the thread that submitted the entry's
// last command (an io_uring "task work"), and that thread must get to
// run. A Go goroutine moves between threads, and any thread of the
// process might by then be asleep in the kernel waiting for the FUSE
// connection itself, above all the one in the server's own umount(2),
// which waits until every entry is back: that entry would never be
// filled, and umount never returns. Locked, the thread does nothing but
// wait in io_uring_enter for that entry. Once the request is there the
// entry is the worker's, no task work can come for it, and the handler
// runs unlocked: a handler that blocks holds a goroutine, not a thread.

const (
	fuseURingCmdRegister       = 1
	fuseURingCmdCommitAndFetch = 2

	// struct fuse_uring_req_header: in_out (the fuse_in_header of a
	// request, the fuse_out_header of a reply), op_in (the first
	// argument of the request, its opcode's struct), ring_ent_in_out.
	uringHdrInOut     = 0
	uringHdrOpIn      = 128
	uringHdrOpInSize  = 128
	uringHdrEntInOut  = 256
	uringReqHeaderLen = 288

	// Where in the header page a worker keeps the iovecs of its
	// REGISTER (read by the kernel when the command is issued).
	uringIovOff = 512

	// Struct fuse_uring_cmd_req in the SQE's command area.
	uringCmdCommitID = 8
	uringCmdQID      = 16

	// userData of the ring's one kind of submission.
	uringUserData = 0xf05e

	// Default of MountOptions.MaxRingWorkers per queue.
	defaultRingWorkersPerQueue = 16
)

// uringEntInOut is struct fuse_uring_ent_in_out.
type uringEntInOut struct {
	Flags     uint64
	CommitID  uint64
	PayloadSz uint32
	Padding   uint32
	Reserved  uint64
}

func ioUringUnsupported(o *MountOptions) string {
	if unsafe.Sizeof(uintptr(0)) < 8 && o.Transport == TransportAuto {
		// Each entry maps max_write of address space; a 32-bit
		// process runs out of it long before a 64-bit one notices.
		return "32-bit process: auto keeps to /dev/fuse (ask for transport uring to use io_uring)"
	}
	return ""
}

// ringPool is the set of workers serving the io_uring queues.
type ringPool struct {
	ms          *Server
	fuseFD      int
	nqueues     int
	payloadSize int
	pageSize    int
	maxWorkers  int

	mu      sync.Mutex
	idle    []int // per queue: workers whose entry the kernel may fill
	total   int   // workers started, in all queues
	stopped bool
	wg      sync.WaitGroup

	// first holds one worker per queue, set up by newRingPool (so that
	// a failure is known before serving) and started by start.
	first []*ringWorker

	logOnce sync.Once

	served   atomic.Uint64
	kicks    atomic.Uint64
	fileNode atomic.Uint64 // of the READ or WRITE taken last
	kickLog  sync.Once
}

func (p *ringPool) counts() (workers int, served uint64) {
	p.mu.Lock()
	workers = p.total
	p.mu.Unlock()
	return workers, p.served.Load()
}

// newRingPool sets up one worker per queue (the least the kernel needs
// before it sends requests through the rings), not yet registered.
func newRingPool(ms *Server) (*ringPool, error) {
	if maxInputSize > unsafe.Sizeof(InHeader{})+uringHdrOpInSize {
		return nil, fmt.Errorf("an opcode's struct (%d bytes) is larger than a ring entry's", maxInputSize-unsafe.Sizeof(InHeader{}))
	}
	n, err := possibleCPUs()
	if err != nil {
		return nil, err
	}
	var fd int
	if err := ms.fuseFD.withFD(func(f int) { fd = f }); err != nil {
		return nil, err
	}
	p := &ringPool{
		ms:       ms,
		fuseFD:   fd,
		nqueues:  n,
		pageSize: syscall.Getpagesize(),
		idle:     make([]int, n),
	}
	p.payloadSize = p.ringPayloadSize()
	p.maxWorkers = ms.opts.MaxRingWorkers
	if p.maxWorkers <= 0 {
		p.maxWorkers = defaultRingWorkersPerQueue * n
	}
	p.maxWorkers = max(p.maxWorkers, 2*n)
	for q := 0; q < n; q++ {
		w, err := p.newWorker(q)
		if err != nil {
			for _, w := range p.first {
				w.release()
			}
			return nil, err
		}
		p.first = append(p.first, w)
	}
	p.total = n
	ms.rememberEarlyInterrupts = true
	return p, nil
}

// ringPayloadSize is the kernel's least payload buffer for the
// negotiated sizes: max(FUSE_MIN_READ_BUFFER, max_write,
// max_pages*PAGE_SIZE) (fuse_uring_create).
func (p *ringPool) ringPayloadSize() int {
	maxPages := 32 // FUSE_DEFAULT_MAX_PAGES_PER_REQ
	if p.ms.negotiatedFlags&CAP_MAX_PAGES != 0 {
		maxPages = (p.ms.opts.MaxWrite-1)/p.pageSize + 1
	}
	size := max(_FUSE_MIN_READ_BUFFER, p.ms.opts.MaxWrite, maxPages*p.pageSize)
	return (size + p.pageSize - 1) / p.pageSize * p.pageSize
}

// possibleCPUs is the kernel's num_possible_cpus(): its number of
// queues, each of which needs an entry.
func possibleCPUs() (int, error) {
	b, err := os.ReadFile("/sys/devices/system/cpu/possible")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range strings.Split(strings.TrimSpace(string(b)), ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return 0, fmt.Errorf("parse /sys/devices/system/cpu/possible %q: %w", b, err)
		}
		c := a
		if isRange {
			if c, err = strconv.Atoi(hi); err != nil {
				return 0, fmt.Errorf("parse /sys/devices/system/cpu/possible %q: %w", b, err)
			}
		}
		n += c - a + 1
	}
	if n <= 0 {
		return 0, fmt.Errorf("no CPUs in /sys/devices/system/cpu/possible (%q)", b)
	}
	return n, nil
}

// start starts the first workers.
func (p *ringPool) start() {
	p.mu.Lock()
	for _, w := range p.first {
		p.idle[w.qid]++
		p.wg.Add(1)
		go w.run()
	}
	p.first = nil
	p.mu.Unlock()
}

// wait waits for every worker to stop.
func (p *ringPool) wait() { p.wg.Wait() }

// took notes that a worker of queue q took a request, and starts
// another one when no entry of q is left for the next request.
func (p *ringPool) took(q int, op uint32, node uint64) {
	if op == _OP_READ || op == _OP_WRITE {
		p.fileNode.Store(node)
	}
	p.mu.Lock()
	p.idle[q]--
	grow := p.idle[q] <= 0 && p.total < p.maxWorkers && !p.stopped
	if grow {
		p.idle[q]++ // counted now, so that no one else grows q for it
		p.total++
		p.wg.Add(1)
	}
	full := p.idle[q] <= 0 && p.total >= p.maxWorkers
	p.mu.Unlock()
	if grow {
		go p.grow(q, p.fileNode.Load())
	}
	if full {
		p.logOnce.Do(func() {
			p.ms.opts.Logger.Printf("fuse: all %d io_uring workers are busy; requests of a busy CPU wait for one (MountOptions.MaxRingWorkers)", p.maxWorkers)
		})
	}
}

// released notes that a worker of queue q is about to give its entry
// back to the kernel.
func (p *ringPool) released(q int) {
	p.mu.Lock()
	p.idle[q]++
	p.mu.Unlock()
}

func (p *ringPool) grow(q int, kickNode uint64) {
	w, err := p.newWorker(q)
	if err != nil {
		p.ms.opts.Logger.Printf("fuse: start an io_uring worker for queue %d: %v", q, err)
		p.mu.Lock()
		p.idle[q]--
		p.total--
		p.mu.Unlock()
		p.wg.Done()
		return
	}
	w.kickNode = kickNode
	w.run()
}

// stop notes that the connection is gone: no more workers.
func (p *ringPool) stop() {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
}

// ringWorker owns one ring entry of one queue and the io_uring through
// which it submits the entry's commands.
type ringWorker struct {
	pool *ringPool
	qid  int
	ring *ioURing

	mem     []byte // the header page, then the payload
	hdr     []byte
	payload []byte

	// cmd is the command to submit next, commitID the request the
	// reply in the buffers answers.
	cmd      uint32
	commitID uint64

	// kickNode: once registered, have the kernel hand out a request it
	// held back, with a retrieve of this file (see the top of this
	// file); 0: no kick.
	kickNode uint64
}

func (p *ringPool) newWorker(q int) (*ringWorker, error) {
	ring, err := newIOURing(2, 4)
	if err != nil {
		return nil, err
	}
	mem, err := unix.Mmap(-1, 0, p.pageSize+p.payloadSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		ring.close()
		return nil, fmt.Errorf("mmap ring entry: %w", err)
	}
	w := &ringWorker{
		pool: p, qid: q, ring: ring, mem: mem,
		hdr:     mem[:p.pageSize],
		payload: mem[p.pageSize:],
		cmd:     fuseURingCmdRegister,
	}
	iov := (*[2]unix.Iovec)(unsafe.Pointer(&w.hdr[uringIovOff]))
	iov[0].Base = &w.hdr[0]
	iov[0].SetLen(uringReqHeaderLen)
	iov[1].Base = &w.payload[0]
	iov[1].SetLen(len(w.payload))
	return w, nil
}

// release gives back a worker's ring and buffers. Only for an entry the
// kernel has not been given or has let go of (the connection ended).
func (w *ringWorker) release() {
	w.ring.close()
	unix.Munmap(w.mem)
}

// prep writes the worker's next command into a submission entry.
func (w *ringWorker) prep() error {
	sqe, err := w.ring.getSQE()
	if err != nil {
		return err
	}
	sqe[0] = ioringOpURingCmd
	*(*int32)(unsafe.Pointer(&sqe[4])) = int32(w.pool.fuseFD)
	*(*uint32)(unsafe.Pointer(&sqe[8])) = w.cmd // cmd_op
	*(*uint64)(unsafe.Pointer(&sqe[32])) = uringUserData
	cmd := sqe[sqeCmdOff:]
	if w.cmd == fuseURingCmdRegister {
		*(*uint64)(unsafe.Pointer(&sqe[16])) = uint64(uintptr(unsafe.Pointer(&w.hdr[uringIovOff])))
		*(*uint32)(unsafe.Pointer(&sqe[24])) = 2
	} else {
		*(*uint64)(unsafe.Pointer(&cmd[uringCmdCommitID])) = w.commitID
	}
	*(*uint16)(unsafe.Pointer(&cmd[uringCmdQID])) = uint16(w.qid)
	return nil
}

// run serves requests until the connection ends. It is locked to its
// thread while its entry is the kernel's (see the top of this file); it
// returns locked, so that the thread, which io_uring knows, ends with it.
func (w *ringWorker) run() {
	p := w.pool
	defer p.wg.Done()
	logger := p.ms.opts.Logger
	submit, locked := true, false
	for {
		if submit {
			if !locked {
				runtime.LockOSThread()
				locked = true
			}
			if err := w.prep(); err != nil {
				logger.Printf("fuse: io_uring queue %d: %v", w.qid, err)
				return
			}
			submit = false
			if w.kickNode != 0 && w.cmd == fuseURingCmdRegister {
				// The entry must be registered before the kick.
				if err := w.ring.enter(false); err == nil {
					p.kick(w.qid, w.kickNode)
					w.kickNode = 0
				}
			}
		}
		switch err := w.ring.enter(true); err {
		case nil, syscall.EINTR:
		case syscall.EAGAIN, syscall.EBUSY:
			time.Sleep(time.Millisecond)
		default:
			// Not expected. The worker stops; its entry's command,
			// if the kernel has it, is cancelled with the ring, and
			// the buffers stay mapped in case the kernel is filling
			// them meanwhile.
			logger.Printf("fuse: io_uring queue %d: io_uring_enter: %v", w.qid, err)
			p.workerGone(w.qid)
			w.ring.close()
			return
		}
		c, ok := w.ring.peek()
		if !ok {
			continue
		}
		w.ring.advance()
		if c.res < 0 {
			switch errno := syscall.Errno(-c.res); errno {
			case syscall.EAGAIN, syscall.EINTR:
				// REGISTER before INIT was answered, or an
				// interrupted submission: again.
				time.Sleep(time.Millisecond)
				submit = true
				continue
			case syscall.ENOTCONN, syscall.ECONNABORTED, syscall.ENODEV, syscall.ECANCELED:
				// Unmounted or aborted: the kernel has let go
				// of the entry.
				p.stop()
				p.workerGone(w.qid)
				w.release()
				return
			default:
				if w.cmd == fuseURingCmdRegister {
					logger.Printf("fuse: io_uring queue %d: register: %v", w.qid, errno)
					p.workerGone(w.qid)
					w.release()
					return
				}
				// The reply was refused (and the kernel ended
				// its request with an error); the kernel keeps
				// the entry as in use, so register the buffers
				// as a new one.
				logger.Printf("fuse: io_uring queue %d: commit of request %d: %v", w.qid, w.commitID, errno)
				w.cmd = fuseURingCmdRegister
				submit = true
				continue
			}
		}
		runtime.UnlockOSThread()
		locked = false
		ih := (*InHeader)(unsafe.Pointer(&w.hdr[uringHdrInOut]))
		p.took(w.qid, ih.Opcode, ih.NodeId)
		p.served.Add(1)
		w.serve()
		p.released(w.qid)
		w.cmd = fuseURingCmdCommitAndFetch
		submit = true
	}
}

// kick makes the kernel hand out a request it holds back for queue q, if
// any: see the top of this file. It runs on a locked worker thread.
func (p *ringPool) kick(q int, node uint64) {
	var was, cpu unix.CPUSet
	if err := unix.SchedGetaffinity(0, &was); err != nil {
		p.ms.opts.Logger.Printf("fuse: io_uring queue %d: kick: %v", q, err)
		return
	}
	cpu.Set(q)
	if err := unix.SchedSetaffinity(0, &cpu); err != nil {
		// Not allowed on that CPU (a cpuset): nothing of ours runs
		// there, and requests held back wait for the next commit.
		p.ms.opts.Logger.Printf("fuse: io_uring queue %d: kick from CPU %d: %v", q, q, err)
		return
	}
	defer unix.SchedSetaffinity(0, &was)
	unique := ringKickBit | p.kicks.Add(1)<<1
	req := newNotifyRequest(_OP_NOTIFY_RETRIEVE_CACHE)
	out := (*NotifyRetrieveOut)(req.outData())
	out.NotifyUnique, out.Nodeid = unique, node // no bytes: Offset 0, Size 0
	if st := p.ms.notifyWrite(req); !st.Ok() && st != ENODEV && st != ENOENT {
		// ENOENT: the file is out of the kernel's cache, and so
		// nothing waits in a read of it.
		p.kickLog.Do(func() {
			p.ms.opts.Logger.Printf("fuse: io_uring queue %d: kick with a retrieve of node %d: %v", q, node, st)
		})
	}
}

// workerGone takes a stopped worker out of the counts.
func (p *ringPool) workerGone(q int) {
	p.mu.Lock()
	p.idle[q]--
	p.total--
	p.mu.Unlock()
}

// directReplyOps are the opcodes whose reply payload is written straight
// into the ring entry's payload buffer: they bring no payload of their
// own that the reply could overwrite while the handler still reads it.
func directReplyOp(op uint32) bool {
	return op == _OP_READ || op == _OP_READDIR || op == _OP_READDIRPLUS
}

// serve handles the request in the worker's entry and leaves the reply
// there, and the request's commit id in w.commitID.
func (w *ringWorker) serve() {
	ms := w.pool.ms
	hdr := w.hdr
	inOut := (*uringEntInOut)(unsafe.Pointer(&hdr[uringHdrEntInOut]))
	w.commitID = inOut.CommitID
	payloadSz := min(int(inOut.PayloadSz), len(w.payload))

	// Put the fuse_in_header right in front of the opcode's struct,
	// into the unused end of in_out, so that the two are one buffer as
	// they are in a read from /dev/fuse.
	inHdrSize := int(unsafe.Sizeof(InHeader{}))
	copy(hdr[uringHdrOpIn-inHdrSize:uringHdrOpIn], hdr[uringHdrInOut:uringHdrInOut+inHdrSize])
	in := hdr[uringHdrOpIn-inHdrSize : uringHdrOpIn+uringHdrOpInSize]

	req := ms.reqPool.Get().(*requestAlloc)
	if ms.opts.SingleThreaded {
		ms.requestProcessingMu.Lock()
	}
	h, inSize, outSize, outPayloadSize, code := parseRequest(in, &ms.kernelSettings, ms.negotiatedFlags)
	req.inputBuf = in
	req.status = code
	if !code.Ok() && code != ENOSYS {
		ms.opts.Logger.Printf("parseRequest: %v", code)
	}
	if code.Ok() {
		req.inputBuf = in[:inSize]
		req.inPayload = w.payload[:payloadSz]
		req.status = req.splitExt(&req.extInline)
		if !req.status.Ok() {
			ms.opts.Logger.Printf("op %s: bad request extension: %v", h.Name, req.status)
		}
	}
	req.outHeaderBuf = req.outHeaderInline[:]
	req.outDataBuf = req.outDataInline[:outSize]
	clear(req.outHeaderBuf)
	clear(req.outDataBuf)
	op := req.inHeader().Opcode
	if outPayloadSize > 0 {
		if directReplyOp(op) && outSize+outPayloadSize <= len(w.payload) {
			req.outPayload = w.payload[outSize : outSize+outPayloadSize]
		} else {
			req.outPayload = ms.buffers.AllocBuffer(uint32(outPayloadSize))
			req.bufferPoolOutputBuf = req.outPayload
		}
	}
	ms.protocolServer.handleRequest(h, &req.request)

	var n int
	if req.suppressReply {
		// No answer is due (NOTIFY_REPLY, or an interrupted
		// request of a connection being torn down), but the entry
		// comes back only with a commit of the request.
		o := req.outHeader()
		o.Unique, o.Status, o.Length = req.inHeader().Unique, 0, uint32(sizeOfOutHeader)
	} else {
		n = w.fillPayload(req)
	}
	copy(hdr[uringHdrInOut:], req.outHeaderBuf)
	inOut.PayloadSz = uint32(n)
	// Zero the opcode struct, so that a shorter one sent next does not
	// read as this one's tail (a read from /dev/fuse would be short).
	clear(hdr[uringHdrOpIn : uringHdrOpIn+uringHdrOpInSize])

	if ms.opts.SingleThreaded {
		ms.requestProcessingMu.Unlock()
	}
	if req.bufferPoolOutputBuf != nil {
		ms.buffers.FreeBuffer(req.bufferPoolOutputBuf)
		req.bufferPoolOutputBuf = nil
	}
	if req.interrupted {
		req.interrupted = false
		req.cancel = make(chan struct{})
	}
	req.clear()
	ms.reqPool.Put(req)
}

var errReplyTooBig = errors.New("reply larger than the ring entry")

// fillPayload writes the reply's arguments (the opcode's struct, then
// its data) into the payload buffer, as the kernel reads them from a
// ring entry, and returns their length. The out header is in
// req.outHeaderBuf.
func (w *ringWorker) fillPayload(req *requestAlloc) int {
	if req.status > OK {
		return 0 // serializeHeader left only the header
	}
	out := w.payload
	n := copy(out, req.outDataBuf)
	switch {
	case req.readResult != nil:
		dst := out[n:]
		size := min(req.readResult.Size(), len(dst))
		data, st := req.readResult.Bytes(dst[:size])
		req.readResult.Done()
		req.readResult = nil
		if !st.Ok() {
			req.status = st
			req.serializeHeader(0)
			return 0
		}
		if len(data) > 0 && (len(dst) == 0 || &data[0] != &dst[0]) {
			data = dst[:copy(dst, data)]
		}
		req.serializeHeader(len(data))
		n += len(data)
	case len(req.outPayload) > 0:
		if len(req.outPayload) > len(out)-n {
			w.pool.ms.opts.Logger.Printf("op %s: %v (%d bytes)", operationName(req.inHeader().Opcode), errReplyTooBig, len(req.outPayload))
			req.status = EIO
			req.serializeHeader(0)
			return 0
		}
		if &req.outPayload[0] != &out[n] {
			copy(out[n:], req.outPayload)
		}
		n += len(req.outPayload)
	}
	return n
}
