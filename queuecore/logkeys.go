package queuecore

// Log keys: every package of the daemon names things in its log lines with
// these, so that a line says queue=… or err=… whoever writes it, and a
// log search finds them all.
const (
	LogQueue      = "queue"
	LogName       = "name"
	LogReason     = "reason"
	LogErr        = "err"
	LogUID        = "uid" // the user a line is about: the daemon's log rate-limits such lines per kind and per user
	LogPath       = "path"
	LogDir        = "dir"
	LogID         = "id"
	LogCount      = "count"
	LogTook       = "took"
	LogLimit      = "limit"
	LogSync       = "sync"
	LogMountpoint = "mountpoint"
)
