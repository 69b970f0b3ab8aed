// Package pgtest gives tests a real PostgreSQL server of their own: initdb
// into a new temporary directory, then postgres listening on a unix socket
// in that directory and on a free loopback TCP port, with fsync on, as a
// child of the test process. The server is stopped, and its directory
// removed, when the test (Start) or the test binary (StartMain) ends; if
// the test process dies, the postmaster gets SIGKILL from the kernel
// (Pdeathsig) and its backends exit on their own when they see it gone.
//
// The binaries are looked for in $YIRANGMQ_PG_BIN, then in
// /usr/lib/postgresql/*/bin (the newest version first), then in PATH.
// Without them a test is skipped, unless YIRANGMQ_REQUIRE_POSTGRES=1 (as in
// CI), where it fails. initdb and postgres refuse to run as root: a test
// run as root runs them as the "postgres" system user.
//
// A child process of a test (a crash test re-runs the test binary) can be
// pointed at its parent's server with Export: Start and StartMain then
// attach to that server instead of starting one, and never stop it. The
// same way, TestMain can start one server for the tests of a package
// (StartMain, then ExportMain), each of which gets it from Start.
//
// StartBouncer puts a PgBouncer (bouncer.go) in front of a server, in
// transaction or session pooling mode, as a child of the test process
// with its own configuration in a temporary directory; without pgbouncer
// a test is skipped, unless YIRANGMQ_REQUIRE_PGBOUNCER=1.
//
// StartWith and NewWith take Options: more addresses to listen on (as the
// host side of a veth pair, for a client in another network namespace)
// and networks that pg_hba.conf trusts; TCPURLAt names such an address.
package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Environment variables that steer the package.
const (
	// EnvBin names a directory holding initdb and postgres.
	EnvBin = "YIRANGMQ_PG_BIN"
	// EnvRequire=1 turns "no PostgreSQL here" from a skip into a failure.
	EnvRequire = "YIRANGMQ_REQUIRE_POSTGRES"
	// EnvServer is set by Export to "PORT DIR" of a running server, for
	// child processes to attach to.
	EnvServer = "YIRANGMQ_PGTEST_SERVER"
)

// ErrNoPostgres is returned by StartMain and FindBin when no PostgreSQL
// binaries are installed.
var ErrNoPostgres = errors.New("no PostgreSQL server binaries (initdb, postgres) found in $" + EnvBin +
	", /usr/lib/postgresql/*/bin or PATH; install the postgresql package (apt-get install postgresql)")

// User is the database role the tests connect as; authentication is trust.
const User = "postgres"

// startTimeout bounds the wait for a starting server to accept connections.
const startTimeout = 60 * time.Second

// Server is a PostgreSQL server for tests.
type Server struct {
	dir  string // temporary directory: data/, the socket, postgres.log
	port int
	bin  string
	cred *syscall.Credential // run initdb and postgres as this user (when root)
	// owned is false for a server attached through EnvServer: this process
	// did not start it and must not stop it.
	owned bool
	// listen is what postgres listens on besides 127.0.0.1
	// (Options.ListenAddresses).
	listen []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been waited for
}

// FindBin returns the directory of initdb and postgres, or ErrNoPostgres.
func FindBin() (string, error) {
	has := func(dir string) bool {
		for _, b := range []string{"initdb", "postgres"} {
			if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	if d := os.Getenv(EnvBin); d != "" {
		if has(d) {
			return d, nil
		}
		return "", fmt.Errorf("$%s=%s holds no initdb and postgres", EnvBin, d)
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// Newest version first: "9.6" < "15" needs a numeric compare.
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(a)), 64)
		vb, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(b)), 64)
		switch {
		case va > vb:
			return -1
		case va < vb:
			return 1
		}
		return 0
	})
	for _, d := range dirs {
		if has(d) {
			return d, nil
		}
	}
	initdb, err1 := exec.LookPath("initdb")
	postgres, err2 := exec.LookPath("postgres")
	if err1 == nil && err2 == nil {
		// Resolve symlinks: postgres finds its share/ and lib/ relative to
		// its real location.
		if p, err := filepath.EvalSymlinks(postgres); err == nil {
			if d := filepath.Dir(p); has(d) {
				return d, nil
			}
		}
		if filepath.Dir(initdb) == filepath.Dir(postgres) {
			return filepath.Dir(postgres), nil
		}
	}
	return "", ErrNoPostgres
}

