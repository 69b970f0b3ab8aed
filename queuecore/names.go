package queuecore

import "strings"

// MaxQueueName is the longest queue name.
const MaxQueueName = 128

// MaxMessageName is the longest message name: a file name on Linux.
const MaxMessageName = 255

// CheckQueueName returns an *InputError unless name is 1–128 of
// [A-Za-z0-9._-] not starting with '.'.
func CheckQueueName(name string) error {
	if name == "" || len(name) > MaxQueueName {
		return &InputError{Field: "queue name", Msg: "must be 1 to 128 characters", Err: ErrInvalidName}
	}
	if name[0] == '.' {
		return &InputError{Field: "queue name", Msg: quote(name) + " starts with '.'", Err: ErrInvalidName}
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return &InputError{Field: "queue name", Msg: quote(name) + " may only hold A-Z a-z 0-9 . _ -", Err: ErrInvalidName}
		}
	}
	return nil
}

// CheckMessageName returns an *InputError unless name is a valid POSIX
// file name (1–255 bytes, no '/' or NUL) that does not start with '.'
// (names with a leading dot are drafts, handled by the filesystem layer).
func CheckMessageName(name string) error {
	if name == "" || len(name) > MaxMessageName {
		return &InputError{Field: "message name", Msg: "must be 1 to 255 bytes", Err: ErrInvalidName}
	}
	if name[0] == '.' {
		return &InputError{Field: "message name", Msg: quote(name) + " starts with '.' (a draft name)", Err: ErrInvalidName}
	}
	if strings.ContainsAny(name, "/\x00") {
		return &InputError{Field: "message name", Msg: quote(name) + " holds '/' or NUL", Err: ErrInvalidName}
	}
	return nil
}
