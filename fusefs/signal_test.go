package fusefs

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestPendingUnblocked(t *testing.T) {
	const status = "Name:\tcat\nSigQ:\t0/31\nSigPnd:\t%s\nShdPnd:\t%s\nSigBlk:\t%s\nSigIgn:\t0000000000000000\n"
	for _, c := range []struct {
		pnd, shd, blk string
		want          bool
	}{
		{"0000000000000000", "0000000000000000", "0000000000000000", false},
		{"0000000000000002", "0000000000000000", "0000000000000000", true},  // SIGINT on the thread
		{"0000000000000000", "0000000000000002", "0000000000000000", true},  // SIGINT to the process
		{"0000000000000002", "0000000000000000", "0000000000000002", false}, // blocked
		{"0000000000000000", "0000000080000000", "fffffffe7ffbfeff", true},  // SIGURG not blocked
		{"zz", "0000000000000000", "0000000000000000", false},               // unreadable: no
	} {
		s := fmt.Sprintf(status, c.pnd, c.shd, c.blk)
		if got := pendingUnblocked(s); got != c.want {
			t.Errorf("SigPnd %s ShdPnd %s SigBlk %s: %v, want %v", c.pnd, c.shd, c.blk, got, c.want)
		}
	}
}

// A real thread's /proc status: a signal it blocks is pending but does
// not count.
func TestSignalPendingOfAThread(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tid := uint32(unix.Gettid())
	// SIGURG: the Go runtime's own preemption signal, which it takes and
	// ignores when it is not its own, so unblocking it below is harmless.
	var set, old unix.Sigset_t
	set.Val[0] = 1 << (unix.SIGURG - 1)
	if err := unix.PthreadSigmask(unix.SIG_BLOCK, &set, &old); err != nil {
		t.Fatal(err)
	}
	defer unix.PthreadSigmask(unix.SIG_SETMASK, &old, nil)
	if err := unix.Tgkill(unix.Getpid(), int(tid), unix.SIGURG); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", tid))
	if err != nil {
		t.Fatal(err)
	}
	// It is pending (else the test shows nothing).
	if !strings.Contains(string(b), fmt.Sprintf("SigPnd:\t%016x", uint64(1)<<(unix.SIGURG-1))) {
		t.Fatalf("SIGURG sent to a thread that blocks it is not in SigPnd:\n%s", b)
	}
	if signalPending(tid) {
		t.Errorf("a blocked SIGURG counts as pending:\n%s", b)
	}
	if signalPending(0) {
		t.Error("tid 0 counts")
	}
}