// Start returns a server for t: a new one, stopped and removed when t ends,
// or the one named by EnvServer. Without PostgreSQL binaries it skips t
// (fails it if EnvRequire=1).
func Start(t testing.TB) *Server {
	t.Helper()
	if s, ok, err := attach(); ok {
		if err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		return s
	}
	s, err := New()
	if errors.Is(err, ErrNoPostgres) {
		if os.Getenv(EnvRequire) == "1" {
			t.Fatalf("pgtest: %v (and %s=1)", err, EnvRequire)
		}
		t.Skipf("pgtest: %v", err)
	}
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// StartMain is Start for TestMain: it returns the server and the function
// that stops it (call it before os.Exit). Without binaries it returns
// ErrNoPostgres, unless EnvRequire=1, when the error says so: the caller
// decides whether to run the tests without a server.
func StartMain() (*Server, func(), error) {
	if s, ok, err := attach(); ok {
		return s, func() {}, err
	}
	s, err := New()
	if err != nil {
		if errors.Is(err, ErrNoPostgres) && os.Getenv(EnvRequire) == "1" {
			err = fmt.Errorf("%w (and %s=1)", err, EnvRequire)
		}
		return nil, func() {}, err
	}
	return s, s.Close, nil
}

// attach returns the server of EnvServer; ok is false when it is not set.
func attach() (s *Server, ok bool, err error) {
	v := os.Getenv(EnvServer)
	if v == "" {
		return nil, false, nil
	}
	portStr, dir, found := strings.Cut(v, " ")
	port, perr := strconv.Atoi(portStr)
	if !found || perr != nil || dir == "" {
		return nil, true, fmt.Errorf("bad $%s %q: want \"PORT DIR\"", EnvServer, v)
	}
	return &Server{dir: dir, port: port}, true, nil
}

// Options say how to set up a new server (StartWith, NewWith). The zero
// value is the server of Start and New.
type Options struct {
	// ListenAddresses are IP addresses for the server to listen on besides
	// 127.0.0.1, on the same TCP port: say, the host side of a veth pair,
	// for clients in another network namespace (see TCPURLAt). Each must
	// be an address of this host when the server starts (and restarts):
	// starting fails when the server cannot listen on one of them.
	ListenAddresses []string
	// TrustNets are networks in CIDR notation (10.213.0.0/30) whose
	// clients pg_hba.conf lets connect over TCP without a password, as it
	// lets 127.0.0.1. The clients of ListenAddresses need them.
	TrustNets []string
}

func (o Options) zero() bool { return len(o.ListenAddresses) == 0 && len(o.TrustNets) == 0 }

// StartWith is Start with opts. A server with options (not the zero
// value) is always a new one, stopped and removed when t ends: it never
// attaches to the server of EnvServer, which was set up without them.
func StartWith(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.zero() {
		return Start(t)
	}
	s, err := NewWith(opts)
	if errors.Is(err, ErrNoPostgres) {
		if os.Getenv(EnvRequire) == "1" {
			t.Fatalf("pgtest: %v (and %s=1)", err, EnvRequire)
		}
		t.Skipf("pgtest: %v", err)
	}
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// New starts a new server. The caller must Close it.
func New() (*Server, error) { return NewWith(Options{}) }

// NewWith starts a new server set up as opts say. The caller must Close
// it.
func NewWith(opts Options) (*Server, error) {
	for _, a := range opts.ListenAddresses {
		if net.ParseIP(a) == nil {
			return nil, fmt.Errorf("listen address %q is not an IP address", a)
		}
	}
	for _, n := range opts.TrustNets {
		if _, _, err := net.ParseCIDR(n); err != nil {
			return nil, fmt.Errorf("trusted network: %w", err)
		}
	}
	bin, err := FindBin()
	if err != nil {
		return nil, err
	}
	// A short parent: the socket's path must fit in 107 bytes. And under
	// root, one that the postgres user can reach (not /root/...).
	parent := os.TempDir()
	if os.Geteuid() == 0 || len(parent) > 60 {
		parent = "/tmp"
	}
	dir, err := os.MkdirTemp(parent, "pgtest-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, bin: bin, owned: true, listen: slices.Clone(opts.ListenAddresses)}
	fail := func(err error) (*Server, error) {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return fail(fmt.Errorf("running as root, initdb and postgres need a non-root user: %w", err))
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}
		if err := os.Chown(dir, uid, gid); err != nil {
			return fail(fmt.Errorf("chown %s to postgres: %w", dir, err))
		}
	}
	// -N: the initial files need no fsync (a test server that dies at
	// birth is made again); the server itself runs with fsync on.
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", s.dataDir(), "-A", "trust", "-U", User,
		"-N", "--locale=C", "-E", "UTF8")
	initdb.Dir = dir
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGKILL}
	if out, err := initdb.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("initdb: %w\n%s", err, out))
	}
	if err := s.trust(opts.TrustNets); err != nil {
		return fail(err)
	}
	var lastErr error
	for range 3 { // a free port can be taken between choosing and binding
		if s.port, err = freePort(); err != nil {
			return fail(err)
		}
		if lastErr = s.Start(); lastErr == nil {
			return s, nil
		}
		if !strings.Contains(lastErr.Error(), "could not bind") && !strings.Contains(lastErr.Error(), "could not create") {
			break
		}
	}
	return fail(lastErr)
}

