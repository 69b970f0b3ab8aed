package backends

import "time"

// Nanos is how the SQL stores keep a time: Unix nanoseconds, the zero
// time as 0.
func Nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// FromNanos is the time Nanos kept, in the local zone (as file times come
// back in the fs store): callers compare times with time.Equal.
func FromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}
