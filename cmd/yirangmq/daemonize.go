package main

// Starting the daemon in the background (--daemon) and the ready pipe on
// which a daemon tells whoever started it that it serves, or why not.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// readyFDEnv names the descriptor on which a mounting daemon writes
// "ready\n" once the mount serves; --daemon and the test harness use it.
const readyFDEnv = "YIRANGMQ_READY_FD"

// The ready pipe: a mounting daemon started with readyFDEnv writes
// "ready\n" on it once the mount serves, or "error: WHY\n" if the mount
// fails, then closes it.
const readyFailed = "error: "

// signalReady tells whoever started us (--daemon's parent, the test
// harness) that the mount serves.
func signalReady() { tellStarter("ready\n") }

// signalFailed tells whoever started us why the mount failed.
func signalFailed(err error) {
	tellStarter(readyFailed + strings.Join(strings.Fields(err.Error()), " ") + "\n")
}

func tellStarter(line string) {
	fdStr := os.Getenv(readyFDEnv)
	if fdStr == "" {
		return
	}
	os.Unsetenv(readyFDEnv)
	fd, err := strconv.Atoi(fdStr)
	if err != nil {
		return
	}
	f := os.NewFile(uintptr(fd), "ready")
	f.Write([]byte(line))
	f.Close()
}

// startDaemon runs the same mount in a background child that logs to
// logFile, and returns once it says ready, or with the error it says on
// the ready pipe if it fails. The child holds none of our descriptors, so
// a pipeline around `yirangmq mount --daemon` ends when this command does.
func startDaemon(ctx context.Context, env *cliEnv, args []string, logFile string) error {
	var childArgs []string
	for _, a := range args {
		if a != "--daemon" {
			childArgs = append(childArgs, a)
		}
	}
	childArgs = append([]string{"--log-file", logFile}, childArgs...)
	self, err := os.Executable()
	if err != nil {
		return err
	}
	logStart := logSize(logFile)
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	cmd := exec.Command(self, append([]string{"mount"}, childArgs...)...)
	cmd.Env = append(os.Environ(), readyFDEnv+"=3")
	cmd.ExtraFiles = []*os.File{w}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, nil, nil // /dev/null
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return err
	}
	w.Close()
	got := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(r).ReadString('\n')
		got <- line
	}()
	select {
	case line := <-got:
		if line == "ready\n" {
			fmt.Fprintf(env.stdout, "yirangmq: mounted, daemon pid %d\n", cmd.Process.Pid)
			_ = cmd.Process.Release()
			return nil
		}
		werr := cmd.Wait()
		if why, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), readyFailed); ok {
			return errors.New(why)
		}
		// It died without a word (a crash, a kill): what it logged, if
		// anything, is in its log.
		return fmt.Errorf("the daemon stopped before the mount was ready (%v)%s", werr, newLogLines(logFile, logStart, 10))
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		return fmt.Errorf("the daemon was not ready after 30 s%s", newLogLines(logFile, logStart, 10))
	}
}

// logSize is the size of a log file, 0 if there is none.
func logSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// newLogLines returns the last n of the lines a log file got past offset
// from (what this run of the daemon wrote), introduced, or "" when none.
func newLogLines(path string, from int64, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if int64(len(b)) < from {
		from = 0 // rotated meanwhile: all of it is new
	}
	if int64(len(b)) == from {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b[from:]), "\n"), "\n")
	return "; its log " + path + " says:\n" + strings.Join(lines[max(0, len(lines)-n):], "\n")
}
