// Copyright 2026 the Go-FUSE Authors. All rights reserved.
// Use of this source code is governed by a BSD-style
// license that can be found in the LICENSE file.

package fuse

import "fmt"

// Transport is how requests and replies travel between the kernel and a
// Server.
type Transport int

const (
	// TransportClassic reads requests from /dev/fuse with read(2) and
	// writes replies with write(2): two system calls per request.
	TransportClassic Transport = iota

	// TransportAuto uses FUSE over io_uring when the kernel offers it in
	// its INIT request (FUSE_OVER_IO_URING, protocol 7.42 or later: Linux
	// 6.14 with CONFIG_FUSE_IO_URING and the fuse module's enable_uring
	// parameter set), and TransportClassic otherwise.
	// Server.TransportInfo says which one it chose and why.
	TransportAuto

	// TransportIoUring serves requests through per-CPU io_uring queues,
	// one COMMIT_AND_FETCH per request (the reply and the wait for the
	// next request in one system call). NewServer fails when the kernel
	// does not offer it or the rings cannot be set up.
	TransportIoUring
)

func (t Transport) String() string {
	switch t {
	case TransportClassic:
		return "classic"
	case TransportAuto:
		return "auto"
	case TransportIoUring:
		return "uring"
	}
	return fmt.Sprintf("Transport(%d)", int(t))
}

// ParseTransport parses "classic", "auto" or "uring" ("io_uring" too).
func ParseTransport(s string) (Transport, error) {
	switch s {
	case "classic":
		return TransportClassic, nil
	case "auto":
		return TransportAuto, nil
	case "uring", "io_uring":
		return TransportIoUring, nil
	}
	return 0, fmt.Errorf("unknown transport %q: want auto, uring or classic", s)
}

// TransportInfo says which transport a Server serves requests with.
type TransportInfo struct {
	// Transport is TransportIoUring or TransportClassic, never Auto.
	Transport Transport
	// Reason says why, in a few words, for a log line.
	Reason string
	// Queues is the number of io_uring queues (one per possible CPU),
	// 0 on the classic transport.
	Queues int
	// RingWorkers is the number of ring entries registered (each with
	// its worker), RingRequests the requests they have served; requests
	// that came through /dev/fuse (FORGET, INTERRUPT, and all of them
	// until every queue had an entry) are not counted.
	RingWorkers  int
	RingRequests uint64
}

// TransportInfo says which transport the server uses, and why.
func (ms *Server) TransportInfo() TransportInfo {
	info := TransportInfo{Transport: TransportClassic, Reason: ms.transportReason}
	if ms.rings != nil {
		info.Transport, info.Queues = TransportIoUring, ms.rings.nqueues
		info.RingWorkers, info.RingRequests = ms.rings.counts()
	}
	return info
}

// ringKickBit marks the uniques of the NOTIFY_RETRIEVEs with which the
// io_uring transport has the kernel hand out the requests it holds back
// (ringWorker.kick); other retrieves never set it.
const ringKickBit = 1 << 63

// uringMinMinor is the first protocol minor version with FUSE over
// io_uring.
const uringMinMinor = 42

// offerIoUring decides, while answering INIT, whether to take up the
// kernel's offer of FUSE over io_uring, and notes why in the server.
func (ms *protocolServer) offerIoUring(in *InitIn) bool {
	switch {
	case ms.opts.Transport == TransportClassic:
		ms.transportReason = "classic transport asked for"
		return false
	case in.Flags64()&CAP_OVER_IO_URING == 0 || in.Minor < uringMinMinor:
		ms.transportReason = fmt.Sprintf("kernel does not offer FUSE over io_uring (protocol 7.%d; needs 7.%d and the fuse module's enable_uring parameter)", in.Minor, uringMinMinor)
		return false
	}
	if why := ioUringUnsupported(ms.opts); why != "" {
		ms.transportReason = why
		return false
	}
	ms.transportReason = fmt.Sprintf("kernel offers FUSE over io_uring (protocol 7.%d)", in.Minor)
	return true
}
