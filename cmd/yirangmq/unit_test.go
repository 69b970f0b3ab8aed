package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"yirangmq/testenv"
)

// unitSettings reads dist/yirangmq.service: key → value, comments out.
func unitSettings(t *testing.T) (map[string]string, string) {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	path := filepath.Join(filepath.Dir(file), "..", "..", "dist", "yirangmq.service")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	kv := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if k, v, ok := strings.Cut(l, "="); ok && !strings.HasPrefix(l, "#") {
			kv[k] = v
		}
	}
	return kv, string(b)
}

// The unit is hardened as far as FUSE mounting allows: systemd-analyze
// verify accepts it, it drops every capability but the ones mounting
// needs, sets no_new_privs, and has no option that makes a mount
// namespace. A daemon run under the same no_new_privs and capability
// bounding set still mounts and serves.
func TestUnitHardened(t *testing.T) {
	kv, text := unitSettings(t)
	for k, want := range map[string]string{
		"NoNewPrivileges": "yes", "RestrictSUIDSGID": "yes", "LockPersonality": "yes",
		"RestrictNamespaces": "yes", "SystemCallArchitectures": "native", "UMask": "0077",
	} {
		if kv[k] != want {
			t.Errorf("unit: %s=%q, want %q", k, kv[k], want)
		}
	}
	caps := strings.Fields(kv["CapabilityBoundingSet"])
	if len(caps) == 0 || !strings.Contains(kv["CapabilityBoundingSet"], "CAP_SYS_ADMIN") {
		t.Fatalf("unit: CapabilityBoundingSet=%q, want a short list with CAP_SYS_ADMIN", kv["CapabilityBoundingSet"])
	}
	for _, bad := range []string{"PrivateTmp", "ProtectSystem", "ProtectHome", "PrivateMounts", "PrivateDevices",
		"ProtectKernelTunables", "ProtectKernelLogs", "ProtectControlGroups", "ReadOnlyPaths", "ProtectClock", "DeviceAllow"} {
		if _, ok := kv[bad]; ok {
			t.Errorf("unit sets %s, which would hide the mount or /dev/fuse", bad)
		}
	}
	bin := testenv.Binary(t)
	if sa, err := exec.LookPath("systemd-analyze"); err == nil {
		unit := filepath.Join(t.TempDir(), "yirangmq.service")
		if err := os.WriteFile(unit, []byte(strings.ReplaceAll(text, "@BINDIR@", filepath.Dir(bin))), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(sa, "verify", unit).CombinedOutput(); err != nil {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	} else {
		t.Log("no systemd-analyze: the unit's syntax is not verified here")
	}
	if os.Getuid() != 0 {
		t.Skip("needs root to mount as the unit does")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("no setpriv")
	}
	// What the unit's NoNewPrivileges and CapabilityBoundingSet do, by
	// setpriv (systemd does not run in the test environment).
	set := "-all"
	for _, c := range caps {
		set += ",+" + strings.ToLower(strings.TrimPrefix(c, "CAP_"))
	}
	d := testenv.StartDaemon(t, testenv.DaemonOptions{
		Args: []string{"-o", "allow_other"},
		Wrap: []string{"setpriv", "--no-new-privs", "--bounding-set", set, "--inh-caps", "-all", "--"},
	})
	status, err := os.ReadFile("/proc/" + strconv.Itoa(d.Pid()) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(status), "NoNewPrivs:\t1") {
		t.Fatalf("the daemon runs without no_new_privs:\n%s", status)
	}
	testenv.MustSh(t, d.Mountpoint, `mkdir q && echo hello > q/inbox/m && m=$(cat q/.next) && test "$(cat q/$m)" = hello && rm q/$m`)
}
