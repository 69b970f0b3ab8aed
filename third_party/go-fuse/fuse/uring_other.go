// Copyright 2026 the Go-FUSE Authors. All rights reserved.
// Use of this source code is governed by a BSD-style
// license that can be found in the LICENSE file.

//go:build !linux

package fuse

import "errors"

// ringPool is Linux only (uring_linux.go).
type ringPool struct{ nqueues int }

func ioUringUnsupported(*MountOptions) string { return "FUSE over io_uring is Linux only" }

func newRingPool(*Server) (*ringPool, error) {
	return nil, errors.New("FUSE over io_uring is Linux only")
}

func (*ringPool) start() {}
func (*ringPool) wait()  {}

func (*ringPool) counts() (int, uint64) { return 0, 0 }
