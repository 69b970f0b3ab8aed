package fusefs

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// A SIGKILL does not always end a FUSE daemon. The kernel aborts a FUSE
// connection only when the daemon's last thread lets go of /dev/fuse, and
// a daemon thread sending an entry invalidation sleeps uninterruptibly for
// the lock of the parent directory. When a client holds that lock while it
// waits for the daemon's answer to its own request, the killed daemon
// never answers and never exits: a zombie that keeps its store locked and
// the mount wedged until someone writes to
// /sys/fs/fuse/connections/N/abort. `yirangmq mount` and the test harness
// do that for a mount whose daemon is gone.

const fusectl = "/sys/fs/fuse/connections"

// MountInfo describes the mount at a mountpoint, read from
// /proc/self/mountinfo without touching the mount (a stat of a wedged
// mount would hang).
type MountInfo struct {
	FSType string // "fuse.yirangmq" for ours
	Conn   string // FUSE connection number (the device minor), "" if not FUSE
}

// LookupMount returns what is mounted at mp (the last mount on it); ok is
// false when nothing is.
func LookupMount(mp string) (info MountInfo, ok bool, err error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return info, false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || unescapeMount(fields[4]) != mp {
			continue
		}
		info, ok = MountInfo{}, true
		if major, minor, _ := strings.Cut(fields[2], ":"); major == "0" {
			info.Conn = minor
		}
		for i := 5; i+1 < len(fields); i++ {
			if fields[i] == "-" {
				info.FSType = fields[i+1]
				break
			}
		}
	}
	return info, ok, sc.Err()
}

func unescapeMount(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

// abortMu serializes AbortConnection: one call must not unmount the
// fusectl it mounted while another writes through it.
var abortMu sync.Mutex

// AbortConnection aborts FUSE connection conn: every request waiting on it
// fails with ENOTCONN, and a daemon stuck in the kernel can finish dying.
// The fusectl file system is mounted first when it is not, and unmounted
// again after: the machine is left as it was found.
func AbortConnection(conn string) error {
	if conn == "" {
		return errors.New("not a FUSE connection")
	}
	abortMu.Lock()
	defer abortMu.Unlock()
	if _, err := os.Stat(filepath.Join(fusectl, conn)); errors.Is(err, os.ErrNotExist) {
		err := unix.Mount("fusectl", fusectl, "fusectl", 0, "")
		if err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount fusectl on %s: %w", fusectl, err)
		}
		if err == nil {
			defer unix.Unmount(fusectl, 0)
		}
	}
	err := os.WriteFile(filepath.Join(fusectl, conn, "abort"), []byte("1"), 0o200)
	if errors.Is(err, os.ErrNotExist) {
		return nil // gone already
	}
	return err
}
