package queuecore

import (
	"context"
	"time"
)

// State is where a message is in its life. The numeric values are stored by
// the backends: never renumber them.
type State uint8

const (
	StateReady    State = 1 // inbox/: deliverable, in delivery order
	StateLeased   State = 2 // processing/: leased until Deadline
	StateDelayed  State = 3 // delayed/: waiting out a backoff or a delay until Deadline
	StateDead     State = 4 // dlq/: dead letter, since StateAt
	StateArchived State = 5 // archive/: acknowledged at StateAt, kept for a while
)

// States lists every state in directory order.
var States = [...]State{StateReady, StateLeased, StateDelayed, StateDead, StateArchived}

// Dir is the directory name of a state in a mount and in the fs store.
func (s State) Dir() string {
	switch s {
	case StateReady:
		return "inbox"
	case StateLeased:
		return "processing"
	case StateDelayed:
		return "delayed"
	case StateDead:
		return "dlq"
	case StateArchived:
		return "archive"
	}
	return ""
}

func (s State) String() string {
	if d := s.Dir(); d != "" {
		return d
	}
	return "invalid"
}

// Valid reports whether s is one of the five states.
func (s State) Valid() bool { return s >= StateReady && s <= StateArchived }

// Live reports whether a message in this state holds its name: names are
// unique among a queue's live messages; archived ones are kept apart.
func (s State) Live() bool { return s.Valid() && s != StateArchived }

// StateFromDir is the inverse of Dir; ok is false for an unknown name.
func StateFromDir(dir string) (State, bool) {
	for _, s := range States {
		if s.Dir() == dir {
			return s, true
		}
	}
	return 0, false
}

// Message is one message's metadata, as the store keeps it. The body is kept
// beside it and read with Store.Body.
type Message struct {
	ID    uint64 // unique in the store for the message's life, never reused; assigned by queuecore
	Queue string
	Name  string
	State State
	// Seq orders messages: queuecore gives a new, larger Seq every time a
	// message enters inbox/, so that ready messages are FIFO by commit.
	Seq      uint64
	Priority int // higher first; from the envelope's attributes.priority
	Size     int64

	MessageID   string    // envelope messageId, or a UUID given at publish
	PublishedAt time.Time // commit time of this publish, or the mtime its writer set before it (inbox mtime)
	FirstAt     time.Time // first publish time, kept across redrives
	StateAt     time.Time // when the message entered its current state
	// Deadline is the lease deadline in processing/ and the due time in
	// delayed/; zero in the other states.
	Deadline time.Time

	Attempts      int // failed deliveries: nacks and lease expiries
	Redrives      int
	Reason        string // reason code of the last failure or dead-lettering
	ReasonMessage string
	FailedAt      time.Time
	Consumer      string // uid, pid and command of the last leaser
	DedupKey      string
	UID, GID      uint32

	// Rev is the message's revision in a SharedStore, which checks it on
	// every update and delete; other stores leave it zero.
	Rev uint64
}

// SortKey is the order of messages within one queue and state, used by both
// stores: List returns messages by (SortKey, Seq) ascending. Ready messages
// go by priority (higher first) then Seq; leased and delayed ones by
// Deadline; dead and archived ones by StateAt.
func (m *Message) SortKey() int64 {
	switch m.State {
	case StateReady:
		return -int64(m.Priority)
	case StateLeased, StateDelayed:
		return m.Deadline.UnixNano()
	default:
		return m.StateAt.UnixNano()
	}
}

// OpKind says what an Op does.
type OpKind uint8

const (
	OpInsert OpKind = 1 // a new message: Msg in full (Msg.Size is len(Body)), with Body
	OpUpdate OpKind = 2 // replace the metadata of message Msg.ID (queue, name and state may change); the body stays
	OpDelete OpKind = 3 // remove message Msg.ID and its body (Msg.Size: the body's size, 0 if not known)
)

// Op is one change in an atomic batch given to Store.Apply.
type Op struct {
	Kind OpKind
	Msg  Message
	Body []byte // OpInsert only
	// From is the state the message was in when the core read it (OpUpdate
	// and OpDelete), so that a shared store can tell other daemons where
	// it moved from.
	From State
	// NoSync marks an op that a power cut may undo without breaking the
	// delivery promise: a lease or an ack, which, undone, only means the
	// message is delivered again. In SyncFull, Apply of a batch whose ops
	// all carry it may return once the batch is written to the operating
	// system (it survives the process being killed) and before it is on
	// stable storage; the store makes it durable within SyncDelay, or
	// sooner with the next batch that does not carry it. SyncStrict and the
	// other modes ignore it.
	NoSync bool
}

// QueueInfo is a queue as the store keeps it.
type QueueInfo struct {
	Name      string
	Policy    []byte // JSON, as accepted by ParsePolicy
	UID, GID  uint32
	Mode      uint32 // permission bits of the queue directory
	CreatedAt time.Time
}

