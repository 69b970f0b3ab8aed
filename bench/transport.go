package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
)

// The daemon serves its mount through one of two transports: classic
// (read(2) and write(2) on /dev/fuse) or FUSE over io_uring (`yirangmq
// mount --transport uring`, docs/performance.md). The suite measures a
// build on each transport it is asked for, each mount's systems named
// with it ("mount sqlite/normal (uring)"). A build from before the flag
// serves classic only, and is started without it.

const (
	transportClassic = "classic"
	transportUring   = "uring"
)

// uringParam is the fuse module's switch for FUSE over io_uring.
const uringParam = "/sys/module/fuse/parameters/enable_uring"

// kernelUring reads uringParam: on when it is "Y"; state says what it
// holds (or why it could not be read), for the line that says why a run
// is classic only.
func kernelUring() (on bool, state string) {
	b, err := os.ReadFile(uringParam)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, uringParam + " does not exist (a kernel without FUSE over io_uring, before 6.14 or without CONFIG_FUSE_IO_URING)"
		}
		return false, err.Error()
	}
	v := strings.TrimSpace(string(b))
	return v == "Y", uringParam + " is " + v
}

// helpHasTransport tells whether `yirangmq mount --help` lists the
// --transport flag.
func helpHasTransport(help string) bool {
	return strings.Contains(help, "--transport ")
}

// binHasTransport asks bin whether its mount command has --transport.
func binHasTransport(bin string) (bool, error) {
	out, err := exec.Command(bin, "mount", "--help").CombinedOutput()
	if err != nil && len(out) == 0 {
		return false, fmt.Errorf("%s mount --help: %w", bin, err)
	}
	return helpHasTransport(string(out)), nil
}

// chooseTransports decides which transports a run measures. asked is
// --transports, explicit whether it was given; binHas whether the build
// has --transport; kernelOn and kernelState what kernelUring said.
// Without --transports: both when the build and the kernel offer
// io_uring, else classic with why (a line for the log and the notes).
// Asked for io_uring where it cannot be had, it fails rather than
// measure classic under io_uring's name.
func chooseTransports(asked []string, explicit, binHas, kernelOn bool, kernelState string) (transports []string, why string, err error) {
	if !explicit {
		switch {
		case !binHas:
			return []string{transportClassic}, "transports: classic only: the build has no --transport (it serves /dev/fuse only)", nil
		case !kernelOn:
			return []string{transportClassic}, "transports: classic only: the kernel does not offer FUSE over io_uring (" + kernelState + ")", nil
		}
		return []string{transportClassic, transportUring}, "", nil
	}
	for _, t := range asked {
		switch t {
		case transportClassic:
		case transportUring:
			if !binHas {
				return nil, "", errors.New("--transports uring: the build has no --transport flag (it serves /dev/fuse only); use --transports classic")
			}
			if !kernelOn {
				return nil, "", fmt.Errorf("--transports uring: the kernel does not offer FUSE over io_uring (%s); as root: echo Y > %s", kernelState, uringParam)
			}
		default:
			return nil, "", fmt.Errorf("--transports %q: want classic or uring", t)
		}
		if slices.Contains(transports, t) {
			return nil, "", fmt.Errorf("--transports: %s twice", t)
		}
		transports = append(transports, t)
	}
	if len(transports) == 0 {
		return nil, "", errors.New("--transports: none given")
	}
	return transports, "", nil
}

// transportFlag is the --transport to start a daemon of transport t
// with: none for a build without the flag (classic, its only one), else
// t itself, since such a build's default (auto) may be either.
func transportFlag(t string, binHas bool) string {
	if !binHas {
		return ""
	}
	return t
}
