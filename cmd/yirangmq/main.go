// Command yirangmq is the yirangmq daemon and its command line: it mounts a
// store as a filesystem of queues and drives queues from the shell.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// command is one subcommand: a name, a one-line summary and its Run.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, env *cliEnv, args []string) error
}

// cliEnv is what a command may touch: its streams, so tests can run
// commands in-process.
type cliEnv struct {
	stdout, stderr io.Writer
	stdin          io.Reader
}

func commands() []command {
	return []command{
		{"mount", "mount a store as a filesystem of queues", runMount},
		{"umount", "unmount a yirangmq mount", runUmount},
		{"publish", "publish files or stdin to a queue (draft, then rename)", runPublish},
		{"consume", "run a command for every message of a queue; exit 0 acks", runConsume},
		{"status", "show the queues of a mount (--watch redraws)", runStatus},
		{"dlq", "list, requeue or purge a queue's dead letters", runDlq},
		{"pause", "stop a queue's deliveries (publishing goes on)", runPause},
		{"resume", "restart a paused queue's deliveries", runResume},
		{"drain", "wait until a queue has nothing ready, in flight or delayed", runDrain},
		{"announce", "make inbox/ raise an inotify event for every message that becomes ready", runAnnounce},
		{"version", "print the version", runVersion},
		{"reference", "print this command line reference as Markdown (docs/cli.md)", runReference},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	env := &cliEnv{stdout: os.Stdout, stderr: os.Stderr, stdin: os.Stdin}
	if isHelperCall(os.Args[0], os.Args[1:]) {
		if err := runHelper(ctx, env, os.Args[1:]); err != nil {
			fmt.Fprintf(env.stderr, "yirangmq: %v\n", err)
			os.Exit(1)
		}
		return
	}
	os.Exit(run(ctx, env, os.Args[1:]))
}

// run dispatches to a command and returns the exit code: 0 ok, 1 the
// command failed, 2 the command line was wrong.
func run(ctx context.Context, env *cliEnv, args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(env.stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] == "--version" {
		args[0] = "version"
	}
	for _, c := range commands() {
		if c.name == args[0] {
			if err := c.run(ctx, env, args[1:]); err != nil {
				if errors.Is(err, errUsage) {
					return 2
				}
				fmt.Fprintf(env.stderr, "yirangmq %s: %v\n", c.name, err)
				return 1
			}
			return 0
		}
	}
	fmt.Fprintf(env.stderr, "yirangmq: unknown command %q (see yirangmq --help)\n", args[0])
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "yirangmq: a durable message queue for devices, served as a filesystem.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Usage: yirangmq COMMAND [OPTIONS] [ARGS]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'yirangmq COMMAND --help' for a command's options.")
	fmt.Fprintln(w, "Exit status: 0 done, 1 the command failed (one line on stderr says why),")
	fmt.Fprintln(w, "2 the command line was wrong (one line on stderr says why, or, with no")
	fmt.Fprintln(w, "command at all, this usage).")
}
