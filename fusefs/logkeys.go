package fusefs

// Log keys, so that every line names things the same way (and as
// queuecore's lines do).
const (
	logQueue = "queue"
	logName  = "name"
	logErr   = "err"
	logUID   = "uid"
)
