package fs

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"yirangmq/queuecore"
)

// writeManifest records every message's ID and place at a clean stop,
// once everything else is durable, so that the next start can tell a
// message removed by hand from one that never was. It is a hint, never
// the truth: the next start reads it once and removes it.
func (s *Store) writeManifest() error {
	s.mu.RLock()
	var b bytes.Buffer
	for _, q := range s.ix.SortedQueues() {
		for _, st := range queuecore.States {
			q.ByState[st].Ascend(func(e *entry) bool {
				fmt.Fprintf(&b, "%d %s %s %s\n", e.ID, q.Name, st.Dir(), strconv.Quote(e.Name()))
				return true
			})
		}
	}
	s.mu.RUnlock()
	if !s.durable {
		// Whatever the commits left to the kernel goes to the disk first:
		// a manifest that outlived the messages it names would call a
		// power cut's losses removals by hand.
		if err := syncfs(s.dir); err != nil {
			return err
		}
	}
	if err := s.writeFileDurably(filepath.Join(s.dir, manifestName), b.Bytes(), nil); err != nil {
		return fmt.Errorf("write the manifest: %w", err)
	}
	if !s.durable {
		return syncfs(s.dir)
	}
	return nil
}

func syncfs(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

// manifestEntry is one line of DIR/manifest.
type manifestEntry struct {
	id    uint64
	queue string
	state queuecore.State
	name  string
}

func parseManifestLine(line string) (manifestEntry, bool) {
	f := strings.SplitN(line, " ", 4)
	if len(f) != 4 {
		return manifestEntry{}, false
	}
	id, err := strconv.ParseUint(f[0], 10, 64)
	st, ok := queuecore.StateFromDir(f[2])
	name, qerr := strconv.Unquote(f[3])
	if err != nil || !ok || qerr != nil {
		return manifestEntry{}, false
	}
	return manifestEntry{id: id, queue: f[1], state: st, name: name}, true
}
