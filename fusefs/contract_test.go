package fusefs_test

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"yirangmq/testenv"
)

// TestContractErrnos keeps the errno table of docs/contract.md true: every
// errno whose row names this test is produced here through a mount, by
// the operation the row describes; a row that names another test must
// name one that exists and expects that errno; and this test has no case
// the table does not list.
func TestContractErrnos(t *testing.T) {
	rows := contractErrnos(t)
	d := testenv.StartDaemon(t, testenv.DaemonOptions{})
	q := mkq(t, d, "q", "")
	small := mkq(t, d, "small", `{"maxMessageBytes": 4}`)
	full := mkq(t, d, "full", `{"maxReady": 1}`)
	paused := mkq(t, d, "paused", `{"paused": true}`)
	p := func(elem ...string) string { return filepath.Join(append([]string{q}, elem...)...) }
	must(t, os.WriteFile(p("inbox", "m"), []byte("m"), 0o644))
	must(t, os.WriteFile(p("inbox", "l"), []byte("l"), 0o644))
	must(t, os.Rename(p("inbox", "l"), p("processing", "l")))
	must(t, os.WriteFile(filepath.Join(paused, "inbox", "m"), []byte("m"), 0o644))
	must(t, os.WriteFile(filepath.Join(full, "inbox", "one"), []byte("1"), 0o644))

	cases := map[string]func() error{
		"EPERM": func() error { return openErr(p("inbox", "m"), unix.O_WRONLY) },
		"ENOENT": func() error {
			return unix.Rename(p("inbox", "nosuch"), p("processing", "nosuch"))
		},
		"EEXIST":    func() error { return openErr(p("inbox", "l"), unix.O_CREAT|unix.O_WRONLY|unix.O_EXCL) },
		"EINVAL":    func() error { return unix.Mkdir(d.Path("bad name"), 0o755) },
		"ENOTEMPTY": func() error { return unix.Rmdir(q) },
		"EFBIG": func() error {
			fd, err := unix.Open(filepath.Join(small, "inbox", "big"), unix.O_CREAT|unix.O_WRONLY|unix.O_EXCL, 0o644)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			_, err = unix.Write(fd, []byte("too big"))
			return err
		},
		"EDQUOT": func() error {
			return openErr(filepath.Join(full, "inbox", "two"), unix.O_CREAT|unix.O_WRONLY|unix.O_EXCL)
		},
		"EAGAIN": func() error {
			return unix.Rename(filepath.Join(paused, "inbox", "m"), filepath.Join(paused, "processing", "m"))
		},
		"EINTR": func() error {
			// A blocked read of .next, interrupted by an alarm whose handler
			// returns: the read fails with EINTR and takes no lease.
			empty := mkq(t, d, "empty", "")
			r := testenv.Sh(t, empty, `perl -e '$SIG{ALRM} = sub {}; alarm 1; open(my $f, "<", ".next") or die "open: $!"; my $n = sysread($f, my $b, 100); print defined($n) ? "read $n" : ($!{EINTR} ? "EINTR" : "$!")'`)
			if strings.TrimSpace(r.Stdout) == "EINTR" {
				return unix.EINTR
			}
			return &os.PathError{Op: "read .next: " + r.Stdout + r.Stderr, Err: unix.EIO}
		},
		"ENOTSUP": func() error { return unix.Setxattr(p("inbox", "m"), "user.other", []byte("1"), 0) },
		"ENODATA": func() error {
			_, err := unix.Getxattr(p("inbox", "m"), "user.yirangmq.lease_deadline", make([]byte, 64))
			return err
		},
		"ENAMETOOLONG": func() error {
			return openErr(p("inbox", strings.Repeat("n", 256)), unix.O_CREAT|unix.O_WRONLY|unix.O_EXCL)
		},
		"ENOTDIR": func() error { return unix.Rmdir(p("inbox", "m")) },
		"EISDIR":  func() error { return unix.Truncate(p("inbox"), 0) },
	}
	for errno, shownBy := range rows {
		if shownBy != "TestContractErrnos" {
			if !testExpects(t, shownBy, errno) {
				t.Errorf("%s: the table says %s shows it, but no such test expects %s", errno, shownBy, errno)
			}
			continue
		}
		run, ok := cases[errno]
		if !ok {
			t.Errorf("%s: the table says this test shows it, but it has no case", errno)
			continue
		}
		if got := errName(run()); got != errno {
			t.Errorf("%s: the operation of its row gave %s", errno, got)
		}
	}
	for errno := range cases {
		if rows[errno] != "TestContractErrnos" {
			t.Errorf("%s: a case here, but the table of docs/contract.md does not give it to this test", errno)
		}
	}
	// Nothing moved while errors were made: the paused queue's message
	// was not leased, and .next took no lease.
	wantNames(t, "paused inbox", ls(t, filepath.Join(paused, "inbox")), "m")
	wantNames(t, "empty processing", ls(t, d.Path("empty", "processing")))
	wantNames(t, "processing", ls(t, p("processing")), "l")
}

func openErr(path string, flags int) error {
	fd, err := unix.Open(path, flags, 0o644)
	if err == nil {
		unix.Close(fd)
	}
	return err
}

// contractErrnos reads the errno table of docs/contract.md: errno → the
// test its row names.
func contractErrnos(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "docs", "contract.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	row := regexp.MustCompile("^\\| `(E[A-Z]+)` \\|.*\\| `(\\w+)` \\|$")
	rows := map[string]string{}
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.Contains(line, "<!-- errno table -->"):
			in = true
		case strings.Contains(line, "<!-- end of errno table -->"):
			in = false
		case in && strings.HasPrefix(line, "| `E"):
			m := row.FindStringSubmatch(line)
			if m == nil {
				t.Fatalf("docs/contract.md: errno row not understood: %s", line)
			}
			rows[m[1]] = m[2]
		}
	}
	if len(rows) < 10 {
		t.Fatalf("docs/contract.md: only %d errno rows found", len(rows))
	}
	return rows
}

// testExpects reports whether a test function (or a helper or method one runs) of this package
// exists and names errno in its body.
func testExpects(t *testing.T, name, errno string) bool {
	t.Helper()
	files, _ := filepath.Glob("*_test.go")
	start := regexp.MustCompile(`(?m)^func (\([^)]*\) )?` + name + `\(`)
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		src := string(b)
		loc := start.FindStringIndex(src)
		if loc == nil {
			continue
		}
		body := src[loc[1]:]
		if end := strings.Index(body, "\n}\n"); end >= 0 {
			body = body[:end]
		}
		return strings.Contains(body, errno)
	}
	return false
}
