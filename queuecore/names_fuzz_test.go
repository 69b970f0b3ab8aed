package queuecore

import (
	"errors"
	"strings"
	"testing"
)

// The names that reach the core come from FUSE requests: any bytes but '/'
// and NUL, which the kernel never passes in a name. These targets hold the
// checks to what docs/contract.md §1 and §2 promise, since a store turns accepted
// names into paths (the fs store) or keys.

func FuzzCheckQueueName(f *testing.F) {
	for _, s := range []string{"q", "jobs-1.a_b", ".", "..", ".hidden", "a/b", "a\x00b", "a b", "\xff", strings.Repeat("q", 128), strings.Repeat("q", 129), ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		err := CheckQueueName(name)
		if err != nil {
			var ie *InputError
			if !errors.As(err, &ie) || !errors.Is(err, ErrInvalidName) {
				t.Fatalf("CheckQueueName(%q) = %v, want an InputError wrapping ErrInvalidName", name, err)
			}
			return
		}
		if len(name) < 1 || len(name) > MaxQueueName {
			t.Fatalf("accepted %q of %d bytes", name, len(name))
		}
		if name[0] == '.' {
			t.Fatalf("accepted %q, which starts with '.'", name)
		}
		for i := 0; i < len(name); i++ {
			c := name[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
				t.Fatalf("accepted %q, which holds %q", name, c)
			}
		}
		// A queue name is also a directory name: never a path, never . or ..
		if strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
			t.Fatalf("accepted %q", name)
		}
		// A state directory or a pseudo-file name is a valid queue name only
		// one level up, where it cannot clash: the check does not care.
		if _, ok := StateFromDir(name); ok && CheckMessageName(name) != nil {
			t.Fatalf("%q is a queue name and a state but not a message name", name)
		}
	})
}

func FuzzCheckMessageName(f *testing.F) {
	for _, s := range []string{"m", "a\nb", "\x01", "\xff\xfe", "ünï", ".draft", ".", "..", "...", "a/b", "/", "a\x00", strings.Repeat("n", 255), strings.Repeat("n", 256), ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		err := CheckMessageName(name)
		if err != nil {
			var ie *InputError
			if !errors.As(err, &ie) || !errors.Is(err, ErrInvalidName) {
				t.Fatalf("CheckMessageName(%q) = %v, want an InputError wrapping ErrInvalidName", name, err)
			}
			// The error message quotes the name: it must stay one log line.
			if strings.ContainsAny(err.Error(), "\n\r\x00") {
				t.Fatalf("error for %q spans lines: %q", name, err.Error())
			}
			// Refused only for what docs/contract.md §2 refuses.
			if len(name) >= 1 && len(name) <= MaxMessageName && name[0] != '.' && !strings.ContainsAny(name, "/\x00") {
				t.Fatalf("refused the valid POSIX name %q: %v", name, err)
			}
			return
		}
		if len(name) < 1 || len(name) > MaxMessageName {
			t.Fatalf("accepted %q of %d bytes", name, len(name))
		}
		if strings.ContainsAny(name, "/\x00") {
			t.Fatalf("accepted %q, which holds '/' or NUL", name)
		}
		if name[0] == '.' {
			t.Fatalf("accepted %q, which starts with '.' (. .. and drafts)", name)
		}
		// A draft of an accepted name is what fusefs takes for a draft.
		if strings.TrimLeft("."+name, ".") != name {
			t.Fatalf("draft .%q does not map back to %q", name, name)
		}
	})
}

// FuzzParseSyncMode: the --sync flag and the sync= mount option.
func FuzzParseSyncMode(f *testing.F) {
	for _, s := range []string{"full", "normal", "off", "FULL", "", "full "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseSyncMode(s)
		if err != nil {
			var ie *InputError
			if !errors.As(err, &ie) {
				t.Fatalf("ParseSyncMode(%q) = %v, want an InputError", s, err)
			}
			return
		}
		if m.String() != s {
			t.Fatalf("ParseSyncMode(%q) = %v, which prints as %q", s, m, m.String())
		}
	})
}

// FuzzStateFromDir: only the five state directories are states.
func FuzzStateFromDir(f *testing.F) {
	for _, s := range []string{"inbox", "processing", "delayed", "dlq", "archive", "Inbox", "", "invalid", "inbox/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, dir string) {
		s, ok := StateFromDir(dir)
		if !ok {
			return
		}
		if !s.Valid() || s.Dir() != dir {
			t.Fatalf("StateFromDir(%q) = %v, valid %v, dir %q", dir, s, s.Valid(), s.Dir())
		}
	})
}

// A policy document is a JSON object: anything else (null included) is
// refused rather than read as "all defaults".
func TestPolicyMustBeAnObject(t *testing.T) {
	for _, doc := range []string{`null`, ` null `, `[]`, `1`, `"x"`, `true`} {
		if _, err := ParsePolicy([]byte(doc)); err == nil {
			t.Errorf("ParsePolicy(%s) accepted a document that is not an object", doc)
		}
	}
	if _, err := ParsePolicy([]byte(` {} `)); err != nil {
		t.Errorf("ParsePolicy({}) = %v; an empty object is all defaults", err)
	}
}
