package main

import (
	"slices"
	"testing"
	"time"
)

// TestParseTrace reads a --debug log (an excerpt of a real one, cut
// short) and checks that requests land in the marker's segment, node
// numbers become paths, negative entries and errnos are named, and
// sequences that differ only in names and FORGETs are counted together.
func TestParseTrace(t *testing.T) {
	labels := []string{"cold/lease/0", "cold/lease/1", "cold/ack/0", "end/0"}
	tr, err := parseTrace("testdata/debug.log", labels)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"cold/lease", "cold/ack"}; !slices.Equal(tr.Order, want) {
		t.Fatalf("phases %q, want %q", tr.Order, want)
	}
	lease := tr.Phases["cold/lease"]
	if len(lease) != 1 || lease[0].Ops != 2 {
		t.Fatalf("cold/lease: %+v, want one sequence for 2 operations", lease)
	}
	want := []string{
		"LOOKUP trace/inbox/cold-c0-000000",
		"BATCH_FORGET",
		"LOOKUP trace/inbox/cold-c0-000000",
		"LOOKUP trace/processing/cold-c0-000000 → negative entry",
		"RENAME trace/inbox/cold-c0-000000 → trace/processing/cold-c0-000000",
	}
	if !slices.Equal(lease[0].Requests, want) {
		t.Errorf("cold/lease requests:\n%q\nwant\n%q", lease[0].Requests, want)
	}
	ack := tr.Phases["cold/ack"]
	if len(ack) != 1 || !slices.Equal(ack[0].Requests, []string{"UNLINK trace/processing/cold-c0-000009 → ENOENT"}) {
		t.Errorf("cold/ack: %+v", ack)
	}
}

func TestSummary(t *testing.T) {
	var l latencies
	for i := 100; i >= 1; i-- {
		l = append(l, time.Duration(i)*time.Microsecond)
	}
	s := l.summary()
	if s.N != 100 || s.P50US != 50 || s.P99US != 99 || s.MaxUS != 100 || s.MeanUS != 50.5 {
		t.Errorf("summary %+v", s)
	}
	if (latencies{}).summary() != (summary{}) {
		t.Error("empty summary not zero")
	}
}
