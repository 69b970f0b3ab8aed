package queuecore

// WithStatfs makes the core measure free space with f (a fake disk).
func WithStatfs(o Options, f func(dir string) (free, total int64, err error)) Options {
	o.statfs = f
	return o
}
