// Command loopbackd serves a go-fuse loopback (passthrough) mount of a
// directory, with the mount options of yirangmq's daemon (fusefs.Mount):
// the price of FUSE itself, for `mountbench suite`. It is a binary of its
// own so that its memory and CPU are go-fuse's alone.
//
//	loopbackd [--cache-timeout 1s] BACKING MOUNTPOINT
//
// It writes "ready\n" to the descriptor named by $YIRANGMQ_READY_FD once
// the mount serves (the daemon's handshake), and unmounts on SIGTERM or
// SIGINT.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// fsName is the filesystem type, fuse.NAME in /proc/mounts; mountbench
// detaches dead mounts of this type that a killed run left behind.
const fsName = "yirangmq-bench-loopback"

// readyFDEnv is testenv.ReadyFDEnv (not imported: it would bring the
// test harness, and its memory, into this binary).
const readyFDEnv = "YIRANGMQ_READY_FD"

func main() {
	timeout := flag.Duration("cache-timeout", time.Second, "entry, attribute and negative entry timeout")
	flag.Parse()
	if flag.NArg() != 2 {
		fmt.Fprintln(os.Stderr, "usage: loopbackd [--cache-timeout 1s] BACKING MOUNTPOINT")
		os.Exit(2)
	}
	root, err := fs.NewLoopbackRoot(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "loopbackd:", err)
		os.Exit(1)
	}
	// fusefs.Mount's options, less its panic handler.
	mo := fuse.MountOptions{
		FsName:           "loopback",
		Name:             fsName,
		DirectMount:      true,
		DirectMountFlags: syscall.MS_NODEV | syscall.MS_NOSUID | syscall.MS_NOEXEC,
		Options:          []string{"nodev", "nosuid", "noexec"},
		MaxBackground:    64,
	}
	server, err := fs.Mount(flag.Arg(1), root, &fs.Options{
		MountOptions:    mo,
		EntryTimeout:    timeout,
		AttrTimeout:     timeout,
		NegativeTimeout: timeout,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "loopbackd: mount:", err)
		os.Exit(1)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sigs
		for range 50 {
			if err := server.Unmount(); err == nil || errors.Is(err, syscall.EINVAL) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	if s := os.Getenv(readyFDEnv); s != "" {
		if fd, err := strconv.Atoi(s); err == nil {
			f := os.NewFile(uintptr(fd), "ready")
			f.Write([]byte("ready\n"))
			f.Close()
		}
		os.Unsetenv(readyFDEnv)
	}
	server.Wait()
}
