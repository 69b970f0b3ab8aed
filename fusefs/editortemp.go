package fusefs

import (
	"context"
	"regexp"

	"golang.org/x/sys/unix"
)

// In-place editors write the new text to a temporary file beside the one
// they edit, then rename it over the original: GNU sed -i uses
// mkstemp("sedXXXXXX"), perl -pi mkstemp("XXXXXXXX") (glibc fills the last
// six). On a message in inbox/ the rename is refused (a committed message
// is immutable) and the editor removes its file, but a temporary file
// committed at its close would be a second message, and a consumer could
// lease it in between. So a file created in inbox/ under such a name is
// held: not committed at its close, but once the process that created it
// has exited, unless it was renamed (to a free name: published under it;
// onto a live message: it becomes a draft, never delivered) or removed
// before. A producer that picks such a name for a real message sees it
// published when its process exits.
var editorTemp = regexp.MustCompile(`^(sed|XX)[A-Za-z0-9]{6}$`)

// isEditorTemp reports whether name is an in-place editor's temporary file.
func isEditorTemp(name string) bool { return editorTemp.MatchString(name) }

// held reports whether the file waits for a rename rather than for its
// close: a draft, or an editor's temporary file.
func (n *msgNode) held() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.pend != nil && !n.pend.done && (n.pend.draft || n.pend.editorTemp)
}

// keepAsDraft turns a held file whose rename was refused into a draft: it
// is never delivered, and goes with rm or after the drafts' time to live.
func (n *msgNode) keepAsDraft() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if p := n.pend; p != nil && p.editorTemp {
		p.editorTemp, p.draft = false, true
	}
}

// openCreator takes a pidfd on the process that created an editor's
// temporary file, so that its exit can be seen (and a pid reused by
// another process never mistaken for it).
func openCreator(tid uint32) int {
	fd, err := unix.PidfdOpen(int(threadGroup(tid)), 0)
	if err != nil {
		return -1 // already gone: committed at its release
	}
	return fd
}

// holdAtRelease starts the wait for the creator's exit of an editor's
// temporary file that is still held at its last close. It reports whether
// it did; the pidfd is closed here otherwise.
func (n *msgNode) holdAtRelease() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.pend
	if p == nil {
		return false
	}
	if !p.editorTemp || p.draft || p.done {
		if p.creatorFD >= 0 {
			unix.Close(p.creatorFD)
			p.creatorFD = -1
		}
		return false
	}
	if p.creatorFD < 0 {
		return false // its creator was gone at create already: commit now
	}
	fd := p.creatorFD
	p.creatorFD = -1
	n.fsys.wg.Add(1)
	go n.commitAfterCreator(fd)
	return true
}

// commitAfterCreator commits a held editor's temporary file once the
// process that created it has exited, if it is still held then. It runs
// on its own goroutine and owns fd: it waits on the pidfd, never on our
// mount.
func (n *msgNode) commitAfterCreator(fd int) {
	defer n.fsys.wg.Done()
	defer unix.Close(fd)
	for {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		k, err := unix.Poll(fds, 500)
		if k > 0 || (err != nil && err != unix.EINTR) {
			break // exited
		}
		select {
		case <-n.fsys.done:
			return
		default:
		}
	}
	n.mu.Lock()
	p := n.pend
	ready := p != nil && p.editorTemp && !p.draft && !p.done
	n.mu.Unlock()
	if ready {
		n.commit(context.Background())
	}
}
