package fusefs

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"yirangmq/queuecore"
)

// stateDir is QUEUE/inbox, processing, delayed, dlq or archive. Renames
// between them are the queue's transitions; unlink is ack or delete;
// create (in inbox/ only) is publish.
type stateDir struct {
	fs.Inode
	fsys  *FS
	queue string
	state queuecore.State
}

var _ = (fs.NodeGetattrer)((*stateDir)(nil))

func (d *stateDir) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	info, err := d.fsys.core.QueueInfo(d.queue)
	if err != nil {
		return errnoOf(err)
	}
	fillDir(&out.Attr, d.fsys.queueIno(d.queue, uint32(d.state)), info.UID, info.GID, info.Mode, info.CreatedAt)
	return 0
}

var _ = (fs.NodeLookuper)((*stateDir)(nil))

func (d *stateDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if nameTooLong(name) {
		return nil, syscall.ENAMETOOLONG // see names.go
	}
	if d.state == queuecore.StateReady {
		if p := d.fsys.pendingFile(d.queue, name); p != nil {
			p.fillAttr(ctx, &out.Attr)
			out.SetEntryTimeout(uncachedEntry) // what it names is decided at its commit
			out.SetAttrTimeout(uncachedEntry)
			return &p.Inode, 0
		}
	}
	if strings.HasPrefix(name, ".") {
		return nil, syscall.ENOENT
	}
	c := d.GetChild(name)
	if c != nil {
		if n, ok := c.Operations().(*msgNode); ok {
			n.mayCache() // before the read: see mayCache
		}
	}
	m, err := d.fsys.core.Get(ctx, d.queue, d.state, name)
	if err != nil {
		return nil, errnoOf(err)
	}
	return d.messageInode(ctx, m, c, out), 0
}

// messageInode answers a LOOKUP of message m, whose name the kernel may
// already have for child c (nil: none).
func (d *stateDir) messageInode(ctx context.Context, m queuecore.Message, c *fs.Inode, out *fuse.EntryOut) *fs.Inode {
	n := &msgNode{fsys: d.fsys, queue: d.queue, name: m.Name, id: m.ID}
	fillMessage(&out.Attr, m)
	// st_ino is msgIno(ID) for the message's whole life; the inode
	// generation changes when the message is found somewhere the kernel
	// did not put it (see placements.go).
	gen := d.fsys.placements.lookedUp(m.ID, d.state)
	ino := msgIno(m.ID)
	out.SetEntryTimeout(d.fsys.opts.NameTimeout)
	if c != nil {
		if old, ok := c.Operations().(*msgNode); ok && c.StableAttr().Ino == ino && old.gen == gen {
			d.fsys.track(old) // the node the kernel had: recently used again
			old.show(&out.Attr, true)
			return c
		}
	}
	n.gen = gen
	in := d.NewInode(ctx, n, fs.StableAttr{Mode: syscall.S_IFREG, Ino: ino, Gen: gen})
	if got, ok := in.Operations().(*msgNode); ok {
		got.show(&out.Attr, true) // n, or the node the kernel already has for this inode
	}
	d.fsys.track(n)
	return in
}

var _ = (fs.NodeReaddirer)((*stateDir)(nil))

// Readdir lists committed messages: inbox/ in delivery order (priority,
// then FIFO), the others by their timestamp.
func (d *stateDir) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	entries := dots(d.fsys.queueIno(d.queue, uint32(d.state)), d.fsys.queueIno(d.queue, kQueueDir))
	err := d.fsys.core.List(ctx, d.queue, d.state, func(m queuecore.Message) bool {
		entries = append(entries, fuse.DirEntry{Name: m.Name, Mode: syscall.S_IFREG, Ino: msgIno(m.ID)})
		return true
	})
	if err != nil {
		return nil, errnoOf(err)
	}
	return fs.NewListDirStream(entries), 0
}

var _ = (fs.NodeCreater)((*stateDir)(nil))

