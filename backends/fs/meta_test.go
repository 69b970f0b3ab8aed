package fs

import (
	"strings"
	"testing"
	"time"

	"yirangmq/queuecore"
)

// roundTrip writes m's fields and reads them back, as the attributes of a
// file would be.
func roundTrip(m *queuecore.Message) (found, []field) {
	fs := fields(m)
	vals := map[string]string{}
	for _, f := range fs {
		vals[f.key] = f.val
	}
	return parseFields(func(k string) (string, error) {
		if v, ok := vals[k]; ok {
			return v, nil
		}
		return "", errNoField
	}), fs
}

func TestFieldsRoundTrip(t *testing.T) {
	at := time.Date(2026, 11, 29, 3, 31, 2, 123456789, time.UTC)
	for _, m := range []queuecore.Message{
		{ID: 1, Queue: "q", State: queuecore.StateReady, Seq: 1},
		{ID: 18446744073709551615, Queue: "a-b.c_d", State: queuecore.StateDead, Seq: 7, Priority: -3,
			MessageID: "id with spaces", PublishedAt: at, FirstAt: at.Add(-time.Hour), StateAt: at.Add(time.Second),
			Deadline: at.Add(time.Minute), Attempts: 5, Redrives: 2, Reason: "BAD_INPUT", ReasonMessage: "line 1\nline 2 \x00 \"quoted\"",
			FailedAt: at, Consumer: "uid=0 pid=1 cmd=a b", DedupKey: "k", UID: 4294967295, GID: 1000},
		{ID: 3, Queue: "q", State: queuecore.StateLeased, Seq: 3, PublishedAt: at}, // first and state time the same: left out
		{ID: 4, Queue: "q", State: queuecore.StateArchived, Seq: 4, PublishedAt: at, FirstAt: time.Time{}, StateAt: time.Time{}},
	} {
		fd, fs := roundTrip(&m)
		if len(fd.problems) > 0 || !fd.hasID || !fd.hasState || !fd.hasQueue {
			t.Errorf("%+v: read back with %v (id %v state %v queue %v)", m, fd.problems, fd.hasID, fd.hasState, fd.hasQueue)
		}
		got := fd.msg
		got.Name, got.Size = m.Name, m.Size
		if !sameMessage(got, m) {
			t.Errorf("round trip of %+v\ngave        %+v\nthrough %v", m, got, fs)
		}
	}
}

func sameMessage(a, b queuecore.Message) bool {
	for _, p := range [][2]*time.Time{{&a.PublishedAt, &b.PublishedAt}, {&a.FirstAt, &b.FirstAt}, {&a.StateAt, &b.StateAt}, {&a.Deadline, &b.Deadline}, {&a.FailedAt, &b.FailedAt}} {
		if !p[0].Equal(*p[1]) {
			return false
		}
		*p[0], *p[1] = time.Time{}, time.Time{}
	}
	return a == b
}

// A person's values that cannot be read are left at their default, each
// said once; the rest of the message stays.
func TestFieldsByHand(t *testing.T) {
	vals := map[string]string{
		keyID: "12", keyState: "inbox", keyQueue: "q", keyAttempts: "many", keyPriority: "7",
		keyPublishedAt: "yesterday", keyReason: "MANUAL",
	}
	fd := parseFields(func(k string) (string, error) {
		if v, ok := vals[k]; ok {
			return v, nil
		}
		return "", errNoField
	})
	if fd.msg.ID != 12 || fd.msg.Priority != 7 || fd.msg.Attempts != 0 || fd.msg.Reason != "MANUAL" || !fd.msg.PublishedAt.IsZero() {
		t.Errorf("read %+v", fd.msg)
	}
	if len(fd.problems) != 2 || !strings.Contains(strings.Join(fd.problems, " "), "attempts") {
		t.Errorf("problems %q, want attempts and published_at", fd.problems)
	}
}

func FuzzDecodeTxn(f *testing.F) {
	f.Add([]byte(encodeTxn(txn{from: "q/inbox/a", to: "q/processing/a", fields: []field{{keyID, "1"}, {keyReasonMessage, "a\nb"}}})))
	f.Add([]byte("to=\"x\"\nto=\"y\"\n"))
	f.Add([]byte("from=x"))
	f.Fuzz(func(t *testing.T, b []byte) {
		tx, err := decodeTxn(b)
		if err != nil {
			return
		}
		again, err := decodeTxn(encodeTxn(tx))
		if err != nil || again.from != tx.from || again.to != tx.to || len(again.fields) != len(tx.fields) {
			t.Fatalf("decode(encode(%+v)) = %+v, %v", tx, again, err)
		}
		for i := range tx.fields {
			if again.fields[i] != tx.fields[i] {
				t.Fatalf("field %d: %+v, want %+v", i, again.fields[i], tx.fields[i])
			}
		}
		// Whatever the txn says, reading it as a message never fails.
		_ = parseFields(tx.get)
		if q, st, name, ok := splitRel(tx.to); ok && relPath(q, st, name) != tx.to {
			t.Fatalf("splitRel(%q) = %q %v %q", tx.to, q, st, name)
		}
	})
}

func FuzzParseFields(f *testing.F) {
	f.Add("id=1\nstate=dlq\nqueue=q\nattempts=3\npublished_at=2026-11-29T03:31:02Z")
	f.Add("id=0\nstate=nowhere\nqueue=.x\nseq=-1\npriority=99999999999")
	f.Fuzz(func(t *testing.T, text string) {
		vals := map[string]string{}
		for _, line := range strings.Split(text, "\n") {
			k, v, _ := strings.Cut(line, "=")
			vals[k] = v
		}
		fd := parseFields(func(k string) (string, error) {
			if v, ok := vals[k]; ok {
				return v, nil
			}
			return "", errNoField
		})
		if fd.hasID && fd.msg.ID == 0 {
			t.Fatal("ID 0 taken")
		}
		if fd.hasState && !fd.msg.State.Valid() {
			t.Fatalf("state %d taken", fd.msg.State)
		}
		if fd.hasQueue && queuecore.CheckQueueName(fd.msg.Queue) != nil {
			t.Fatalf("queue %q taken", fd.msg.Queue)
		}
		if !fd.hasID || !fd.hasState || !fd.hasQueue {
			return
		}
		// What was read writes back to the same.
		m := fd.msg
		fd2, _ := roundTrip(&m)
		got := fd2.msg
		if !sameMessage(got, m) {
			t.Fatalf("%+v wrote back as %+v", m, got)
		}
	})
}

func TestManifestLine(t *testing.T) {
	me, ok := parseManifestLine(`12 q dlq "m 05\n"`)
	if !ok || me.id != 12 || me.queue != "q" || me.state != queuecore.StateDead || me.name != "m 05\n" {
		t.Errorf("parsed %+v %v", me, ok)
	}
	for _, bad := range []string{"", "12 q dlq", "x q dlq \"a\"", "1 q nowhere \"a\"", `1 q dlq a`} {
		if _, ok := parseManifestLine(bad); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}