func (s *Server) dataDir() string { return filepath.Join(s.dir, "data") }
func (s *Server) logPath() string { return filepath.Join(s.dir, "postgres.log") }

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Dir is the server's directory, which holds its unix socket.
func (s *Server) Dir() string { return s.dir }

// Port is the server's TCP port on 127.0.0.1 (also the number in the name
// of its unix socket).
func (s *Server) Port() int { return s.port }

// URL is the connection URL of database db through the unix socket.
func (s *Server) URL(db string) string {
	q := url.Values{"host": {s.dir}, "port": {strconv.Itoa(s.port)}, "sslmode": {"disable"}}
	return (&url.URL{Scheme: "postgres", User: url.User(User), Path: "/" + db, RawQuery: q.Encode()}).String()
}

// TCPURL is the connection URL of database db through loopback TCP.
func (s *Server) TCPURL(db string) string {
	u := url.URL{Scheme: "postgres", User: url.User(User), Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)),
		Path: "/" + db, RawQuery: "sslmode=disable"}
	return u.String()
}

// TCPURLAt is the connection URL of database db through TCP to address
// host, one of Options.ListenAddresses (or 127.0.0.1), at the server's
// port.
func (s *Server) TCPURLAt(host, db string) string {
	u := url.URL{Scheme: "postgres", User: url.User(User), Host: net.JoinHostPort(host, strconv.Itoa(s.port)),
		Path: "/" + db, RawQuery: "sslmode=disable"}
	return u.String()
}

// trust appends to pg_hba.conf a trust line for TCP clients of each of
// nets (initdb -A trust wrote those of the loopback addresses).
func (s *Server) trust(nets []string) error {
	if len(nets) == 0 {
		return nil
	}
	var b strings.Builder
	b.WriteString("\n# pgtest.Options.TrustNets\n")
	for _, n := range nets {
		fmt.Fprintf(&b, "host all all %s trust\n", n)
	}
	// Appending keeps the file's owner (the postgres user, under root).
	f, err := os.OpenFile(filepath.Join(s.dataDir(), "pg_hba.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("pg_hba.conf: %w", err)
	}
	if _, err := f.WriteString(b.String()); err != nil {
		f.Close()
		return fmt.Errorf("pg_hba.conf: %w", err)
	}
	return f.Close()
}

// Export makes child processes started by t (through os.Environ) attach to
// this server rather than start their own; it is undone when t ends.
func (s *Server) Export(t testing.TB) {
	t.Helper()
	t.Setenv(EnvServer, fmt.Sprintf("%d %s", s.port, s.dir))
}

// ExportMain is Export for TestMain, which owns the server: every test of
// the process then gets it from Start (which attaches to it and never
// stops it), and so do child processes, until undo.
func (s *Server) ExportMain() (undo func()) {
	old, had := os.LookupEnv(EnvServer)
	os.Setenv(EnvServer, fmt.Sprintf("%d %s", s.port, s.dir))
	return func() {
		if had {
			os.Setenv(EnvServer, old)
		} else {
			os.Unsetenv(EnvServer)
		}
	}
}

// CreateDB creates database name, which must not exist, and returns its URL.
func (s *Server) CreateDB(t testing.TB, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.createDB(ctx, name, false); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return s.URL(name)
}

// EnsureDB creates database name unless it exists and returns its URL.
func (s *Server) EnsureDB(ctx context.Context, name string) (string, error) {
	if err := s.createDB(ctx, name, true); err != nil {
		return "", err
	}
	return s.URL(name), nil
}

func (s *Server) createDB(ctx context.Context, name string, mayExist bool) error {
	c, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return fmt.Errorf("connect to create database %s: %w", name, err)
	}
	defer c.Close(context.Background())
	_, err = c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	var pgErr *pgconn.PgError
	if mayExist && errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database
		return nil
	}
	if err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