// Create starts a message (or a draft, for a name with a leading dot) in
// inbox/. It is committed at close; see pending.go.
func (d *stateDir) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if d.state != queuecore.StateReady {
		return nil, nil, 0, d.fsys.refuse(refusal{msg: "create refused: messages are published in inbox/", queue: d.queue, name: name, uid: callerUID(ctx), errno: syscall.EPERM}, "dir", d.state.Dir())
	}
	draft := strings.HasPrefix(name, ".")
	check := name
	if draft {
		check = strings.TrimLeft(name, ".")
		if check == "" {
			return nil, nil, 0, syscall.EINVAL
		}
	}
	if err := queuecore.CheckMessageName(check); err != nil {
		return nil, nil, 0, d.fsys.refuse(refusal{msg: "create refused", queue: d.queue, name: name, uid: callerUID(ctx), errno: errnoOf(err), err: err})
	}
	if !draft {
		if err := d.fsys.core.CheckPublish(ctx, d.queue, name); err != nil {
			return nil, nil, 0, d.fsys.refuse(refusal{msg: "create refused", queue: d.queue, name: name, uid: callerUID(ctx), errno: errnoOf(err), err: err, info: true})
		}
	}
	if d.fsys.memoryFull() {
		return nil, nil, 0, errnoOf(errMemoryFull) // logged when the daemon reached its budget (memory.go)
	}
	policy, err := d.fsys.core.Policy(d.queue)
	if err != nil {
		return nil, nil, 0, errnoOf(err)
	}
	uid, gid, pid := caller(ctx)
	n := &msgNode{fsys: d.fsys, queue: d.queue, name: name, id: d.fsys.core.NewID(), pend: &pending{
		draft: draft, creator: pid, uid: uid, gid: gid, created: time.Now(), limit: policy.MaxMessageBytes,
		editorTemp: !draft && isEditorTemp(name), creatorFD: -1,
	}}
	if n.pend.editorTemp {
		n.pend.creatorFD = openCreator(pid)
	}
	key := pendingKey{d.queue, name}
	d.fsys.mu.Lock()
	if _, busy := d.fsys.pending[key]; busy {
		d.fsys.mu.Unlock()
		return nil, nil, 0, syscall.EEXIST
	}
	d.fsys.pending[key] = n
	d.fsys.placements.created(n.id)
	d.fsys.mu.Unlock()
	n.fillAttr(ctx, &out.Attr)
	if draft || n.pend.editorTemp {
		// A draft or an editor's temporary file is not published at its
		// close: the kernel must not keep the name (mount.go).
		out.SetEntryTimeout(uncachedEntry)
	} else {
		out.SetEntryTimeout(d.fsys.opts.NameTimeout)
	}
	ino := d.NewInode(ctx, n, fs.StableAttr{Mode: syscall.S_IFREG, Ino: msgIno(n.id)})
	d.fsys.trackNew(n)
	n.opened()
	return ino, &writeHandle{}, fuse.FOPEN_DIRECT_IO, 0
}

var _ = (fs.NodeUnlinker)((*stateDir)(nil))

// Unlink acks in processing/ and deletes elsewhere; a file still being
// written (or a draft) is discarded.
//
// An unlink that returns 0 in inbox/ means the message will never be
// delivered, and the unlink of a file just closed never fails with ENOENT,
// whatever its size: an empty file is committed at RELEASE, which the
// kernel sends after close(2) has returned, so its unlink can come before,
// during or after that commit. Before, the file is discarded and the
// commit finds nothing to do; during, the unlink waits for the commit
// (it holds the node's mutex) and then deletes what it published; after,
// the message is in the store like any other.
func (d *stateDir) Unlink(ctx context.Context, name string) syscall.Errno {
	if d.state == queuecore.StateReady {
		if p := d.fsys.pendingFile(d.queue, name); p != nil {
			m, settled := p.discardOrCommitted(ctx)
			if settled {
				return 0
			}
			if m.ID != 0 && (m.State == queuecore.StateDelayed || m.State == queuecore.StateDead) {
				// Published with a delay, or kept in dlq/ by its
				// validation: the file named inbox/NAME is that message.
				return errnoOf(d.fsys.core.Delete(ctx, d.queue, m.State, m.Name))
			}
		}
	}
	var err error
	if d.state == queuecore.StateLeased {
		err = d.fsys.core.Ack(ctx, d.queue, name)
	} else {
		err = d.fsys.core.Delete(ctx, d.queue, d.state, name)
	}
	return errnoOf(err)
}

var _ = (fs.NodeRenamer)((*stateDir)(nil))

