package backends

import (
	"math"
	"time"
)

// Nanos is how every store keeps a time in a number: Unix nanoseconds,
// clamped to what an int64 holds (the years 1678 to 2262) so that it is
// defined for every time, and the zero time as 0. (So the instant of the
// Unix epoch itself reads back as the zero time; no message time is it.)
func Nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	const maxSec = math.MaxInt64/1_000_000_000 - 1
	switch s := t.Unix(); {
	case s > maxSec:
		return math.MaxInt64
	case s < -maxSec:
		return math.MinInt64
	}
	return t.UnixNano()
}

// FromNanos is the time Nanos kept, in the local zone: callers compare
// times with time.Equal.
func FromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}
