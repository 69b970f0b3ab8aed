package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Environment variables of the PgBouncer harness.
const (
	// EnvBouncer names the pgbouncer binary.
	EnvBouncer = "YIRANGMQ_PGBOUNCER"
	// EnvRequireBouncer=1 turns "no pgbouncer here" from a skip into a
	// failure, as EnvRequire does for PostgreSQL.
	EnvRequireBouncer = "YIRANGMQ_REQUIRE_PGBOUNCER"
)

// ErrNoBouncer is returned by FindBouncer when pgbouncer is not installed.
var ErrNoBouncer = errors.New("no pgbouncer found in $" + EnvBouncer + ", /usr/sbin or PATH; install the pgbouncer package (apt-get install pgbouncer)")

// Pool modes of a Bouncer (PgBouncer's pool_mode).
const (
	// Transaction gives a client a server session for one transaction
	// at a time: what most sites run, and what LISTEN and session
	// advisory locks do not survive.
	Transaction = "transaction"
	// Session gives a client a server session for as long as it stays
	// connected, and resets it (DISCARD ALL) when it leaves.
	Session = "session"
)

// Bouncer is a PgBouncer in front of a Server, for tests: a child of the
// test process (as the postgres user when root, since pgbouncer refuses
// to run as root), listening on a free loopback TCP port, with its
// configuration, log and socket in a temporary directory of its own.
// Every database of the server is reachable through it under its own name
// (the fallback database "*"), in one pool mode for all; trust
// authentication for User. A test that wants both modes, as a site with
// a transaction-mode database and a session-mode one for the sessions
// would have, starts two.
type Bouncer struct {
	dir, bin, mode string
	port           int
	cred           *syscall.Credential

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// FindBouncer returns the path of the pgbouncer binary, or ErrNoBouncer.
func FindBouncer() (string, error) {
	if p := os.Getenv(EnvBouncer); p != "" {
		if fi, err := os.Stat(p); err != nil || fi.IsDir() {
			return "", fmt.Errorf("$%s=%s is no pgbouncer binary", EnvBouncer, p)
		}
		return p, nil
	}
	if fi, err := os.Stat("/usr/sbin/pgbouncer"); err == nil && !fi.IsDir() {
		return "/usr/sbin/pgbouncer", nil
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	return "", ErrNoBouncer
}

// StartBouncer starts a PgBouncer in pool mode mode (Transaction or
// Session) in front of srv, stopped and removed when t ends. Without
// pgbouncer it skips t (fails it if EnvRequireBouncer=1).
func StartBouncer(t testing.TB, srv *Server, mode string) *Bouncer {
	t.Helper()
	b, err := NewBouncer(srv, mode)
	if errors.Is(err, ErrNoBouncer) {
		if os.Getenv(EnvRequireBouncer) == "1" {
			t.Fatalf("pgtest: %v (and %s=1)", err, EnvRequireBouncer)
		}
		t.Skipf("pgtest: %v", err)
	}
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(b.Close)
	return b
}

// NewBouncer starts a PgBouncer in front of srv. The caller must Close it.
func NewBouncer(srv *Server, mode string) (*Bouncer, error) {
	if mode != Transaction && mode != Session {
		return nil, fmt.Errorf("pool mode %q: want %s or %s", mode, Transaction, Session)
	}
	bin, err := FindBouncer()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("/tmp", "pgbouncer-")
	if err != nil {
		return nil, err
	}
	b := &Bouncer{dir: dir, bin: bin, mode: mode}
	fail := func(err error) (*Bouncer, error) {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return fail(fmt.Errorf("running as root, pgbouncer needs a non-root user: %w", err))
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		b.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}
		if err := os.Chown(dir, uid, gid); err != nil {
			return fail(err)
		}
	}
	users := fmt.Sprintf("%q \"\"\n", User)
	if err := os.WriteFile(filepath.Join(dir, "userlist.txt"), []byte(users), 0o644); err != nil {
		return fail(err)
	}
	var lastErr error
	for range 3 { // a free port can be taken between choosing and binding
		if b.port, err = freePort(); err != nil {
			return fail(err)
		}
		if err := b.writeConfig(srv); err != nil {
			return fail(err)
		}
		if lastErr = b.Start(); lastErr == nil {
			return b, nil
		}
	}
	return fail(lastErr)
}

// writeConfig writes pgbouncer.ini: the server through its unix socket,
// every database by its own name.
func (b *Bouncer) writeConfig(srv *Server) error {
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%d

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir = %s
auth_type = trust
auth_file = %s
admin_users = %s
pool_mode = %s
max_client_conn = 1000
default_pool_size = 20
logfile = %s
log_connections = 0
log_disconnections = 0
`, srv.Dir(), srv.Port(), b.port, b.dir, filepath.Join(b.dir, "userlist.txt"), User, b.mode, b.logPath())
	return os.WriteFile(filepath.Join(b.dir, "pgbouncer.ini"), []byte(ini), 0o644)
}

func (b *Bouncer) logPath() string { return filepath.Join(b.dir, "pgbouncer.log") }

// Port is the bouncer's TCP port on 127.0.0.1.
func (b *Bouncer) Port() int { return b.port }

// Mode is the bouncer's pool mode.
func (b *Bouncer) Mode() string { return b.mode }

// URL is the connection URL of database db through the bouncer, over
// loopback TCP.
func (b *Bouncer) URL(db string) string {
	u := url.URL{Scheme: "postgres", User: url.User(User), Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)),
		Path: "/" + db, RawQuery: "sslmode=disable"}
	return u.String()
}

// Start starts the (stopped) bouncer and waits until it answers a query
// for the server's postgres database.
func (b *Bouncer) Start() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd != nil {
		return errors.New("start: pgbouncer is running")
	}
	logf, err := os.OpenFile(filepath.Join(b.dir, "stderr.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(b.bin, filepath.Join(b.dir, "pgbouncer.ini"))
	cmd.Dir = b.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: b.cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start pgbouncer: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	b.cmd, b.exited = cmd, exited
	deadline := time.Now().Add(startTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := ping(ctx, b.URL("postgres"))
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			b.cmd, b.exited = nil, nil
			return fmt.Errorf("pgbouncer exited at start:\n%s", b.Log())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			b.killLocked()
			return fmt.Errorf("pgbouncer did not answer within %v: %v\n%s", startTimeout, err, b.Log())
		}
	}
}

// ping runs a query on a connection of its own (simple protocol: the
// bouncer may be in transaction mode).
func ping(ctx context.Context, u string) error {
	c, err := pgx.Connect(ctx, u+"&default_query_exec_mode=simple_protocol")
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	var one int
	return c.QueryRow(ctx, "SELECT 1").Scan(&one)
}

// Log is what the bouncer logged.
func (b *Bouncer) Log() string {
	var out []string
	for _, p := range []string{b.logPath(), filepath.Join(b.dir, "stderr.log")} {
		if data, err := os.ReadFile(p); err == nil {
			out = append(out, strings.TrimSpace(string(data)))
		}
	}
	return strings.Join(out, "\n")
}

// Stop shuts the bouncer down at once (SIGTERM, PgBouncer's immediate
// shutdown: every client and server connection is closed, as when its
// host goes; SIGINT would wait for every session to end). It is a no-op
// on a stopped bouncer.
func (b *Bouncer) Stop() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd == nil {
		return nil
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.exited:
		b.cmd, b.exited = nil, nil
		return nil
	case <-time.After(10 * time.Second):
		b.killLocked()
		return errors.New("stop: pgbouncer did not exit within 10s; killed it")
	}
}

func (b *Bouncer) killLocked() {
	if b.cmd == nil {
		return
	}
	_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
	<-b.exited
	b.cmd, b.exited = nil, nil
}

// Close stops the bouncer and removes its directory.
func (b *Bouncer) Close() {
	if err := b.Stop(); err != nil {
		b.mu.Lock()
		b.killLocked()
		b.mu.Unlock()
	}
	_ = os.RemoveAll(b.dir)
}
