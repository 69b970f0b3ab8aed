package testenv

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// Result is what a command did.
type Result struct {
	Stdout, Stderr string
	Code           int // exit status; -1 if killed by a signal
}

// Sh runs a shell script with sh -e -c in dir, as a user of the mount
// would. -e: a command of a multi-line script that fails ends it with its
// status, so a script's checks (test ..., cmp ...) all count, not only
// its last line; a command that may fail says so (|| true, if).
func Sh(t testing.TB, dir, script string) Result {
	t.Helper()
	cmd := exec.Command("sh", "-e", "-c", script)
	cmd.Dir = dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := Result{Stdout: out.String(), Stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.Code = ee.ExitCode()
	default:
		t.Fatalf("run %q: %v", script, err)
	}
	return r
}

// MustSh runs a script that must succeed and returns its output.
func MustSh(t testing.TB, dir, script string) string {
	t.Helper()
	r := Sh(t, dir, script)
	if r.Code != 0 {
		t.Fatalf("%q failed with %d:\n%s%s", script, r.Code, r.Stdout, r.Stderr)
	}
	return r.Stdout
}

var (
	clientOnce sync.Once
	clientPath string
	clientErr  error
)

// CClient compiles testenv/testdata/client.c, a small C program that uses
// plain open/write/close/rename/read the way legacy programs do and
// prints the errno of each call.
func CClient(t testing.TB) string {
	t.Helper()
	clientOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		src := filepath.Join(filepath.Dir(file), "testdata", "client.c")
		dir, err := os.MkdirTemp("", "yirangmq-client-")
		if err != nil {
			clientErr = err
			return
		}
		clientPath = filepath.Join(dir, "client")
		if out, err := exec.Command("cc", "-O1", "-Wall", "-pthread", "-o", clientPath, src).CombinedOutput(); err != nil {
			clientErr = errors.New("cc: " + err.Error() + "\n" + string(out))
		}
	})
	if clientErr != nil {
		t.Fatal(clientErr)
	}
	return clientPath
}