// Count is the number and total body size of a queue's messages in one state.
type Count struct {
	N     int64
	Bytes int64
}

// SyncMode is the durability of a commit, with the words of SQLite's
// PRAGMA synchronous.
type SyncMode uint8

const (
	// SyncFull: a commit is on stable storage before Apply returns;
	// concurrent commits share one fsync (group commit). A batch whose
	// ops are all NoSync (a lease, an ack) is exempt: it survives a crash
	// of the process at once and a power cut after at most SyncDelay.
	SyncFull SyncMode = iota
	// SyncNormal: a commit survives a crash of the process (it has been
	// written to the kernel) but not a power cut.
	SyncNormal
	// SyncOff: like SyncNormal for a process crash; the store may skip
	// even the syncs it does in normal mode (checkpoints).
	SyncOff
	// SyncStrict: like SyncFull, NoSync batches too: every commit is on
	// stable storage before Apply returns.
	SyncStrict
)

// SyncDelay bounds how long a NoSync batch committed in SyncFull may stay
// off stable storage.
const SyncDelay = 100 * time.Millisecond

// Durable reports whether a commit in mode m is on stable storage when
// Apply returns (for a NoSync batch in SyncFull: within SyncDelay).
func (m SyncMode) Durable() bool { return m == SyncFull || m == SyncStrict }

// WaitsFor reports whether Apply in mode m waits for the batch ops to be
// on stable storage before it returns.
func WaitsFor(m SyncMode, ops []Op) bool {
	switch m {
	case SyncStrict:
		return true
	case SyncFull:
		for i := range ops {
			if !ops[i].NoSync {
				return true
			}
		}
	}
	return false
}

func (m SyncMode) String() string {
	switch m {
	case SyncFull:
		return "full"
	case SyncNormal:
		return "normal"
	case SyncOff:
		return "off"
	case SyncStrict:
		return "strict"
	}
	return "invalid"
}

// ParseSyncMode reads "strict", "full", "normal" or "off".
func ParseSyncMode(s string) (SyncMode, error) {
	for _, m := range []SyncMode{SyncStrict, SyncFull, SyncNormal, SyncOff} {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, &InputError{Field: "sync", Msg: "must be strict, full, normal or off, not " + quote(s)}
}

// Store keeps queues and messages durably. queuecore owns every rule about
// them; a store only keeps what it is given, atomically, and answers
// queries in the orders described here. A store must be safe for concurrent
// use. Reads see every batch whose Apply has returned.
type Store interface {
	// Queues lists every queue, by name.
	Queues(ctx context.Context) ([]QueueInfo, error)
	// PutQueue creates a queue or replaces its policy and permissions.
	PutQueue(ctx context.Context, q QueueInfo) error
	// DeleteQueue removes a queue and all its messages in one atomic step.
	// ErrNotFound if there is no such queue.
	DeleteQueue(ctx context.Context, name string) error

	// Apply makes a batch of changes atomically: after a crash either all
	// of them or none are there. It returns once the batch is as durable as
	// the store's SyncMode promises; concurrent Apply calls may share one
	// commit (group commit), but a failing batch never fails another.
	// Errors: ErrNotFound when an update or delete names an unknown ID or a
	// message is put in an unknown queue; ErrExists when an insert reuses
	// an ID, or when two messages would share (queue, name) among live
	// states or among archived ones.
	Apply(ctx context.Context, ops []Op) error

	// Lookup finds the live message of a queue with that name
	// (archived=false: ready, leased, delayed or dead), or the archived one
	// (archived=true). ErrNotFound if there is none.
	Lookup(ctx context.Context, queue, name string, archived bool) (Message, error)
	// Body returns the body of message id. ErrNotFound if there is none.
	Body(ctx context.Context, id uint64) ([]byte, error)
	// List calls fn with the messages of a queue in one state, ordered by
	// (SortKey, Seq), until fn returns false. fn must not call the store.
	List(ctx context.Context, queue string, state State, fn func(Message) bool) error
	// Due returns up to limit leased or delayed messages, of every queue,
	// whose Deadline is at or before t, earliest first.
	Due(ctx context.Context, t time.Time, limit int) ([]Message, error)
	// NextDue is the earliest Deadline of any leased or delayed message;
	// ok is false when there is none.
	NextDue(ctx context.Context) (t time.Time, ok bool, err error)
	// Counts returns, per queue and state, the number and bytes of messages.
	// queuecore calls it once at start and keeps its own gauges after.
	Counts(ctx context.Context) (map[string]map[State]Count, error)
	// MaxID is the largest message ID or Seq the store has ever been given
	// (0 for a new store), so that queuecore never reuses one.
	MaxID(ctx context.Context) (uint64, error)

	// Close releases the store and its lock. Pending Applies finish first.
	Close() error
}
