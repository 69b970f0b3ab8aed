package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"

	"github.com/spf13/pflag"
)

// errUsage means the command line was wrong; what was wrong has been
// printed already.
var errUsage = errors.New("usage")

// parseFlags parses args with fs and reports whether the command should
// go on. On -h/--help it prints the help to stdout and returns false, nil
// (exit 0); on a bad flag or value it prints one line saying what was
// wrong and returns false, errUsage (exit 2).
func parseFlags(env *cliEnv, fs *pflag.FlagSet, args []string) (bool, error) {
	fs.SetOutput(env.stderr)
	if fs.Usage == nil {
		fs.Usage = func() {
			fmt.Fprintf(fs.Output(), "Usage: yirangmq %s [OPTIONS]\n\nOptions:\n", fs.Name())
			printOptions(fs)
		}
	}
	help := fs.BoolP("help", "h", false, "show this help")
	if err := fs.Parse(args); err != nil {
		// pflag prints nothing itself with ContinueOnError.
		fmt.Fprintf(env.stderr, "yirangmq %s: %v (see yirangmq %s --help)\n", fs.Name(), err, fs.Name())
		return false, errUsage
	}
	if *help {
		fs.SetOutput(env.stdout)
		fs.Usage()
		printExamples(env.stdout, fs.Name())
		return false, nil
	}
	return true, nil
}

// parseFlagsNoArgs is parseFlags for a command that takes no arguments:
// a stray one is a wrong command line too.
func parseFlagsNoArgs(env *cliEnv, fs *pflag.FlagSet, args []string) (bool, error) {
	if ok, err := parseFlags(env, fs, args); !ok {
		return false, err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(env.stderr, "yirangmq %s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return false, errUsage
	}
	return true, nil
}

func runVersion(ctx context.Context, env *cliEnv, args []string) error {
	fs := pflag.NewFlagSet("version", pflag.ContinueOnError)
	if ok, err := parseFlagsNoArgs(env, fs, args); !ok {
		return err
	}
	stores := "sqlite fs postgres"
	if !withPostgres {
		stores = "sqlite fs"
	}
	fmt.Fprintf(env.stdout, "yirangmq %s (%s, %s/%s; stores: %s)\n", version, runtime.Version(), runtime.GOOS, runtime.GOARCH, stores)
	return nil
}

// printOptions prints a command's flags as pflag does, but a bool flag as
// plain --flag: pflag shows every bool as --flag[=true|false], which reads
// as if a value were needed.
func printOptions(fs *pflag.FlagSet) {
	const noise = "[=true|false]"
	// The same width in spaces keeps the columns of the other lines.
	fmt.Fprint(fs.Output(), strings.ReplaceAll(fs.FlagUsages(), noise, strings.Repeat(" ", len(noise))))
}