// Rename is a transition of docs/contract.md §2, or the commit of a draft.
func (d *stateDir) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if flags&^uint32(unix.RENAME_NOREPLACE) != 0 {
		return syscall.EINVAL // RENAME_EXCHANGE, RENAME_WHITEOUT
	}
	to, ok := newParent.(*stateDir)
	if !ok {
		return syscall.EPERM
	}
	if p := d.fsys.pendingFile(d.queue, name); p != nil && d.state == queuecore.StateReady {
		if p.held() {
			return d.commitDraft(ctx, name, to, newName) // a draft or an editor's temporary file
		}
		return d.renamePending(ctx, p, name, to, newName)
	}
	if d.state == queuecore.StateReady && strings.HasPrefix(name, ".") {
		return syscall.ENOENT // a draft that is gone
	}
	if d.state == queuecore.StateReady && to.state == queuecore.StateReady && to.queue == d.queue && newName != name {
		return d.renameReady(ctx, name, newName)
	}
	if newName != name {
		return d.fsys.refuse(refusal{msg: "rename refused: a message keeps its name", queue: d.queue, name: name, uid: callerUID(ctx), errno: syscall.EPERM}, "new", newName)
	}
	leaser := ""
	if to.state == queuecore.StateLeased {
		leaser = d.fsys.consumer(ctx)
	}
	m, err := d.fsys.core.Move(ctx, queuecore.MoveRequest{Queue: d.queue, From: d.state, Name: name, ToQueue: to.queue, To: to.state, Consumer: leaser})
	if err != nil {
		var ve *queuecore.ValidationError
		switch {
		case errors.Is(err, queuecore.ErrNotAllowed):
			return d.fsys.refuse(refusal{msg: "rename refused", queue: d.queue, name: name, uid: callerUID(ctx), errno: errnoOf(err)},
				"from", d.state.Dir(), "to", to.queue+"/"+to.state.Dir())
		case errors.As(err, &ve):
			// A redrive, a replay or a forward of a body that the queue's
			// format or schema rejects now.
			return d.fsys.refuse(refusal{msg: "rename refused: the message fails the queue's validation", queue: d.queue, name: name, uid: callerUID(ctx), errno: errnoOf(err), err: err},
				"from", d.state.Dir(), "to", to.queue+"/"+to.state.Dir())
		}
		return errnoOf(err)
	}
	// The kernel moved its dentry and inode to the new place. Where the
	// queue put something else there, the kernel is not told (see
	// Options): a nack waiting in delayed/ still shows under inbox/ until
	// the entry times out, and an operation on it is checked against
	// where it is; a replay or a forward is a new message, which the
	// moved inode stands for meanwhile (successors).
	d.fsys.placements.moved(m.ID, to.state)
	child := d.GetChild(name)
	if child == nil {
		return 0
	}
	old, _ := child.Operations().(*msgNode)
	if to.state == queuecore.StateLeased && (old == nil || !old.attrsStillRight(m)) {
		// The leaser owns it now (fillMessage): its next setxattr or
		// touch must not be checked against the publisher the kernel
		// cached. Attributes only: takes no inode lock in the kernel.
		child.NotifyContent(-1, 0)
	}
	if old != nil && old.id != m.ID {
		d.fsys.successors.add(old.id, m.Queue, m.ID, time.Now())
	}
	return 0
}

// renameReady gives a ready message that no one has leased a new name in
// inbox/: the temp-then-rename idiom (os.CreateTemp + os.Rename, Python's
// NamedTemporaryFile + os.replace, mkstemp + rename), whose temporary file
// was published at its close. A consumer that leased the temporary name
// first wins: the rename is ENOENT and the message is delivered once.
func (d *stateDir) renameReady(ctx context.Context, name, newName string) syscall.Errno {
	if strings.HasPrefix(newName, ".") {
		return d.fsys.refuse(refusal{msg: "rename refused: a message cannot become a draft", queue: d.queue, name: name, uid: callerUID(ctx), errno: syscall.EPERM}, "new", newName)
	}
	if d.fsys.pendingFile(d.queue, newName) != nil {
		return syscall.EEXIST // a file being written holds that name
	}
	m, err := d.fsys.core.Rename(ctx, d.queue, name, newName)
	if err != nil {
		return d.fsys.refuse(refusal{msg: "rename refused", queue: d.queue, name: name, uid: callerUID(ctx), errno: errnoOf(err), err: err, info: true}, "new", newName)
	}
	// The kernel moves its dentry and inode to newName once this returns;
	// the node must answer for the message under its new name.
	if child := d.GetChild(name); child != nil {
		if n, ok := child.Operations().(*msgNode); ok && n.id == m.ID {
			n.mu.Lock()
			n.name = newName
			n.mu.Unlock()
		}
	}
	return 0
}

