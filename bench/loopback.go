package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"yirangmq/testenv"
)

// The loopback mount is the price of FUSE itself: go-fuse's passthrough
// filesystem over a plain directory of the same disk, served by a child
// process (loopbackd/) as our daemon serves its mount, with the mount
// options of fusefs.Mount. The same file operations through it and
// through the yirangmq mount differ only by what the queue does.

// loopbackFSName is its filesystem type, fuse.NAME in /proc/mounts (the
// same as loopbackd's).
const loopbackFSName = "yirangmq-bench-loopback"

// buildLoopback builds the loopback daemon (./loopbackd) into dir: a
// small binary of its own, so that its memory is go-fuse's and not this
// benchmark's. It belongs to this module (bench/go.mod),
// not to the product's at root.
func buildLoopback(ctx context.Context, root, dir string) (string, error) {
	bin := filepath.Join(dir, "loopbackd")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./loopbackd")
	cmd.Dir = filepath.Join(root, "bench")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build loopbackd: %v\n%s", err, out)
	}
	// Read from the disk when started, as the yirangmq binary is.
	if err := evictCached(bin); err != nil {
		return "", err
	}
	return bin, nil
}

// startLoopback mounts a go-fuse loopback of dir/backing on dir/mnt in a
// child process (bin, from buildLoopback) and waits for its ready
// handshake; with syncAtFlush its daemon fdatasyncs a written file at
// FLUSH (sysLoopbackSync). The daemon it returns stops like a yirangmq
// one (SIGTERM, clean unmount).
func startLoopback(bin, dir string, cacheTimeout time.Duration, syncAtFlush bool) (*daemon, error) {
	d := &daemon{
		mnt:     filepath.Join(dir, "mnt"),
		store:   filepath.Join(dir, "backing"),
		logPath: filepath.Join(dir, "loopback.log"),
	}
	for _, p := range []string{d.mnt, d.store} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return nil, err
		}
	}
	lf, err := os.Create(d.logPath)
	if err != nil {
		return nil, err
	}
	d.logFile = lf
	args := []string{"--cache-timeout", cacheTimeout.String()}
	if syncAtFlush {
		args = append(args, "--sync-at-flush")
	}
	d.cmd = exec.Command(bin, append(args, d.store, d.mnt)...)
	d.cmd.Stdout, d.cmd.Stderr = lf, lf
	// As for the daemons: SIGTERM (and a clean unmount) if we die.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	exited, ready, err := testenv.StartReady(d.cmd, 20*time.Second)
	if err != nil {
		lf.Close()
		return nil, fmt.Errorf("start loopback: %w", err)
	}
	d.exited = exited
	if !ready {
		d.stop()
		return nil, fmt.Errorf("loopback not ready after 20 s:\n%s", d.tail(2000))
	}
	return d, nil
}