// Start starts the (stopped) server and waits until it accepts
// connections.
func (s *Server) Start() error {
	if !s.owned {
		return errors.New("start: the server belongs to another process")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("start: the server is running")
	}
	logf, err := os.OpenFile(s.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	logStart, _ := logf.Seek(0, 2)
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), "-D", s.dataDir(), "-k", s.dir, "-p", strconv.Itoa(s.port),
		"-c", "listen_addresses="+strings.Join(append([]string{"127.0.0.1"}, s.listen...), ","),
		"-c", "fsync=on",
		"-c", "max_connections=200",
		"-c", "shared_buffers=32MB",
		"-c", "unix_socket_permissions=0777",
		"-c", "log_min_messages=warning")
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so that Kill reaches the backends too; and
	// SIGKILL when this process dies, so that no server outlives its test.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.cmd, s.exited = cmd, exited

	deadline := time.Now().Add(startTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c, err := pgx.Connect(ctx, s.URL("postgres"))
		cancel()
		if err == nil {
			_ = c.Close(context.Background())
			// With several addresses, postgres starts when it can listen
			// on any one of them, and logs the others.
			if log := s.logSince(logStart); len(s.listen) > 0 && strings.Contains(log, "could not create listen socket") {
				s.killLocked()
				return fmt.Errorf("postgres could not bind every listen address:\n%s", log)
			}
			return nil
		}
		select {
		case <-exited:
			s.cmd, s.exited = nil, nil
			return fmt.Errorf("postgres exited at start:\n%s", s.logSince(logStart))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.killLocked()
			return fmt.Errorf("postgres did not accept connections within %v: %v\n%s", startTimeout, err, s.logSince(logStart))
		}
	}
}

// logSince returns the server log written after offset off.
func (s *Server) logSince(off int64) string {
	b, err := os.ReadFile(s.logPath())
	if err != nil {
		return err.Error()
	}
	if off > 0 && off <= int64(len(b)) {
		b = b[off:]
	}
	return string(bytes.TrimSpace(b))
}

// Stop shuts the server down (fast shutdown: sessions are ended, the data
// is checkpointed). It is a no-op on a stopped server.
func (s *Server) Stop() error {
	if !s.owned {
		return errors.New("stop: the server belongs to another process")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return nil
	}
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.exited:
		s.cmd, s.exited = nil, nil
		return nil
	case <-time.After(30 * time.Second):
		s.killLocked()
		return errors.New("stop: postgres did not shut down within 30s; killed it")
	}
}

// Kill kills the server and its backends with SIGKILL, as a crash would;
// Start recovers it.
func (s *Server) Kill() {
	if !s.owned {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
}

func (s *Server) killLocked() {
	if s.cmd == nil {
		return
	}
	// Each backend is in a session of its own (postgres calls setsid), so
	// the process group is only the postmaster: kill its children one by
	// one, as a crash of the host would. Listed first, because they are
	// reparented when the postmaster dies; killed after it, so that it
	// starts no new one.
	pm := s.cmd.Process.Pid
	kids := children(pm)
	_ = syscall.Kill(-pm, syscall.SIGKILL)
	<-s.exited
	for _, pid := range kids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	// Wait until they are gone (or zombies, which hold no shared memory),
	// so that a restart finds the shared memory free.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		alive := false
		for _, pid := range kids {
			if st := procState(pid); st != "" && st != "Z" {
				alive = true
			}
		}
		if !alive {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.cmd, s.exited = nil, nil
}

// children lists the processes whose parent is ppid.
func children(ppid int) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil {
			// "pid (comm) state ppid ...": comm may hold anything, so
			// parse after its last ')'.
			if i := bytes.LastIndexByte(stat, ')'); i >= 0 {
				f := strings.Fields(string(stat[i+1:]))
				if len(f) > 1 && f[1] == strconv.Itoa(ppid) {
					pids = append(pids, pid)
				}
			}
		}
	}
	return pids
}

// procState is the state letter of process pid ("" if there is none).
func procState(pid int) string {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return ""
	}
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 {
		if f := strings.Fields(string(stat[i+1:])); len(f) > 0 {
			return f[0]
		}
	}
	return ""
}

// Restart stops the server and starts it again, failing t on error.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if err := s.Stop(); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	if err := s.Start(); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
}

// Close stops the server and removes its directory. It does nothing to a
// server of another process.
func (s *Server) Close() {
	if !s.owned {
		return
	}
	if err := s.Stop(); err != nil {
		s.Kill()
	}
	_ = os.RemoveAll(s.dir)
}

// SchemaURL creates database db and schema in it, if need be, and returns
// a URL whose search_path is that schema: a store of its own at the cost
// of a CREATE SCHEMA rather than a CREATE DATABASE.
func (s *Server) SchemaURL(ctx context.Context, db, schema string) (string, error) {
	dbURL, err := s.EnsureDB(ctx, db)
	if err != nil {
		return "", err
	}
	c, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return "", err
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return "", err
	}
	return dbURL + "&options=" + url.QueryEscape("-csearch_path="+schema), nil
}