// renamePending renames a file still being written (mkstemp, write,
// rename, then close): it is committed at its close under the new name.
func (d *stateDir) renamePending(ctx context.Context, p *msgNode, name string, to *stateDir, newName string) syscall.Errno {
	if to.queue != d.queue || to.state != queuecore.StateReady {
		return syscall.ENOENT // not committed yet: not a message to lease or move
	}
	if strings.HasPrefix(newName, ".") {
		return d.fsys.refuse(refusal{msg: "rename refused: a file being written cannot become a draft", queue: d.queue, name: name, uid: callerUID(ctx), errno: syscall.EPERM},
			"to", to.queue+"/"+to.state.Dir()+"/"+newName)
	}
	if newName == name {
		return 0
	}
	if err := d.fsys.core.CheckPublish(ctx, d.queue, newName); err != nil {
		return errnoOf(err)
	}
	// A node's mutex before f.mu, as everywhere (see sweepDrafts).
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pend == nil || p.pend.done {
		return syscall.ENOENT // committed meanwhile: the caller may retry
	}
	d.fsys.mu.Lock()
	defer d.fsys.mu.Unlock()
	if _, busy := d.fsys.pending[pendingKey{d.queue, newName}]; busy {
		return syscall.EEXIST
	}
	if d.fsys.pending[pendingKey{d.queue, name}] != p {
		return syscall.ENOENT
	}
	delete(d.fsys.pending, pendingKey{d.queue, name})
	d.fsys.pending[pendingKey{d.queue, newName}] = p
	p.name = newName
	return 0
}

// commitDraft publishes a draft .NAME renamed to NAME in the same inbox/.
func (d *stateDir) commitDraft(ctx context.Context, name string, to *stateDir, newName string) syscall.Errno {
	if to.queue != d.queue || to.state != queuecore.StateReady || strings.HasPrefix(newName, ".") {
		return d.fsys.refuse(refusal{msg: "rename refused: a draft is committed by renaming it to a name without the leading dot in the same inbox/", queue: d.queue, name: name, uid: callerUID(ctx), errno: syscall.EPERM},
			"to", to.queue+"/"+to.state.Dir()+"/"+newName)
	}
	p := d.fsys.pendingFile(d.queue, name)
	if p == nil {
		return syscall.ENOENT
	}
	// A rename that fails leaves its source where it was: check first, and
	// give the draft back its name if the commit still fails. An editor's
	// temporary file renamed onto a message (sed -i, perl -pi) becomes a
	// draft: the edit was refused, and it must never be delivered.
	if err := d.fsys.core.CheckPublish(ctx, d.queue, newName); err != nil {
		p.keepAsDraft()
		return errnoOf(err)
	}
	if d.fsys.takePending(d.queue, name) != p {
		return syscall.ENOENT
	}
	if errno := p.rename(newName); errno != 0 {
		return errno
	}
	errno := p.commit(ctx)
	if errno != 0 && p.restoreDraft(name) {
		d.fsys.mu.Lock()
		if _, taken := d.fsys.pending[pendingKey{d.queue, name}]; !taken {
			d.fsys.pending[pendingKey{d.queue, name}] = p
		}
		d.fsys.mu.Unlock()
	}
	return errno
}

var _ = (fs.NodeMkdirer)((*stateDir)(nil))

func (d *stateDir) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

var _ = (fs.NodeRmdirer)((*stateDir)(nil))

func (d *stateDir) Rmdir(ctx context.Context, name string) syscall.Errno { return syscall.ENOTDIR }

var _ = (fs.NodeSymlinker)((*stateDir)(nil))

func (d *stateDir) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

var _ = (fs.NodeLinker)((*stateDir)(nil))

func (d *stateDir) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

var _ = (fs.NodeMknoder)((*stateDir)(nil))

func (d *stateDir) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

var _ = (fs.NodeSetattrer)((*stateDir)(nil))

// Setattr of a state directory: its mode and owner are its queue's (chmod
// and chown the queue directory to change them), so a chmod and utimes are
// accepted and change nothing, as is a chown to the owner it has (`cp -a
// dir/. inbox/` and `rsync -a dir/ inbox/` set them on the target); a
// chown to another owner is EPERM.
func (d *stateDir) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	info, err := d.fsys.core.QueueInfo(d.queue)
	if err != nil {
		return errnoOf(err)
	}
	if _, ok := in.GetSize(); ok {
		return syscall.EISDIR
	}
	uid, hasUID := in.GetUID()
	gid, hasGID := in.GetGID()
	if (hasUID && uid != info.UID) || (hasGID && gid != info.GID) {
		return d.fsys.refuse(refusal{msg: "chown refused: state directories follow their queue", queue: d.queue, uid: callerUID(ctx), errno: syscall.EPERM}, "dir", d.state.Dir())
	}
	return d.Getattr(ctx, fh, out)
}

func (f *FS) takePending(queue, name string) *msgNode {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := pendingKey{queue, name}
	n := f.pending[key]
	delete(f.pending, key)
	return n
}

var _ = (fs.NodeSetxattrer)((*stateDir)(nil))

// Setxattr: a state directory has no extended attributes of its own;
// ENOTSUP (not ENODATA) tells cp -a and rsync -A that ACLs are not
// supported here, which they accept.
func (d *stateDir) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	return syscall.ENOTSUP
}
